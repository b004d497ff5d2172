//! Share changes reach a node through its own object, and only the changes of what its volumes
//! read: a share no volume of the node reads created, edited and deleted, and a write of the
//! status of the share its volume does read (as every other node's driver makes), cost the node
//! no write of its `SharedResourceNode` (counted in the apiserver's audit log, not by the
//! controller); the positive control after them, an edit of that share's spec, is one write
//! that moves the share's entry. The driver never lists or watches a share or projection.

use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use sharedresource_api::node_view::SharedResourceNode;

use crate::shares::{DRIVER_USER, WITHIN, create_object, notice_writes, shared_secrets};
use crate::support::{Outcome, Suite};

const SHARES: &str = "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets";

/// Checks the node named `node`, whose one volume reads SharedSecret `share`; three tries when
/// a notice of another kind (a grant's, or a relist of the controller's watches) falls within
/// one.
pub async fn share_changes_elsewhere_cost_this_node_nothing(suite: &Suite, node: &str, share: &str) -> Outcome {
    let mut outcome = Err("no measurement was made".to_string());
    for attempt in 0..3 {
        match once(suite, node, share, attempt).await {
            Ok(Some(report)) => {
                println!("shares: {report}");
                return never_listed_or_watched(suite);
            }
            Ok(None) => outcome = Err("the node was told of something else during each of 3 measurements".into()),
            Err(error) => return Err(error),
        }
    }
    outcome
}

/// One measurement: `None` when the node was told of something else meanwhile.
async fn once(suite: &Suite, node: &str, share: &str, attempt: usize) -> Result<Option<String>, String> {
    let nodes = Api::<SharedResourceNode>::all(suite.admin.clone());
    let status = |n: SharedResourceNode| n.status.unwrap_or_default();
    let entry = format!("SharedSecret/{share}");
    let before = status(nodes.get(node).await.map_err(|e| e.to_string())?);
    if before.of_object(&entry).is_none() {
        return Err(format!("node {node} is not told of {entry}: {before:?}"));
    }
    let writes_before = notice_writes(suite, node)?;
    let shares = Api::<kube::api::DynamicObject>::all_with(suite.admin.clone(), &shared_secrets());

    // A write of the read share's status alone, as another node's driver makes: its generation
    // does not move.
    let elsewhere = json!({"status": {"nodesNotUpdated": [{"node": format!("elsewhere-{attempt}"), "message": "e2e", "since": "2026-01-01T00:00:00Z"}]}});
    shares
        .patch_status(share, &PatchParams::default(), &Patch::Merge(&elsewhere))
        .await
        .map_err(|e| format!("writing the status of {share}: {e}"))?;
    // A share no volume of this node reads: created, edited, deleted.
    let unread = format!("share-notices-unread-{attempt}");
    create_object(suite, SHARES, json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": unread},
        "spec": {"secretRef": {"namespace": "shares-owner", "name": "db-creds"}}
    }))
    .await?;
    let described = json!({"spec": {"description": "edited"}});
    shares.patch(&unread, &PatchParams::default(), &Patch::Merge(&described)).await.map_err(|e| e.to_string())?;
    shares.delete(&unread, &Default::default()).await.map_err(|e| e.to_string())?;
    // The controller gathers notices for 50 ms before it writes: a pause, so that were any of
    // the above told to this node, it would be seen before the control. (A slower controller
    // could only let a wrong write land after the control: counted there, never failing wrongly.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A relist told to every node, or a grant notice (the scenario's bindings before this one
    // are deleted as it starts), is a write this measurement does not count: measured again.
    let told_else = |now: &sharedresource_api::node_view::NodeNotices| {
        now.every_object != before.every_object
            || now.namespaces != before.namespaces
            || now.every_namespace != before.every_namespace
    };
    let between = status(nodes.get(node).await.map_err(|e| e.to_string())?);
    if told_else(&between) {
        return Ok(None);
    }
    let written = notice_writes(suite, node)? - writes_before;
    if written != 0 || between.of_object(&entry) != before.of_object(&entry) {
        return Err(format!(
            "the node reading only {share} was written {written} times for a status write of it and an unread share made, edited and deleted; expected none (status before {before:?}, after {between:?})\n{}",
            suite.read_grants.log_tail(30)
        ));
    }

    // The positive control: the read share's spec edited.
    let edited = json!({"spec": {"description": format!("edited {attempt}")}});
    shares.patch(share, &PatchParams::default(), &Patch::Merge(&edited)).await.map_err(|e| e.to_string())?;
    let deadline = Instant::now() + WITHIN;
    let after = loop {
        let now = status(nodes.get(node).await.map_err(|e| e.to_string())?);
        if now.of_object(&entry) != between.of_object(&entry) {
            break now;
        }
        if Instant::now() > deadline {
            return Err(format!("an edit of {share} was not told to node {node} within {WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let clear = json!({"status": {"nodesNotUpdated": null}});
    shares.patch_status(share, &PatchParams::default(), &Patch::Merge(&clear)).await.map_err(|e| e.to_string())?;
    if told_else(&after) {
        return Ok(None);
    }
    let writes = notice_writes(suite, node)? - writes_before;
    if writes != 1 {
        return Err(format!("an edit of {share} was told to the node in {writes} writes; expected 1"));
    }
    Ok(Some(format!(
        "a status write of {share} and an unread share's life wrote nothing to the node; an edit of {share} one write"
    )))
}

/// The driver never listed or watched a share or projection, as the audit log records its
/// requests; it did read shares by name (the positive control). Every driver of the suite acts
/// as this identity; requests RBAC refused are left out.
fn never_listed_or_watched(suite: &Suite) -> Outcome {
    let events = suite.cluster.audit_events()?;
    let ours: Vec<_> = events.iter().filter(|e| e.acting_user() == DRIVER_USER && !e.forbidden()).collect();
    let of_kind = |resource: &'static str| {
        ours.iter().filter(move |e| e.object_ref.as_ref().is_some_and(|o| o.resource == resource))
    };
    if !of_kind("sharedsecrets").any(|e| e.verb == "get") {
        return Err("the driver never read a share by name (the positive control)".into());
    }
    for resource in ["sharedsecrets", "sharedconfigmaps", "sharedprojections"] {
        if let Some(event) = of_kind(resource).find(|e| e.verb == "list" || e.verb == "watch") {
            return Err(format!("the driver made a {} of {resource}: {}", event.verb, event.request_uri));
        }
    }
    Ok(())
}
