//! Providers of secrets kept outside Kubernetes, published through the CSI socket with real
//! tmpfs mounts and the access check against a real kube-apiserver, the driver in this process
//! as its ServiceAccount with the shipped RBAC, beside a SharedSecret's publish in the same run
//! (the floor: the same access check, the same mount and writer, content from the cluster):
//! - `exec`, eager: 10 files from a helper taking 5 ms per call (target: < 80 ms; the calls
//!   run `helperConcurrency` = 4 at once);
//! - `secrets-store`: 10 objects of 1 KiB from the e2e provider built on the upstream driver's
//!   provider API module, on its unix socket (target: p99 < 20 ms).
//!
//! Helpers are started as the driver's program starts them: through this program, behind the
//! helpers' seccomp filter. The apiserver, etcd and the provider run on CPU 0, this process on CPU 1. Needs root (mounts)
//! and Go (the peers). Not a test: nothing fails on a number.
//!
//! `cargo bench -p inline-guard-benches --bench providers_latency [-- --json FILE]`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inline_guard_benches::percentile;
use inline_guard_benches::shares_cluster::{self, DRIVER, DRIVER_GROUPS, pin};
use inline_guard_benches::volume_requests::{publish_request, unpublish_request};
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_tests::cluster::{ChildProcess, Cluster};
use serde_json::json;
use sharedresource_csi_driver::apiserver::client::ApiserverClients;
use sharedresource_csi_driver::content::KubernetesSource;
use sharedresource_csi_driver::content::external::helper_confinement;
use sharedresource_csi_driver::content::external::provider::{ProviderConfig, check_providers};
use sharedresource_csi_driver::content::external::providers::Providers;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::test_util::client::unix_channel;

/// Publishes of each kind, in alternating rounds.
const PUBLISHES: usize = 300;
const ROUNDS: usize = 3;
const FILES: usize = 10;

/// A helper serving `FILES` files, each `get` taking 5 ms (and a process start).
const SLOW_HELPER: &str = r#"#!/bin/sh
case "$1" in
mount) echo '{"enable-dirs": ["s"], "mount-param": [], "files": {"s": ["f0","f1","f2","f3","f4","f5","f6","f7","f8","f9"]}}' ;;
get) sleep 0.005; echo "content of $2" ;;
*) exit 1 ;;
esac
"#;

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The attributes of a volume of each kind.
fn attributes(kind: &str) -> (&'static str, String) {
    match kind {
        "share" => ("sharedSecret", "bench-share".into()),
        "exec" => ("provider", "slow-helper".into()),
        _ => ("provider", "e2e".into()),
    }
}

fn context(index: usize, kind: &str) -> Vec<(&'static str, String)> {
    let mut context = vec![
        ("csi.storage.k8s.io/pod.name", format!("pod-{index}")),
        ("csi.storage.k8s.io/pod.namespace", "bench-consumer".to_string()),
        ("csi.storage.k8s.io/pod.uid", format!("uid-{index}")),
        ("csi.storage.k8s.io/serviceAccount.name", "reader".to_string()),
        attributes(kind),
    ];
    if kind == "secrets-store" {
        let objects: String = (0..FILES).map(|i| format!("  - |\n    objectName: object-{i}\n")).collect();
        context.push(("objects", format!("array:\n{objects}")));
    }
    context
}

async fn post(admin: &kube::Client, path: &str, object: serde_json::Value) {
    shares_cluster::post(admin, path, object).await.unwrap();
}

/// The share, the grant of every share and provider to `reader`, and the driver's read grant.
async fn set_up(cluster: &Cluster, admin: &kube::Client) {
    for namespace in ["bench-owner", "bench-consumer"] {
        post(
            admin,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .await;
    }
    let data: serde_json::Map<String, serde_json::Value> =
        (0..FILES).map(|i| (format!("key-{i}"), json!("x".repeat(1024)))).collect();
    post(
        admin,
        "/api/v1/namespaces/bench-owner/secrets",
        json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bench-secret"}, "stringData": data
        }),
    )
    .await;
    post(admin, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
        "metadata": {"name": "bench-share"}, "spec": {"secretRef": {"namespace": "bench-owner", "name": "bench-secret"}}
    }))
    .await;
    post(admin, "/apis/rbac.authorization.k8s.io/v1/namespaces/bench-consumer/roles", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-all"},
        "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets", "providers"], "verbs": ["use"]}]
    }))
    .await;
    post(admin, "/apis/rbac.authorization.k8s.io/v1/namespaces/bench-consumer/rolebindings", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader-uses-all"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-all"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "bench-consumer"}]
    }))
    .await;
    let driver = cluster.client_as(DRIVER, &DRIVER_GROUPS).await.unwrap();
    shares_cluster::wait_readable(&driver, "bench-owner", "bench-secret").await.unwrap();
}

