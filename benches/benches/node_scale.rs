//! The node's view at scale: one real kube-apiserver and etcd, and N driver instances in this
//! process, each acting as its own node (its own node name, state and kubelet directories, CSI
//! socket, apiserver client, watches and access checks, its own SharedResourceNode, as in a
//! cluster; volumes on a recording mounter, since mounts are not what is measured), each with 20
//! published volumes over 20 shares. The read-grants controller runs too, as its
//! ServiceAccount, with the access notices and their central answers. For each N:
//! - publish: 20 volumes per node, every node's at once, or with `--pods-per-second R` the
//!   cluster's pods arriving one after another at R a second (as a scheduler binds them);
//! - idle for `--idle-seconds` (300 by default), then what the apiserver keeps: its heap right
//!   after a forced collection and its goroutines' stacks;
//! - unrelated RoleBindings churned at 10 per second, in a namespace no volume uses;
//! - a tenant's 20 RoleBindings of 30 000 ServiceAccount subjects each, in that namespace: the
//!   growth of this process's memory (every driver and the access-notices controller);
//! - relevant RoleBindings churned at 1 per second, of the service account of half the volumes
//!   (granting what it has already, so the volumes stay);
//! - a share no volume reads edited at 10 per second: what the nodes are told of it;
//! - 100 updates of one shared Secret, each timed until every node's volume shows it;
//! - 20 edits of one share (retargeted to another Secret and back), each timed until every
//!   node's volume of it shows it;
//! - revocation, 5 rounds: the binding of that service account deleted, timed until each node's
//!   volume of it is emptied (and so until every node's), then made again.
//!
//! Before the nodes start, [`FLOOR_WATCHES`] plain watches of one Secret by name (kubelet's
//! kind) are opened and what the apiserver keeps for each is read: the floor a volume's watch
//! is compared with. With the nodes started and before any volume, what the apiserver keeps is
//! read again: a node's own cost, apart from its volumes'. The nodes' directories are a tmpfs
//! when run as root.
//!
//! Per phase: the apiserver's CPU seconds (its own `process_cpu_seconds_total`) and etcd's (its
//! CPU clock), the drivers' (this process's CPU clock: the N drivers and the load, which is
//! small), requests by verb and resource (the apiserver's `apiserver_request_total`: the
//! controller's writes to nodes are its PATCHes of `sharedresourcenodes`), and the watches open
//! by scope (`apiserver_longrunning_requests`: `cluster` for a kind cluster-wide, `resource` for
//! one object by name). The apiserver and etcd are pinned to CPU 0,
//! this process to CPU 1. Not a test: nothing fails on a number.
//!
//! `--baseline-nodes N` adds a run of N nodes whose controller does not answer the nodes' access
//! questions (each node asks its own after every notice: the design before the central answers),
//! side by side in the same report.
//!
//! `cargo bench -p inline-guard-benches --bench node_scale -- [--nodes 10,50,200]
//!  [--baseline-nodes 200] [--idle-seconds 300] [--churn-seconds 20] [--pods-per-second 0]
//!  [--json FILE]` (root not
//!  needed; Go for the peers). With `NODE_SCALE_HEAP_PROFILE=PREFIX`, the apiserver's heap
//!  profile at each look at what it keeps (after the forced collection) is written to
//!  `PREFIX-<when>`, for `go tool pprof -top -sample_index=inuse_space -diff_base A B`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use inline_guard_benches::apiserver_metrics::{self, Sample};
use inline_guard_benches::dir_changes::{Changed, DirChanges};
use inline_guard_benches::process_cpu::cpu_time;
use inline_guard_benches::shares_cluster::{self, DRIVER, DRIVER_GROUPS, pids_of, pin, post};
use inline_guard_benches::volume_requests::publish_request;
use inline_guard_benches::{option, percentile, resident_mb};
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_tests::cluster::Cluster;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use sharedresource_csi_driver::apiserver::client::ApiserverClients;
use sharedresource_csi_driver::content::KubernetesSource;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::test_util::client::unix_channel;
use sharedresource_csi_driver::volume::mounter::FakeMounter;

const VOLUMES_PER_NODE: usize = 20;
const SHARES: usize = 20;
const UPDATES: usize = 100;
const OWNER: &str = "scale-owner";
/// Half the volumes are of this namespace's `reader` (the one the churn and revocation concern),
/// half of [`OTHER`]'s.
const CONSUMER: &str = "scale-a";
const OTHER: &str = "scale-b";
/// Where the unrelated bindings churn: no volume's pod runs there.
const ELSEWHERE: &str = "scale-elsewhere";
const BINDING: &str = "reader-uses-all";
/// A tenant's bindings: how many, and how many subjects each.
const FAT_BINDINGS: usize = 20;
const FAT_SUBJECTS: usize = 30_000;
/// How long a change may take to reach every node before the run gives up.
const PATIENCE: Duration = Duration::from_secs(120);
/// How long a wait for the nodes' volumes goes without news from inotify before it looks at
/// every node still behind (a change inotify cannot tell, such as a file's content rewritten in
/// place, is still seen).
const LOOK_AGAIN: Duration = Duration::from_millis(100);

