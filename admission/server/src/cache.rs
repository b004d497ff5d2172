//! The lister cache: metadata-only watches of Namespaces and CSIDrivers feeding label stores that
//! keep only what decisions read, a bounded wait for the first sync, and a remembered live GET for
//! objects the watch has not delivered yet (a CSIDriver created a moment before the pod using it).

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::{FutureExt as _, StreamExt as _};
use inline_guard_admission::{ClusterFacts, FactsError};
use inline_guard_policy::Labels;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource};
use lru::LruCache;
use tokio::sync::Mutex;
use tracing::warn;

use crate::health::Readiness;
use crate::label_store::LabelStore;
use crate::metrics::{CacheKind, Metrics};

/// A Namespace as cached: metadata only.
pub type NamespaceMeta = PartialObjectMeta<Namespace>;
/// A CSIDriver as cached: metadata only.
pub type CsiDriverMeta = PartialObjectMeta<CSIDriver>;

/// Bounds of the cache.
#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    /// How long a request waits for the first sync before it is answered "unavailable".
    pub sync_wait: Duration,
    /// How long a live lookup's answer (found or not) is reused.
    pub miss_ttl: Duration,
    /// How many live lookup answers are remembered.
    pub miss_capacity: NonZeroUsize,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings {
            sync_wait: Duration::from_secs(5),
            miss_ttl: Duration::from_secs(5),
            miss_capacity: NonZeroUsize::MIN.saturating_add(1023),
        }
    }
}

/// A lookup straight to the apiserver, for objects the cache does not hold.
#[async_trait]
pub trait LiveLookup: Send + Sync {
    /// The labels of a namespace; `None` when it does not exist.
    async fn namespace_labels(&self, name: &str) -> Result<Option<Labels>, String>;
    /// The labels of a CSIDriver; `None` when it does not exist.
    async fn csi_driver_labels(&self, name: &str) -> Result<Option<Labels>, String>;
}

/// Live lookups through the Kubernetes API (metadata-only GETs).
pub struct ApiLookup {
    namespaces: Api<NamespaceMeta>,
    csi_drivers: Api<CsiDriverMeta>,
}

impl ApiLookup {
    /// Lookups with `client`.
    pub fn new(client: Client) -> ApiLookup {
        ApiLookup { namespaces: Api::all(client.clone()), csi_drivers: Api::all(client) }
    }
}

#[async_trait]
impl LiveLookup for ApiLookup {
    async fn namespace_labels(&self, name: &str) -> Result<Option<Labels>, String> {
        let found = self.namespaces.get_opt(name).await.map_err(|error| error.to_string())?;
        Ok(found.map(|meta| meta.metadata.labels.unwrap_or_default()))
    }

    async fn csi_driver_labels(&self, name: &str) -> Result<Option<Labels>, String> {
        let found = self.csi_drivers.get_opt(name).await.map_err(|error| error.to_string())?;
        Ok(found.map(|meta| meta.metadata.labels.unwrap_or_default()))
    }
}

type Remembered = (Instant, Option<Arc<Labels>>);

/// Cluster facts from the label stores, with live lookups for misses.
pub struct KubeFacts {
    namespaces: Arc<LabelStore>,
    csi_drivers: Arc<LabelStore>,
    live: Arc<dyn LiveLookup>,
    // One lock for every miss: at most one live GET is in flight, so a storm of misses (a
    // Deployment scaling up in a namespace the watch has not delivered yet) costs one request.
    misses: Mutex<LruCache<(CacheKind, String), Remembered>>,
    settings: CacheSettings,
    metrics: Arc<Metrics>,
}

impl KubeFacts {
    /// Facts over the given stores.
    pub fn new(
        namespaces: Arc<LabelStore>,
        csi_drivers: Arc<LabelStore>,
        live: Arc<dyn LiveLookup>,
        settings: CacheSettings,
        metrics: Arc<Metrics>,
    ) -> KubeFacts {
        let misses = Mutex::new(LruCache::new(settings.miss_capacity));
        KubeFacts { namespaces, csi_drivers, live, misses, settings, metrics }
    }

