//! The Kubernetes-backed shares against a real kube-apiserver (built by `tests/peers`), with the
//! driver in this process on real tmpfs mounts, as its ServiceAccount with the shipped RBAC:
//! - NodePublishVolume with its SubjectAccessReview and reads: p50 / p99 over 1 000 publishes
//!   (target: p99 < 10 ms);
//! - the process's memory with 1 000 volumes over 100 shares (target: < 60 MB);
//! - a Secret update reaching the files of a volume: p50 / p99 over 100 updates, from the
//!   update's response to the changed file (target: p99 < 200 ms).
//!
//! Needs root (mounts) and Go (the peers). Not a test: nothing fails on a number.
//!
//! `cargo bench -p inline-guard-benches --bench shares_latency [-- --json FILE]`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inline_guard_benches::shares_cluster::{self, DRIVER, DRIVER_GROUPS, pin};
use inline_guard_benches::volume_requests::{publish_request, unpublish_request};
use inline_guard_benches::{percentile, resident_mb};
use inline_guard_proto::csi::v1::NodePublishVolumeRequest;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_tests::cluster::Cluster;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use sharedresource_csi_driver::apiserver::client::ApiserverClients;
use sharedresource_csi_driver::content::KubernetesSource;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::test_util::client::unix_channel;

const VOLUMES: usize = 1_000;
const SHARES: usize = 100;
const UPDATES: usize = 100;

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn request(index: usize, target: &Path) -> NodePublishVolumeRequest {
    let pod = [
        ("csi.storage.k8s.io/pod.name", format!("pod-{index}")),
        ("csi.storage.k8s.io/pod.namespace", "bench-consumer".to_string()),
        ("csi.storage.k8s.io/pod.uid", format!("uid-{index}")),
        ("csi.storage.k8s.io/serviceAccount.name", "reader".to_string()),
        ("sharedSecret", format!("share-{}", index % SHARES)),
    ];
    publish_request(index, target, &pod)
}

async fn post(admin: &kube::Client, path: &str, object: serde_json::Value) {
    shares_cluster::post(admin, path, object).await.unwrap();
}

