//! `config/deploy/driver/node-writes.yaml` on the real apiserver: with a token bound to its Node
//! (as kubelet asks for a pod of the DaemonSet), the driver's identity writes the
//! SharedResourceNode of its own name and its own entry of a share's `nodesNotUpdated`, and
//! nothing of another node's; a token naming no node writes neither. The driver learns its
//! Node's uid from that token, owns its object by the Node, and the object goes with the Node.
//!
//! The suite's other drivers act as the shipped ServiceAccount with tokens naming no node (the
//! apiserver impersonates them), so the policy is applied as shipped but for the one user it
//! matches: a ServiceAccount of this scenario's own, bound to the shipped driver's ClusterRole.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sharedresource_api::node_view::SharedResourceNode;
use sharedresource_csi_driver::content::cluster::node_owner::{own_node_uid, owned_by_node};
use std::time::Instant;

use crate::shares::{WITHIN, create_object, shared_secrets};
use crate::support::{Outcome, Suite, create_namespace};

const NAMESPACE: &str = "node-writes-e2e";
const ACCOUNT: &str = "driver";
const NODE: &str = "node-writes-a";
const OTHER: &str = "node-writes-b";
const SHARE: &str = "node-writes-share";
const SHIPPED_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-csi-driver";

/// The shipped policy and binding, matching this scenario's account instead of the driver's.
fn policy_for_this_scenario() -> Result<Vec<Value>, String> {
    let shipped = inline_guard_tests::apply::objects(
        &inline_guard_tests::repo_root().join("config/deploy/driver/node-writes.yaml"),
    )?;
    let text = serde_json::to_string(&shipped).map_err(|e| e.to_string())?;
    if !text.contains(SHIPPED_USER) {
        return Err(format!("node-writes.yaml no longer matches {SHIPPED_USER}"));
    }
    let text = text
        .replace(SHIPPED_USER, &format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}"))
        .replace("sharedresource-csi-driver-node-writes", "sharedresource-csi-driver-node-writes-e2e");
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// A token of this scenario's account, bound to Node `node` (`None`: to nothing).
async fn token_client(suite: &Suite, node: Option<&Node>) -> Result<kube::Client, String> {
    let accounts = Api::<ServiceAccount>::namespaced(suite.admin.clone(), NAMESPACE);
    let bound = node.map(|node| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
    });
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), bound_object_ref: bound },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("TokenRequest: {e}"))?;
    let token = answer.status.ok_or("a TokenRequest without status")?.token;
    suite.cluster.client_with_token(&token).await
}

/// The node object `name` as a driver applies it.
fn node_view(name: &str) -> Value {
    json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedResourceNode",
        "metadata": {"name": name}, "spec": {"namespaces": ["team-a"]}
    })
}

/// Whether `result` was refused by an admission policy (403 saying so; RBAC's refusals are
/// another failure), or allowed.
fn refused<T>(result: Result<T, kube::Error>) -> Result<bool, String> {
    match result {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("ValidatingAdmissionPolicy") => {
            Ok(true)
        }
        Err(error) => Err(error.to_string()),
    }
}