    async fn lookup(&self, kind: CacheKind, store: &LabelStore, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        if tokio::time::timeout(self.settings.sync_wait, store.wait_until_ready()).await.is_err() {
            return Err(FactsError::Unavailable(format!(
                "the {} cache has not synced after {:?}",
                kind.plural(),
                self.settings.sync_wait
            )));
        }
        if let Some(labels) = store.get(name) {
            return Ok(Some(labels));
        }

        let key = (kind, name.to_string());
        let mut misses = self.misses.lock().await;
        if let Some((at, labels)) = misses.get(&key)
            && at.elapsed() < self.settings.miss_ttl
        {
            return Ok(labels.clone());
        }
        // The watch may have caught up while this request waited for the lock.
        if let Some(labels) = store.get(name) {
            return Ok(Some(labels));
        }
        self.metrics.live_lookup();
        let found = match kind {
            CacheKind::Namespace => self.live.namespace_labels(name).await,
            CacheKind::CsiDriver => self.live.csi_driver_labels(name).await,
        }
        .map_err(|error| FactsError::Unavailable(format!("live lookup of {} {name}: {error}", kind.singular())))?;
        let labels = found.map(Arc::new);
        misses.put(key, (Instant::now(), labels.clone()));
        Ok(labels)
    }
}

#[async_trait]
impl ClusterFacts for KubeFacts {
    async fn namespace_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        self.lookup(CacheKind::Namespace, &self.namespaces, name).await
    }

    async fn csi_driver_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        self.lookup(CacheKind::CsiDriver, &self.csi_drivers, name).await
    }
}

impl Readiness for KubeFacts {
    fn ready(&self) -> Result<(), String> {
        match (self.namespaces.is_ready(), self.csi_drivers.is_ready()) {
            (true, true) => Ok(()),
            (false, true) => Err("the namespaces cache has not synced".into()),
            (true, false) => Err("the csidrivers cache has not synced".into()),
            (false, false) => Err("the namespaces and csidrivers caches have not synced".into()),
        }
    }
}

/// Starts metadata-only watches of Namespaces and CSIDrivers. Returns the facts, and the future
/// that drives both watches (retrying with backoff on errors, while the stores keep serving their
/// last state) until dropped.
pub fn watch_cluster(
    client: Client,
    settings: CacheSettings,
    metrics: Arc<Metrics>,
) -> (Arc<KubeFacts>, impl Future<Output = ()>) {
    let namespaces = Arc::new(LabelStore::new(CacheKind::Namespace));
    let csi_drivers = Arc::new(LabelStore::new(CacheKind::CsiDriver));
    let facts = Arc::new(KubeFacts::new(
        namespaces.clone(),
        csi_drivers.clone(),
        Arc::new(ApiLookup::new(client.clone())),
        settings,
        metrics.clone(),
    ));
    let drive = futures_util::future::join(
        feed(Api::<NamespaceMeta>::all(client.clone()), namespaces, metrics.clone()),
        feed(Api::<CsiDriverMeta>::all(client), csi_drivers, metrics),
    )
    .map(|_| ());
    (facts, drive)
}

async fn feed<K>(api: Api<PartialObjectMeta<K>>, store: Arc<LabelStore>, metrics: Arc<Metrics>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let kind = store.kind();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .for_each(|event| {
            match event {
                Ok(event) => {
                    store.apply(event);
                    metrics.set_cache(kind, store.len(), store.is_ready(), unix_now());
                }
                Err(error) => {
                    warn!(kind = kind.plural(), %error, "watch failed; retrying with backoff, serving the last known state");
                    metrics.watch_error(kind);
                }
            }
            std::future::ready(())
        })
        .await;
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

#[cfg(test)]
mod tests;