/// One simulated node: its directories and socket, and its driver's task.
struct SimNode {
    dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<Result<(), sharedresource_csi_driver::error::RunError>>,
    node: NodeClient<tonic::transport::Channel>,
}

/// Where the simulated nodes keep their directories: a tmpfs when run as root, as each of the
/// driver's volumes is a tmpfs on a node (on the disk, emptying a volume is the disk's work:
/// ext4's block and inode bookkeeping took most of a revocation's CPU in this process); the
/// disk otherwise, as the results say.
struct NodesDir {
    dir: tempfile::TempDir,
    tmpfs: bool,
}

impl NodesDir {
    fn new() -> Result<NodesDir, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("the nodes' directory: {e}"))?;
        let tmpfs = nix::unistd::geteuid().is_root()
            && std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "mode=0700", "inline-guard-bench-nodes"])
                .arg(dir.path())
                .status()
                .is_ok_and(|status| status.success());
        Ok(NodesDir { dir, tmpfs })
    }
}

impl Drop for NodesDir {
    fn drop(&mut self) {
        if self.tmpfs {
            // What a killed run leaves mounted, the next run's sweep unmounts (run_root).
            let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
        }
    }
}

fn target(node: &Path, volume: usize) -> PathBuf {
    node.join(format!("pods/uid-{volume}/volumes/kubernetes.io~csi/db/mount"))
}

async fn start_node(cluster: &Cluster, index: usize, within: &NodesDir) -> Result<SimNode, String> {
    let dir = tempfile::tempdir_in(within.dir.path()).map_err(|e| e.to_string())?;
    let socket = dir.path().join("csi.sock");
    let mut plugin = Plugin::in_directory(dir.path(), socket.clone());
    plugin.node_id = format!("sim-node-{index}");
    plugin.config.refresh_seconds = 60;
    plugin.mounter = Arc::new(FakeMounter::default());
    // Requests over HTTP/1.1, watches over HTTP/2, as the driver's binary has them.
    let config = cluster.config_as(DRIVER, &DRIVER_GROUPS).await?;
    let clients = ApiserverClients::new(config, sharedresource_csi_driver::apiserver::rate::RateLayer::shipped())
        .map_err(|e| e.to_string())?;
    // As the binary: its own node's view, through which grant changes arrive.
    let source = KubernetesSource::new(clients, tokio::runtime::Handle::current(), plugin.metrics.clone())
        .with_node(plugin.node_id.clone(), Default::default());
    plugin.content = Arc::new(source);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(plugin.run(async {
        let _ = stopped.await;
    }));
    let node = NodeClient::new(unix_channel(socket, Duration::from_secs(30)).await?);
    Ok(SimNode { dir, stop, running, node })
}

/// How long one volume's publish is tried again while the apiserver answers UNAVAILABLE.
const PUBLISH_PATIENCE: Duration = Duration::from_secs(600);
/// The longest wait between two tries (kubelet's own cap is about two minutes; shorter here, so
/// that a publish follows the apiserver's recovery closely).
const PUBLISH_BACKOFF_CAP: Duration = Duration::from_secs(16);

/// When pods arrive: all at once (`Pace::AtOnce`), or one after another across the cluster at
/// a rate (`Pace::PerSecond`), as a scheduler binds them: kube-scheduler's client is allowed 50
/// requests a second by default (`clientConnection.qps`), one binding each, so a cluster's new
/// pods reach their kubelets at about that pace however many nodes there are.
#[derive(Clone, Copy)]
enum Pace {
    AtOnce,
    PerSecond { rate: f64, since: Instant, nodes: usize },
}

impl Pace {
    /// Waits until the pod of `volume` on node `index` has arrived: the cluster's pods take
    /// turns node by node, every node's first pod before any node's second.
    async fn arrival(&self, index: usize, volume: usize) {
        if let Pace::PerSecond { rate, since, nodes } = *self {
            let turn = (volume * nodes + index) as f64;
            tokio::time::sleep_until((since + Duration::from_secs_f64(turn / rate)).into()).await;
        }
    }
}

