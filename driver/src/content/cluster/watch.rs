//! What makes a volume's content change, watched so that a change applies at once rather than at
//! the next periodic refresh: the Secrets and ConfigMaps shares name, each watched on its own by
//! name, once this node served a volume from it, metadata only (no Secret data ever reaches the
//! driver through them). Shares, projections and grants are not watched by the node: it hears of
//! their changes through its own object ([`super::node_view`]). An event only notes which
//! volumes to refresh (the volumes of the shares the object served, and of the projections
//! showing those shares), and the refresher computes those again through the same path as the
//! periodic refresh, so the two cannot disagree; the periodic refresh stays the backstop for
//! anything a watch misses.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use tracing::warn;

use super::cache::ShareCache;
use super::share_types::Share;
use crate::apiserver::client::WatchConnections;
use crate::content::changes::Changes;
use crate::metrics::Metrics;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::ShareKind;
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::shares::{SharedConfigMap, SharedSecret};

/// The backing objects volumes were served from, and the shares that named them: only their
/// changes matter, and only those shares' volumes are refreshed. They are the only Secrets and
/// ConfigMaps this node watches, each on its own (`fieldSelector=metadata.name=...`, as kubelet's
/// `Watch` strategy does), so the driver needs read access to nothing else. A share that names
/// another object, or is gone, no longer holds its old one here: an object no share served from
/// is watched no more.
#[derive(Debug)]
pub struct Served {
    objects: Mutex<HashMap<ObjectKey, HashSet<String>>>,
    // Counts the times the set of objects changed.
    changed: tokio::sync::watch::Sender<u64>,
}

/// A backing object: its kind, namespace and name.
type ObjectKey = (ShareKind, String, String);

impl Default for Served {
    fn default() -> Served {
        Served { objects: Mutex::default(), changed: tokio::sync::watch::Sender::new(0) }
    }
}

impl Served {
    /// Notes that share `share` of `kind` served its backing object `namespace/name` (and no
    /// other object any more).
    pub fn note(&self, kind: ShareKind, namespace: &str, name: &str, share: &str) {
        let mut objects = self.objects.locked();
        let key = (kind, namespace.to_string(), name.to_string());
        if objects.get(&key).is_some_and(|shares| shares.contains(share)) {
            return;
        }
        let new_object = !objects.contains_key(&key);
        let dropped = Self::drop_share(&mut objects, kind, share);
        objects.entry(key).or_default().insert(share.to_string());
        let changed = new_object || dropped;
        drop(objects);
        if changed {
            self.changed.send_modify(|count| *count += 1);
        }
    }

    /// Share `share` of `kind` is gone: it serves no object.
    pub fn forget_share(&self, kind: ShareKind, share: &str) {
        let mut objects = self.objects.locked();
        let changed = Self::drop_share(&mut objects, kind, share);
        drop(objects);
        if changed {
            self.changed.send_modify(|count| *count += 1);
        }
    }

    /// Removes `share` of `kind` from every object, and the objects no share is left to;
    /// whether any object went.
    fn drop_share(objects: &mut HashMap<ObjectKey, HashSet<String>>, kind: ShareKind, share: &str) -> bool {
        let before = objects.len();
        objects.retain(|(of, _, _), shares| {
            if *of == kind {
                shares.remove(share);
            }
            !shares.is_empty()
        });
        objects.len() != before
    }