pub async fn a_node_writes_only_its_own_view_and_status_entry(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    create_namespace(admin, NAMESPACE, "none", &[]).await?;
    create_object(
        suite,
        &format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts"),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}}),
    )
    .await?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "node-writes-e2e"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sharedresource-csi-driver"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]
    });
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding).await?;
    let nodes = Api::<Node>::all(admin.clone());
    let node: Node = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE}})).map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| e.to_string())?;
    let result = async {
        inline_guard_tests::apply::apply(admin, &policy_for_this_scenario()?, false).await?;
        let on_node = token_client(suite, Some(&node)).await?;
        let unbound = token_client(suite, None).await?;
        let apply = PatchParams::apply("sharedresource-csi-driver").force();
        let views = |client: &kube::Client| Api::<SharedResourceNode>::all(client.clone());

        // The policy loads a moment after it is created: another node's object is refused once
        // it applies (one written before is removed, and asked again).
        let deadline = Instant::now() + WITHIN;
        loop {
            let written = views(&on_node).patch(OTHER, &apply, &Patch::Apply(node_view(OTHER))).await;
            if refused(written)? {
                break;
            }
            let _ = views(admin).delete(OTHER, &DeleteParams::default()).await;
            if Instant::now() > deadline {
                return Err(format!("a node wrote another node's SharedResourceNode for {WITHIN:?}"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let own = views(&on_node).patch(NODE, &apply, &Patch::Apply(node_view(NODE))).await;
        if refused(own)? {
            return Err("a node's driver was refused its own SharedResourceNode".into());
        }
        if !refused(views(&unbound).patch(NODE, &apply, &Patch::Apply(node_view(NODE))).await)? {
            return Err("a token naming no node wrote a SharedResourceNode".into());
        }

        // A share whose status lists another node: this node adds and removes its own entry only.
        create_object(
            suite,
            "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets",
            json!({
                "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": SHARE},
                "spec": {"secretRef": {"namespace": NAMESPACE, "name": "absent"}}
            }),
        )
        .await?;
        let shares = |client: &kube::Client| Api::<kube::api::DynamicObject>::all_with(client.clone(), &shared_secrets());
        let entry = |node: &str| json!({"node": node, "message": "1 volume on this node serves its previous content", "since": "2026-01-01T00:00:00Z"});
        let other_entry = json!({"status": {"nodesNotUpdated": [entry(OTHER)]}});
        shares(admin)
            .patch_status(SHARE, &PatchParams::apply("e2e-other-node").force(), &Patch::Apply(json!({
                "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": SHARE},
                "status": other_entry["status"]
            })))
            .await
            .map_err(|e| format!("writing the other node's entry as the admin: {e}"))?;
        let own_entry = json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": SHARE},
            "status": {"nodesNotUpdated": [entry(NODE)]}
        });
        let manager = PatchParams::apply(&format!("sharedresource.csi.inlineguard.dev/{NODE}")).force();
        if refused(shares(&on_node).patch_status(SHARE, &manager, &Patch::Apply(own_entry)).await)? {
            return Err("a node was refused its own entry of a share's status".into());
        }
        let erase = Patch::Merge(json!({"status": {"nodesNotUpdated": [entry(NODE)]}}));
        if !refused(shares(&on_node).patch_status(SHARE, &PatchParams::default(), &erase).await)? {
            return Err("a node erased another node's entry of a share's status".into());
        }
        let forge = Patch::Merge(json!({"status": {"nodesNotUpdated": [entry(NODE), entry(OTHER), entry("node-writes-c")]}}));
        if !refused(shares(&on_node).patch_status(SHARE, &PatchParams::default(), &forge).await)? {
            return Err("a node wrote an entry for another node".into());
        }
        let share = shares(admin).get(SHARE).await.map_err(|e| e.to_string())?;
        let listed: Vec<&str> = share.data["status"]["nodesNotUpdated"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| entry["node"].as_str())
            .collect();
        if listed != [OTHER, NODE] && listed != [NODE, OTHER] {
            return Err(format!("the share's status lists {listed:?}, expected the two nodes' own entries"));
        }

        // Its own object is owned by its Node, whose uid the driver learns from its token alone,
        // and goes with the Node (the garbage collector removes it).
        let timeout = std::time::Duration::from_secs(10);
        let uid = own_node_uid(&on_node, NODE, timeout).await.ok_or("the driver did not learn its Node's uid")?;
        if node.metadata.uid.as_deref() != Some(uid.as_str()) {
            return Err(format!("the driver took {uid} for the uid of Node {NODE}, which is {:?}", node.metadata.uid));
        }
        if own_node_uid(&unbound, NODE, timeout).await.is_some() {
            return Err("a token bound to no node gave a Node's uid".into());
        }
        let mut owned = node_view(NODE);
        owned["metadata"]["ownerReferences"] = owned_by_node(NODE, &uid);
        views(&on_node).patch(NODE, &apply, &Patch::Apply(owned)).await.map_err(|e| e.to_string())?;
        let written = views(admin).get(NODE).await.map_err(|e| e.to_string())?;
        if written.metadata.owner_references.as_ref().is_none_or(|owners| owners.len() != 1 || owners[0].uid != uid) {
            return Err(format!("the node's object is not owned by its Node: {:?}", written.metadata.owner_references));
        }
        nodes.delete(NODE, &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        let deadline = Instant::now() + WITHIN;
        while views(admin).get_opt(NODE).await.map_err(|e| e.to_string())?.is_some() {
            if Instant::now() > deadline {
                return Err(format!("SharedResourceNode {NODE} outlived its Node by {WITHIN:?}"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        println!("node writes: own view and own entry written; another node's view, entry and erasure refused; the view went with its Node");
        Ok(())
    }
    .await;
    let _ = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &shared_secrets())
        .delete(SHARE, &DeleteParams::default())
        .await;
    for name in [NODE, OTHER] {
        let _ = Api::<SharedResourceNode>::all(admin.clone()).delete(name, &DeleteParams::default()).await;
    }
    let _ = Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .delete("sharedresource-csi-driver-node-writes-e2e", &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>::all(admin.clone())
        .delete("sharedresource-csi-driver-node-writes-e2e", &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
        .delete("node-writes-e2e", &DeleteParams::default())
        .await;
    let _ = nodes.delete(NODE, &DeleteParams::default()).await;
    result
}