/// Publishes every volume of `node` (node `index`), each when its pod arrives (`pace`); how
/// many publishes were retried.
async fn publish_all(node: &mut SimNode, index: usize, pace: Pace) -> Result<u64, String> {
    let mut retries = 0;
    for volume in 0..VOLUMES_PER_NODE {
        pace.arrival(index, volume).await;
        let namespace = if volume % 2 == 0 { CONSUMER } else { OTHER };
        let pod = [
            ("csi.storage.k8s.io/pod.name", format!("pod-{volume}")),
            ("csi.storage.k8s.io/pod.namespace", namespace.to_string()),
            ("csi.storage.k8s.io/pod.uid", format!("uid-{volume}")),
            ("csi.storage.k8s.io/serviceAccount.name", "reader".to_string()),
            ("sharedSecret", format!("share-{}", volume % SHARES)),
        ];
        let request = publish_request(volume, &target(node.dir.path(), volume), &pod);
        // As kubelet does: UNAVAILABLE (the apiserver's 429 when its priority and fairness
        // queues are full, a grant not landed yet) is tried again, with backoff doubling to a
        // cap, for as long as kubelet would keep the pod waiting here (it never gives up; this
        // gives up after PUBLISH_PATIENCE, so a run that cannot finish says so).
        let mut wait = Duration::from_millis(100);
        let first = Instant::now();
        loop {
            match node.node.node_publish_volume(request.clone()).await {
                Ok(_) => break,
                Err(status) if status.code() == tonic::Code::Unavailable && first.elapsed() < PUBLISH_PATIENCE => {
                    retries += 1;
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(PUBLISH_BACKOFF_CAP);
                }
                Err(status) => return Err(format!("publish: {status}")),
            }
        }
    }
    Ok(retries)
}

/// What the apiserver, etcd and this process had used at one moment.
struct Reading {
    at: Instant,
    samples: Vec<Sample>,
    etcd: Duration,
    ours: Duration,
}

async fn read(admin: &kube::Client, etcd: &[u32]) -> Result<Reading, String> {
    let request = hyper::Request::get("/metrics").body(Vec::new()).map_err(|e| e.to_string())?;
    let text = admin.request_text(request).await.map_err(|e| format!("GET /metrics: {e}"))?;
    let etcd = etcd.iter().map(|pid| cpu_time(*pid).unwrap_or_default()).sum();
    Ok(Reading {
        at: Instant::now(),
        samples: apiserver_metrics::parse(&text),
        etcd,
        ours: cpu_time(std::process::id())?,
    })
}

const REQUESTS: &str = "apiserver_request_total";

/// What the apiserver keeps, in MB, right after a collection (forced through its profiling
/// endpoint, which the suites' clusters serve): its live objects, the heap's spans that hold
/// them (live objects and the free slots between them, which a burst of writes leaves behind),
/// and its goroutines' stacks (about three per watch). The resident set and the heap between
/// collections also hold garbage the collector has not reached yet, which grows with the write
/// rate, not with what is kept.
struct Kept {
    live_mb: f64,
    heap_mb: f64,
    stacks_mb: f64,
}

impl Kept {
    /// Held: the heap's spans in use and the stacks.
    fn mb(&self) -> f64 {
        self.heap_mb + self.stacks_mb
    }

    /// Live: the objects and the stacks.
    fn live_mb(&self) -> f64 {
        self.live_mb + self.stacks_mb
    }
}

async fn kept(admin: &kube::Client, when: &str) -> Result<Kept, String> {
    let collect = hyper::Request::get("/debug/pprof/heap?gc=1&debug=1").body(Vec::new()).map_err(|e| e.to_string())?;
    let profile = admin.request_text(collect).await.map_err(|e| format!("GET /debug/pprof/heap?gc=1&debug=1: {e}"))?;
    // Kept for `go tool pprof` when asked: what the kept memory is made of, at each look.
    if let Ok(prefix) = std::env::var("NODE_SCALE_HEAP_PROFILE") {
        let path = format!("{prefix}-{when}");
        std::fs::write(&path, profile).map_err(|e| format!("writing {path}: {e}"))?;
    }
    let request = hyper::Request::get("/metrics").body(Vec::new()).map_err(|e| e.to_string())?;
    let samples =
        apiserver_metrics::parse(&admin.request_text(request).await.map_err(|e| format!("GET /metrics: {e}"))?);
    Ok(Kept {
        live_mb: apiserver_metrics::sum(&samples, "go_memstats_heap_alloc_bytes", &[]) / 1e6,
        heap_mb: apiserver_metrics::sum(&samples, "go_memstats_heap_inuse_bytes", &[]) / 1e6,
        stacks_mb: apiserver_metrics::sum(&samples, "go_memstats_stack_inuse_bytes", &[]) / 1e6,
    })
}

/// How many plain watches of one Secret by name the floor opens: what kubelet opens for each
/// Secret its pods mount, and the driver for each object its volumes show.
const FLOOR_WATCHES: usize = 200;