    /// The shares that served backing object `namespace/name` of `kind`.
    fn shares_of(&self, kind: ShareKind, namespace: &str, name: &str) -> Vec<String> {
        let served = self.objects.locked();
        served
            .get(&(kind, namespace.to_string(), name.to_string()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// What a watch can follow: a kind of the cluster, decoded from its JSON, movable across tasks.
pub(super) trait Watchable:
    Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static
{
}

/// How an object changed.
enum Changed {
    Applied,
    Deleted,
}

/// What an event of a backing object's watch makes the refresher cover: the volumes of the
/// shares that served the object (kind, namespace, name); its versions go to the cache.
#[derive(Clone)]
struct Interest(ObjectKey, Arc<Served>, Arc<ShareCache>);

/// Watches the backing objects volumes were served from over `connections`, each on its own,
/// noting in `wake` what each change touches; runs until dropped. Shares, projections and grants
/// are not watched here: the node hears of their changes through its own object
/// ([`super::node_view`]).
pub async fn watch_changes(
    connections: Arc<WatchConnections>,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    wake: Arc<Changes>,
    metrics: Arc<Metrics>,
) {
    let following = Following { connections, served, cache, wake: wake.clone(), metrics };
    let mut changes = following.served.changed.subscribe();
    let mut watches = ObjectWatches::default();
    let watching = async move {
        loop {
            watches.follow_served(&following);
            if changes.changed().await.is_err() {
                return;
            }
        }
    };
    futures_util::future::join(watching, wake.deliver_grant_looks()).await;
}

/// The watches of backing objects, one per object; dropping it stops them all.
#[derive(Default)]
struct ObjectWatches(HashMap<ObjectKey, tokio::task::JoinHandle<()>>);

impl Drop for ObjectWatches {
    fn drop(&mut self) {
        for watch in self.0.values() {
            watch.abort();
        }
    }
}

/// What the watches of backing objects share: where to watch from, what was served, the cache,
/// whom to wake and what to count.
struct Following {
    connections: Arc<WatchConnections>,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    wake: Arc<Changes>,
    metrics: Arc<Metrics>,
}

impl ObjectWatches {
    /// Watches each backing object some share served a volume from, and stops watching the
    /// others. Only valid names go into a watch's path and field selector: a share naming
    /// something else serves nothing (its volumes are refused naming it) and is watched nowhere.
    fn follow_served(&mut self, following: &Following) {
        let wanted: HashSet<ObjectKey> = following.served.objects.locked().keys().cloned().collect();
        self.0.retain(|object, watch| {
            let keep = wanted.contains(object);
            if !keep {
                watch.abort();
            }
            keep
        });
        for object in wanted {
            if let std::collections::hash_map::Entry::Vacant(entry) = self.0.entry(object) {
                let (kind, namespace, name) = entry.key();
                let (Ok(namespace), Ok(name)) = (NamespaceName::parse(namespace), ObjectName::parse(name)) else {
                    continue;
                };
                let watch = match kind {
                    ShareKind::Secret => watch_backing::<SharedSecret>(*kind, &(namespace, name), following),
                    ShareKind::ConfigMap => watch_backing::<SharedConfigMap>(*kind, &(namespace, name), following),
                };
                let Some(watch) = watch else { continue };
                entry.insert(watch);
            }
        }
    }
}

/// Starts the metadata-only watch of backing object `(namespace, name)` of a share of kind `S`
/// on a connection of its own; `None` (logged) when no connection is left for it.
fn watch_backing<S: Share>(
    kind: ShareKind,
    (namespace, name): &(NamespaceName, ObjectName),
    following: &Following,
) -> Option<tokio::task::JoinHandle<()>> {
    let lease = match following.connections.lease(1) {
        Ok(lease) => lease,
        Err(error) => {
            warn!(error = %crate::quote::Logged(&error), "no connection for a watch; its volumes follow it through the periodic refresh");
            return None;
        }
    };
    let api = Api::<PartialObjectMeta<S::Backing>>::namespaced(lease.client.clone(), namespace.as_str());
    let one = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let key = (kind, namespace.as_str().to_string(), name.as_str().to_string());
    let interest = Interest(key, following.served.clone(), following.cache.clone());
    let watch = wake_on::<S::Backing>(api, one, interest, following.wake.clone(), following.metrics.clone());
    // The lease goes with the task: its stream is free again once the task ends.
    Some(tokio::spawn(async move {
        let _lease = lease;
        watch.await
    }))
}

async fn wake_on<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    interest: Interest,
    wake: Arc<Changes>,
    metrics: Arc<Metrics>,
) where
    K: Watchable,
{
    let mut listed: Option<String> = None;
    watch_stream(api, config)
        .default_backoff()
        .for_each(|event| {
            match event {
                Ok(Event::Init) => listed = None,
                Ok(Event::InitApply(object)) => listed = object.metadata.resource_version,
                Ok(Event::InitDone) => interest.listed(listed.take(), &wake),
                Ok(Event::Apply(object)) => interest.changed(&object, Changed::Applied, &wake),
                Ok(Event::Delete(object)) => interest.changed(&object, Changed::Deleted, &wake),
                Err(error) => {
                    metrics.watch_error(&K::kind(&()));
                    warn!(kind = %K::kind(&()), error = %crate::quote::Logged(&error), "watch failed; retrying with backoff (the periodic refresh continues)");
                }
            }
            std::future::ready(())
        })
        .await;
}

impl Interest {
    /// A list is done; `listed` is the version it held of the backing object (`None`: it held
    /// none, deleted meanwhile). A list may show a change that no event will: the volumes served
    /// from it are woken when what it found may differ from what they hold (the cache knows
    /// which versions were read; a share that starts naming it woke its own volumes already),
    /// so a watch started by a publish costs that volume no second look. The listed version
    /// goes to the cache, so the volumes need not read the object again until it changes.
    fn listed(&self, listed: Option<String>, wake: &Changes) {
        let Interest((kind, namespace, name), served, cache) = self;
        if cache.listed_version(*kind, namespace, name, listed) {
            for share in served.shares_of(*kind, namespace, name) {
                wake.share(kind.attribute(), &share);
            }
        }
    }

    /// `object` was applied or deleted: the volumes of the shares served from it are woken, and
    /// the cache learns its new version, or that it has none.
    fn changed<K>(&self, object: &PartialObjectMeta<K>, how: Changed, wake: &Changes) {
        let (namespace, name) = names_of(object);
        let Interest((kind, _, _), served, cache) = self;
        let version = match how {
            Changed::Applied => object.metadata.resource_version.clone(),
            Changed::Deleted => None,
        };
        cache.saw_version(*kind, namespace, name, version);
        for share in served.shares_of(*kind, namespace, name) {
            wake.share(kind.attribute(), &share);
        }
    }
}

/// An object's namespace and name as the apiserver sent them.
fn names_of<K>(object: &PartialObjectMeta<K>) -> (&str, &str) {
    (object.metadata.namespace.as_deref().unwrap_or_default(), object.metadata.name.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_served_from_an_object_are_those_that_named_it() {
        let served = Served::default();
        served.note(ShareKind::Secret, "owner", "db-creds", "db");
        served.note(ShareKind::Secret, "owner", "db-creds", "db-again");
        served.note(ShareKind::Secret, "other", "db-creds", "other-db");
        served.note(ShareKind::ConfigMap, "owner", "db-creds", "ca");
        let mut of_owner = served.shares_of(ShareKind::Secret, "owner", "db-creds");
        of_owner.sort();
        assert_eq!(of_owner, ["db", "db-again"]);
        assert_eq!(served.shares_of(ShareKind::ConfigMap, "owner", "db-creds"), ["ca"]);
        assert_eq!(served.shares_of(ShareKind::Secret, "other", "db-creds"), ["other-db"]);
        assert!(served.shares_of(ShareKind::Secret, "owner", "api-key").is_empty());
    }

    #[test]
    fn a_share_that_names_another_object_or_is_gone_holds_its_old_one_no_more() {
        let served = Served::default();
        let mut changed = served.changed.subscribe();
        served.note(ShareKind::Secret, "owner", "db-creds", "db");
        served.note(ShareKind::Secret, "owner", "db-creds", "db-again");
        assert!(changed.has_changed().unwrap(), "a first object");
        changed.mark_unchanged();
        served.note(ShareKind::Secret, "owner", "db-creds", "db-again");
        assert!(!changed.has_changed().unwrap(), "the same object again");
        served.note(ShareKind::Secret, "owner", "db-v2", "db");
        assert!(changed.has_changed().unwrap(), "a new object");
        changed.mark_unchanged();
        assert_eq!(served.shares_of(ShareKind::Secret, "owner", "db-creds"), ["db-again"]);
        served.note(ShareKind::Secret, "owner", "db-v2", "db-again");
        assert!(changed.has_changed().unwrap(), "db-creds is served by no share");
        changed.mark_unchanged();
        assert!(served.shares_of(ShareKind::Secret, "owner", "db-creds").is_empty());
        served.forget_share(ShareKind::ConfigMap, "db");
        assert!(!changed.has_changed().unwrap(), "another kind's share of the same name");
        served.forget_share(ShareKind::Secret, "db");
        assert!(!changed.has_changed().unwrap(), "db-v2 still served by db-again");
        served.forget_share(ShareKind::Secret, "db-again");
        assert!(changed.has_changed().unwrap());
        assert!(served.objects.locked().is_empty());
    }
}
