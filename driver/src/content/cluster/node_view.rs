//! This node's view by name: its own `SharedResourceNode`, the only place it learns of grant
//! changes. The driver writes the spec (the namespaces of the pods whose volumes here the access
//! check guards, as [`NodeView`] keeps them) and watches the object by name; the access-notices
//! controller writes the status. A namespace whose value moved (or appeared: a namespace new to
//! the node is looked at once) has its volumes' access looked at again, as a grant's change
//! always was ([`Changes::grant_changed`]); a moved `everyNamespace`, every volume's. Values are
//! compared, not counted, so a watch that lists again after missing events finds what moved.
//! The node keeps no RBAC, and no change of a namespace it does not serve reaches it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::content::changes::{Accounts, Changes};
use crate::content::live_volumes::SecondLook;
use crate::metrics::Metrics;
use crate::quote::Logged;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::node_view::{GrantChanges, MAX_NAMESPACES, SharedResourceNode, SharedResourceNodeSpec};

/// The field manager of the node's writes of its spec.
const MANAGER: &str = "sharedresource-csi-driver";
/// How long namespace changes are gathered before the spec is written: a node starting many pods
/// writes once.
const GATHER: Duration = Duration::from_millis(200);
/// The first wait before a failed write is tried again, doubled up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The namespaces of the volumes whose access the node checks, by volume id; since when the
/// object says less than they are (its write pending or failing); and since when its status has
/// lacked an entry for a namespace its spec lists (the controller not telling it).
#[derive(Debug, Default)]
pub struct NodeView {
    volumes: Mutex<(HashMap<String, String>, SecondLook)>,
    changed: Notify,
    behind_since: Mutex<Option<tokio::time::Instant>>,
    untold_since: Mutex<Option<tokio::time::Instant>>,
}

impl NodeView {
    /// Since when the node's object has not said what its volumes serve, or its status has not
    /// answered what its spec says (`None`: neither). Meanwhile, grant changes of some namespace
    /// of its volumes may not be told to the node.
    pub fn behind_since(&self) -> Option<tokio::time::Instant> {
        let behind = *self.behind_since.locked();
        let untold = *self.untold_since.locked();
        behind.into_iter().chain(untold).min()
    }

    /// The object, as last seen, lists in its spec a namespace its status has no entry for
    /// (`untold`), or not.
    fn seen(&self, untold: bool) {
        let mut since = self.untold_since.locked();
        if untold {
            since.get_or_insert_with(tokio::time::Instant::now);
        } else {
            *since = None;
        }
    }

    /// The namespaces changed: the object is behind until written again.
    fn mark_changed(&self) {
        self.behind_since.locked().get_or_insert_with(tokio::time::Instant::now);
        self.changed.notify_one();
    }

    /// `spec` was written: the object is current if the volumes still say `spec`.
    fn written(&self, spec: &SharedResourceNodeSpec) {
        // Held while the volumes are read: a change after the read marks it behind again.
        let mut behind = self.behind_since.locked();
        if self.spec() == *spec {
            *behind = None;
        }
    }

    /// Volume `volume_id` is of a pod of `namespace` (noted at each ask, before its access is).
    pub fn note(&self, volume_id: &str, namespace: &str) {
        let mut volumes = self.volumes.locked();
        // Every refresh notes its volume again: a volume already noted costs one lookup, not a
        // scan of the node's volumes.
        if volumes.0.get(volume_id).is_some_and(|noted| noted == namespace) {
            return;
        }
        let new_namespace = !volumes.0.values().any(|n| n == namespace);
        volumes.0.insert(volume_id.to_string(), namespace.to_string());
        drop(volumes);
        if new_namespace {
            self.mark_changed();
        }
    }

    /// Forgets the volumes two looks in a row did not find among `live`.
    pub fn retain_live(&self, live: &HashSet<String>) {
        let mut volumes = self.volumes.locked();
        let (table, look) = &mut *volumes;
        let forget = look.to_forget(table.keys(), live);
        for id in &forget {
            table.remove(id);
        }
        drop(volumes);
        if !forget.is_empty() {
            self.mark_changed();
        }
    }

    /// Volume `volume_id` was unpublished.
    pub fn released(&self, volume_id: &str) {
        if self.volumes.locked().0.remove(volume_id).is_some() {
            self.mark_changed();
        }
    }