/// What one watch of one Secret by name costs the apiserver to keep (held, live), in kB: [`FLOOR_WATCHES`]
/// of them opened on the driver's identity and HTTP/2 connections (as kubelet's client carries
/// its own), with no driver running, the kept memory read before and after.
async fn kept_per_named_watch(admin: &kube::Client, cluster: &Cluster) -> Result<(f64, f64), String> {
    let config = cluster.config_as(DRIVER, &DRIVER_GROUPS).await?;
    let connections = sharedresource_csi_driver::apiserver::client::WatchConnections::new(
        config,
        sharedresource_csi_driver::apiserver::rate::RateLayer::shipped(),
    )
    .map_err(|e| e.to_string())?;
    let before = kept(admin, "before-the-watches-alone").await?;
    let mut open = Vec::with_capacity(FLOOR_WATCHES);
    for watch in 0..FLOOR_WATCHES {
        let lease = connections.lease(1).map_err(|e| e.to_string())?;
        let secrets = Api::<Secret>::namespaced(lease.client.clone(), OWNER);
        let by_name = kube::api::WatchParams::default().fields(&format!("metadata.name=secret-{}", watch % SHARES));
        // Answered once the apiserver has started the watch; held (not read) until dropped.
        let events = secrets.watch(&by_name, "0").await.map_err(|e| format!("watch: {e}"))?.boxed();
        open.push((lease, events));
    }
    let opened = kept(admin, "the-watches-alone").await?;
    drop(open);
    let per_watch = |kept: fn(&Kept) -> f64| (kept(&opened) - kept(&before)) * 1e3 / FLOOR_WATCHES as f64;
    Ok((per_watch(Kept::mb), per_watch(Kept::live_mb)))
}

/// What a phase cost, from the readings at its start and end.
fn cost(before: &Reading, after: &Reading) -> Value {
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    let cpu = |r: &Reading| apiserver_metrics::sum(&r.samples, "process_cpu_seconds_total", &[]);
    let requests = apiserver_metrics::grown(
        &apiserver_metrics::by(&before.samples, REQUESTS, &["verb", "resource"]),
        &apiserver_metrics::by(&after.samples, REQUESTS, &["verb", "resource"]),
    );
    let reviews = requests.get("POST subjectaccessreviews").copied().unwrap_or(0.0);
    json!({
        "seconds": seconds,
        "apiserver_cpu_s": cpu(after) - cpu(before),
        "etcd_cpu_s": (after.etcd.saturating_sub(before.etcd)).as_secs_f64(),
        "drivers_cpu_s": (after.ours.saturating_sub(before.ours)).as_secs_f64(),
        "access_reviews": reviews,
        "requests": requests,
    })
}

fn binding(name: &str, namespace: &str, account: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-all"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    })
}

/// Creates binding `k` and deletes binding `k - 1` of `account` in `namespace`, every `every`,
/// for `seconds`.
async fn churn(
    admin: &kube::Client,
    namespace: &str,
    account: &str,
    every: Duration,
    seconds: u64,
) -> Result<u64, String> {
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), namespace);
    let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings");
    let mut ticker = tokio::time::interval(every);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut changes = 0;
    let mut k = 0u64;
    while Instant::now() < end {
        ticker.tick().await;
        post(admin, &path, binding(&format!("churn-{k}"), namespace, account)).await?;
        changes += 1;
        if k > 0 {
            bindings.delete(&format!("churn-{}", k - 1), &DeleteParams::default()).await.map_err(|e| e.to_string())?;
            changes += 1;
        }
        k += 1;
    }
    if k > 0 {
        bindings.delete(&format!("churn-{}", k - 1), &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        changes += 1;
    }
    Ok(changes)
}

/// A tenant's RoleBindings in [`ELSEWHERE`]: [`FAT_BINDINGS`] of [`FAT_SUBJECTS`]
/// ServiceAccount subjects each (each about 1.1 MiB in etcd), to an empty Role, as request
/// bodies: made before this process's memory is read, so the load's own allocations are not
/// counted as the drivers' or the controller's.
fn fat_bindings() -> Vec<Vec<u8>> {
    (0..FAT_BINDINGS)
        .map(|index| {
            let subjects: Vec<Value> = (0..FAT_SUBJECTS)
                .map(|j| json!({"kind": "ServiceAccount", "name": format!("s{index}-{j}"), "namespace": ELSEWHERE}))
                .collect();
            serde_json::to_vec(&json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": format!("fat-{index}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "empty"},
                "subjects": subjects
            }))
            .unwrap_or_default()
        })
        .collect()
}

/// Makes the tenant's empty Role and `bindings` to it; how many subjects.
async fn make_fat_bindings(admin: &kube::Client, bindings: &[Vec<u8>]) -> Result<usize, String> {
    let roles = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ELSEWHERE}/roles");
    post(admin, &roles, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "empty"}, "rules": []}))
        .await?;
    let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ELSEWHERE}/rolebindings");
    for body in bindings {
        let request = hyper::Request::post(&path)
            .header("content-type", "application/json")
            .body(body.clone())
            .map_err(|e| e.to_string())?;
        // The answer (the binding again) is not kept: the bytes only.
        admin.request_text(request).await.map(drop).map_err(|e| format!("POST {path}: {e}"))?;
    }
    Ok(bindings.len() * FAT_SUBJECTS)
}

const SHARES_PATH: &str = "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets";
/// The Secret share-0 is retargeted to, and its password.
const ALT_SECRET: &str = "secret-alt";
const ALT_PASSWORD: &str = "alt";
/// A share no volume reads (of [`ALT_SECRET`]), edited while the nodes are counted.
const UNREAD_SHARE: &str = "share-unread";
/// How many times share-0 is retargeted (there and back counts two), and how many revocations.
const RETARGETS: usize = 20;
const REVOCATIONS: usize = 5;

