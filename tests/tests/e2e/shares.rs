//! Shares on the real apiserver: the shipped CRDs and driver RBAC applied as written, the driver
//! (Kubernetes source) running as its ServiceAccount with real tmpfs mounts on a real socket, and
//! NodePublishVolume built from stored pods as `kubelet_publish` builds it. Each step asserts the
//! files a container would see, and every change arrives through the driver's watches (its
//! periodic refresh is an hour away).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inline_guard_proto::csi::v1::NodeUnpublishVolumeRequest;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_tests::apply::{apply, objects};
use inline_guard_tests::repo_root;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sharedresource_csi_driver::content::KubernetesSource;
use sharedresource_csi_driver::content::cluster::NoticeSettings;
use sharedresource_csi_driver::content::external::providers::Providers;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::volume::refresh::pod_event_sink::ApiserverPodEvents;
use tonic::Code;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::support::{
    Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_namespace, create_service_account, pods_path,
    wait_established,
};

/// The driver's identity in `config/deploy/driver/rbac.yaml`.
pub const DRIVER_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-csi-driver";
/// How long a change may take to reach the files. The periodic refresh is set to an hour, so
/// only the watches can deliver a change in time. A watch delivers within milliseconds (the
/// scenarios print how long); the bound is wide so that a busy machine cannot fail them.
pub const WITHIN: Duration = Duration::from_secs(60);

pub async fn apply_file(suite: &Suite, file: &str) -> Outcome {
    apply(&suite.admin, &objects(&repo_root().join(file))?, false).await.map(drop)
}

/// Creates the SharedSecret `name` sharing Secret `namespace/secret`.
pub async fn create_shared_secret(suite: &Suite, name: &str, namespace: &str, secret: &str) -> Outcome {
    let share = json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
        "metadata": {"name": name}, "spec": {"secretRef": {"namespace": namespace, "name": secret}}
    });
    create_object(suite, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", share).await
}

pub async fn create_object(suite: &Suite, path: &str, object: Value) -> Outcome {
    let answer = create(&suite.admin, path, &object, false).await?;
    if answer.status != 201 {
        return Err(format!("POST {path}: {} {}", answer.status, answer.message()));
    }
    Ok(())
}

fn grant(namespace: &str) -> (Value, Value) {
    use_grant(namespace, "sharedsecrets", "db", ("use-db", "reader-uses-db"))
}

/// A Role granting `use` of `resource` named `name` in `namespace`, and its binding to the
/// namespace's `reader` account; `(role, binding)` name the two objects.
pub fn use_grant(namespace: &str, resource: &str, name: &str, (role, binding): (&str, &str)) -> (Value, Value) {
    let role_object = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": role, "namespace": namespace},
        "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": [resource], "resourceNames": [name], "verbs": ["use"]}]
    });
    let binding_object = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": binding, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]
    });
    (role_object, binding_object)
}

/// Creates [`use_grant`]'s Role and RoleBinding, named `use-NAME` and `reader-uses-NAME`.
pub async fn create_use_grant(suite: &Suite, namespace: &str, resource: &str, name: &str) -> Outcome {
    let (role, binding) =
        use_grant(namespace, resource, name, (&format!("use-{name}"), &format!("reader-uses-{name}")));
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"), role).await?;
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"), binding)
        .await
}

fn share(name: &str) -> Value {
    json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
        "metadata": {"name": name},
        "spec": {"secretRef": {"namespace": "shares-owner", "name": "db-creds"}, "description": "the app's database"}
    })
}

/// A pod of account `reader` named `name`, with a volume `db` of SharedSecret `share`.
pub fn pod_mounting_share(name: &str, share: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "serviceAccountName": "reader",
            "containers": [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": [{"name": "db", "mountPath": "/db"}]}],
            "volumes": [{"name": "db", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {"sharedSecret": share}}}]
        }
    })
}

/// The driver in process, as its ServiceAccount with the shipped RBAC, reading the cluster
/// (Kubernetes source) with real tmpfs mounts under a temp dir; its periodic refresh is an hour
/// away, so only its watches can deliver a change within a scenario.
pub struct InProcessDriver {
    /// kubelet's root and the driver's state: targets are `dir/pods/...`.
    pub dir: tempfile::TempDir,
    /// The CSI socket.
    pub socket: std::path::PathBuf,
    /// What the driver counts.
    pub metrics: std::sync::Arc<sharedresource_csi_driver::metrics::Metrics>,
    /// Its node's name (one of its own: each node has its own `SharedResourceNode`, and two
    /// drivers of one name would write over each other's view).
    pub node: String,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<sharedresource_csi_driver::error::Result<()>>,
}

impl InProcessDriver {
    pub async fn start(suite: &Suite) -> Result<InProcessDriver, String> {
        InProcessDriver::start_with(suite, Providers::default()).await
    }

    /// [`InProcessDriver::start`], serving volumes that name one of `providers` too.
    pub async fn start_with(suite: &Suite, providers: Providers) -> Result<InProcessDriver, String> {
        InProcessDriver::start_refreshing(suite, providers, 3600).await
    }

