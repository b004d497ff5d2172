//! A lazy `exec` provider on the real node: the node's driver configured with the shipped
//! example helper (wrapped to log its calls) in mode lazy. The pod's container, running as a user
//! other than root, starts with the volume mounted and the helper asked only `mount` (run behind
//! the helpers' seccomp filter); once the
//! test lets it read, the helper's `get` runs, once for many reads within the TTL. Then a
//! planned restart (a new driver beside the old one, as the DaemonSet's rolling update starts
//! it): the old driver hands the volume over and exits 0 on its SIGTERM, and the running
//! container reads on, no read failed, with no new `mount`; kubelet neither deregisters the
//! driver nor registers it again (the successor accepts on the very registration socket), and
//! the CSINode lists it. Then an unplanned one (SIGKILL), whose new socket kubelet registers
//! again (the control that its log shows a registration when one happens):
//! the FUSE session ends with the process, so the container's reads fail with "Transport
//! endpoint is not connected" as documented; deleting the pod still leaves nothing on the node.

use serde_json::json;

use crate::node::{
    DriverConfigured, ONE_AT_A_TIME, create_pod, delete_and_wait, node, nothing_left, pod_on_node, uid, volume_present,
    wait_for_log,
};
use crate::providers::{helper_calls, helper_confinement, logging_example_helper};
use crate::shares::{create_object, use_grant};
use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite, create_namespace};

const NAMESPACE: &str = "node-lazy-provider";
const POD: &str = "lazy-reader";
/// Says it started, waits for the test's go, then reads the helper's file every second.
const READER: &str = r#"echo started; until [ -e /trigger/go ]; do sleep 0.2; done
n=0; while true; do n=$((n+1)); echo "read $n: $(cat /vault/secrets/db-password 2>&1)"; sleep 1; done"#;