/// The p50, p99 and longest of `delays`, in milliseconds.
fn spread(mut delays: Vec<Duration>) -> Value {
    delays.sort_unstable();
    let ms = |p: f64| percentile(&delays, p).as_secs_f64() * 1e3;
    json!({"p50": ms(0.5), "p99": ms(0.99), "max": ms(1.0)})
}

/// SharedSecret `name` of Secret `secret` in [`OWNER`].
fn shared_secret(name: &str, secret: &str) -> Value {
    json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": name},
        "spec": {"secretRef": {"namespace": OWNER, "name": secret}}
    })
}

/// Edits the description of share [`UNREAD_SHARE`] every `every` for `seconds`; how many edits.
async fn edit_unread_share(admin: &kube::Client, every: Duration, seconds: u64) -> Result<u64, String> {
    let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &shared_secrets());
    let mut ticker = tokio::time::interval(every);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut edits = 0;
    while Instant::now() < end {
        ticker.tick().await;
        let patch = Patch::Merge(json!({"spec": {"description": format!("edit {edits}")}}));
        shares.patch(UNREAD_SHARE, &PatchParams::default(), &patch).await.map_err(|e| e.to_string())?;
        edits += 1;
    }
    Ok(edits)
}

fn shared_secrets() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("sharedresource.inlineguard.dev", "v1alpha1", "SharedSecret"),
        "sharedsecrets",
    )
}

/// The watches open of each scope: `cluster` (a kind cluster-wide), `namespace` (a namespace's),
/// `resource` (one object by name).
fn watches_by_scope(reading: &Reading) -> Value {
    let of = |scope: &str| {
        apiserver_metrics::sum(
            &reading.samples,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("scope", scope)],
        )
    };
    json!({"cluster": of("cluster"), "namespace": of("namespace"), "resource": of("resource")})
}

/// The watches of one object by name open, by resource (`secrets`, `leases`,
/// `sharedresourcenodes`, ...).
fn named_watches_by_resource(reading: &Reading) -> Value {
    let named: Vec<Sample> = reading
        .samples
        .iter()
        .filter(|s| {
            s.name == "apiserver_longrunning_requests"
                && s.labels.get("verb").is_some_and(|verb| verb == "WATCH")
                && s.labels.get("scope").is_some_and(|scope| scope == "resource")
        })
        .cloned()
        .collect();
    json!(apiserver_metrics::by(&named, "apiserver_longrunning_requests", &["resource"]))
}

/// Waits until `done` holds for volume 0 (CONSUMER's reader, share-0) of every node; how long.
async fn until_every_node(nodes: &[SimNode], what: &str, done: impl Fn(&Path) -> bool) -> Result<Duration, String> {
    let each = until_each_node(nodes, what, done).await?;
    Ok(each.into_iter().max().unwrap_or_default())
}

/// Waits until `done` holds for volume 0 (CONSUMER's reader, share-0) of every node; how long
/// each node took. A node is looked at once at the start, then when inotify tells its volume's
/// directory changed, and every node still behind at each [`LOOK_AGAIN`] without news: the
/// looks cost the core the simulated drivers share next to nothing while they work (looking at
/// every node every 2 ms was a fifth of its CPU samples at 200 nodes).
async fn until_each_node(nodes: &[SimNode], what: &str, done: impl Fn(&Path) -> bool) -> Result<Vec<Duration>, String> {
    let started = Instant::now();
    let targets: Vec<PathBuf> = nodes.iter().map(|node| target(node.dir.path(), 0)).collect();
    // Watched before the first look: a change between the two is seen by the look or told.
    let mut changes = DirChanges::watch(targets.iter().map(PathBuf::as_path))?;
    let mut took: Vec<Option<Duration>> = vec![None; nodes.len()];
    let look = |index: usize, took: &mut Vec<Option<Duration>>| {
        if took[index].is_none() && done(&targets[index]) {
            took[index] = Some(started.elapsed());
        }
    };
    let mut changed = Changed::Any;
    loop {
        match changed {
            Changed::Any => (0..targets.len()).for_each(|index| look(index, &mut took)),
            Changed::Some(indices) => indices.into_iter().for_each(|index| look(index, &mut took)),
        }
        let behind = took.iter().filter(|took| took.is_none()).count();
        if behind == 0 {
            return Ok(took.into_iter().flatten().collect());
        }
        if started.elapsed() > PATIENCE {
            return Err(format!("{what}: {behind} of {} nodes not there after {PATIENCE:?}", nodes.len()));
        }
        changed = changes.next(LOOK_AGAIN).await?;
    }
}