/// The helper and the provider's objects under `dir`, and the provider started; the providers'
/// configuration.
fn providers(dir: &Path, provider: &Path) -> (ChildProcess, Providers) {
    let helper = dir.join("slow-helper");
    std::fs::write(&helper, SLOW_HELPER).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let objects = dir.join("objects");
    std::fs::create_dir_all(&objects).unwrap();
    for i in 0..FILES {
        std::fs::write(objects.join(format!("object-{i}")), vec![b'x'; 1024]).unwrap();
    }
    let socket = dir.join("e2e.sock");
    let arguments = [("--socket", &socket), ("--objects", &objects), ("--log", &dir.join("mounts.log"))]
        .map(|(flag, path)| format!("{flag}={}", path.display()));
    let process = ChildProcess::spawn("e2e-provider", provider, &arguments, &[], dir).unwrap();
    let configured: Vec<ProviderConfig> = serde_json::from_value(json!([
        // As root: the helper lives in the run's private directory, which `nobody` cannot enter.
        {"name": "slow-helper", "kind": "exec", "helper": helper, "timeout": "10s", "runAsUser": 0, "runAsGroup": 0},
        {"name": "e2e", "kind": "secrets-store", "socket": socket, "timeout": "10s"},
    ]))
    .unwrap();
    (process, Providers::new(check_providers(&configured).unwrap(), 4))
}

fn main() {
    // The helper's calls are started as the driver's program starts them: through the program
    // itself (here this one), behind the helpers' seccomp filter, the launcher's exec included.
    helper_confinement::launch_if_asked();
    helper_confinement::confine_helpers_through_this_program();
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped().expect("a run directory");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let peers = inline_guard_tests::peers::peers().expect("the peers (Go on PATH)");
    runtime.block_on(async {
        let cluster = Cluster::start(&peers).await.expect("the control plane");
        let admin = cluster.client().await.unwrap();
        let _read_grants = shares_cluster::install_driver(&cluster, &admin).await.unwrap();
        set_up(&cluster, &admin).await;
        let dir = tempfile::tempdir().unwrap();
        let (_provider, providers) = providers(dir.path(), &peers.secrets_store_provider);
        let pinned =
            pin(&[peers.kube_apiserver.as_path(), peers.etcd.as_path(), peers.secrets_store_provider.as_path()]);
        let socket = dir.path().join("csi.sock");
        let mut plugin = Plugin::in_directory(dir.path(), socket.clone());
        plugin.config.refresh_seconds = 3600;
        let clients = ApiserverClients::new(
            cluster.config_as(DRIVER, &DRIVER_GROUPS).await.unwrap(),
            sharedresource_csi_driver::apiserver::rate::RateLayer::shipped(),
        )
        .unwrap();
        let source = KubernetesSource::new(clients, tokio::runtime::Handle::current(), plugin.metrics.clone());
        plugin.content = Arc::new(source.with_providers(providers));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        let mut node = NodeClient::new(unix_channel(socket.clone(), Duration::from_secs(10)).await.unwrap());

        let kinds = ["share", "exec", "secrets-store"];
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
        let mut index = 0;
        for _ in 0..ROUNDS {
            for (k, kind) in kinds.iter().enumerate() {
                let first = index;
                for _ in 0..PUBLISHES / ROUNDS {
                    let target = volume_target(dir.path(), index);
                    let started = Instant::now();
                    node.node_publish_volume(publish_request(index, &target, &context(index, kind))).await.expect(kind);
                    times[k].push(started.elapsed());
                    index += 1;
                }
                // Unpublished before the next kind: each measures against the same number of
                // volumes on the node.
                for volume in first..index {
                    node.node_unpublish_volume(unpublish_request(volume, &volume_target(dir.path(), volume)))
                        .await
                        .unwrap();
                }
            }
        }
        let _ = stop.send(());
        running.await.unwrap().unwrap();

        println!(
            "kube-apiserver {} on this machine; driver in-process as its ServiceAccount; {pinned}",
            cluster.version
        );
        let mut results = serde_json::Map::new();
        for (kind, times) in kinds.iter().zip(times.iter_mut()) {
            times.sort_unstable();
            let (p50, p99) = (percentile(times, 0.5), percentile(times, 0.99));
            println!(
                "NodePublishVolume, {kind:>13}, {FILES} files, {} publishes: p50 {}  p99 {}  max {}",
                times.len(),
                ms(p50),
                ms(p99),
                ms(times[times.len() - 1])
            );
            results.insert(
                kind.to_string(),
                json!({"p50_ms": p50.as_secs_f64() * 1e3, "p99_ms": p99.as_secs_f64() * 1e3}),
            );
        }
        let ratio =
            |kind: usize| percentile(&times[kind], 0.5).as_secs_f64() / percentile(&times[0], 0.5).as_secs_f64();
        println!("p50 over the share's: exec {:.2}x, secrets-store {:.2}x", ratio(1), ratio(2));
        if let Some(path) = std::env::args().skip_while(|a| a != "--json").nth(1) {
            results.insert("placement".into(), json!(pinned));
            results.insert("apiserver".into(), json!(cluster.version));
            results.insert("publishes".into(), json!(PUBLISHES));
            results.insert("files".into(), json!(FILES));
            std::fs::write(&path, serde_json::to_vec_pretty(&results).unwrap()).expect("writing the results");
        }
        drop(cluster);
    });
}

fn volume_target(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("pods/uid-{index}/volumes/kubernetes.io~csi/v/mount"))
}
