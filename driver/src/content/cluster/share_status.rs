//! A share's `status.conditions`, written by the drivers that serve it: whether its backing object
//! exists, and whether the driver can read it. Computed from what a refresh pass saw; written
//! only when it differs from what the share already reports, with `lastTransitionTime` moved
//! only for a condition whose status changed, so the drivers of many nodes seeing the same facts
//! agree and do not rewrite each other. Written when a refresh pass ends ([`write_statuses`]).
//! Beside them, each node's entry in `nodesNotUpdated` when its volumes of the share could not
//! take an update ([`write_node_entries`]), applied by that node's driver alone.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use sharedresource_api::ShareKind;
use sharedresource_api::object_name::ObjectName;
use sharedresource_api::shares::{SharedConfigMap, SharedSecret};
use tracing::warn;

use super::cache::ShareCache;
use super::pass::{Seen, SeenShares};
use super::share_types::Share;
use super::written_entries::WrittenEntries;
use crate::DRIVER_NAME;
use crate::apiserver::request::{RequestFailed, ask};
use crate::quote::{Logged, quote};

/// The condition saying whether the backing object exists.
pub const EXISTS: &str = "BackingObjectExists";
/// The condition saying whether the driver can read the backing object.
pub const READABLE: &str = "BackingObjectReadable";

/// The conditions for `seen` of the object `what` (e.g. `Secret infra/db-creds`), keeping
/// `current`'s transition times where a condition's status did not change; `None` when
/// `current` already says the same.
pub fn desired(current: &[Condition], seen: &Seen, what: &str, now: Time) -> Option<Vec<Condition>> {
    let (exists, readable) = match seen {
        Seen::Read => {
            (("True", "Found", format!("{what} exists")), ("True", "Read", format!("{what} is read by the driver")))
        }
        Seen::Missing => (
            (
                "False",
                "NotFound",
                format!(
                    "{what} does not exist: volumes marking the share optional are served without it until it \
                     does, the others are refused"
                ),
            ),
            ("False", "NotFound", format!("{what} does not exist")),
        ),
        Seen::Unreadable(why) => (
            ("Unknown", "ReadFailed", format!("{what} could not be read: {why}")),
            ("False", "ReadFailed", format!("{what} could not be read: {why}")),
        ),
    };
    let wanted = [(EXISTS, exists), (READABLE, readable)];
    let same = wanted.iter().all(|(kind, (status, reason, message))| {
        current.iter().any(|c| c.type_ == *kind && c.status == *status && c.reason == *reason && c.message == *message)
    });
    if same && current.len() == wanted.len() {
        return None;
    }
    Some(
        wanted
            .into_iter()
            .map(|(kind, (status, reason, message))| {
                let previous = current.iter().find(|c| c.type_ == kind);
                let last_transition_time = match previous {
                    Some(previous) if previous.status == status => previous.last_transition_time.clone(),
                    _ => now.clone(),
                };
                Condition {
                    type_: kind.to_string(),
                    status: status.to_string(),
                    reason: reason.to_string(),
                    message,
                    last_transition_time,
                    observed_generation: None,
                }
            })
            .collect(),
    )
}

/// Writes the status of every share a pass saw whose conditions changed, with `client`, each
/// request given up after `timeout`; what `cache` holds of a share written says its new
/// conditions (no watch of shares brings them back to this node).
pub async fn write_statuses(client: kube::Client, timeout: Duration, seen: SeenShares, cache: Arc<ShareCache>) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for ((kind, share), (backing, current, seen)) in seen {
        let what = format!("{} {}/{}", kind.backing_kind(), backing.namespace, backing.name);
        let Some(conditions) = desired(&current, &seen, &what, now.clone()) else { continue };
        // Only shares a pass found are seen, so the name is one the apiserver gave.
        let Ok(name) = ObjectName::parse(&share) else { continue };
        let patch = Patch::Merge(serde_json::json!({"status": {"conditions": &conditions}}));
        let request = || format!("writing the status of {} {}", kind.kind(), quote(&share));
        let written = match kind {
            ShareKind::Secret => write_status::<SharedSecret>(&client, &name, &patch, (timeout, request)).await,
            ShareKind::ConfigMap => write_status::<SharedConfigMap>(&client, &name, &patch, (timeout, request)).await,
        };
        match written {
            Ok(()) => cache.wrote_conditions(kind, &share, conditions),
            Err(error) => warn!(error = %Logged(&error), "could not write the share's status"),
        }
    }
}