async fn set_up(admin: &kube::Client, cluster: &Cluster, answers: bool) -> Result<tokio::task::JoinHandle<()>, String> {
    let controller = shares_cluster::install_driver_answering(cluster, admin, answers).await?;
    for namespace in [OWNER, CONSUMER, OTHER, ELSEWHERE] {
        post(
            admin,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .await?;
    }
    for share in 0..SHARES {
        post(
            admin,
            &format!("/api/v1/namespaces/{OWNER}/secrets"),
            json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("secret-{share}")},
                "stringData": {"password": "x".repeat(32), "user": "app", "url": "postgres://db:5432/app"}
            }),
        )
        .await?;
        post(admin, SHARES_PATH, shared_secret(&format!("share-{share}"), &format!("secret-{share}"))).await?;
    }
    // The Secret share-0 is retargeted to and back, and the share naming it that no volume reads
    // (so the read-grants controller grants it to the driver before any retargeting).
    post(
        admin,
        &format!("/api/v1/namespaces/{OWNER}/secrets"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ALT_SECRET}, "stringData": {"password": ALT_PASSWORD}}),
    )
    .await?;
    post(admin, SHARES_PATH, shared_secret(UNREAD_SHARE, ALT_SECRET)).await?;
    for namespace in [CONSUMER, OTHER, ELSEWHERE] {
        post(admin, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"), json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-all"},
            "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "verbs": ["use"]}]
        }))
        .await?;
    }
    for namespace in [CONSUMER, OTHER] {
        let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings");
        post(admin, &path, binding(BINDING, namespace, "reader")).await?;
    }
    let driver = cluster.client_as(DRIVER, &DRIVER_GROUPS).await?;
    shares_cluster::wait_readable(&driver, OWNER, &format!("secret-{}", SHARES - 1)).await?;
    Ok(controller)
}

/// At most this share of a core, used by this process and by the apiserver over a
/// [`QUIET_FOR`], is a settled cluster (idle, 200 nodes use about 5 % each).
const QUIET_SHARE: f64 = 0.10;
/// How long the quiet must last.
const QUIET_FOR: Duration = Duration::from_millis(500);
/// The longest wait for quiet: past it, the round starts anyway (the wait is reported).
const SETTLE_AT_MOST: Duration = Duration::from_secs(30);

/// Waits until this process (the drivers and the controller) and the apiserver (`apiserver`'s
/// pids) each used at most [`QUIET_SHARE`] of a core over [`QUIET_FOR`]; how long that took. A
/// revocation round starts from a settled cluster: right after the grant made again, the nodes
/// may still open their Secrets' watches again and the controller still write their statuses,
/// which a round timed then would count as the revocation's.
async fn settled(apiserver: &[u32]) -> Result<Duration, String> {
    let started = Instant::now();
    let used = || -> Result<(Duration, Duration), String> {
        let theirs = apiserver.iter().map(|pid| cpu_time(*pid)).sum::<Result<Duration, String>>()?;
        Ok((cpu_time(std::process::id())?, theirs))
    };
    let mut before = used()?;
    loop {
        tokio::time::sleep(QUIET_FOR).await;
        let now = used()?;
        let share = |then: Duration, now: Duration| now.saturating_sub(then).as_secs_f64() / QUIET_FOR.as_secs_f64();
        let quiet = share(before.0, now.0) <= QUIET_SHARE && share(before.1, now.1) <= QUIET_SHARE;
        if quiet || started.elapsed() >= SETTLE_AT_MOST {
            return Ok(started.elapsed());
        }
        before = now;
    }
}

/// Says on stderr which phase a run with `count` nodes is in (the whole bench takes most of an
/// hour; a profiler can also be started on a phase's line).
fn progress(count: usize, phase: &str) {
    eprintln!("node_scale: {count} nodes: {phase}");
}

