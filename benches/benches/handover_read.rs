//! A lazy provider's cached file read in a loop while the driver serving it hands the node over
//! to a successor, as the DaemonSet's rolling update does: two whole drivers (the plugin as it
//! runs on a node: its CSI socket, its state lock, its handover offer) in one node directory,
//! real FUSE, the successor started beside the predecessor, `HANDOVERS` times in a row. Each
//! read is what a program does to read a small file (open, read to the end, close); its time is
//! classed by when it ran: before the first handover, during one (from the successor's start
//! until it holds the node and answers on its CSI socket), after the last. The longest read during a handover is
//! what a container waits while its volume is paused and passed on. No read may fail: one that
//! does ends the benchmark with its error. (A handover ends when the successor answers a Probe
//! on the node's socket: it serves the CSI socket only once it serves the volumes it took.)
//!
//! The drivers (and the helper's runtime) are pinned to CPU 0, the reader to CPU 1. Needs root
//! (mounts). Not a test: nothing fails on a number.
//!
//! `cargo bench -p inline-guard-benches --bench handover_read [-- --json FILE]`

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use inline_guard_benches::lazy_bench::{FILE_BYTES, lazy_provider, online_cores, pin_to};
use inline_guard_benches::percentile;
use inline_guard_benches::volume_requests::{publish_request, unpublish_request};
use inline_guard_proto::csi::v1::ProbeRequest;
use inline_guard_proto::csi::v1::identity_client::IdentityClient;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use sharedresource_csi_driver::content::external::exec::ExecProviders;
use sharedresource_csi_driver::content::external::lazy_only::LazyOnlySource;
use sharedresource_csi_driver::content::external::provider::ExecProvider;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::test_util::client::unix_channel;

const HANDOVERS: usize = 5;
/// How long the reader reads before the first handover, between two, and after the last.
const STEADY: Duration = Duration::from_secs(2);

/// One driver on its own thread and runtime, until stopped (its SIGTERM).
struct Driver {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Driver {
    fn start(root: &Path, provider: &ExecProvider, helpers: &tokio::runtime::Handle) -> Driver {
        let mut plugin = Plugin::in_directory(root, root.join("csi.sock"));
        plugin.config.health_address = None;
        plugin.config.refresh_seconds = 3600;
        let providers = BTreeMap::from([("bench".to_string(), provider.clone())]);
        let providers = ExecProviders::new(providers, 4);
        plugin.content = Arc::new(LazyOnlySource { providers, provider: "bench".into(), runtime: helpers.clone() });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime
                .block_on(plugin.run(async {
                    let _ = stopped.await;
                }))
                .map_err(|error| error.to_string())
        });
        Driver { stop, thread }
    }

    fn stop(self) -> Result<(), String> {
        let _ = self.stop.send(());
        self.thread.join().map_err(|_| "a driver's thread panicked".to_string())?
    }
}

/// The identity of the file at `path`, once there is one.
/// With the time it was made: a socket bound where another was just removed often gets the
/// removed one's inode number (ext4 reuses it at once), so the number alone does not tell them
/// apart.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// One read: when it started and how long it took.
type Read = (Instant, Duration);

/// Reads `path` in a loop on CPU 1 (when pinned) until `stop`; every read, or the first error.
fn reader(path: PathBuf, pinned: bool, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Result<Vec<Read>, String>> {
    std::thread::spawn(move || {
        if pinned {
            pin_to(1)?;
        }
        let mut buffer = Vec::with_capacity(2 * FILE_BYTES);
        let mut reads = Vec::with_capacity(1 << 20);
        while !stop.load(Ordering::Relaxed) {
            buffer.clear();
            let started = Instant::now();
            std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut buffer))
                .map_err(|e| format!("read {} of {}: {e}", reads.len() + 1, path.display()))?;
            reads.push((started, started.elapsed()));
            if buffer.len() != FILE_BYTES {
                return Err(format!("read {} bytes of {}, expected {FILE_BYTES}", buffer.len(), path.display()));
            }
        }
        Ok(reads)
    })
}

/// Waits (a minute at most) for `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within a minute"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Count, p50, p99 and max of `reads`, in µs, as JSON and as a line.
fn summary(name: &str, reads: &mut [Duration]) -> (serde_json::Value, String) {
    reads.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if reads.is_empty() {
        return (serde_json::json!({"reads": 0}), format!("  {name}: no read"));
    }
    let (p50, p99, max) = (percentile(reads, 0.5), percentile(reads, 0.99), reads[reads.len() - 1]);
    (
        serde_json::json!({"reads": reads.len(), "p50_us": us(p50), "p99_us": us(p99), "max_us": us(max)}),
        format!("  {name}: {} reads, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs", reads.len(), us(p50), us(p99), us(max)),
    )
}