/// Writes this node's entries of the shares' `status.nodesNotUpdated` that `entries` says
/// changed, each by server-side apply as this node's own field manager: the entries of other
/// nodes belong to their drivers, so no driver ever writes over another's. An entry is applied
/// with its words; applying none removes this node's. A failed write is tried again at the
/// next pass's end.
pub async fn write_node_entries(client: kube::Client, timeout: Duration, node: String, entries: Arc<WrittenEntries>) {
    // A field manager's name holds at most 128 characters.
    let manager: String = format!("{DRIVER_NAME}/{node}").chars().take(128).collect();
    let _writing = entries.writing.lock().await;
    for ((kind, share), entry) in entries.to_write() {
        let Ok(name) = ObjectName::parse(&share) else { continue };
        let mut apply = serde_json::json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1",
            "kind": kind.kind(),
            "metadata": {"name": share},
        });
        if let Some(entry) = &entry {
            let since =
                k8s_openapi::jiff::Timestamp::try_from(entry.since).map(|at| at.to_string()).unwrap_or_default();
            apply["status"] =
                serde_json::json!({"nodesNotUpdated": [{"node": node, "message": entry.message, "since": since}]});
        }
        let patch = Patch::Apply(apply);
        let params = PatchParams::apply(&manager).force();
        let request = || format!("writing node {node}'s entry in the status of {} {}", kind.kind(), quote(&share));
        let written = match kind {
            ShareKind::Secret => {
                apply_status::<SharedSecret>(&client, &name, &patch, &params, (timeout, request)).await
            }
            ShareKind::ConfigMap => {
                apply_status::<SharedConfigMap>(&client, &name, &patch, &params, (timeout, request)).await
            }
        };
        if let Err(error) = written {
            entries.not_written(&(kind, share));
            warn!(error = %Logged(&error), "could not write this node's entry in the share's status");
        }
    }
}

/// Applies `patch` to the status of share `name` of kind `S` with `params`, given up after
/// `timeout`.
async fn apply_status<S: Share>(
    client: &kube::Client,
    name: &ObjectName,
    patch: &Patch<serde_json::Value>,
    params: &PatchParams,
    (timeout, what): (Duration, impl Fn() -> String),
) -> Result<(), RequestFailed> {
    let api = Api::<S>::all(client.clone());
    let call = async {
        match api.patch_status(name.as_str(), params, patch).await {
            // A share deleted meanwhile has no status to keep an entry in.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            answer => answer.map(drop),
        }
    };
    ask(timeout, what, call).await
}

/// Writes `patch` to the status of share `name` of kind `S`, given up after `timeout`.
async fn write_status<S: Share>(
    client: &kube::Client,
    name: &ObjectName,
    patch: &Patch<serde_json::Value>,
    (timeout, what): (Duration, impl Fn() -> String),
) -> Result<(), RequestFailed> {
    let api = Api::<S>::all(client.clone());
    ask(timeout, what, api.patch_status(name.as_str(), &PatchParams::default(), patch)).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn conditions_follow_what_was_seen_and_move_their_time_only_on_a_change() {
        let what = "Secret infra/db-creds";
        let read = desired(&[], &Seen::Read, what, at(10)).unwrap();
        assert_eq!(
            read.iter().map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str())).collect::<Vec<_>>(),
            [(EXISTS, "True", "Found"), (READABLE, "True", "Read")]
        );
        assert_eq!(desired(&read, &Seen::Read, what, at(20)), None, "the same facts write nothing");
        let missing = desired(&read, &Seen::Missing, what, at(30)).unwrap();
        assert_eq!(
            missing[0].message,
            "Secret infra/db-creds does not exist: volumes marking the share optional are served without it until it \
             does, the others are refused"
        );
        assert!(missing.iter().all(|c| c.status == "False" && c.last_transition_time == at(30)));
        let unreadable = desired(&missing, &Seen::Unreadable("forbidden".into()), what, at(40)).unwrap();
        assert_eq!((unreadable[0].status.as_str(), unreadable[0].last_transition_time.clone()), ("Unknown", at(40)));
        assert_eq!(
            (unreadable[1].status.as_str(), unreadable[1].last_transition_time.clone()),
            ("False", at(30)),
            "still False: its transition time stays"
        );
    }
}
