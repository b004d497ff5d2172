//! What makes a volume's content change, watched so that a change applies at once rather than at
//! the next periodic refresh: shares (created, edited, deleted), the Secrets and ConfigMaps they
//! name (each watched on its own, once this node served a volume from it), and projections; grant
//! changes arrive through this node's own object ([`super::node_view`]). The watches of backing objects and projections are
//! metadata-only: no Secret data ever reaches the driver through them. An event only notes which
//! volumes to refresh (a share's event: that share's volumes; a backing object's: the volumes of
//! the shares it served, and of the projections showing those shares; a projection's: its
//! volumes; a grant notice's: the volumes of the namespaces it names), and the
//! refresher computes those again through the same path as the periodic refresh, so the two
//! cannot disagree; the periodic refresh stays the backstop for anything a watch misses.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use kube::{Client, Resource};
use tracing::warn;

use super::cache::{CachedShare, ShareCache};
use super::share_types::Share;
use crate::apiserver_client::WatchConnections;
use crate::content::changes::Changes;
use crate::metrics::Metrics;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::ShareKind;
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::projection::spec::SharedProjection;
use sharedresource_api::shares::{ObjectRef, SharedConfigMap, SharedSecret};

/// The backing objects volumes were served from, and the shares that named them: only their
/// changes matter, and only those shares' volumes are refreshed. They are the only Secrets and
/// ConfigMaps this node watches, each on its own (`fieldSelector=metadata.name=...`, as kubelet's
/// `Watch` strategy does), so the driver needs read access to nothing else.
#[derive(Debug)]
pub struct Served {
    objects: Mutex<HashMap<ObjectKey, HashSet<String>>>,
    // Counts the times an object was served for the first time.
    new_objects: tokio::sync::watch::Sender<u64>,
}

/// A backing object: its kind, namespace and name.
type ObjectKey = (ShareKind, String, String);

impl Default for Served {
    fn default() -> Served {
        Served { objects: Mutex::default(), new_objects: tokio::sync::watch::Sender::new(0) }
    }
}

impl Served {
    /// Notes that share `share` of `kind` served its backing object `namespace/name`.
    pub fn note(&self, kind: ShareKind, namespace: &str, name: &str, share: &str) {
        let mut objects = self.objects.locked();
        let key = (kind, namespace.to_string(), name.to_string());
        let new_object = !objects.contains_key(&key);
        objects.entry(key).or_default().insert(share.to_string());
        drop(objects);
        if new_object {
            self.new_objects.send_modify(|count| *count += 1);
        }
    }