    /// [`InProcessDriver::start_with`], refreshing every volume every `refresh_seconds`.
    pub async fn start_refreshing(
        suite: &Suite,
        providers: Providers,
        refresh_seconds: u64,
    ) -> Result<InProcessDriver, String> {
        let plugin = |dir: &Path, socket: PathBuf| {
            let mut plugin = Plugin::in_directory(dir, socket);
            plugin.config.refresh_seconds = refresh_seconds;
            plugin
        };
        InProcessDriver::start_plugin(suite, providers, (in_process_node(), Default::default()), plugin).await
    }

    /// [`InProcessDriver::start`] as node `node`, hearing of grant changes as `notices` says.
    pub async fn start_hearing(suite: &Suite, node: &str, notices: NoticeSettings) -> Result<InProcessDriver, String> {
        let plugin = |dir: &Path, socket: PathBuf| {
            let mut plugin = Plugin::in_directory(dir, socket);
            plugin.config.refresh_seconds = 3600;
            plugin
        };
        InProcessDriver::start_plugin(suite, Providers::default(), (node.to_string(), notices), plugin).await
    }

    /// [`InProcessDriver::start`] with volumes of `tmpfs_size` bytes, telling pods of their
    /// volumes' content in Events, as the shipped driver does.
    pub async fn start_telling_events(suite: &Suite, tmpfs_size: u64) -> Result<InProcessDriver, String> {
        let client = driver_client(suite).await?;
        let node = in_process_node();
        let events_node = node.clone();
        let plugin = move |dir: &Path, socket: PathBuf| {
            let mut plugin = Plugin::in_directory(dir, socket);
            plugin.config.tmpfs_size = tmpfs_size;
            let timeout = Duration::from_secs(10);
            let events = ApiserverPodEvents::new(client, tokio::runtime::Handle::current(), &events_node, timeout);
            plugin.events = std::sync::Arc::new(events);
            plugin
        };
        InProcessDriver::start_plugin(suite, Providers::default(), (node, Default::default()), plugin).await
    }

    /// The driver `plugin` makes for a directory and socket, reading the cluster.
    async fn start_plugin(
        suite: &Suite,
        providers: Providers,
        (node, notices): (String, NoticeSettings),
        plugin: impl FnOnce(&Path, PathBuf) -> Plugin,
    ) -> Result<InProcessDriver, String> {
        let client = driver_client(suite).await?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let socket = dir.path().join("csi.sock");
        let mut plugin = plugin(dir.path(), socket.clone());
        let metrics = plugin.metrics.clone();
        // It reads pods, as the suite's node does: the projection scenarios show pod labels.
        let source = KubernetesSource::new(client, tokio::runtime::Handle::current(), metrics.clone());
        let source = source.with_pod_metadata(true).with_providers(providers).with_node(node.clone(), notices);
        plugin.content = std::sync::Arc::new(source);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        Ok(InProcessDriver { dir, socket, metrics, node, stop, running })
    }

    /// Stops the driver and unmounts whatever is still mounted under its directory; an error if
    /// the driver failed, or if a volume was left mounted (a scenario unpublishes what it
    /// published, as kubelet does).
    pub async fn stop(self) -> Outcome {
        let _ = self.stop.send(());
        let stopped = self.running.await.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string()));
        let left = inline_guard_tests::run_root::mounts_under(self.dir.path());
        for point in &left {
            let _ = std::process::Command::new("umount").arg("-l").arg(point).output();
        }
        stopped?;
        if left.is_empty() { Ok(()) } else { Err(format!("the scenario left these mounted (now unmounted): {left:?}")) }
    }
}

/// A node name no other in-process driver of this run has: `in-process-<n>`.
fn in_process_node() -> String {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("in-process-{}", STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// A client acting as the driver's ServiceAccount, with its groups (RBAC decides what it may do).
pub async fn driver_client(suite: &Suite) -> Result<kube::Client, String> {
    let groups = ["system:serviceaccounts", "system:serviceaccounts:inline-guard-driver", "system:authenticated"];
    suite.cluster.client_as(DRIVER_USER, &groups).await
}

/// NodeUnpublishVolume retried on ABORTED (a refresh of the volume is under way), as kubelet
/// retries it.
pub async fn unpublish_as_kubelet(
    node: &mut NodeClient<tonic::transport::Channel>,
    volume_id: String,
    target_path: String,
) -> Outcome {
    let deadline = Instant::now() + WITHIN;
    loop {
        let request = NodeUnpublishVolumeRequest { volume_id: volume_id.clone(), target_path: target_path.clone() };
        match node.node_unpublish_volume(request).await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == Code::Aborted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => return Err(format!("unpublish: {status}")),
        }
    }
}

/// The SharedSecret resource, for dynamic calls.
pub fn shared_secrets() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("sharedresource.inlineguard.dev", "v1alpha1", "SharedSecret"),
        "sharedsecrets",
    )
}

