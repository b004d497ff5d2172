//! No pod before the driver, on the real node: its kubelet registers the Node with the startup
//! taint (as a node pool's startup taints do) and the overlay opts in as an operator does
//! (`startup-taint.yaml` copied into it, `startupTaint: true` in driver.yaml). A pod reading a
//! share, created before anything is installed, is held off the node by the scheduler for the
//! taint; the shipped DaemonSet (which tolerates it) registers the driver with kubelet, the
//! driver removes the taint from its own Node once kubelet's write of the CSINode lists it (the
//! audit log orders them), and the pod is placed then and reads the share. A pod that tolerates
//! the taint, placed before the driver (kubelet's mount fails), is told once the driver is
//! registered (by the shipped read-grants controller, which the driver asks through its node's
//! `SharedResourceNode`: no node lists pods), and reads the share at kubelet's next retry.

use std::time::{Duration, Instant};

use inline_guard_tests::cluster::{Cluster, namespace_defaults};
use inline_guard_tests::node::kubelet::NODE_NAME;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use sharedresource_csi_driver::controllers::startup_taint::STARTUP_TAINT_KEY;

use crate::workload::{CONSUMER, DRIVER, apply, share_reader};

/// The pod created before the driver.
pub const EARLY: &str = "early";
/// The driver's identity as its DaemonSet's pods run.
const DRIVER_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-csi-driver";

