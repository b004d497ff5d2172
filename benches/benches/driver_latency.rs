//! NodePublishVolume and NodeUnpublishVolume latency over the CSI socket with real tmpfs mounts,
//! for a 10-key, 64 KiB volume, and the process's memory with 1 000 volumes published. Targets:
//! publish p99 under 5 ms; 1 000 volumes under 50 MB. Needs root (real mounts).
//!
//! `cargo bench -p inline-guard-benches --bench driver_latency [-- --json FILE]`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inline_guard_benches::volume_requests::{publish_request, unpublish_request};
use inline_guard_benches::{percentile, resident_mb};
use inline_guard_proto::csi::v1::NodePublishVolumeRequest;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::test_util::client::unix_channel;

const VOLUMES: usize = 1_000;
const KEYS: usize = 10;
const VOLUME_BYTES: usize = 64 * 1024;

fn request(index: usize, target: &Path) -> NodePublishVolumeRequest {
    let pod = [
        ("csi.storage.k8s.io/pod.name", "web"),
        ("csi.storage.k8s.io/pod.namespace", "apps"),
        ("csi.storage.k8s.io/pod.uid", "u"),
        ("csi.storage.k8s.io/serviceAccount.name", "web"),
        ("share", "bench"),
    ];
    publish_request(index, target, &pod.map(|(k, v)| (k, v.to_string())))
}

fn main() {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false);
    if !is_root {
        eprintln!("driver_latency needs root (real tmpfs mounts); not run");
        return;
    }
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped().expect("a run directory");
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("shares/bench");
    std::fs::create_dir_all(&share).unwrap();
    for key in 0..KEYS {
        std::fs::write(share.join(format!("key-{key}")), vec![b'x'; VOLUME_BYTES / KEYS]).unwrap();
    }
    let socket = dir.path().join("csi.sock");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let baseline = resident_mb();
        let plugin = Plugin::in_directory(dir.path(), socket.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        let channel = unix_channel(socket.clone(), Duration::from_secs(10)).await.unwrap();
        let mut node = NodeClient::new(channel);
        let targets: Vec<PathBuf> = (0..VOLUMES)
            .map(|i| dir.path().join(format!("pods/{i}/volumes/kubernetes.io~csi/shared/mount")))
            .collect();
        // kubelet creates the pod's volume directory before calling the driver; only the
        // target itself is the driver's to create.
        for target in &targets {
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        }

        let mut publish = Vec::with_capacity(VOLUMES);
        for (index, target) in targets.iter().enumerate() {
            let started = Instant::now();
            node.node_publish_volume(request(index, target)).await.expect("publish");
            publish.push(started.elapsed());
        }
        let with_volumes = resident_mb();
        let mut unpublish = Vec::with_capacity(VOLUMES);
        for (index, target) in targets.iter().enumerate() {
            let started = Instant::now();
            node.node_unpublish_volume(unpublish_request(index, target)).await.expect("unpublish");
            unpublish.push(started.elapsed());
        }
        stop.send(()).unwrap();
        running.await.unwrap().unwrap();

        publish.sort_unstable();
        unpublish.sort_unstable();
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        println!("{VOLUMES} volumes of {KEYS} keys, {} KiB each, tmpfs, over the CSI socket", VOLUME_BYTES / 1024);
        println!("NodePublishVolume    p50 {}  p99 {}  max {}", ms(percentile(&publish, 0.5)), ms(percentile(&publish, 0.99)), ms(publish[publish.len() - 1]));
        println!("NodeUnpublishVolume  p50 {}  p99 {}  max {}", ms(percentile(&unpublish, 0.5)), ms(percentile(&unpublish, 0.99)), ms(unpublish[unpublish.len() - 1]));
        println!(
            "resident set: {baseline:.1} MB before, {with_volumes:.1} MB with {VOLUMES} volumes published (driver and client in one process; tmpfs pages are not counted)"
        );
        if let Some(path) = std::env::args().skip_while(|a| a != "--json").nth(1) {
            let millis = |sorted: &[Duration], p: f64| percentile(sorted, p).as_secs_f64() * 1e3;
            let results = serde_json::json!({
                "volumes": VOLUMES, "keys": KEYS, "volume_bytes": VOLUME_BYTES,
                "publish": {"p50_ms": millis(&publish, 0.5), "p99_ms": millis(&publish, 0.99)},
                "unpublish": {"p50_ms": millis(&unpublish, 0.5), "p99_ms": millis(&unpublish, 0.99)},
                "resident_mb": with_volumes, "resident_mb_before": baseline,
            });
            std::fs::write(&path, serde_json::to_vec_pretty(&results).unwrap()).expect("writing the results");
        }
    });
}
