//! A projection on the real node: kubelet, asked by the shipped CSIDriver for a token of its one
//! audience,
//! passes the pod's token on publish; the driver composes it with a SharedSecret and pod facts;
//! the container reads all three, and the token it reads is one the apiserver accepts for the
//! pod's service account and that very pod. What `projections` proves with a stand-in for
//! kubelet, this proves against kubelet's own request.

use k8s_openapi::api::authentication::v1::TokenReview;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::node::{
    ONE_AT_A_TIME, create_pod, delete_and_wait, grant, node, nothing_left, pod_on_node, share_object, uid,
    volume_present, wait_for_log,
};
use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_namespace};
use inline_guard_tests::node::Node;

const NAMESPACE: &str = "node-projection";
/// The audience the shipped CSIDriver's `tokenRequests` names: kubelet asks for this token only.
const AUDIENCE: &str = "sharedresource.inlineguard.dev";

/// Prints, every second, what the projection shows.
const VIEWER: &str = r#"while true; do echo "name: $(cat /view/pod/name)"; echo "labels: $(cat /view/pod/labels | tr '\n' ' ')"; echo "ca: $(cat /view/ca.crt)"; echo "private: $(cat /view/private/ca.crt 2>&1)"; echo "token: $(cat /view/token)"; sleep 1; done"#;
/// The pod's fsGroup: kubelet passes it with each publish (the driver has VOLUME_MOUNT_GROUP),
/// and a file only its owner (root) could read becomes readable by the pod's group.
const FS_GROUP: u32 = 3000;

fn viewer_pod(node: &Node) -> Value {
    let csi = json!({"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {"projection": "view"}});
    let mut pod = pod_on_node(node, "viewer", VIEWER, csi, "/view");
    pod["metadata"]["labels"] = json!({"app": "viewer"});
    pod["spec"]["securityContext"]["fsGroup"] = json!(FS_GROUP);
    pod
}

pub async fn kubelet_passes_the_token_and_the_container_reads_the_composed_volume(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let admin = &suite.admin;
    create_namespace(admin, NAMESPACE, "none", &[]).await?;
    share_object(suite, "node-projection", "projected ca").await?;
    grant(suite, NAMESPACE, "node-projection").await?;
    let projection = json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection", "metadata": {"name": "view"},
        "spec": {"sources": [
            {"sharedSecret": {"name": "node-projection", "items": [
                {"key": "ca.crt", "path": "ca.crt"},
                {"key": "ca.crt", "path": "private/ca.crt", "mode": 0o400}
            ]}},
            {"podInfo": {"items": [{"path": "pod/name", "fieldPath": "metadata.name"}, {"path": "pod/labels", "fieldPath": "metadata.labels"}]}},
            {"serviceAccountToken": {"audience": AUDIENCE, "path": "token"}}
        ]}
    });
    let path = format!("/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/{NAMESPACE}/sharedprojections");
    let answer = create(admin, &path, &projection, false).await?;
    if answer.status != 201 {
        return Err(format!("creating the projection: {} {}", answer.status, answer.message()));
    }

    let pod = create_pod(suite, NAMESPACE, &viewer_pod(node)).await?;
    let log = wait_for_log(node, NAMESPACE, "viewer", "the token", |l| l.starts_with("token: ey")).await?;
    for wanted in ["name: viewer", "labels: app=\"viewer\"", "ca: projected ca", "private: projected ca"] {
        if !log.iter().any(|line| line.trim_end() == wanted) {
            return Err(format!("the container never read {wanted:?}: {log:?}"));
        }
    }
    let token = log.iter().rev().find_map(|l| l.strip_prefix("token: ")).unwrap_or_default().to_string();
    let review: TokenReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": [AUDIENCE]}
    }))
    .map_err(|e| e.to_string())?;
    let status = Api::<TokenReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| e.to_string())?
        .status
        .ok_or("a TokenReview without status")?;
    let user = status.user.clone().unwrap_or_default();
    let bound_pod = user.extra.as_ref().and_then(|extra| extra.get("authentication.kubernetes.io/pod-name")).cloned();
    if status.authenticated != Some(true)
        || user.username.as_deref() != Some(&format!("system:serviceaccount:{NAMESPACE}:reader"))
        || bound_pod != Some(vec!["viewer".to_string()])
    {
        return Err(format!("the token the container read is not the pod's for {AUDIENCE:?}: {status:?}"));
    }
    // A change to the share reaches the container through the projection.
    share_object(suite, "node-projection", "rotated ca").await?;
    wait_for_log(node, NAMESPACE, "viewer", "the updated share", |l| l == "ca: rotated ca").await?;
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, NAMESPACE, "viewer").await?;
    nothing_left(node, &uid(&pod))?;
    println!(
        "kubelet passed the pod's token; the container read it with the share and pod facts; updated; unpublished"
    );
    Ok(())
}