fn main() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("handover_read mounts FUSE: run it as root".into());
    }
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped()?;
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    let cores = online_cores();
    let pinned = cores >= 2;
    if pinned {
        // Before any thread starts: the drivers' and the helpers' threads stay on CPU 0.
        pin_to(0)?;
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path();
    std::fs::create_dir_all(root.join("shares")).map_err(|e| e.to_string())?;
    let provider = lazy_provider(root)?;
    let helpers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let kubelet = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let socket = root.join("csi.sock");
    let target = root.join("pods/uid-0/volumes/kubernetes.io~csi/v/mount");
    let context = [
        ("csi.storage.k8s.io/pod.name", "pod-0".to_string()),
        ("csi.storage.k8s.io/pod.namespace", "bench".to_string()),
        ("csi.storage.k8s.io/pod.uid", "uid-0".to_string()),
        ("csi.storage.k8s.io/serviceAccount.name", "reader".to_string()),
        ("provider", "bench".to_string()),
    ];
    let probe = |node_socket: PathBuf| {
        kubelet.block_on(async {
            let mut identity = IdentityClient::new(unix_channel(node_socket, Duration::from_secs(60)).await?);
            identity.probe(ProbeRequest {}).await.map(drop).map_err(|e| e.to_string())
        })
    };
    let publish = |node_socket: PathBuf| {
        kubelet.block_on(async {
            let mut node = NodeClient::new(unix_channel(node_socket, Duration::from_secs(60)).await?);
            node.node_publish_volume(publish_request(0, &target, &context)).await.map_err(|e| e.to_string())
        })
    };

    let offer = root.join("state").join(sharedresource_csi_driver::volume::lazy::handover::SOCKET_FILE);
    let mut driver = Driver::start(root, &provider, helpers.handle());
    publish(socket.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let reading = reader(target.join("s/f"), pinned, stop.clone());

    let mut windows = Vec::new();
    let mut outcome = Ok(());
    for _ in 0..HANDOVERS {
        std::thread::sleep(STEADY);
        // The CSI socket itself is handed over (the same listening socket, the same file), so
        // the successor is seen by its own handover offer, bound once it holds the node; the
        // predecessor accepts no more by then, so the Probe is the successor's answer.
        let before = identity(&offer);
        let started = Instant::now();
        let successor = Driver::start(root, &provider, helpers.handle());
        let placed = wait_until("the successor holding the node (its handover offer in place)", || {
            identity(&offer).is_some_and(|now| Some(now) != before)
        })
        .and_then(|()| probe(socket.clone()));
        // A successor that stopped says why (its run's error) rather than the wait's.
        let (placed, successor) = match (placed, successor.thread.is_finished()) {
            (Err(waited), true) => (Err(format!("{waited}; the successor stopped: {:?}", successor.stop())), None),
            (placed, _) => (placed, Some(successor)),
        };
        let Some(successor) = successor else {
            outcome = placed;
            break;
        };
        windows.push((started, Instant::now()));
        // The predecessor, handed over, is stopped as kubelet stops the old pod.
        let predecessor = std::mem::replace(&mut driver, successor);
        outcome = placed.and(predecessor.stop());
        if outcome.is_err() || reading.is_finished() {
            break;
        }
    }
    std::thread::sleep(STEADY);
    stop.store(true, Ordering::Relaxed);
    let reads = reading.join().map_err(|_| "the reader panicked".to_string())?;
    let unpublished = kubelet.block_on(async {
        let mut node = NodeClient::new(unix_channel(socket.clone(), Duration::from_secs(60)).await?);
        node.node_unpublish_volume(unpublish_request(0, &target)).await.map_err(|e| e.to_string())
    });
    let stopped = driver.stop();
    outcome?;
    let reads = reads?;
    unpublished?;
    stopped?;

    let (first, last) = (windows[0].0, windows[windows.len() - 1].1);
    let during = |(started, took): &Read| windows.iter().any(|(from, to)| *started <= *to && *started + *took >= *from);
    let mut phases: [Vec<Duration>; 3] = Default::default();
    for read in &reads {
        if during(read) {
            phases[1].push(read.1);
        } else if read.0 + read.1 < first {
            phases[0].push(read.1);
        } else if read.0 > last {
            phases[2].push(read.1);
        }
    }
    let handovers_ms: Vec<f64> = windows.iter().map(|(from, to)| (*to - *from).as_secs_f64() * 1e3).collect();
    let machine = format!(
        "{cores} cores; {}",
        if pinned { "drivers and helpers on CPU 0, reader on CPU 1" } else { "one core: nothing pinned" }
    );
    println!(
        "a lazy volume's cached {FILE_BYTES}-byte file read in a loop (open, read, close) across {} handovers, {} reads, none failed; {machine}",
        windows.len(),
        reads.len()
    );
    let mut results = serde_json::Map::new();
    for (name, phase) in ["before", "during", "after"].into_iter().zip(phases.iter_mut()) {
        let (value, line) = summary(name, phase);
        println!("{line}");
        results.insert(name.into(), value);
    }
    let longest = handovers_ms.iter().cloned().fold(0.0, f64::max);
    println!(
        "  each handover, the successor's start to its first answer: {handovers_ms:.1?} ms (longest {longest:.1} ms)"
    );
    if let Some(path) = json {
        results.insert("machine".into(), machine.into());
        results.insert("file_bytes".into(), FILE_BYTES.into());
        results.insert("handovers".into(), windows.len().into());
        results.insert("reads".into(), reads.len().into());
        results.insert("handover_ms".into(), serde_json::json!(handovers_ms));
        std::fs::write(&path, serde_json::to_vec_pretty(&results).map_err(|e| e.to_string())?)
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
