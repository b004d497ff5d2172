//! The startup taint, against the real apiserver with the shipped opt-in file
//! (`config/deploy/driver/startup-taint.yaml`) and a token the apiserver issued to the driver's
//! ServiceAccount bound to a Node, as a DaemonSet pod's is: the driver's own code removes the
//! taint only after kubelet's registration notice and the CSINode listing the driver, in that
//! order in the audit log; keeps every other taint; writes when into its node's
//! `SharedResourceNode`, and the suite's read-grants controller (its process, as its
//! ServiceAccount, with the opt-in's RBAC) tells the pods of that node with a volume of the
//! driver, placed before, that it is registered (an Event read back from the apiserver) and
//! records it told; the driver's own token may not list pods; and the policy refuses the same
//! identity any other change, to its own Node or another.

use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sharedresource_api::node_view::SharedResourceNode;
use sharedresource_csi_driver::DRIVER_NAME;
use sharedresource_csi_driver::controllers::startup_taint::{STARTUP_TAINT_KEY, remove_when_registered};

use crate::support::{Outcome, Suite, create, create_namespace, create_service_account, pods_path};

const NODE: &str = "startup-taint-node";
const OTHER: &str = "startup-taint-other";
const DRIVER_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-csi-driver";

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"taints": [
        {"key": "example.com/kept", "effect": "NoSchedule"},
        {"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"}]}})
}

fn csi_node(drivers: &[&str]) -> Value {
    let drivers: Vec<Value> = drivers.iter().map(|name| json!({"name": name, "nodeID": NODE})).collect();
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": NODE}, "spec": {"drivers": drivers}})
}

/// The namespace of the pods placed before the driver.
const PODS: &str = "startup-taint-pods";

/// A pod bound to `node`, with a volume of the driver (`ours`) or not.
fn pod_on(name: &str, node: &str, ours: bool) -> Value {
    let driver = if ours { DRIVER_NAME } else { "ebs.csi.aws.com" };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeName": node, "serviceAccountName": "reader",
        "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
        "volumes": [{"name": "shared", "csi": {"driver": driver, "readOnly": true, "volumeAttributes": {"sharedSecret": "db"}}}]}})
}

/// Waits (up to 60 s) until the read-grants controller has recorded Node [`NODE`]'s
/// registration told, then for its `DriverRegistered` Events in [`PODS`]; returns them, by the
/// pod they are about, once one is there.
async fn told_pods(admin: &kube::Client) -> Result<Vec<(String, String)>, String> {
    let objects = Api::<SharedResourceNode>::all(admin.clone());
    let events = Api::<Event>::namespaced(admin.clone(), PODS);
    let started = Instant::now();
    loop {
        let object = objects.get_opt(NODE).await.map_err(|e| e.to_string())?;
        let registered = object.as_ref().and_then(|o| o.spec.driver_registered);
        let told = object.as_ref().and_then(|o| o.status.as_ref()).and_then(|s| s.registration_told);
        let listed = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let about: Vec<(String, String)> = listed
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("DriverRegistered"))
            .map(|e| {
                let pod = e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
                (pod, e.note.clone().unwrap_or_default())
            })
            .collect();
        if registered.is_some() && told == registered && !about.is_empty() {
            return Ok(about);
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "within 60 s: SharedResourceNode {NODE} says registered {registered:?}, told {told:?}; \
                 DriverRegistered Events in {PODS}: {about:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn taint_keys(admin: &kube::Client, name: &str) -> Result<Vec<String>, String> {
    let node = Api::<Node>::all(admin.clone()).get(name).await.map_err(|e| e.to_string())?;
    Ok(node.spec.and_then(|spec| spec.taints).unwrap_or_default().into_iter().map(|taint| taint.key).collect())
}

/// A token of the driver's ServiceAccount bound to Node `NODE`, as the kubelet of that node asks
/// for a pod of the DaemonSet: it carries the node's name.
async fn driver_on_node(suite: &Suite, uid: &str) -> Result<kube::Client, String> {
    let accounts = Api::<ServiceAccount>::namespaced(suite.admin.clone(), "inline-guard-driver");
    let bound = BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(NODE.into()),
        uid: Some(uid.into()),
    };
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), bound_object_ref: Some(bound) },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request("sharedresource-csi-driver", &PostParams::default(), &request)
        .await
        .map_err(|e| format!("TokenRequest bound to Node {NODE}: {e}"))?;
    let token = answer.status.ok_or("a TokenRequest without status")?.token;
    suite.cluster.client_with_token(&token).await
}