pub async fn a_pod_on_the_node_reads_a_lazy_providers_file_when_it_first_opens_it(suite: &Suite) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = node(suite)?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (root, trigger) = (work.path().join("root"), work.path().join("trigger"));
    std::fs::create_dir_all(root.join(NAMESPACE).join(POD)).map_err(|e| e.to_string())?;
    std::fs::write(root.join(NAMESPACE).join(POD).join("db-password"), "from-the-helper").map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&trigger).map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt as _;
    for open in [work.path(), trigger.as_path()] {
        std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    }
    let wrapper = logging_example_helper(work.path(), &root)?;
    let config = format!(
        // As root: the helper lives in the run's private directory (see `one_provider`).
        "providers:\n- {{name: vault-lazy, kind: exec, helper: {}, mode: lazy, cacheTTL: 1h, runAsUser: 0, runAsGroup: 0}}\n",
        wrapper.display()
    );
    node.restart_driver_with(&config)?;
    let _restore = DriverConfigured(node);

    create_namespace(&suite.admin, NAMESPACE, "none", &[]).await?;
    let (role, binding) = use_grant(NAMESPACE, "providers", "vault-lazy", ("use-vault-lazy", "reader-uses-vault-lazy"));
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles"), role).await?;
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"), binding)
        .await?;
    let csi =
        json!({"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {"provider": "vault-lazy"}});
    let mut spec = pod_on_node(node, POD, READER, csi, "/vault");
    spec["spec"]["volumes"]
        .as_array_mut()
        .ok_or("the reader pod has no volumes")?
        .push(json!({"name": "trigger", "hostPath": {"path": trigger, "type": "Directory"}}));
    spec["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .ok_or("the reader container has no volume mounts")?
        .push(json!({"name": "trigger", "mountPath": "/trigger", "readOnly": true}));
    let pod = create_pod(suite, NAMESPACE, &spec).await?;

    // The container runs, so the volume is published: the helper was asked `mount` only.
    wait_for_log(node, NAMESPACE, POD, "the container's start", |line| line == "started").await?;
    volume_present(node, &uid(&pod))?;
    let before = helper_calls(work.path());
    if before.len() != 1 || !before[0].starts_with("mount ") {
        return Err(format!("before the container read anything the helper was called {before:?}; expected one mount"));
    }
    // The node's driver program started it behind the helpers' seccomp filter.
    let confinement = helper_confinement(work.path());
    if confinement != "Seccomp:\t2" {
        return Err(format!("the helper ran with {confinement:?}; expected \"Seccomp:\\t2\", behind a filter"));
    }

    std::fs::write(trigger.join("go"), "").map_err(|e| e.to_string())?;
    wait_for_log(node, NAMESPACE, POD, "three reads of the lazy file", |line| line == "read 3: from-the-helper")
        .await?;
    let after = helper_calls(work.path());
    if after[1..] != ["get secrets/db-password".to_string()] {
        return Err(format!("three reads within the TTL made the helper calls {after:?}; expected one get"));
    }

    // A planned restart: the successor takes the volume over while the container reads on.
    let reads_before = last_read(&node.container_log(NAMESPACE, POD, "reader"))?;
    let registrations_before = node.kubelet_registrations(SHARED_RESOURCE_DRIVER);
    if registrations_before.0 == 0 {
        return Err(format!("kubelet's log shows no registration of the driver: {}", node.log_tails()));
    }
    node.hand_over_driver()?;
    let wanted = format!("read {}: from-the-helper", reads_before + 3);
    wait_for_log(node, NAMESPACE, POD, "three more reads after the handover", |line| line == wanted).await?;
    // Every read, the first included (busybox's cat copies with sendfile(2), which reads what
    // the kernel holds without asking for a newer size), and none failed across the handover.
    let log = node.container_log(NAMESPACE, POD, "reader");
    if let Some(failed) =
        log.iter().filter(|line| line.starts_with("read ")).find(|line| !line.ends_with(": from-the-helper"))
    {
        return Err(format!("the container read {failed:?}: {log:?}"));
    }
    let handed = helper_calls(work.path());
    if handed.iter().filter(|call| call.starts_with("mount ")).count() != 1 {
        return Err(format!("the handover ran the helper's mount again: {handed:?}"));
    }
    // kubelet saw no change of the registration socket: no deregistration, no new registration.
    let registrations_after = node.kubelet_registrations(SHARED_RESOURCE_DRIVER);
    if registrations_after != registrations_before {
        return Err(format!(
            "across the handover kubelet's (registrations, deregistrations) of the driver went from {registrations_before:?} to {registrations_after:?}"
        ));
    }
    csi_node_lists_the_driver(suite).await?;

    // An unplanned restart: the FUSE session ended with the killed process, as documented.
    node.restart_driver_with(&config)?;
    // Its new socket is a new plugin to kubelet: the count above would have seen one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while node.kubelet_registrations(SHARED_RESOURCE_DRIVER).0 <= registrations_after.0 {
        if std::time::Instant::now() > deadline {
            return Err(format!("kubelet did not register the restarted driver: {}", node.log_tails()));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let broken = "Transport endpoint is not connected";
    wait_for_log(node, NAMESPACE, POD, "the running container's reads after a driver restart", |line| {
        line.starts_with("read ") && line.ends_with(broken)
    })
    .await?;
    delete_and_wait(suite, NAMESPACE, POD).await?;
    nothing_left(node, &uid(&pod))?;
    println!(
        "the container read lazily with helper calls {after:?}; across a handover it read on ({} reads, helper \
         calls {handed:?}); after a SIGKILL restart its reads failed: {broken}",
        reads_before + 3
    );
    Ok(())
}

/// Fails unless the node's CSINode lists the driver.
async fn csi_node_lists_the_driver(suite: &Suite) -> Outcome {
    let csi_nodes = kube::Api::<k8s_openapi::api::storage::v1::CSINode>::all(suite.admin.clone());
    let name = node(suite)?.name();
    let csi_node = csi_nodes.get(name).await.map_err(|e| format!("reading CSINode {name}: {e}"))?;
    let drivers: Vec<&str> = csi_node.spec.drivers.iter().map(|driver| driver.name.as_str()).collect();
    if !drivers.contains(&SHARED_RESOURCE_DRIVER) {
        return Err(format!("the CSINode lists {drivers:?}, not {SHARED_RESOURCE_DRIVER}"));
    }
    Ok(())
}

/// The number of the container's last read (`read N: ...`).
fn last_read(log: &[String]) -> Result<u64, String> {
    log.iter()
        .rev()
        .find_map(|line| line.strip_prefix("read ")?.split_once(':')?.0.parse().ok())
        .ok_or_else(|| format!("the container logged no read: {log:?}"))
}
