//! The startup taint, opt-in (`startupTaint: true`): nodes join the cluster tainted
//! [`STARTUP_TAINT_KEY`] (kubelet's `--register-with-taints`, or a node pool's startup taints), so
//! no pod lands on them before this driver can serve it, and the driver removes the taint from
//! its own Node once kubelet has it: after kubelet told this process its registration succeeded
//! (`NotifyRegistrationStatus`, which kubelet sends only after it wrote the driver into the
//! node's CSINode) and the CSINode lists the driver, read back from the apiserver. Never before:
//! a taint removed at the driver's start, before kubelet had registered it, let 7 of 7 pods fail
//! with "driver name ... not found in the list of registered CSI drivers" (aws-efs-csi-driver
//! #1936).
//!
//! The RBAC that lets it (`config/deploy/driver/startup-taint.yaml`) is `patch nodes`, which RBAC
//! cannot narrow to one node; a ValidatingAdmissionPolicy there narrows it to the Node named by
//! the driver's own token (its `authentication.kubernetes.io/node-name`) and to this one change.
//!
//! The pods placed on the node before (tolerating the taint, or bound by name) are told by the
//! access-notices controller (`access_notices::waiting_pods`), which the driver asks through its
//! own `SharedResourceNode` (`driverRegistered`): listing a node's pods would need `list pods`
//! cluster-wide, which no node's identity is given.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::DRIVER_NAME;
use crate::apiserver::request::{RequestFailed, ask};
use crate::quote::Logged;
use sharedresource_api::node_view::SharedResourceNode;

/// The taint's key; any effect (NoSchedule, NoExecute) is removed.
pub const STARTUP_TAINT_KEY: &str = "sharedresource.csi.inlineguard.dev/agent-not-ready";

/// The first wait after a step that failed; doubled each time up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(200);
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// How many times the node's object is tried before the waiting pods are left untold (an
/// install without the `SharedResourceNode` kind, say): about a minute and a half.
const REGISTRATION_WRITES: u32 = 10;
/// The field manager of `driverRegistered`, apart from the node's view's (which applies the rest
/// of the spec and so leaves this field as it is).
const REGISTRATION_MANAGER: &str = "sharedresource-csi-driver-registration";

/// `taints` without the startup taint, or `None` when it has none (nothing to change).
pub fn without_startup_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    let kept: Vec<Taint> = taints.iter().filter(|taint| taint.key != STARTUP_TAINT_KEY).cloned().collect();
    (kept.len() != taints.len()).then_some(kept)
}

/// Whether `csi_node` lists this driver.
pub fn lists_the_driver(csi_node: &CSINode) -> bool {
    csi_node.spec.drivers.iter().any(|driver| driver.name == DRIVER_NAME)
}