    /// The spec saying these namespaces: listed when they fit, `everyNamespace` otherwise.
    fn spec(&self) -> SharedResourceNodeSpec {
        let namespaces: BTreeSet<String> = self.volumes.locked().0.values().cloned().collect();
        if namespaces.len() > MAX_NAMESPACES {
            return SharedResourceNodeSpec { namespaces: Vec::new(), every_namespace: true };
        }
        SharedResourceNodeSpec { namespaces: namespaces.into_iter().collect(), every_namespace: false }
    }
}

/// What a node learns from a new status, compared with the one it saw before.
#[derive(Debug, PartialEq, Eq)]
pub enum Told {
    /// Nothing moved.
    Nothing,
    /// Every volume's access is to be looked at again.
    EveryNamespace,
    /// The access of these namespaces' volumes is to be looked at again.
    Namespaces(Vec<String>),
}

/// What moved from `before` to `now` (`before` is `None` at the first sight: a driver that has
/// just started holds no answer a notice could make stale).
pub fn told(before: Option<&GrantChanges>, now: &GrantChanges) -> Told {
    let Some(before) = before else { return Told::Nothing };
    if before.every_namespace != now.every_namespace {
        return Told::EveryNamespace;
    }
    let moved: Vec<String> = now
        .namespaces
        .iter()
        .filter(|entry| before.of(&entry.namespace) != Some(entry.noticed))
        .map(|entry| entry.namespace.clone())
        .collect();
    if moved.is_empty() { Told::Nothing } else { Told::Namespaces(moved) }
}

/// Keeps node `node`'s object: writes its spec as `view` changes and follows its status into
/// `wake`, requests on `client`, the watch on `watches`; runs until dropped.
pub async fn follow(
    (client, watches): (kube::Client, kube::Client),
    node: String,
    view: Arc<NodeView>,
    wake: Arc<Changes>,
    (metrics, timeout): (Arc<Metrics>, Duration),
) {
    let rewrite = Arc::new(Notify::new());
    futures_util::future::join(
        write_spec(client, &node, &view, &rewrite, timeout),
        watch_status(watches, (&node, &view), &wake, &rewrite, &metrics),
    )
    .await;
}

/// Writes the spec whenever the namespaces change (or `rewrite` asks: the object was deleted).
async fn write_spec(client: kube::Client, node: &str, view: &NodeView, rewrite: &Notify, timeout: Duration) {
    let api = Api::<SharedResourceNode>::all(client);
    let mut written: Option<SharedResourceNodeSpec> = None;
    let mut retry = FIRST_RETRY;
    let mut failed = false;
    loop {
        let wait = async {
            if failed {
                tokio::time::sleep(retry).await;
            } else {
                view.changed.notified().await;
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = rewrite.notified() => {
                written = None;
                view.mark_changed();
            }
        }
        // The first write waits for nothing: the object must exist before any notice can reach it.
        if written.is_some() {
            tokio::time::sleep(GATHER).await;
        }
        let spec = view.spec();
        if written.as_ref() == Some(&spec) {
            view.written(&spec);
            continue;
        }
        let object = serde_json::json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1",
            "kind": "SharedResourceNode",
            "metadata": {"name": node},
            "spec": spec,
        });
        let what = || format!("writing SharedResourceNode {node}");
        let apply = PatchParams::apply(MANAGER).force();
        match crate::apiserver_request::ask(timeout, what, api.patch(node, &apply, &Patch::Apply(&object))).await {
            Ok(_) => {
                info!(
                    namespaces = spec.namespaces.len(),
                    every_namespace = spec.every_namespace,
                    "this node's view written"
                );
                view.written(&spec);
                written = Some(spec);
                (failed, retry) = (false, FIRST_RETRY);
            }
            Err(error) => {
                warn!(error = %Logged(&error), "this node's view could not be written; trying again (grant changes reach its volumes through the periodic rechecks meanwhile)");
                (failed, retry) = (true, (retry * 2).min(MAX_RETRY));
            }
        }
    }
}

