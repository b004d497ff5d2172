//! A handover asked from a pod: a root process in a pod that mounts the driver's state directory
//! read-only (a hostPath, as a careless debugging pod or a compromised privileged one would)
//! asks the running DaemonSet's driver for its lazy volumes with `handover-ask`, a successor's
//! words with a proof it could not write. The driver must refuse before pausing anything: the
//! asking pod hears nothing after its claim, and the lazy volume's reader reads on (checked by
//! the caller).

use std::path::Path;
use std::time::{Duration, Instant};

use inline_guard_tests::cluster::namespace_defaults;
use inline_guard_tests::node::{BUSYBOX_IMAGE, Node};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::workload;

/// The asking pod's namespace, privileged (hostPath volumes).
const NAMESPACE: &str = "deploy-root-pod";
/// The asking pod, and its container.
const POD: &str = "handover-ask";
/// The host's dynamic loader and libraries, which run the (host-built) client in a busybox
/// image: mounted read-only, as the program and the state directory are.
const HOST_LIBRARIES: &str = "/usr/lib/x86_64-linux-gnu";

/// Runs `handover-ask` in a root pod on `node` with the driver's state directory mounted
/// read-only; Ok once it was challenged (so it reached the driver as root) and refused.
pub async fn refused(admin: &kube::Client, node: &Node) -> Result<(), String> {
    workload::apply(
        admin,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
    )
    .await?;
    namespace_defaults(admin, NAMESPACE, Duration::from_secs(60)).await?;
    let client = Path::new(env!("CARGO_BIN_EXE_handover-ask"));
    let client_dir = client.parent().ok_or("handover-ask has no directory")?;
    let client_name = client.file_name().ok_or("handover-ask has no name")?.to_string_lossy();
    let host_path = |name: &str, path: &Path| json!({"name": name, "hostPath": {"path": path, "type": "Directory"}});
    let mount = |name: &str, at: &str| json!({"name": name, "mountPath": at, "readOnly": true});
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": POD, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": [
                    "/host-libraries/ld-linux-x86-64.so.2", "--library-path", "/host-libraries",
                    format!("/client/{client_name}"), "/state"
                ],
                "securityContext": {"runAsUser": 0},
                "volumeMounts": [mount("state", "/state"), mount("client", "/client"), mount("libraries", "/host-libraries")],
            }],
            "volumes": [
                host_path("state", &node.plugin.state),
                host_path("client", client_dir),
                host_path("libraries", Path::new(HOST_LIBRARIES)),
            ],
        }
    });
    let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
    let pods = Api::<Pod>::namespaced(admin.clone(), NAMESPACE);
    pods.create(&PostParams::default(), &pod).await.map_err(|e| format!("the asking pod: {e}"))?;
    let started = Instant::now();
    let verdict = loop {
        let log = node.container_log(NAMESPACE, POD, POD);
        let phase = pods.get(POD).await.ok().and_then(|p| p.status).and_then(|s| s.phase).unwrap_or_default();
        if let Some(verdict) = log.iter().find_map(|line| line.strip_prefix("verdict: ")) {
            println!("deploy: a root pod asking for a handover: {log:?}");
            break verdict.to_string();
        }
        if matches!(phase.as_str(), "Succeeded" | "Failed") && started.elapsed() > Duration::from_secs(5) {
            return Err(format!("the asking pod ended {phase} without a verdict: {log:?}"));
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("the asking pod gave no verdict within 120 s (phase {phase:?}): {log:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let log = node.container_log(NAMESPACE, POD, POD);
    // The positive control: it reached the driver as root and was challenged, and its proof
    // could not be written.
    if !log.iter().any(|line| line.starts_with("challenged; could not write the proof")) {
        return Err(format!("the asking pod was not challenged, or could write the state directory: {log:?}"));
    }
    if verdict != "refused" {
        return Err(format!("the driver handed its volumes to a pod that could not prove it is a driver: {log:?}"));
    }
    inline_guard_tests::node::delete_and_wait(admin, NAMESPACE, POD).await?;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone());
    namespaces
        .delete(NAMESPACE, &Default::default())
        .await
        .map_err(|e| format!("deleting namespace {NAMESPACE}: {e}"))?;
    Ok(())
}