/// Waits until `registered` says kubelet registered this process, then until Node `node`'s
/// CSINode lists the driver, then removes the startup taint from the Node (if it has one) and
/// writes when into the node's `SharedResourceNode`, so that the access-notices controller tells
/// the pods placed on the node before.
/// Each request is given up after `timeout` and tried again with backoff; it returns once the
/// Node has no startup taint, or when `registered`'s sender is gone (the driver is stopping).
pub async fn remove_when_registered(
    client: kube::Client,
    node: String,
    mut registered: watch::Receiver<bool>,
    timeout: Duration,
) {
    if registered.wait_for(|registered| *registered).await.is_err() {
        return;
    }
    let mut wait = FIRST_WAIT;
    loop {
        match step(&client, &node, timeout).await {
            Ok(Step::Done { node_uid }) => {
                // Pods placed here before (tolerating the taint, or bound by name) hear of it.
                if let Err(failed) = ask_waiting_pods_told(&client, &node, &node_uid, timeout).await {
                    warn!(error = %Logged(&failed.0), "the pods placed before the driver was registered are not told");
                }
                return;
            }
            Ok(Step::NotListed) => {}
            Err(failed) => warn!(error = %Logged(&failed.0), "removing the startup taint failed; trying again"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
    }
}

/// Writes the time of the registration into node `node`'s `SharedResourceNode` (server-side
/// apply of that one field, the object owned by the Node of uid `node_uid`, as the node's view
/// has it, so that it goes with its Node), tried [`REGISTRATION_WRITES`] times with backoff; the
/// last failure when every try failed.
async fn ask_waiting_pods_told(
    client: &kube::Client,
    node: &str,
    node_uid: &str,
    timeout: Duration,
) -> Result<(), RequestFailed> {
    let api = kube::Api::<SharedResourceNode>::all(client.clone());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let object = json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1",
        "kind": "SharedResourceNode",
        "metadata": {"name": node, "ownerReferences": crate::content::cluster::node_owner::owned_by_node(node, node_uid)},
        "spec": {"driverRegistered": i64::try_from(now.as_millis()).unwrap_or(i64::MAX)},
    });
    let apply = PatchParams::apply(REGISTRATION_MANAGER).force();
    let mut wait = FIRST_WAIT;
    let mut attempt = 1;
    loop {
        let what = || format!("writing the registration into SharedResourceNode {}", crate::quote::quote(node));
        match ask(timeout, what, api.patch(node, &apply, &Patch::Apply(&object))).await {
            Ok(_) => return Ok(()),
            Err(failed) if attempt == REGISTRATION_WRITES => return Err(failed),
            Err(_) => {}
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
        attempt += 1;
    }
}

/// What one attempt found.
enum Step {
    /// The Node has no startup taint (now, or already); its uid.
    Done { node_uid: String },
    /// kubelet's registration is not in the CSINode yet.
    NotListed,
}

async fn step(client: &kube::Client, node: &str, timeout: Duration) -> Result<Step, RequestFailed> {
    let csi_nodes = kube::Api::<CSINode>::all(client.clone());
    let csi_node =
        ask(timeout, || format!("reading CSINode {}", crate::quote::quote(node)), csi_nodes.get_opt(node)).await?;
    if !csi_node.as_ref().is_some_and(lists_the_driver) {
        return Ok(Step::NotListed);
    }
    let nodes = kube::Api::<Node>::all(client.clone());
    let current = ask(timeout, || format!("reading Node {}", crate::quote::quote(node)), nodes.get(node)).await?;
    let taints = current.spec.as_ref().and_then(|spec| spec.taints.as_deref()).unwrap_or_default();
    let node_uid = current.metadata.uid.clone().unwrap_or_default();
    let Some(kept) = without_startup_taint(taints) else {
        info!("the Node has no startup taint");
        return Ok(Step::Done { node_uid });
    };
    // The resourceVersion makes the patch conditional: a taint another client added meanwhile
    // is never overwritten (409 Conflict, and the next attempt reads the Node again).
    let patch = json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"taints": kept},
    });
    let what = || format!("removing the startup taint from Node {}", crate::quote::quote(node));
    ask(timeout, what, nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch))).await?;
    info!("registered with kubelet and listed in the CSINode: the startup taint is removed");
    Ok(Step::Done { node_uid })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::fake::FakeApiserver;
    use hyper::Method;
    use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
    use serde_json::Value;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint { key: key.into(), effect: effect.into(), ..Default::default() }
    }

    #[test]
    fn only_the_startup_taint_is_taken_away_whatever_its_effect() {
        let taints = [
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
            taint(STARTUP_TAINT_KEY, "NoSchedule"),
            taint(STARTUP_TAINT_KEY, "NoExecute"),
            taint("dedicated", "NoSchedule"),
        ];
        assert_eq!(
            without_startup_taint(&taints),
            Some(vec![taint("node.kubernetes.io/not-ready", "NoSchedule"), taint("dedicated", "NoSchedule")])
        );
        assert_eq!(without_startup_taint(&taints[..1]), None, "nothing to change");
        assert_eq!(without_startup_taint(&[]), None);
        assert_eq!(without_startup_taint(&taints[1..2]), Some(vec![]));
    }

    #[test]
    fn a_csinode_lists_the_driver_only_by_its_name() {
        let with = |names: &[&str]| CSINode {
            spec: CSINodeSpec {
                drivers: names
                    .iter()
                    .map(|name| CSINodeDriver { name: name.to_string(), node_id: "n".into(), ..Default::default() })
                    .collect(),
            },
            ..Default::default()
        };
        assert!(lists_the_driver(&with(&["ebs.csi.aws.com", DRIVER_NAME])));
        assert!(!lists_the_driver(&with(&["ebs.csi.aws.com"])));
        assert!(!lists_the_driver(&with(&[])));
    }

    const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/node-a";
    const NODE: &str = "/api/v1/nodes/node-a";
    const NODE_VIEW: &str = "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedresourcenodes/node-a";

    fn put_csinode(apiserver: &FakeApiserver, drivers: &[&str]) {
        let drivers: Vec<_> = drivers.iter().map(|name| json!({"name": name, "nodeID": "node-a"})).collect();
        let object = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node-a"},
            "spec": {"drivers": drivers}});
        apiserver.put(CSINODE, object);
    }

    fn put_node(apiserver: &FakeApiserver, taints: &[&str]) {
        let taints: Vec<_> = taints.iter().map(|key| json!({"key": key, "effect": "NoSchedule"})).collect();
        let object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "node-a-uid"},
            "spec": {"taints": taints}});
        apiserver.put(NODE, object);
    }

    fn taint_keys(apiserver: &FakeApiserver) -> Vec<Value> {
        let node = apiserver.get(NODE).unwrap();
        node["spec"]["taints"].as_array().unwrap().iter().map(|taint| taint["key"].clone()).collect()
    }

    /// When each request of `method` on `path` came, from `started`.
    fn times(apiserver: &FakeApiserver, method: Method, path: &str, started: tokio::time::Instant) -> Vec<Duration> {
        let seen = apiserver.seen().into_iter().filter(|seen| seen.method == method && seen.path == path);
        seen.map(|seen| seen.at - started).collect()
    }

    fn millis(list: &[u64]) -> Vec<Duration> {
        list.iter().map(|millis| Duration::from_millis(*millis)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_taint_goes_once_the_csinode_lists_the_driver_then_the_node_view_says_when() {
        let apiserver = FakeApiserver::new();
        put_csinode(&apiserver, &["ebs.csi.aws.com"]);
        put_node(&apiserver, &["dedicated", STARTUP_TAINT_KEY]);
        let (_sender, registered) = watch::channel(true);
        let started = tokio::time::Instant::now();
        let removing = tokio::spawn(remove_when_registered(
            apiserver.client(),
            "node-a".into(),
            registered,
            Duration::from_secs(5),
        ));

        // Not listed yet: the CSINode is read again after waits that double from 200 ms.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(times(&apiserver, Method::GET, CSINODE, started), millis(&[0, 200, 600, 1400, 3000, 6200]));
        assert_eq!(taint_keys(&apiserver), [json!("dedicated"), json!(STARTUP_TAINT_KEY)], "kept while not listed");
        assert!(apiserver.writes().is_empty(), "nothing written before the CSINode lists the driver");

        put_csinode(&apiserver, &["ebs.csi.aws.com", DRIVER_NAME]);
        tokio::time::timeout(Duration::from_secs(120), removing).await.unwrap().unwrap();
        assert_eq!(taint_keys(&apiserver), [json!("dedicated")], "only the startup taint goes");
        let node_patch = apiserver.writes().into_iter().find(|seen| seen.path == NODE).unwrap();
        assert!(node_patch.body["metadata"]["resourceVersion"].is_string(), "conditional: {}", node_patch.body);
        let view = apiserver.get(NODE_VIEW).expect("the node's view is told of the registration");
        assert!(view["spec"]["driverRegistered"].as_i64().is_some_and(|at| at > 0), "{view}");
        assert_eq!(view["metadata"]["ownerReferences"][0]["uid"], json!("node-a-uid"), "goes with its Node");
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_without_the_taint_is_left_as_it_is_and_its_view_still_told() {
        let apiserver = FakeApiserver::new();
        put_csinode(&apiserver, &[DRIVER_NAME]);
        put_node(&apiserver, &["dedicated"]);
        let (_sender, registered) = watch::channel(true);
        let removing = remove_when_registered(apiserver.client(), "node-a".into(), registered, Duration::from_secs(5));
        tokio::time::timeout(Duration::from_secs(120), removing).await.unwrap();
        let writes: Vec<String> = apiserver.writes().into_iter().map(|seen| seen.path).collect();
        assert_eq!(writes, [NODE_VIEW], "the Node is not written");
        assert_eq!(taint_keys(&apiserver), [json!("dedicated")]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_registration_is_written_again_with_backoff_and_its_last_failure_returned() {
        // Three failures, then written: four tries, 200 ms, 400 ms and 800 ms apart.
        let apiserver = FakeApiserver::new();
        apiserver.fail(Method::PATCH, NODE_VIEW, 500, 3);
        let started = tokio::time::Instant::now();
        let told = ask_waiting_pods_told(&apiserver.client(), "node-a", "node-a-uid", Duration::from_secs(5)).await;
        assert!(told.is_ok(), "{told:?}");
        assert_eq!(times(&apiserver, Method::PATCH, NODE_VIEW, started), millis(&[0, 200, 600, 1400]));
        assert!(apiserver.get(NODE_VIEW).is_some());

        // Never written: ten tries, the waits doubling up to 30 s, then the last failure.
        let apiserver = FakeApiserver::new();
        apiserver.fail(Method::PATCH, NODE_VIEW, 500, usize::MAX);
        let (client, started) = (apiserver.client(), tokio::time::Instant::now());
        let telling = ask_waiting_pods_told(&client, "node-a", "node-a-uid", Duration::from_secs(5));
        let told = tokio::time::timeout(Duration::from_secs(600), telling).await.expect("it gives up");
        assert!(told.is_err());
        let tries = times(&apiserver, Method::PATCH, NODE_VIEW, started);
        assert_eq!(tries, millis(&[0, 200, 600, 1400, 3000, 6200, 12600, 25400, 51000, 81000]));
        assert_eq!(tokio::time::Instant::now() - started, Duration::from_secs(81), "no wait after the last try");
    }

    #[tokio::test]
    async fn nothing_is_asked_before_kubelet_registered_the_driver_and_a_stopping_driver_gives_up() {
        // A client that would fail every request: the wait must end before any is made.
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let (sender, receiver) = watch::channel(false);
        let removing = tokio::spawn(remove_when_registered(client, "n".into(), receiver, Duration::from_millis(10)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!removing.is_finished(), "it waits for the registration");
        drop(sender);
        tokio::time::timeout(Duration::from_secs(60), removing).await.unwrap().unwrap();
    }
}