/// Creates [`EARLY`] (its namespace and account first), read-only by itself (no webhook runs
/// yet), and waits until the scheduler says the taint keeps it off the node; returns its uid.
pub async fn pod_held_off_by_the_taint(admin: &kube::Client) -> Result<String, String> {
    apply(admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CONSUMER}})).await?;
    namespace_defaults(admin, CONSUMER, Duration::from_secs(60)).await?;
    apply(
        admin,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": CONSUMER}}),
    )
    .await?;
    let mut pod = share_reader(EARLY);
    pod["spec"]["volumes"][0]["csi"]["readOnly"] = json!(true);
    let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
    let pods = Api::<Pod>::namespaced(admin.clone(), CONSUMER);
    let created = pods.create(&PostParams::default(), &pod).await.map_err(|e| format!("creating {EARLY}: {e}"))?;
    let started = Instant::now();
    loop {
        let pod = pods.get(EARLY).await.map_err(|e| e.to_string())?;
        if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            return Err(format!("{EARLY} was placed on the node before the driver was installed"));
        }
        // The scheduler's message counts untolerated taints without naming them: that the startup
        // taint is the one is read from the Node, whose only taint it is then.
        let scheduled = pod.status.and_then(|s| s.conditions).into_iter().flatten().find(|c| c.type_ == "PodScheduled");
        let held = scheduled.as_ref().is_some_and(|c| {
            c.reason.as_deref() == Some("Unschedulable") && c.message.as_deref().is_some_and(|m| m.contains("taint"))
        });
        let taints = node_taints(admin).await?;
        if held && taints == [STARTUP_TAINT_KEY] {
            let message = scheduled.and_then(|c| c.message).unwrap_or_default();
            println!("deploy: {EARLY} held off the node, whose one taint is {STARTUP_TAINT_KEY}: {message}");
            return Ok(created.metadata.uid.unwrap_or_default());
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the startup taint did not hold {EARLY} off the node within 120 s: its PodScheduled condition is \
                 {scheduled:?}, the Node's taints {taints:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A pod created before the driver that tolerates the startup taint: placed at once.
pub const TOLERANT: &str = "tolerant";

/// Creates [`TOLERANT`] (after [`pod_held_off_by_the_taint`] made its namespace and account):
/// the scheduler places it on the tainted node, whose kubelet fails to mount its volume with no
/// driver to ask; waits for kubelet's FailedMount Event saying so. Returns its uid.
pub async fn pod_placed_before_the_driver(admin: &kube::Client) -> Result<String, String> {
    let mut pod = share_reader(TOLERANT);
    pod["spec"]["volumes"][0]["csi"]["readOnly"] = json!(true);
    pod["spec"]["tolerations"] = json!([{"key": STARTUP_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
    let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
    let created = Api::<Pod>::namespaced(admin.clone(), CONSUMER)
        .create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating {TOLERANT}: {e}"))?;
    let uid = created.metadata.uid.unwrap_or_default();
    let failed = wait_for_event(admin, &uid, |e| e.reason.as_deref() == Some("FailedMount")).await?;
    println!("deploy: {TOLERANT}, placed before the driver, failed to mount: {}", failed.note.unwrap_or_default());
    Ok(uid)
}

/// Waits (up to 120 s) for the `DriverRegistered` Event on [`TOLERANT`] (`uid`), reported as the
/// driver (the read-grants controller makes it for the node's driver); its note.
pub async fn told_the_driver_is_registered(admin: &kube::Client, uid: &str) -> Result<String, String> {
    let told = wait_for_event(admin, uid, |e| {
        e.reason.as_deref() == Some("DriverRegistered") && e.reporting_controller.as_deref() == Some(DRIVER)
    })
    .await?;
    let note = told.note.unwrap_or_default();
    let wanted =
        format!("{DRIVER} is now registered with kubelet on node {NODE_NAME}: the pod's volumes of it (\"shared\")");
    if told.type_.as_deref() != Some("Normal") || !note.starts_with(&wanted) {
        return Err(format!(
            "the driver's Event on {TOLERANT} is {:?} {note:?}, expected Normal starting {wanted:?}",
            told.type_
        ));
    }
    println!("deploy: {TOLERANT} told: {note}");
    Ok(note)
}

/// Waits (up to 300 s: kubelet's mount retries back off to about two minutes) until pod `name` of
/// [`CONSUMER`] runs.
pub async fn wait_running(admin: &kube::Client, name: &str) -> Result<(), String> {
    let pods = Api::<Pod>::namespaced(admin.clone(), CONSUMER);
    let started = Instant::now();
    loop {
        let pod = pods.get(name).await.map_err(|e| e.to_string())?;
        let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
        if phase == "Running" {
            println!("deploy: {name} running {:?} after the wait began", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!("{CONSUMER}/{name} is {phase:?}, not Running, after 300 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits (up to 120 s) for the driver's Event of `reason` about pod `uid` of [`CONSUMER`]; its
/// note.
pub async fn wait_for_driver_event(admin: &kube::Client, uid: &str, reason: &str) -> Result<String, String> {
    let told = wait_for_event(admin, uid, |e| {
        e.reason.as_deref() == Some(reason) && e.reporting_controller.as_deref() == Some(DRIVER)
    })
    .await?;
    Ok(told.note.unwrap_or_default())
}

/// Waits (up to 120 s) for an Event (`events.k8s.io`) about pod `uid` of [`CONSUMER`] that
/// `wanted` accepts.
async fn wait_for_event(admin: &kube::Client, uid: &str, wanted: impl Fn(&Event) -> bool) -> Result<Event, String> {
    let events = Api::<Event>::namespaced(admin.clone(), CONSUMER);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let about: Vec<Event> = listed
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
            .collect();
        if let Some(event) = about.iter().find(|e| wanted(e)) {
            return Ok(event.clone());
        }
        if Instant::now() > deadline {
            let seen: Vec<_> = about.iter().map(|e| (e.reason.clone(), e.note.clone())).collect();
            return Err(format!("no such Event about pod {uid} of {CONSUMER} within 120 s; its Events: {seen:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The keys of the Node's taints.
async fn node_taints(admin: &kube::Client) -> Result<Vec<String>, String> {
    let node = Api::<NodeObject>::all(admin.clone()).get(NODE_NAME).await.map_err(|e| e.to_string())?;
    Ok(node.spec.and_then(|s| s.taints).into_iter().flatten().map(|t| t.key).collect())
}

/// The taint is gone from the Node (and its other taints are not), and by the audit log the
/// driver patched the Node once, after kubelet's first write of the CSINode that lists it.
pub async fn removed_after_kubelet_listed_the_driver(admin: &kube::Client, cluster: &Cluster) -> Result<(), String> {
    let keys = node_taints(admin).await?;
    if keys.iter().any(|key| key == STARTUP_TAINT_KEY) {
        return Err(format!("the startup taint is still on the Node: {keys:?}"));
    }
    let events = cluster.audit_events()?;
    let about_node = |resource: &'static str| {
        events.iter().filter(move |e| {
            e.stage == "ResponseComplete"
                && e.response_status.as_ref().is_some_and(|s| s.code < 300)
                && e.object_ref.as_ref().is_some_and(|o| o.resource == resource && o.name == NODE_NAME)
        })
    };
    let listed: Vec<&str> = about_node("csinodes")
        .filter(|e| {
            e.acting_user() == format!("system:node:{NODE_NAME}")
                && ["create", "update", "patch"].contains(&e.verb.as_str())
        })
        .filter(|e| {
            let drivers =
                e.request_object.as_ref().and_then(|o| o["spec"]["drivers"].as_array().cloned()).unwrap_or_default();
            drivers.iter().any(|d| d["name"] == DRIVER)
        })
        .map(|e| e.request_received_timestamp.as_str())
        .collect();
    let patches: Vec<&str> = about_node("nodes")
        .filter(|e| e.verb == "patch" && e.acting_user() == DRIVER_USER)
        .map(|e| e.request_received_timestamp.as_str())
        .collect();
    let (Some(first_listed), [patched]) = (listed.iter().min(), patches.as_slice()) else {
        return Err(format!(
            "expected kubelet's CSINode write listing the driver and one Node patch by the driver in the audit log, \
             got {listed:?} and {patches:?}"
        ));
    };
    // RFC 3339 UTC with microseconds: the text orders as the times do.
    if patched <= first_listed {
        return Err(format!(
            "the driver patched the Node at {patched}, before kubelet's CSINode listed it at {first_listed}"
        ));
    }
    println!(
        "deploy: kubelet's CSINode listed the driver at {first_listed}; the driver removed the startup taint at {patched}"
    );
    Ok(())
}
