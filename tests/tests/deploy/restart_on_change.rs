//! Rollout on change as an operator opts in (the overlay adds `rollout-on-change.yaml` and
//! `--rollout-on-change` to the shipped read-grants Deployment): a Deployment labelled to restart
//! reads the share; its Secret changes; its pod is replaced once by the Deployment controller and
//! the new pod, placed by the scheduler and run by the node's kubelet, reads the new content. Its
//! old pod's volume is gone from the node, and so is the new one's once the Deployment is deleted.

use std::time::{Duration, Instant};

use inline_guard_tests::node::Node;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;
use sharedresource_csi_driver::controllers::rollout::plan::{
    OBSERVED_ANNOTATION, RESTART_LABEL, RESTARTED_AT_ANNOTATION,
};

use crate::workload::{CONSUMER, apply, set_content, share_reader, wait_for_content};

/// The labelled Deployment, and its pods' `app` label.
const NAME: &str = "restarted";
/// How long each step may take on a busy machine.
const WITHIN: Duration = Duration::from_secs(120);

/// The Deployment's pods that are Ready: (name, uid).
async fn ready_pods(admin: &kube::Client) -> Result<Vec<(String, String)>, String> {
    let pods = Api::<Pod>::namespaced(admin.clone(), CONSUMER)
        .list(&ListParams::default().labels(&format!("app={NAME}")))
        .await;
    Ok(pods
        .map_err(|e| format!("listing the pods of {NAME}: {e}"))?
        .items
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && crate::ready(pod))
        .map(|pod| (pod.metadata.name.unwrap_or_default(), pod.metadata.uid.unwrap_or_default()))
        .collect())
}

/// Waits until `what` holds of the Deployment's pods and itself; what it returned.
async fn wait<T>(
    admin: &kube::Client,
    what: &str,
    check: impl AsyncFn(&kube::Client) -> Result<Option<T>, String>,
) -> Result<T, String> {
    let started = Instant::now();
    loop {
        if let Some(found) = check(admin).await? {
            println!("deploy: {CONSUMER}/{NAME}: {what} after {:?}", started.elapsed());
            return Ok(found);
        }
        if started.elapsed() > WITHIN {
            return Err(format!("{CONSUMER}/{NAME}: not {what} within {WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Deployment's record and restartedAt, and its ReplicaSets.
async fn deployment_state(admin: &kube::Client) -> Result<(Option<String>, Option<String>, usize), String> {
    let deployment =
        Api::<Deployment>::namespaced(admin.clone(), CONSUMER).get(NAME).await.map_err(|e| e.to_string())?;
    let observed = deployment.metadata.annotations.and_then(|a| a.get(OBSERVED_ANNOTATION).cloned());
    let restarted = deployment
        .spec
        .and_then(|spec| spec.template.metadata)
        .and_then(|meta| meta.annotations)
        .and_then(|a| a.get(RESTARTED_AT_ANNOTATION).cloned());
    let sets = Api::<ReplicaSet>::namespaced(admin.clone(), CONSUMER)
        .list(&ListParams::default().labels(&format!("app={NAME}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok((observed, restarted, sets.items.len()))
}

/// The scenario, with the share's content `current` when it starts and `next` after.
pub async fn restarted_once_when_its_share_changes(
    admin: &kube::Client,
    node: &Node,
    current: &str,
    next: &str,
) -> Result<(), String> {
    let template = json!({"metadata": {"labels": {"app": NAME}}, "spec": share_reader(NAME)["spec"]});
    apply(
        admin,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": CONSUMER, "labels": {RESTART_LABEL: "true"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": NAME}}, "template": template}
        }),
    )
    .await?;
    let (first, first_uid) = wait(admin, "one pod Ready", async |admin: &kube::Client| {
        let pods = ready_pods(admin).await?;
        Ok((pods.len() == 1).then(|| pods[0].clone()))
    })
    .await?;
    wait_for_content(node, &first, current, 0).await?;
    node.volume_present(&first_uid)?;
    wait(admin, "recorded by the controller", async |admin: &kube::Client| {
        let (observed, restarted, sets) = deployment_state(admin).await?;
        if restarted.is_some() || sets != 1 {
            return Err(format!("{NAME} was restarted on first sight ({restarted:?}, {sets} ReplicaSets)"));
        }
        Ok(observed.map(drop))
    })
    .await?;

    set_content(admin, next).await?;
    let changed = Instant::now();
    let (second, second_uid) = wait(admin, "its pod replaced", async |admin: &kube::Client| {
        let pods = ready_pods(admin).await?;
        Ok((pods.len() == 1 && pods[0].0 != first).then(|| pods[0].clone()))
    })
    .await?;
    println!(
        "deploy: {CONSUMER}/{NAME}: {first} replaced by {second} {:?} after the Secret's change",
        changed.elapsed()
    );
    wait_for_content(node, &second, next, 0).await?;
    node.volume_present(&second_uid)?;
    // Once: one restart, one more ReplicaSet, and the old pod's volume gone from the node.
    let (_, restarted, sets) = deployment_state(admin).await?;
    if restarted.is_none() || sets != 2 {
        return Err(format!("after one change {NAME} has restartedAt {restarted:?} and {sets} ReplicaSets, not 2"));
    }
    wait(admin, "its first pod gone", async |admin: &kube::Client| {
        let left = Api::<Pod>::namespaced(admin.clone(), CONSUMER).get_opt(&first).await.map_err(|e| e.to_string())?;
        Ok(left.is_none().then_some(()))
    })
    .await?;
    node.nothing_left(&first_uid)?;
    // Still once, seen again after the rollout finished and the controller had the new pod's
    // and ReplicaSet's changes to react to: no second restart, no third ReplicaSet.
    let (_, restarted_later, sets_later) = deployment_state(admin).await?;
    if restarted_later != restarted || sets_later != 2 {
        return Err(format!(
            "{NAME} was restarted again after its one change: restartedAt {restarted:?} then {restarted_later:?}, \
             {sets_later} ReplicaSets"
        ));
    }

    Api::<Deployment>::namespaced(admin.clone(), CONSUMER)
        .delete(NAME, &DeleteParams::foreground())
        .await
        .map_err(|e| format!("deleting Deployment {NAME}: {e}"))?;
    wait(admin, "deleted with its pods", async |admin: &kube::Client| {
        let pods = Api::<Pod>::namespaced(admin.clone(), CONSUMER)
            .list(&ListParams::default().labels(&format!("app={NAME}")))
            .await;
        Ok(pods.map_err(|e| e.to_string())?.items.is_empty().then_some(()))
    })
    .await?;
    node.nothing_left(&second_uid)
}