    /// Whether a volume was served from object `namespace/name` of `kind`.
    fn contains(&self, kind: ShareKind, namespace: &str, name: &str) -> bool {
        let objects = self.objects.locked();
        objects.contains_key(&(kind, namespace.to_string(), name.to_string()))
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

/// What an event of a kind makes the refresher cover.
#[derive(Clone)]
enum Interest {
    /// Changes to one backing object (kind, namespace, name) that some volume was served from;
    /// its versions go to the cache.
    Served(ObjectKey, Arc<Served>, Arc<ShareCache>),
    /// A projection's change: its volumes.
    Projection,
}

/// The cluster-wide watches of [`watch_changes`]: shares of two kinds, and projections. Grants
/// are not watched here: the node hears of their changes through its own object
/// ([`super::node_view`]).
const CLUSTER_WIDE_WATCHES: usize = 3;

/// Watches everything a volume depends on over `connections`, noting in `wake` what each
/// change touches; runs until dropped.
pub async fn watch_changes(
    connections: Arc<WatchConnections>,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    wake: Arc<Changes>,
    metrics: Arc<Metrics>,
) {
    let lease = match connections.lease(CLUSTER_WIDE_WATCHES) {
        Ok(lease) => lease,
        Err(error) => {
            warn!(error = %crate::quote::Logged(&error), "no connection for the watches; volumes follow the cluster only through the periodic refresh");
            return;
        }
    };
    let client = lease.client.clone();
    let m = || metrics.clone();
    futures_util::future::join3(
        follow_shares::<SharedSecret>(
            (client.clone(), connections.clone()),
            (served.clone(), cache.clone()),
            wake.clone(),
            m(),
        ),
        follow_shares::<SharedConfigMap>((client.clone(), connections), (served, cache), wake.clone(), m()),
        futures_util::future::join(
            wake_on::<SharedProjection>(
                Api::all(client),
                watcher::Config::default(),
                Interest::Projection,
                wake.clone(),
                m(),
            ),
            wake.deliver_grant_looks(),
        ),
    )
    .await;
}

/// The watches of backing objects, one per object; dropping it stops them all.
#[derive(Default)]
struct ObjectWatches(HashMap<(NamespaceName, ObjectName), tokio::task::JoinHandle<()>>);

impl Drop for ObjectWatches {
    fn drop(&mut self) {
        for watch in self.0.values() {
            watch.abort();
        }
    }
}

/// Watches the shares of one kind (`S`). A share's event refreshes that share's volumes. Each
/// backing object (`S::Backing`) that a share names and this node has served a volume from is watched on
/// its own, metadata only: started when both first hold, stopped when no share names it any
/// more; so no other Secret or ConfigMap is ever watched (or need be readable by the driver),
/// and a node that serves no share watches none.
async fn follow_shares<S: Share>(
    (client, connections): (Client, Arc<WatchConnections>),
    (served, cache): (Arc<Served>, Arc<ShareCache>),
    wake: Arc<Changes>,
    metrics: Arc<Metrics>,
) {
    let events = watch_stream(Api::<S>::all(client), watcher::Config::default()).default_backoff().map(Some);
    // An object served for the first time may need its watch: `None` in the stream.
    let new_objects = futures_util::stream::unfold(served.new_objects.subscribe(), |mut changes| async move {
        changes.changed().await.ok()?;
        Some((None, changes))
    });
    let mut events = futures_util::stream::select(events, new_objects).boxed();
    let following = Following { connections, served, cache, wake, metrics };
    let mut shares = SharesOfKind::new(S::KIND);
    while let Some(event) = events.next().await {
        match event {
            None => {}
            Some(Ok(event)) => shares.note::<S>(event, &following),
            Some(Err(error)) => {
                following.metrics.watch_error(&S::kind(&()));
                warn!(kind = %S::kind(&()), error = %crate::quote::Logged(&error), "watch failed; retrying with backoff (the periodic refresh continues)");
            }
        }
        shares.watch_served_objects::<S>(&following);
    }
}

/// What the watches of shares share: where to watch from, what was served, the cache, whom to
/// wake and what to count.
struct Following {
    connections: Arc<WatchConnections>,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    wake: Arc<Changes>,
    metrics: Arc<Metrics>,
}

/// What the watch of one kind of share keeps between its events.
struct SharesOfKind {
    kind: ShareKind,
    /// Share name → the backing object it names.
    shares: HashMap<String, ObjectRef>,
    /// The shares of a relist under way.
    relisting: Option<HashMap<String, CachedShare>>,
    /// The watches of the backing objects served.
    watches: ObjectWatches,
}

impl SharesOfKind {
    fn new(kind: ShareKind) -> SharesOfKind {
        SharesOfKind { kind, shares: HashMap::new(), relisting: None, watches: ObjectWatches::default() }
    }

    /// Takes in one event of the shares' watch: the cache learns the share, its volumes are woken.
    fn note<S: Share>(&mut self, event: Event<S>, following: &Following) {
        let (kind, cache, wake) = (self.kind, &following.cache, &following.wake);
        let name_of = |share: &S| share.meta().name.clone().unwrap_or_default();
        let found = |share: &S| -> CachedShare { (share.backing_ref().clone(), share.conditions()) };
        match event {
            Event::Init => self.relisting = Some(HashMap::new()),
            Event::InitApply(share) => {
                self.relisting.get_or_insert_with(HashMap::new).insert(name_of(&share), found(&share));
            }
            // A relist may have missed changes: every volume is looked at again.
            Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                self.shares = listed.iter().map(|(name, (backing, _))| (name.clone(), backing.clone())).collect();
                cache.list_shares(kind, listed);
                wake.everything();
            }
            Event::Apply(share) => {
                let (name, found) = (name_of(&share), found(&share));
                self.shares.insert(name.clone(), found.0.clone());
                cache.set_share(kind, &name, Some(found));
                wake.share(kind.attribute(), &name);
            }
            Event::Delete(share) => {
                let name = name_of(&share);
                self.shares.remove(&name);
                cache.set_share(kind, &name, None);
                wake.share(kind.attribute(), &name);
            }
        }
    }

    /// Watches each backing object that a share names and this node has served, and stops
    /// watching the others. Only valid names go into a watch's path and field selector: a share
    /// naming something else serves nothing (its volumes are refused naming it) and is watched
    /// nowhere.
    fn watch_served_objects<S: Share>(&mut self, following: &Following) {
        let wanted: HashSet<(NamespaceName, ObjectName)> = self
            .shares
            .values()
            .filter(|named| following.served.contains(self.kind, &named.namespace, &named.name))
            .filter_map(|named| {
                Some((NamespaceName::parse(&named.namespace).ok()?, ObjectName::parse(&named.name).ok()?))
            })
            .collect();
        self.watches.0.retain(|object, watch| {
            let keep = wanted.contains(object);
            if !keep {
                watch.abort();
            }
            keep
        });
        for object in wanted {
            if let std::collections::hash_map::Entry::Vacant(entry) = self.watches.0.entry(object) {
                let Some(watch) = watch_backing::<S>(self.kind, entry.key(), following) else { continue };
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
    let interest = Interest::Served(key, following.served.clone(), following.cache.clone());
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
    /// A list is done; `listed` is the version it held of a backing object (`None`: it held
    /// none, deleted meanwhile). A list may show a change that no event will: for a backing
    /// object, the volumes served from it are woken when what it found may differ from what
    /// they hold (the cache knows which versions were read; a share that starts naming it woke
    /// its own volumes already), so a watch started by a publish costs that volume no second
    /// look; a projection's relist wakes every volume. The listed version goes to the cache,
    /// so the volumes need not read the object again until it changes.
    fn listed(&self, listed: Option<String>, wake: &Changes) {
        match self {
            Interest::Served((kind, namespace, name), served, cache) => {
                if cache.listed_version(*kind, namespace, name, listed) {
                    for share in served.shares_of(*kind, namespace, name) {
                        wake.share(kind.attribute(), &share);
                    }
                }
            }
            Interest::Projection => wake.everything(),
        }
    }

    /// `object` was applied or deleted: the volumes it concerns are woken (and the cache
    /// learns a backing object's new version, or that it has none).
    fn changed<K>(&self, object: &PartialObjectMeta<K>, how: Changed, wake: &Changes) {
        let (namespace, name) = names_of(object);
        match self {
            Interest::Projection => wake.projection(namespace, name),
            Interest::Served((kind, _, _), served, cache) => {
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
        assert!(served.contains(ShareKind::Secret, "other", "db-creds"));
        assert!(!served.contains(ShareKind::ConfigMap, "other", "db-creds"));
    }

    #[test]
    fn an_object_served_for_the_first_time_is_announced_once() {
        let served = Served::default();
        let mut announced = served.new_objects.subscribe();
        served.note(ShareKind::Secret, "owner", "db-creds", "db");
        assert!(announced.has_changed().unwrap(), "a first object");
        announced.mark_unchanged();
        served.note(ShareKind::Secret, "owner", "db-creds", "db-again");
        assert!(!announced.has_changed().unwrap(), "the same object again");
        served.note(ShareKind::Secret, "owner", "api-key", "api");
        assert!(announced.has_changed().unwrap(), "another object of the namespace");
        announced.mark_unchanged();
        served.note(ShareKind::ConfigMap, "owner", "api-key", "api");
        assert!(announced.has_changed().unwrap(), "the same names, for another kind");
    }
}
