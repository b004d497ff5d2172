//! A Secrets Store CSI provider on the real node: the node's driver configured with the e2e
//! provider (built on upstream's provider API module) as kind `secrets-store`, a pod of a
//! service account granted `use` of it reads the provider's object from inside its container,
//! kubelet's token for the shipped CSIDriver's audience reaches the provider as upstream's
//! driver passes it, and the pod's deletion leaves nothing.

use serde_json::{Value, json};

use crate::node::{
    DriverConfigured, ONE_AT_A_TIME, create_pod, delete_and_wait, node, nothing_left, pod_on_node, uid, volume_present,
    wait_for_log,
};
use crate::shares::{create_object, use_grant};
use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite, create_namespace};
use inline_guard_tests::cluster::ChildProcess;

const NAMESPACE: &str = "node-secrets-store";
/// The audience the shipped CSIDriver's `tokenRequests` names.
const AUDIENCE: &str = "sharedresource.inlineguard.dev";
/// Prints, every second, the object the provider served.
const READER: &str = r#"while true; do echo "content: $(cat /store/db-password)"; sleep 1; done"#;

pub async fn a_pod_on_the_node_reads_a_secrets_store_providers_object(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (objects, socket, log) =
        (work.path().join("objects"), work.path().join("e2e.sock"), work.path().join("mounts.log"));
    std::fs::create_dir_all(&objects).map_err(|e| e.to_string())?;
    std::fs::write(objects.join("db-password"), "from-the-provider").map_err(|e| e.to_string())?;
    let arguments = [("--socket", &socket), ("--objects", &objects), ("--log", &log)]
        .map(|(flag, path)| format!("{flag}={}", path.display()));
    let provider =
        ChildProcess::spawn("e2e-provider", &suite.peers.secrets_store_provider, &arguments, &[], work.path())?;
    node.restart_driver_with(&format!(
        "providers:\n- {{name: e2e, kind: secrets-store, socket: {}, timeout: 5s}}\n",
        socket.display()
    ))?;
    let _restore = DriverConfigured(node);

    create_namespace(&suite.admin, NAMESPACE, "none", &[]).await?;
    let (role, binding) = use_grant(NAMESPACE, "providers", "e2e", ("use-e2e", "reader-uses-e2e"));
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles"), role).await?;
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"), binding)
        .await?;
    let objects_parameter = "array:\n  - |\n    objectName: db-password\n";
    let csi = json!({"driver": SHARED_RESOURCE_DRIVER, "readOnly": true,
        "volumeAttributes": {"provider": "e2e", "objects": objects_parameter}});
    let pod = create_pod(suite, NAMESPACE, &pod_on_node(node, "store-reader", READER, csi, "/store")).await?;
    let read =
        wait_for_log(node, NAMESPACE, "store-reader", "the provider's object", |l| l == "content: from-the-provider")
            .await
            .map_err(|e| format!("{e}\n{}", provider.log_tail(20)))?;

    let mounts: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let ours = mounts
        .iter()
        .find(|m| m["pod"] == format!("{NAMESPACE}/store-reader"))
        .ok_or_else(|| format!("the provider logged no Mount for the pod: {mounts:?}"))?;
    if ours["serviceAccount"] != "reader" || ours["tokenAudiences"] != json!([AUDIENCE]) || ours["permission"] != "420"
    {
        return Err(format!(
            "the provider was sent {ours}: expected service account reader, kubelet's token for {AUDIENCE}, permission 420"
        ));
    }
    volume_present(node, &uid(&pod))?;
    delete_and_wait(suite, NAMESPACE, "store-reader").await?;
    nothing_left(node, &uid(&pod))?;
    println!("the container read {:?}; the provider saw {ours}", read.iter().find(|l| l.starts_with("content: ")));
    Ok(())
}