/// Waits until SharedSecret `name` reports `wanted` (type, status) conditions.
pub async fn wait_for_conditions(admin: &kube::Client, name: &str, wanted: &[(&str, &str)]) -> Outcome {
    let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &shared_secrets());
    let deadline = Instant::now() + WITHIN;
    loop {
        let share = shares.get(name).await.map_err(|e| e.to_string())?;
        let conditions: Vec<(String, String)> = share.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["type"].as_str().unwrap_or_default().to_string(),
                    c["status"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        if wanted.iter().all(|(kind, status)| conditions.iter().any(|(k, s)| k == kind && s == status)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("SharedSecret {name} reports {conditions:?}, expected {wanted:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The files of a volume (or a directory of it), as a container would list them (user-visible
/// names only).
pub fn files(target: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(target)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with(".."))
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read_to_string(e.path()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Whether `target` is a mount point in this namespace and a directory that can be listed.
pub fn still_mounted(target: &Path) -> bool {
    sharedresource_csi_driver::volume::mounter::listed_in_mountinfo(target).unwrap_or(false)
        && std::fs::read_dir(target).is_ok()
}

/// Waits until `target` is mounted, readable and `view` of it equals `expected` ("emptied" is
/// mounted, readable and empty: an unmounted or vanished volume shows nothing either); returns
/// how long that took. `shown` turns a view into the failure's words.
pub async fn wait_for_view<T: PartialEq>(
    target: &Path,
    what: &str,
    view: impl Fn(&Path) -> T,
    expected: &T,
    shown: impl Fn(&T) -> String,
) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let seen = view(target);
        let present = still_mounted(target);
        if present && seen == *expected {
            return Ok(started.elapsed());
        }
        if started.elapsed() > WITHIN {
            return Err(format!(
                "{what}: the volume holds {} (mounted and readable: {present}), expected {} within {WITHIN:?}",
                shown(&seen),
                shown(expected)
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn wait_for_files(target: &Path, what: &str, expected: &[(&str, &str)]) -> Outcome {
    let expected: Vec<(String, String)> = expected.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    wait_for_view(target, what, files, &expected, |files| format!("{files:?}")).await.map(drop)
}

/// The driver's SubjectAccessReviews so far, whatever their answer.
fn access_checks(metrics: &sharedresource_csi_driver::metrics::Metrics) -> u64 {
    metrics
        .encode()
        .lines()
        .filter(|line| line.starts_with("sharedresource_csi_driver_access_checks_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits until the driver has made no access check for 3 s (the last look at a grant comes
/// 2.25 s after it), and returns the count. A wait before a step, never the proof of a count.
pub async fn settled_access_checks(metrics: &sharedresource_csi_driver::metrics::Metrics) -> Result<u64, String> {
    let deadline = Instant::now() + WITHIN;
    let mut count = access_checks(metrics);
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_secs(3) {
        if Instant::now() > deadline {
            return Err(format!("the driver kept making access checks for {WITHIN:?}: {count}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = access_checks(metrics);
        if now != count {
            (count, since) = (now, Instant::now());
        }
    }
    Ok(count)
}

/// The users the driver's SubjectAccessReviews asked about, in the apiserver's audit log, in
/// its order.
fn reviewed_users(suite: &Suite) -> Result<Vec<String>, String> {
    Ok(suite
        .cluster
        .audit_events()?
        .iter()
        .filter(|e| e.acting_user() == DRIVER_USER)
        .filter_map(|e| e.access_review_user().map(str::to_string))
        .collect())
}

/// The SubjectAccessReviews the driver has sent about the published volume's account, as the
/// apiserver's audit log records them.
fn reviews_by_the_driver(suite: &Suite) -> Result<usize, String> {
    Ok(reviewed_users(suite)?.iter().filter(|user| *user == READER_USER).count())
}

/// The SubjectAccessReviews the access-notices controller has sent about the published volume's
/// account (the central answers), as the apiserver's audit log records them.
fn reviews_by_the_controller(suite: &Suite) -> Result<usize, String> {
    Ok(suite
        .cluster
        .audit_events()?
        .iter()
        .filter(|e| e.acting_user() == crate::support::READ_GRANTS_USER)
        .filter(|e| e.access_review_user() == Some(READER_USER))
        .count())
}

const READER_USER: &str = "system:serviceaccount:shares-consumer:reader";
/// The namespaces of `access_updates_revocation_and_deletion_reach_the_files`, whose accounts
/// only its driver asks about.
const SCENARIO_NAMESPACES: [&str; 3] = ["shares-owner", "shares-consumer", "shares-stranger"];

/// A RoleBinding of `namespace` named `name`, granting Role `use-db` to `subjects`.
fn use_db_binding(namespace: &str, name: &str, subjects: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-db"},
        "subjects": subjects
    })
}

fn service_account(namespace: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": namespace})
}

fn role_bindings_path(namespace: &str) -> String {
    format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings")
}

/// Grant changes that cannot concern this node's volumes cost the node nothing: a RoleBinding of
/// a namespace it serves no volume in, a ClusterRoleBinding to a ClusterRole that cannot grant
/// `use`, and such a ClusterRole. The access-notices controller writes this node's
/// `SharedResourceNode` for none of them (its writes counted in the apiserver's audit log, not
/// by the controller) and the driver asks nothing about any account. The positive control comes
/// after them on the RoleBindings' stream (delivered in order): a binding in the namespace the
/// node serves is one write, and the volumes there are looked at again.
///
/// The node's view first: it lists the one namespace of its live volumes (the refused stranger's
/// namespace, noted at its publish, is forgotten after two looks at the live volumes). Other
/// scenarios run meanwhile, and a ClusterRole one of them makes that can grant `use` is told to
/// every node: a measurement during which every namespace was told of a change is made again,
/// up to three times (the three changes here, were they told to every node, would move it each
/// time).
async fn binding_changes_elsewhere_cost_this_node_nothing(
    suite: &Suite,
    node_name: &str,
    metrics: &sharedresource_csi_driver::metrics::Metrics,
) -> Outcome {
    let nodes = Api::<sharedresource_api::node_view::SharedResourceNode>::all(suite.admin.clone());
    let mut stranger_seen = false;
    let deadline = Instant::now() + WITHIN;
    loop {
        let node = nodes.get_opt(node_name).await.map_err(|e| e.to_string())?;
        let told = |n: &sharedresource_api::node_view::SharedResourceNode| {
            n.status.as_ref().and_then(|status| status.of("shares-consumer")).is_some()
        };
        // Only the namespace it serves in the status too: the refused stranger's entry, if it was
        // told, is dropped by a write of its own.
        let entries = |n: &sharedresource_api::node_view::SharedResourceNode| {
            n.status.as_ref().map_or(0, |status| status.namespaces.len())
        };
        // The stranger's namespace is listed (its refused publish was noted before access was
        // asked) until two looks at the live volumes miss it: seen first, then gone.
        let listed_stranger = |n: &sharedresource_api::node_view::SharedResourceNode| {
            n.spec.namespaces.iter().any(|namespace| namespace == "shares-stranger")
        };
        stranger_seen |= node.as_ref().is_some_and(listed_stranger);
        if stranger_seen
            && node.is_some_and(|n| n.spec.namespaces == ["shares-consumer"] && told(&n) && entries(&n) == 1)
        {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "SharedResourceNode {node_name} did not list shares-stranger and then shares-consumer alone, told, within {WITHIN:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut made = Vec::new();
    let mut outcome = Err("no measurement was made".to_string());
    for attempt in 0..3 {
        match elsewhere_once(suite, node_name, metrics, attempt, &mut made).await {
            Ok(Some(report)) => {
                println!("shares: {report}");
                outcome = Ok(());
                break;
            }
            Ok(None) => {
                outcome = Err("every namespace was told of a grant change during each of 3 measurements".into());
            }
            Err(error) => {
                outcome = Err(error);
                break;
            }
        }
    }
    for path in made {
        let request = http::Request::delete(path).body(Vec::new()).map_err(|e| e.to_string())?;
        let _ = suite.admin.request_text(request).await;
    }
    outcome
}

/// One measurement of [`binding_changes_elsewhere_cost_this_node_nothing`], its objects named for
/// `attempt` and their paths added to `made`: `None` when every namespace was told of a change
/// meanwhile, else what it saw.
async fn elsewhere_once(
    suite: &Suite,
    node_name: &str,
    metrics: &sharedresource_csi_driver::metrics::Metrics,
    attempt: usize,
    made: &mut Vec<String>,
) -> Result<Option<String>, String> {
    let nodes = Api::<sharedresource_api::node_view::SharedResourceNode>::all(suite.admin.clone());
    let status = |n: sharedresource_api::node_view::SharedResourceNode| n.status.unwrap_or_default();
    let before = status(nodes.get(node_name).await.map_err(|e| e.to_string())?);
    let checks_before = settled_access_checks(metrics).await?;
    let writes_before = notice_writes(suite, node_name)?;
    let answered_before = reviews_by_the_controller(suite)?;

    let stranger = format!("stranger-uses-db-{attempt}");
    create_object(
        suite,
        &role_bindings_path("shares-stranger"),
        use_db_binding("shares-stranger", &stranger, json!([service_account("shares-stranger", "reader")])),
    )
    .await?;
    made.push(format!("{}/{stranger}", role_bindings_path("shares-stranger")));
    let reads_only = format!("shares-e2e-reads-only-{attempt}");
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/clusterroles", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": reads_only},
        "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "verbs": ["get"]}]
    }))
    .await?;
    made.push(format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{reads_only}"));
    let views = format!("shares-e2e-other-views-{attempt}");
    create_object(
        suite,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": views},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reads_only},
            "subjects": [service_account("shares-consumer", "reader")]
        }),
    )
    .await?;
    made.push(format!("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{views}"));

    // The positive control: a binding in the namespace the node serves.
    let other = format!("other-uses-db-{attempt}");
    create_object(
        suite,
        &role_bindings_path("shares-consumer"),
        use_db_binding("shares-consumer", &other, json!([service_account("shares-consumer", "other")])),
    )
    .await?;
    made.push(format!("{}/{other}", role_bindings_path("shares-consumer")));
    let deadline = Instant::now() + WITHIN;
    while status(nodes.get(node_name).await.map_err(|e| e.to_string())?).of("shares-consumer")
        == before.of("shares-consumer")
    {
        if Instant::now() > deadline {
            return Err(format!("a binding in shares-consumer was not told to node {node_name} within {WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checks_after = settled_access_checks(metrics).await?;
    let after = status(nodes.get(node_name).await.map_err(|e| e.to_string())?);
    let writes = notice_writes(suite, node_name)? - writes_before;
    if after.every_namespace != before.every_namespace {
        return Ok(None);
    }
    if writes != 1 {
        return Err(format!(
            "the node serving only shares-consumer was written {writes} times for three grant changes elsewhere and one in shares-consumer; expected 1 (status before {before:?}, after {after:?})\n{}",
            suite.read_grants.log_tail(30)
        ));
    }
    // The positive control's cost: the controller asked the volume's question again, once for
    // every node, and the node took its answer, asking nothing.
    let answered = reviews_by_the_controller(suite)? - answered_before;
    if answered == 0 || after.namespaces.iter().any(|entry| entry.namespace == "shares-consumer" && !entry.answered) {
        return Err(format!(
            "the binding in the node's own namespace was not answered by the controller ({answered} reviews of the volume's account; status {after:?})"
        ));
    }
    if checks_after != checks_before {
        return Err(format!(
            "the binding in the node's own namespace made the driver ask {} access checks; the controller answered them",
            checks_after - checks_before
        ));
    }
    Ok(Some(format!(
        "three grant changes elsewhere wrote nothing to the node; the binding in its namespace one write, {answered} reviews by the controller and none by the driver"
    )))
}

/// The writes of the access-notices controller to node `node`'s object so far, as the
/// apiserver's audit log records them.
pub fn notice_writes(suite: &Suite, node: &str) -> Result<usize, String> {
    let path = format!("/apis/sharedresource.inlineguard.dev/v1alpha1/sharedresourcenodes/{node}/status");
    Ok(suite
        .cluster
        .audit_events()?
        .iter()
        // The whole path: `in-process-2` is a prefix of `in-process-21`.
        .filter(|e| e.request_uri.split('?').next() == Some(path.as_str()))
        .filter(|e| e.stage == "ResponseComplete" && e.verb == "patch")
        .filter(|e| e.acting_user() == crate::support::READ_GRANTS_USER)
        .count())
}

/// A binding of the volume's own service account is answered by the access-notices controller
/// (the positive control of the count above: it asks, once for every node), and the driver asks
/// nothing: its own count and the apiserver's audit log of its reviews both stay put.
async fn a_binding_of_the_volumes_account_is_answered_by_the_controller(
    suite: &Suite,
    metrics: &sharedresource_csi_driver::metrics::Metrics,
) -> Outcome {
    let before = settled_access_checks(metrics).await?;
    let (reviews_before, answered_before) = (reviews_by_the_driver(suite)?, reviews_by_the_controller(suite)?);
    let binding =
        use_db_binding("shares-consumer", "reader-also-uses-db", json!([service_account("shares-consumer", "reader")]));
    create_object(suite, &role_bindings_path("shares-consumer"), binding).await?;
    let deadline = Instant::now() + WITHIN;
    while reviews_by_the_controller(suite)? == answered_before {
        if Instant::now() > deadline {
            return Err(format!(
                "the controller asked nothing about the volume's account within {WITHIN:?} of its binding\n{}",
                suite.read_grants.log_tail(30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let relevant = settled_access_checks(metrics).await?;
    let reviews_relevant = reviews_by_the_driver(suite)?;
    if relevant != before || reviews_relevant != reviews_before {
        return Err(format!(
            "the driver counts {} access checks for its account's binding, the audit log {} of its SubjectAccessReviews; the controller answers them",
            relevant - before,
            reviews_relevant - reviews_before
        ));
    }
    let answered = reviews_by_the_controller(suite)? - answered_before;
    Api::<RoleBinding>::namespaced(suite.admin.clone(), "shares-consumer")
        .delete("reader-also-uses-db", &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    println!("shares: the volume's own account's binding cost the controller {answered} reviews and the driver none");
    Ok(())
}

pub async fn access_updates_revocation_and_deletion_reach_the_files(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/crds.yaml").await?;
    wait_established(&suite.admin, "sharedsecrets.sharedresource.inlineguard.dev").await?;
    apply_file(suite, "config/deploy/driver/rbac.yaml").await?;
    for namespace in SCENARIO_NAMESPACES {
        create_namespace(admin, namespace, "none", &[]).await?;
        create_service_account(admin, namespace, "reader").await?;
    }
    create_object(
        suite,
        "/api/v1/namespaces/shares-owner/secrets",
        json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-creds"},
            "stringData": {"password": "s3cret", "user": "app"}
        }),
    )
    .await?;
    create_object(suite, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", share("db")).await?;
    let (role, binding) = grant("shares-consumer");
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/namespaces/shares-consumer/roles", role).await?;
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/namespaces/shares-consumer/rolebindings", binding.clone())
        .await?;
    let mut stored = Vec::new();
    for (namespace, pod) in [
        ("shares-consumer", pod_mounting_share("reader", "db")),
        ("shares-stranger", pod_mounting_share("reader", "db")),
        ("shares-consumer", pod_mounting_share("lost", "nope")),
    ] {
        let answer = create(admin, &pods_path(namespace), &pod, false).await?;
        if answer.status != 201 {
            return Err(format!("creating a pod in {namespace}: {} {}", answer.status, answer.message()));
        }
        stored.push(serde_json::from_value::<Pod>(answer.body).map_err(|e| e.to_string())?);
    }

    // The driver as its ServiceAccount, with the shipped RBAC; no periodic refresh in the
    // scenario's lifetime: every change must arrive through a watch or a notice.
    let driver = InProcessDriver::start(suite).await?;
    let (dir, metrics) = (&driver.dir, driver.metrics.clone());
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);

    let result = async {
        let target = dir.path().join("pods/reader/volumes/kubernetes.io~csi/db/mount");
        let request = kubelet_request(&stored[0], "db", &target)?;
        publish_as_kubelet(&mut node, &request).await.map_err(|e| format!("publish allowed by the RoleBinding: {e}"))?;
        wait_for_files(&target, "published", &[("password", "s3cret"), ("user", "app")]).await?;

        // Without a binding in its namespace: PERMISSION_DENIED naming share, namespace, account.
        let stranger = dir.path().join("pods/stranger/volumes/kubernetes.io~csi/db/mount");
        let denied = node.node_publish_volume(kubelet_request(&stored[1], "db", &stranger)?).await.err().ok_or("a pod without access was published")?;
        let expected = "service account shares-stranger/reader may not use SharedSecret \"db\": grant it the verb \"use\" on sharedsecrets.sharedresource.inlineguard.dev \"db\" (a Role and RoleBinding in namespace shares-stranger)";
        if denied.code() != Code::PermissionDenied || denied.message() != expected {
            return Err(format!("expected PERMISSION_DENIED {expected:?}, got {denied:?}"));
        }
        if stranger.exists() {
            return Err("a refused publish left its target".into());
        }
        // A share that does not exist: NOT_FOUND naming it.
        let lost = dir.path().join("pods/lost/volumes/kubernetes.io~csi/db/mount");
        let missing = node.node_publish_volume(kubelet_request(&stored[2], "db", &lost)?).await.err().ok_or("a missing share was published")?;
        if missing.code() != Code::NotFound || missing.message() != "SharedSecret \"nope\" not found" {
            return Err(format!("expected NOT_FOUND for the missing share, got {missing:?}"));
        }

        binding_changes_elsewhere_cost_this_node_nothing(suite, &driver.node, &metrics).await?;
        crate::share_notices::share_changes_elsewhere_cost_this_node_nothing(suite, &driver.node, "db").await?;
        a_binding_of_the_volumes_account_is_answered_by_the_controller(suite, &metrics).await?;

        // The Secret changes: a new password, a key removed.
        let secrets = Api::<Secret>::namespaced(admin.clone(), "shares-owner");
        let update = json!({"data": {"password": "cm90YXRlZA==", "user": null}});
        secrets.patch("db-creds", &PatchParams::default(), &Patch::Merge(&update)).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the Secret update", &[("password", "rotated")]).await?;
        wait_for_conditions(admin, "db", &[("BackingObjectExists", "True"), ("BackingObjectReadable", "True")]).await?;

        // The backing Secret deleted: the volume is emptied and the share says why; back: back.
        secrets.delete("db-creds", &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the Secret was deleted", &[]).await?;
        wait_for_conditions(admin, "db", &[("BackingObjectExists", "False"), ("BackingObjectReadable", "False")]).await?;
        create_object(suite, "/api/v1/namespaces/shares-owner/secrets", json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-creds"}, "stringData": {"password": "rotated"}
        }))
        .await?;
        wait_for_files(&target, "after the Secret came back", &[("password", "rotated")]).await?;
        wait_for_conditions(admin, "db", &[("BackingObjectExists", "True"), ("BackingObjectReadable", "True")]).await?;

        // Access revoked: the volume is emptied and stays mounted; granted again: content back.
        let bindings = Api::<RoleBinding>::namespaced(admin.clone(), "shares-consumer");
        bindings.delete("reader-uses-db", &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the RoleBinding was removed", &[]).await?;
        let binding: RoleBinding = serde_json::from_value(binding).map_err(|e| e.to_string())?;
        bindings.create(&PostParams::default(), &binding).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the RoleBinding came back", &[("password", "rotated")]).await?;
        // The Role edited (no binding changes): only the Role watch can tell, the periodic
        // refresh being an hour away, once the looks at the binding's return are over.
        settled_access_checks(&metrics).await?;
        let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), "shares-consumer");
        let verbs = |verbs: &[&str]| json!({"rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "resourceNames": ["db"], "verbs": verbs}]});
        roles.patch("use-db", &PatchParams::default(), &Patch::Merge(&verbs(&["get"]))).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the Role lost the verb", &[]).await?;
        roles.patch("use-db", &PatchParams::default(), &Patch::Merge(&verbs(&["use"]))).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the Role got the verb back", &[("password", "rotated")]).await?;

        // The share deleted: emptied; recreated: back.
        let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &shared_secrets());
        shares.delete("db", &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        wait_for_files(&target, "after the share was deleted", &[]).await?;
        create_object(suite, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets", share("db")).await?;
        wait_for_files(&target, "after the share was recreated", &[("password", "rotated")]).await?;

        // The share's gauges: its one volume, refreshed (the clock's own seconds, written every
        // few seconds), none stale.
        let labels = "{kind=\"SharedSecret\",namespace=\"\",name=\"db\"}";
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
        wait_for_metric(&metrics, &format!("sharedresource_csi_driver_share_volumes{labels}"), |n| n == 1.0).await?;
        let refreshed = format!("sharedresource_csi_driver_share_last_refresh_timestamp_seconds{labels}");
        wait_for_metric(&metrics, &refreshed, |at| at > 0.0 && at <= started.as_secs_f64() + 3600.0).await?;
        wait_for_metric(&metrics, &format!("sharedresource_csi_driver_share_stale_seconds{labels}"), |s| s == 0.0).await?;

        unpublish_as_kubelet(&mut node, request.volume_id, request.target_path).await?;
        if target.exists() {
            return Err("unpublish left the target".into());
        }
        // Unpublished: the share's series goes (seen above first).
        wait_for_metric_gone(&metrics, &format!("sharedresource_csi_driver_share_volumes{labels}")).await?;
        let counted = metrics.encode();
        for line in [
            // The reader's volume.
            "sharedresource_csi_driver_publishes_total{result=\"ok\"} 1",
            "sharedresource_csi_driver_publishes_total{result=\"permission_denied\"} 1",
            "sharedresource_csi_driver_publishes_total{result=\"not_found\"} 1",
            // The same two failures by their kind.
            "sharedresource_csi_driver_publish_errors_total{error_type=\"AccessDenied\"} 1",
            "sharedresource_csi_driver_publish_errors_total{error_type=\"ObjectNotFound\"} 1",
            "sharedresource_csi_driver_volumes_published 0",
        ] {
            if !counted.contains(line) {
                return Err(format!("the driver's metrics lack {line:?}:\n{counted}"));
            }
        }
        // Three withdrawals emptied the volume (binding, share, Secret); a watch event racing a
        // restoration may add one, so at least three.
        let revocations: u64 = counted
            .lines()
            .find_map(|l| l.strip_prefix("sharedresource_csi_driver_revocations_total "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        if revocations < 3 {
            return Err(format!("the driver counted {revocations} revocations, expected at least 3"));
        }
        // The driver listed and watched Secrets one by one (`fieldSelector=metadata.name=`,
        // which the audit log shows as the object's name), never a namespace's or all of them;
        // this share's among them. (Every driver of the suite acts as this identity; requests
        // RBAC refused are left out: `read_grants` probes what it may not do.)
        let reads: Vec<(String, String)> = suite
            .cluster
            .audit_events()?
            .into_iter()
            .filter(|e| e.acting_user() == DRIVER_USER && (e.verb == "watch" || e.verb == "list") && !e.forbidden())
            .filter_map(|e| e.object_ref.filter(|o| o.resource == "secrets").map(|o| (o.namespace, o.name)))
            .collect();
        let this_share = ("shares-owner".to_string(), "db-creds".to_string());
        if !reads.contains(&this_share) || reads.iter().any(|(_, name)| name.is_empty()) {
            return Err(format!("the driver listed or watched Secrets other than one by one: {reads:?}"));
        }
        println!("shares: published by RoleBinding, refused without ({expected}), updated, revoked and restored, deleted and restored");
        Ok(())
    }
    .await;
    // The scenario's failure first; a driver failure or a leftover mount otherwise.
    result.and(driver.stop().await)
}

/// The value of the series `series` (name and labels, as OpenMetrics writes them) in `metrics`.
pub fn metric(metrics: &sharedresource_csi_driver::metrics::Metrics, series: &str) -> Option<f64> {
    let text = metrics.encode();
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits (up to [`WITHIN`]) until series `series` has a value for which `wanted` holds; that
/// value.
pub async fn wait_for_metric(
    metrics: &sharedresource_csi_driver::metrics::Metrics,
    series: &str,
    wanted: impl Fn(f64) -> bool,
) -> Result<f64, String> {
    let deadline = Instant::now() + WITHIN;
    loop {
        match metric(metrics, series) {
            Some(value) if wanted(value) => return Ok(value),
            seen if Instant::now() > deadline => {
                return Err(format!("{series} is {seen:?}, never what was wanted:\n{}", metrics.encode()));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits (up to [`WITHIN`]) until series `series` is no longer written.
async fn wait_for_metric_gone(metrics: &sharedresource_csi_driver::metrics::Metrics, series: &str) -> Outcome {
    let deadline = Instant::now() + WITHIN;
    while metric(metrics, series).is_some() {
        if Instant::now() > deadline {
            return Err(format!("{series} is still written after its volume went"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `GET path` on a health port, the whole answer.
async fn health_get(address: std::net::SocketAddr, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tcp = loop {
        match tokio::net::TcpStream::connect(address).await {
            Ok(tcp) => break tcp,
            Err(error) if Instant::now() > deadline => return Err(format!("the health port {address}: {error}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.map_err(|e| e.to_string())?;
    Ok(answer)
}

/// The driver process SIGKILLed and restarted while a volume is published: the content stays,
/// refreshing resumes in the new process (a ConfigMap change still reaches the files), a Role
/// edit that withdraws access empties the volume (through the Role watch, or the periodic recheck
/// every 2 s), and giving it back restores
/// it when access comes back, and the unpublish leaves no mount or record. A SharedConfigMap.
pub async fn driver_killed_and_restarted_keeps_and_refreshes_the_volume(suite: &Suite) -> Outcome {
    use inline_guard_tests::node::plugin::PluginFiles;

    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/crds.yaml").await?;
    wait_established(&suite.admin, "sharedconfigmaps.sharedresource.inlineguard.dev").await?;
    apply_file(suite, "config/deploy/driver/rbac.yaml").await?;
    for namespace in ["restart-owner", "restart-consumer"] {
        create_namespace(admin, namespace, "none", &[]).await?;
        create_service_account(admin, namespace, "reader").await?;
    }
    create_object(
        suite,
        "/api/v1/namespaces/restart-owner/configmaps",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-settings"}, "data": {"mode": "fast"}
        }),
    )
    .await?;
    create_object(suite, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedconfigmaps", json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedConfigMap",
        "metadata": {"name": "settings"}, "spec": {"configMapRef": {"namespace": "restart-owner", "name": "app-settings"}}
    }))
    .await?;
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/namespaces/restart-consumer/roles", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-settings"},
        "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedconfigmaps"], "resourceNames": ["settings"], "verbs": ["use"]}]
    }))
    .await?;
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/namespaces/restart-consumer/rolebindings", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader-uses-settings"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-settings"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "restart-consumer"}]
    }))
    .await?;
    let mut pod = pod_mounting_share("reader", "unused");
    pod["spec"]["volumes"][0]["csi"]["volumeAttributes"] = json!({"sharedConfigMap": "settings"});
    let answer = create(admin, &pods_path("restart-consumer"), &pod, false).await?;
    if answer.status != 201 {
        return Err(format!("creating the pod: {} {}", answer.status, answer.message()));
    }
    let stored: Pod = serde_json::from_value(answer.body).map_err(|e| e.to_string())?;

    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let kubelet = dir.path().join("kubelet");
    std::fs::create_dir_all(&kubelet).map_err(|e| e.to_string())?;
    let health: std::net::SocketAddr =
        format!("127.0.0.1:{}", inline_guard_tests::cluster::free_port()?).parse().map_err(|e| format!("{e}"))?;
    let files_of = PluginFiles::kubernetes(
        &dir.path().join("driver"),
        &kubelet,
        &suite.cluster.kubeconfig_as(DRIVER_USER)?,
        2,
        health,
    )?;
    let mut driver = files_of.start(dir.path(), "driver")?;
    let target = kubelet.join("pods/reader/volumes/kubernetes.io~csi/db/mount");
    let request = kubelet_request(&stored, "db", &target)?;
    let mut node = NodeClient::new(channel(files_of.socket.clone()).await?);
    publish_as_kubelet(&mut node, &request).await.map_err(|e| format!("publish: {e}\n{}", driver.log_tail(20)))?;
    wait_for_files(&target, "published", &[("mode", "fast")]).await?;

    driver.kill();
    let mut driver = files_of.start(dir.path(), "driver-restarted")?;
    let mut node = NodeClient::new(channel(files_of.socket.clone()).await?);
    wait_for_files(&target, "after the restart", &[("mode", "fast")]).await?;
    let ready = health_get(health, "/readyz").await?;
    if !ready.starts_with("HTTP/1.1 200") {
        return Err(format!("the restarted driver's /readyz: {ready}"));
    }
    let metrics = health_get(health, "/metrics").await?;
    if !metrics.contains("sharedresource_csi_driver_volumes_published 1") {
        return Err(format!("the restarted driver does not count its recovered volume:\n{metrics}"));
    }
    let config_maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), "restart-owner");
    config_maps
        .patch("app-settings", &PatchParams::default(), &Patch::Merge(&json!({"data": {"mode": "slow"}})))
        .await
        .map_err(|e| e.to_string())?;
    wait_for_files(&target, "a change after the restart", &[("mode", "slow")])
        .await
        .map_err(|e| format!("{e}\n{}", driver.log_tail(20)))?;
    // Access withdrawn by editing the Role: the restarted driver's Role watch (or its periodic
    // recheck, every 2 s here) empties the volume; the verb given back restores it.
    let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), "restart-consumer");
    let rules = |verbs: &[&str]| json!({"rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedconfigmaps"], "resourceNames": ["settings"], "verbs": verbs}]});
    roles
        .patch("use-settings", &PatchParams::default(), &Patch::Merge(&rules(&["get"])))
        .await
        .map_err(|e| e.to_string())?;
    wait_for_files(&target, "after the Role lost the verb", &[]).await?;
    roles
        .patch("use-settings", &PatchParams::default(), &Patch::Merge(&rules(&["use"])))
        .await
        .map_err(|e| e.to_string())?;
    wait_for_files(&target, "after the Role got the verb back", &[("mode", "slow")]).await?;
    // The same publish again is answered from the recovered record.
    node.node_publish_volume(request.clone()).await.map_err(|e| format!("republish after the restart: {e}"))?;
    unpublish_as_kubelet(&mut node, request.volume_id, request.target_path).await?;
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| p.starts_with(&dir.path().to_string_lossy().into_owned()))
        .collect();
    let records: Vec<_> = std::fs::read_dir(&files_of.state)
        .map_err(|e| e.to_string())?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    driver.kill();
    if !mounts.is_empty() || !records.is_empty() || target.exists() {
        return Err(format!("left behind: mounts {mounts:?}, records {}", records.len()));
    }
    println!("driver SIGKILLed and restarted: content kept, refresh resumed, nothing left after unpublish");
    Ok(())
}