pub async fn removed_only_once_kubelet_lists_the_driver(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let shipped = inline_guard_tests::apply::objects(
        &inline_guard_tests::repo_root().join("config/deploy/driver/startup-taint.yaml"),
    )?;
    inline_guard_tests::apply::apply(admin, &shipped, false).await?;
    let nodes = Api::<Node>::all(admin.clone());
    let csi_nodes = Api::<CSINode>::all(admin.clone());
    let post = PostParams::default();
    let created = nodes.create(&post, &serde_json::from_value(node(NODE)).map_err(|e| e.to_string())?).await;
    let created = created.map_err(|e| format!("creating Node {NODE}: {e}"))?;
    nodes
        .create(&post, &serde_json::from_value(node(OTHER)).map_err(|e| e.to_string())?)
        .await
        .map_err(|e| format!("creating Node {OTHER}: {e}"))?;
    let outcome = async {
        csi_nodes
            .create(&post, &serde_json::from_value(csi_node(&[])).map_err(|e| e.to_string())?)
            .await
            .map_err(|e| format!("creating CSINode {NODE}: {e}"))?;
        let driver = driver_on_node(suite, created.metadata.uid.as_deref().unwrap_or_default()).await?;
        // Pods placed before the driver (no kubelet runs these Nodes: they stay Pending).
        create_namespace(admin, PODS, "none", &[]).await?;
        create_service_account(admin, PODS, "reader").await?;
        for (name, node, ours) in [("early", NODE, true), ("plain", NODE, false), ("elsewhere", OTHER, true)] {
            let answer = create(admin, &pods_path(PODS), &pod_on(name, node, ours), false).await?;
            if answer.status != 201 {
                return Err(format!("creating pod {name}: {} {}", answer.status, answer.message()));
            }
        }
        let (registered, registration) = tokio::sync::watch::channel(false);
        let removing =
            tokio::spawn(remove_when_registered(driver.clone(), NODE.into(), registration, Duration::from_secs(5)));

        // Registered with kubelet, but not yet in the CSINode: the driver reads it and waits.
        registered.send_replace(true);
        tokio::time::sleep(Duration::from_secs(2)).await;
        if !taint_keys(admin, NODE).await?.iter().any(|key| key == STARTUP_TAINT_KEY) {
            return Err("the startup taint was removed before the CSINode listed the driver".into());
        }
        // kubelet writes the driver into the CSINode: the taint goes, the other one stays.
        csi_nodes
            .patch(NODE, &PatchParams::default(), &Patch::Merge(&csi_node(&["ebs.csi.aws.com", DRIVER_NAME])))
            .await
            .map_err(|e| format!("listing the driver in CSINode {NODE}: {e}"))?;
        let listed = Instant::now();
        tokio::time::timeout(Duration::from_secs(60), removing)
            .await
            .map_err(|_| "the startup taint was not removed within 60 s of the CSINode listing the driver")?
            .map_err(|e| e.to_string())?;
        let keys = taint_keys(admin, NODE).await?;
        if keys != ["example.com/kept"] {
            return Err(format!("expected only the other taint to stay, the Node has {keys:?}"));
        }
        println!("startup taint: removed {:?} after the CSINode listed the driver", listed.elapsed());
        // Told, by the read-grants controller the driver asked through its node's object: the pod
        // of this node with a volume of the driver, and no other.
        let told = told_pods(admin).await?;
        let names: Vec<&str> = told.iter().map(|(pod, _)| pod.as_str()).collect();
        if names != ["early"] {
            return Err(format!("expected pod early told DriverRegistered, and no other: {told:?}"));
        }
        let wanted = format!(
            "{DRIVER_NAME} is now registered with kubelet on node {NODE}: the pod's volumes of it (\"shared\")"
        );
        if !told[0].1.starts_with(&wanted) {
            return Err(format!("the note {:?} does not start {wanted:?}", told[0].1));
        }
        // No node's identity lists pods: not cluster-wide, not its own node's.
        let node_pods = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
        for (what, params) in [("cluster-wide", ListParams::default()), ("of its node", node_pods)] {
            match Api::<Pod>::all(driver.clone()).list(&params).await {
                Err(kube::Error::Api(status)) if status.code == 403 => {}
                other => return Err(format!("the driver's token listing pods {what}: expected 403, got {other:?}")),
            }
        }

        // The audit log: the driver read the CSINode while it lacked the driver, and patched the
        // Node once, after the CSINode's update.
        let events = suite.cluster.audit_events()?;
        let of = |resource: &str, verb: &str, user: Option<&str>| -> Vec<String> {
            events
                .iter()
                .filter(|e| {
                    e.stage == "ResponseComplete" && e.verb == verb && user.is_none_or(|u| e.acting_user() == u)
                })
                .filter(|e| e.object_ref.as_ref().is_some_and(|o| o.resource == resource && o.name == NODE))
                .map(|e| e.request_received_timestamp.clone())
                .collect()
        };
        let (reads, patches, listing) = (
            of("csinodes", "get", Some(DRIVER_USER)),
            of("nodes", "patch", Some(DRIVER_USER)),
            of("csinodes", "patch", None),
        );
        if reads.is_empty() || patches.len() != 1 || listing.len() != 1 {
            return Err(format!(
                "expected the driver's CSINode reads, one Node patch and one CSINode update in the audit log, \
                 got {} reads, {patches:?}, {listing:?}",
                reads.len()
            ));
        }
        // RFC 3339 UTC with microseconds: the text orders as the times do.
        if patches[0] <= listing[0] {
            return Err(format!(
                "the driver patched the Node at {} before the CSINode listed it at {}",
                patches[0], listing[0]
            ));
        }

        // The policy: the same identity may do nothing else to a Node.
        let refused = [
            (
                OTHER,
                json!({"spec": {"taints": [{"key": "example.com/kept", "effect": "NoSchedule"}]}}),
                "may change only the Node its own token names",
            ),
            (
                NODE,
                json!({"metadata": {"labels": {"example.com/x": "y"}}}),
                "may change nothing of a Node but its startup taint",
            ),
            (
                NODE,
                json!({"spec": {"taints": []}}),
                "may only remove the sharedresource.csi.inlineguard.dev/agent-not-ready taint",
            ),
            (NODE, json!({"spec": {"unschedulable": true}}), "may change nothing of a Node but its startup taint"),
        ];
        let as_driver = Api::<Node>::all(driver);
        for (name, patch, message) in refused {
            match as_driver.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains(message) => {}
                other => {
                    return Err(format!(
                        "the driver's {patch} of Node {name}: expected 403 {message:?}, got {other:?}"
                    ));
                }
            }
        }
        Ok(())
    }
    .await;
    for name in [NODE, OTHER] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    // The pods bound to Nodes that never ran them: gone at once.
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), PODS);
    let _ = pods.delete_collection(&DeleteParams::default().grace_period(0), &Default::default()).await;
    let _ = csi_nodes.delete(NODE, &DeleteParams::default()).await;
    outcome
}