/// Follows the object's status by name, waking the volumes a moved value concerns.
async fn watch_status(
    client: kube::Client,
    (node, view): (&str, &NodeView),
    wake: &Changes,
    rewrite: &Notify,
    metrics: &Metrics,
) {
    let api = Api::<SharedResourceNode>::all(client);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = watch_stream(api, by_name).default_backoff().boxed();
    let mut seen: Option<GrantChanges> = None;
    while let Some(event) = events.next().await {
        let object = match event {
            Ok(Event::Apply(object) | Event::InitApply(object)) => object,
            Ok(Event::Delete(_)) => {
                rewrite.notify_one();
                continue;
            }
            Ok(Event::Init | Event::InitDone) => continue,
            Err(error) => {
                metrics.watch_error("SharedResourceNode");
                warn!(error = %Logged(&error), "watch of this node's view failed; retrying with backoff (the periodic rechecks continue)");
                continue;
            }
        };
        let status = object.status.unwrap_or_default();
        // The controller answers a namespace new to the spec with an entry: one missing for long
        // means it is not telling this node (its writes refused, or it does not run).
        view.seen(!object.spec.every_namespace && object.spec.namespaces.iter().any(|n| status.of(n).is_none()));
        match told(seen.as_ref(), &status) {
            Told::Nothing => {}
            Told::EveryNamespace => wake.grants_relisted(),
            Told::Namespaces(namespaces) => wake.grant_changed(namespaces.into_iter().map(Accounts::OfNamespace)),
        }
        seen = Some(status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::node_view::NamespaceGrantChanges;

    fn status(every: i64, entries: &[(&str, i64)]) -> GrantChanges {
        GrantChanges {
            namespaces: entries
                .iter()
                .map(|(namespace, noticed)| NamespaceGrantChanges {
                    namespace: namespace.to_string(),
                    noticed: *noticed,
                })
                .collect(),
            every_namespace: every,
        }
    }

    #[test]
    fn a_moved_or_new_namespace_is_told_and_nothing_at_the_first_sight() {
        let before = status(1, &[("team-a", 10), ("team-b", 10)]);
        assert_eq!(told(None, &before), Told::Nothing);
        assert_eq!(told(Some(&before), &before), Told::Nothing);
        let moved = status(1, &[("team-a", 11), ("team-b", 10), ("team-c", 5)]);
        assert_eq!(told(Some(&before), &moved), Told::Namespaces(vec!["team-a".into(), "team-c".into()]));
        // A namespace gone from the status is no longer served: nothing to look at.
        assert_eq!(told(Some(&before), &status(1, &[("team-a", 10)])), Told::Nothing);
        assert_eq!(told(Some(&before), &status(2, &[("team-a", 10), ("team-b", 10)])), Told::EveryNamespace);
    }

    #[test]
    fn the_object_is_behind_from_a_change_until_the_spec_saying_it_is_written() {
        let view = NodeView::default();
        assert_eq!(view.behind_since(), None, "nothing to say yet");
        view.note("v1", "team-a");
        let since = view.behind_since().expect("behind once a namespace is new");
        view.note("v2", "team-b");
        assert_eq!(view.behind_since(), Some(since), "behind since the first change");
        view.written(&SharedResourceNodeSpec { namespaces: vec!["team-a".into()], every_namespace: false });
        assert_eq!(view.behind_since(), Some(since), "an older spec leaves it behind");
        view.written(&view.spec());
        assert_eq!(view.behind_since(), None);
        view.note("v3", "team-a");
        assert_eq!(view.behind_since(), None, "a namespace it lists already changes nothing");
        view.seen(true);
        let untold = view.behind_since().expect("behind while the status lacks a namespace");
        view.seen(true);
        assert_eq!(view.behind_since(), Some(untold), "since the first sight");
        view.seen(false);
        assert_eq!(view.behind_since(), None);
    }

    #[test]
    fn the_spec_lists_the_namespaces_of_live_volumes_until_too_many() {
        let view = NodeView::default();
        view.note("v1", "team-b");
        view.note("v2", "team-a");
        view.note("v3", "team-a");
        assert_eq!(view.spec().namespaces, ["team-a", "team-b"]);
        view.released("v1");
        assert_eq!(view.spec().namespaces, ["team-a"]);
        let live: HashSet<String> = ["v2".to_string()].into();
        view.retain_live(&live);
        view.retain_live(&live);
        assert_eq!(view.spec().namespaces, ["team-a"]);
        view.retain_live(&HashSet::new());
        assert_eq!(view.spec().namespaces, ["team-a"], "one look is not enough");
        view.retain_live(&HashSet::new());
        assert!(view.spec().namespaces.is_empty());
        for i in 0..=MAX_NAMESPACES {
            view.note(&format!("v{i}"), &format!("ns-{i}"));
        }
        assert_eq!(view.spec(), SharedResourceNodeSpec { namespaces: vec![], every_namespace: true });
    }
}