/// One run with `count` nodes, the controller answering the nodes' access questions or not
/// (`answers`).
async fn run(
    count: usize,
    idle: u64,
    churn_seconds: u64,
    answers: bool,
    pods_per_second: f64,
) -> Result<Value, String> {
    let peers = inline_guard_tests::peers::peers()?;
    let cluster = Cluster::start(&peers).await?;
    let placement = pin(&[peers.kube_apiserver.as_path(), peers.etcd.as_path()]);
    let etcd = pids_of(&[peers.etcd.as_path()]);
    let admin = cluster.client().await?;
    let _controller = set_up(&admin, &cluster, answers).await?;
    progress(count, "a watch by name, alone");
    let per_named_watch_kb = kept_per_named_watch(&admin, &cluster).await?;
    progress(count, "starting the nodes");
    let memory_before = resident_mb();
    let within = NodesDir::new()?;
    let mut nodes = Vec::with_capacity(count);
    for index in 0..count {
        nodes.push(start_node(&cluster, index, &within).await?);
    }
    // Each node's own watches are open before a volume is published: what a node costs the
    // apiserver before its volumes do.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kept_without_volumes = kept(&admin, &format!("{count}-nodes-without-volumes")).await?;
    let mut phases = BTreeMap::new();

    progress(count, "publishing");
    let start = read(&admin, &etcd).await?;
    let published = Instant::now();
    let pace = if pods_per_second > 0.0 {
        Pace::PerSecond { rate: pods_per_second, since: published, nodes: count }
    } else {
        Pace::AtOnce
    };
    let publishes = nodes.iter_mut().enumerate().map(|(index, node)| publish_all(node, index, pace));
    let retries: u64 = futures_util::future::try_join_all(publishes).await?.into_iter().sum();
    let publish_seconds = published.elapsed().as_secs_f64();
    let after_publish = read(&admin, &etcd).await?;
    let mut phase = cost(&start, &after_publish);
    phase["publishes_retried"] = json!(retries);
    phase["answered_429"] = json!(
        apiserver_metrics::sum(&after_publish.samples, REQUESTS, &[("code", "429")])
            - apiserver_metrics::sum(&start.samples, REQUESTS, &[("code", "429")])
    );
    phases.insert("publish", phase);
    let memory = resident_mb();

    progress(count, "idle");
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let retained = kept(&admin, &format!("{count}-nodes-idle")).await?;
    let after_idle = read(&admin, &etcd).await?;
    phases.insert("idle", cost(&after_publish, &after_idle));
    let watches = apiserver_metrics::sum(&after_idle.samples, "apiserver_longrunning_requests", &[("verb", "WATCH")]);
    let watch_scopes = watches_by_scope(&after_idle);
    let named_watches = named_watches_by_resource(&after_idle);

    progress(count, "bindings churned where no node serves, a share no node reads edited");
    let unrelated = churn(&admin, ELSEWHERE, "bystander", Duration::from_millis(100), churn_seconds).await?;
    let after_unrelated = read(&admin, &etcd).await?;
    let mut phase = cost(&after_idle, &after_unrelated);
    phase["binding_changes"] = json!(unrelated);
    phases.insert("unrelated_bindings", phase);

    let edits = edit_unread_share(&admin, Duration::from_millis(100), churn_seconds).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_unread = read(&admin, &etcd).await?;
    let mut phase = cost(&after_unrelated, &after_unread);
    phase["share_edits"] = json!(edits);
    phases.insert("unread_share_edits", phase);

    progress(count, "a tenant's bindings");
    let bodies = fat_bindings();
    let memory_before_tenant = resident_mb();
    let before_tenant = Instant::now();
    let tenant_subjects = make_fat_bindings(&admin, &bodies).await?;
    // The notices of the tenant's namespace (which no node serves) are gathered and dropped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_tenant = read(&admin, &etcd).await?;
    let mut phase = cost(&after_unread, &after_tenant);
    phase["subjects"] = json!(tenant_subjects);
    phase["made_seconds"] = json!(before_tenant.elapsed().as_secs_f64());
    phase["drivers_and_controller_rss_growth_mb"] = json!(resident_mb() - memory_before_tenant);
    drop(bodies);
    phases.insert("tenant_fat_bindings", phase);

    progress(count, "relevant bindings churned, Secret updates, share edits");
    let relevant = churn(&admin, CONSUMER, "reader", Duration::from_secs(1), churn_seconds).await?;
    // The last looks (2 s after the last change) belong to this phase.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_relevant = read(&admin, &etcd).await?;
    let mut phase = cost(&after_tenant, &after_relevant);
    phase["binding_changes"] = json!(relevant);
    phases.insert("relevant_bindings", phase);

    let secrets = Api::<Secret>::namespaced(admin.clone(), OWNER);
    let mut delays = Vec::with_capacity(UPDATES);
    for update in 0..UPDATES {
        let value = format!("user-{update}");
        let patch = Patch::Merge(json!({"stringData": {"user": value}}));
        secrets.patch("secret-0", &PatchParams::default(), &patch).await.map_err(|e| e.to_string())?;
        let seen = |mount: &Path| std::fs::read_to_string(mount.join("user")).is_ok_and(|v| v == value);
        delays.push(until_every_node(&nodes, "a Secret update", seen).await?);
    }
    let after_updates = read(&admin, &etcd).await?;
    let mut phase = cost(&after_relevant, &after_updates);
    phase["to_every_node_ms"] = spread(delays);
    phases.insert("secret_updates", phase);

    // share-0 retargeted to another Secret and back: until every node's volume of it shows it.
    let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &shared_secrets());
    let mut delays = Vec::with_capacity(RETARGETS);
    for retarget in 0..RETARGETS {
        let (secret, password) = if retarget % 2 == 0 {
            (ALT_SECRET.to_string(), ALT_PASSWORD.to_string())
        } else {
            ("secret-0".into(), "x".repeat(32))
        };
        let patch = Patch::Merge(json!({"spec": {"secretRef": {"namespace": OWNER, "name": secret}}}));
        shares.patch("share-0", &PatchParams::default(), &patch).await.map_err(|e| e.to_string())?;
        let seen = |mount: &Path| std::fs::read_to_string(mount.join("password")).is_ok_and(|v| v == password);
        delays.push(until_every_node(&nodes, "a share's edit", seen).await?);
    }
    let after_retargets = read(&admin, &etcd).await?;
    let mut phase = cost(&after_updates, &after_retargets);
    phase["to_every_node_ms"] = spread(delays);
    phases.insert("share_edits", phase);

    // The binding of half the volumes' account deleted, until every node's volume 0 is emptied;
    // made again, until every one shows its files.
    progress(count, "revocations");
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), CONSUMER);
    let mut revocations = Vec::with_capacity(REVOCATIONS);
    let mut each_node = Vec::with_capacity(REVOCATIONS * count);
    let mut before_round = after_retargets;
    let apiserver = pids_of(&[peers.kube_apiserver.as_path()]);
    let mut settling = Vec::with_capacity(REVOCATIONS);
    for round in 0..REVOCATIONS {
        settling.push(settled(&apiserver).await?);
        bindings.delete(BINDING, &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        let each = until_each_node(&nodes, "a revocation", |mount| !mount.join("password").exists()).await?;
        revocations.push(each.iter().max().copied().unwrap_or_default());
        each_node.extend(each);
        let after_revocation = read(&admin, &etcd).await?;
        if round == 0 {
            phases.insert("revocation", cost(&before_round, &after_revocation));
        }
        let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{CONSUMER}/rolebindings");
        post(&admin, &path, binding(BINDING, CONSUMER, "reader")).await?;
        until_every_node(&nodes, "a grant made again", |mount| mount.join("password").exists()).await?;
        before_round = read(&admin, &etcd).await?;
    }
    let after_revocation = before_round;
    revocations.sort_unstable();
    let ms = |p: f64| percentile(&revocations, p).as_secs_f64() * 1e3;
    if let Some(phase) = phases.get_mut("revocation") {
        phase["to_every_node_ms"] = json!({"p50": ms(0.5), "max": ms(1.0), "rounds": REVOCATIONS});
        // Each node's own delay, every round: what a node of a cluster sees, where the nodes'
        // work is not queued on one core.
        phase["to_each_node_ms"] = spread(each_node);
        phase["settled_before_ms"] = spread(settling);
    }

    let rss = apiserver_metrics::sum(&after_revocation.samples, "process_resident_memory_bytes", &[]) / 1e6;
    // The Go heap in use (live objects and what the collector has not returned yet): the
    // resident set less the runtime's slack.
    let heap = apiserver_metrics::sum(&after_revocation.samples, "go_memstats_heap_inuse_bytes", &[]) / 1e6;
    for node in nodes {
        let _ = node.stop.send(());
        let _ = node.running.await;
    }
    let directories = if within.tmpfs { "tmpfs" } else { "disk" };
    drop(within);
    let result = json!({
        "nodes": count, "volumes_per_node": VOLUMES_PER_NODE, "shares": SHARES, "apiserver": cluster.version,
        "placement": placement, "publish_seconds": publish_seconds, "pods_per_second": pods_per_second, "watches_open": watches, "watches_by_scope": watch_scopes, "named_watches_by_resource": named_watches,
        "apiserver_rss_mb": rss, "apiserver_heap_mb": heap, "apiserver_retained_mb": retained.mb(),
        "apiserver_retained_stacks_mb": retained.stacks_mb, "apiserver_retained_without_volumes_mb": kept_without_volumes.mb(),
        "apiserver_kept_per_named_watch_kb": per_named_watch_kb.0, "apiserver_live_per_named_watch_kb": per_named_watch_kb.1,
        "apiserver_live_mb": retained.live_mb(), "apiserver_live_without_volumes_mb": kept_without_volumes.live_mb(), "drivers_rss_mb": memory - memory_before, "phases": phases,
        "central_answers": answers, "nodes_directories": directories,
    });
    drop(cluster);
    Ok(result)
}