fn main() {
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped().expect("a run directory");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let peers = inline_guard_tests::peers::peers().expect("the peers (Go on PATH)");
    runtime.block_on(async {
        let cluster = Cluster::start(&peers).await.expect("the control plane");
        // In a cluster the apiserver runs elsewhere than the node: here etcd and the apiserver
        // get CPU 0, and this process (the driver and its client) CPU 1, so neither's bursts
        // stand in the other's latency.
        let pinned = pin(&[peers.kube_apiserver.as_path(), peers.etcd.as_path()]);
        let admin = cluster.client().await.unwrap();
        let _read_grants = shares_cluster::install_driver(&cluster, &admin).await.unwrap();
        for namespace in ["bench-owner", "bench-consumer"] {
            post(&admin, "/api/v1/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})).await;
        }
        for share in 0..SHARES {
            post(&admin, "/api/v1/namespaces/bench-owner/secrets", json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("secret-{share}")},
                "stringData": {"password": "x".repeat(32), "user": "app", "url": "postgres://db:5432/app"}
            }))
            .await;
            post(&admin, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", json!({
                "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
                "metadata": {"name": format!("share-{share}")},
                "spec": {"secretRef": {"namespace": "bench-owner", "name": format!("secret-{share}")}}
            }))
            .await;
        }
        post(&admin, "/apis/rbac.authorization.k8s.io/v1/namespaces/bench-consumer/roles", json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-all"},
            "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "verbs": ["use"]}]
        }))
        .await;
        post(&admin, "/apis/rbac.authorization.k8s.io/v1/namespaces/bench-consumer/rolebindings", json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader-uses-all"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-all"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "bench-consumer"}]
        }))
        .await;

        let driver_client = cluster.client_as(DRIVER, &DRIVER_GROUPS).await.unwrap();
        let last = format!("secret-{}", SHARES - 1);
        shares_cluster::wait_readable(&driver_client, "bench-owner", &last).await.unwrap();
        let before = resident_mb();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let mut plugin = Plugin::in_directory(dir.path(), socket.clone());
        plugin.config.refresh_seconds = 3600;
        // Requests over HTTP/1.1, watches over HTTP/2, as the driver's binary has them.
        let clients = ApiserverClients::new(cluster.config_as(DRIVER, &DRIVER_GROUPS).await.unwrap(), sharedresource_csi_driver::apiserver::rate::RateLayer::shipped()).unwrap();
        plugin.content = Arc::new(KubernetesSource::new(clients, tokio::runtime::Handle::current(), plugin.metrics.clone()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        let channel = unix_channel(socket.clone(), Duration::from_secs(10)).await.unwrap();
        let mut node = NodeClient::new(channel);

        let targets: Vec<PathBuf> =
            (0..VOLUMES).map(|i| dir.path().join(format!("pods/uid-{i}/volumes/kubernetes.io~csi/db/mount"))).collect();
        let mut publish = Vec::with_capacity(VOLUMES);
        for (index, target) in targets.iter().enumerate() {
            let started = Instant::now();
            node.node_publish_volume(request(index, target)).await.expect("publish");
            publish.push(started.elapsed());
        }
        let with_volumes = resident_mb();


        // Updates to share 0's Secret, watched in volume 0.
        let secrets = Api::<Secret>::namespaced(admin.clone(), "bench-owner");
        let file = targets[0].join("user");
        let mut updates = Vec::with_capacity(UPDATES);
        for update in 0..UPDATES {
            let value = format!("user-{update}");
            let patch = Patch::Merge(json!({"stringData": {"user": value}}));
            secrets.patch("secret-0", &PatchParams::default(), &patch).await.unwrap();
            let started = Instant::now();
            let deadline = started + Duration::from_secs(10);
            while std::fs::read_to_string(&file).unwrap_or_default() != value {
                assert!(Instant::now() < deadline, "update {update} never reached the files");
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            updates.push(started.elapsed());
        }
        // Every volume taken down before the driver stops: a run must leave no tmpfs behind
        // (earlier runs left their 1 000 mounts in /tmp).
        for (index, target) in targets.iter().enumerate() {
            node.node_unpublish_volume(unpublish_request(index, target)).await.expect("unpublish");
        }
        let _ = stop.send(());
        running.await.unwrap().unwrap();

        publish.sort_unstable();
        updates.sort_unstable();
        println!(
            "kube-apiserver {} on this machine; driver in-process as its ServiceAccount; {pinned}",
            cluster.version
        );
        println!("NodePublishVolume with the access check, {VOLUMES} volumes over {SHARES} shares: p50 {}  p99 {}  max {}", ms(percentile(&publish, 0.5)), ms(percentile(&publish, 0.99)), ms(publish[publish.len() - 1]));
        println!("Secret update -> files of a volume ({UPDATES} updates; {VOLUMES} volumes published): p50 {}  p99 {}  max {}", ms(percentile(&updates, 0.5)), ms(percentile(&updates, 0.99)), ms(updates[updates.len() - 1]));
        println!("resident set: {before:.1} MB before the driver, {with_volumes:.1} MB with {VOLUMES} volumes (driver and client in one process; tmpfs pages not counted)");
        if let Some(path) = std::env::args().skip_while(|a| a != "--json").nth(1) {
            let millis = |sorted: &[Duration], p: f64| percentile(sorted, p).as_secs_f64() * 1e3;
            let results = json!({
                "volumes": VOLUMES, "shares": SHARES, "updates": UPDATES, "apiserver": cluster.version,
                "placement": pinned,
                "publish": {"p50_ms": millis(&publish, 0.5), "p99_ms": millis(&publish, 0.99)},
                "update_to_files": {"p50_ms": millis(&updates, 0.5), "p99_ms": millis(&updates, 0.99)},
                "resident_mb": with_volumes, "resident_mb_before": before,
            });
            std::fs::write(&path, serde_json::to_vec_pretty(&results).unwrap()).expect("writing the results");
        }
        drop(cluster);
    });
}