fn main() {
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped().expect("a run directory");
    sharedresource_csi_driver::program::raise_open_files_limit();
    let counts: String = option("--nodes").expect("--nodes").unwrap_or_else(|| "10,50,200".into());
    let idle: u64 = option("--idle-seconds").expect("--idle-seconds").unwrap_or(300);
    let churn_seconds: u64 = option("--churn-seconds").expect("--churn-seconds").unwrap_or(20);
    let baseline: Option<usize> = option("--baseline-nodes").expect("--baseline-nodes");
    // 0: every node's pods at once (the default); else the cluster's pods arrive at this rate.
    let pods_per_second: f64 = option("--pods-per-second").expect("--pods-per-second").unwrap_or(0.0);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut runs = Vec::new();
    let counts =
        counts.split(',').map(|count| (count.trim().parse().expect("--nodes: numbers separated by commas"), true));
    for (count, answers) in counts.chain(baseline.map(|count| (count, false))) {
        let result = runtime
            .block_on(run(count, idle, churn_seconds, answers, pods_per_second))
            .unwrap_or_else(|e| panic!("{count} nodes (central answers: {answers}): {e}"));
        println!("{}", serde_json::to_string_pretty(&result).unwrap());
        runs.push(result);
    }
    if let Some(path) = option::<String>("--json").expect("--json") {
        let all = json!({"idle_seconds": idle, "churn_seconds": churn_seconds, "runs": runs});
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap()).expect("writing the results");
    }
}
