//! What makes a volume's content change, watched so that a change applies at once rather than at
//! the next periodic refresh: shares (created, edited, deleted), the Secrets and ConfigMaps they
//! name, and RoleBindings and ClusterRoleBindings (a grant given or taken). Metadata-only watches:
//! no Secret data ever reaches the driver through them. An event only wakes the refresher, which
//! computes every volume again (the same path as the periodic refresh, so the two cannot
//! disagree); the periodic refresh stays the backstop for anything a watch misses.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use kube::{Client, Resource};
use tokio::sync::Notify;
use tracing::warn;

use super::access::ShareKind;
use super::api::{SharedConfigMap, SharedSecret};
use crate::metrics::Metrics;

/// After a binding changes, when to look again (the apiserver's RBAC cache follows the same
/// watch, usually within milliseconds).
const AUTHORIZER_CATCH_UP: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(500), std::time::Duration::from_secs(2)];

/// The backing objects volumes were last served from: only their changes wake the refresher.
#[derive(Debug, Default)]
pub struct Served(Mutex<HashSet<(ShareKind, String, String)>>);

impl Served {
    /// Notes that a volume was served from `kind`'s backing object `namespace/name`.
    pub fn note(&self, kind: ShareKind, namespace: &str, name: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert((kind, namespace.to_string(), name.to_string()));
    }

    fn contains(&self, kind: ShareKind, namespace: &str, name: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains(&(kind, namespace.to_string(), name.to_string()))
    }
}

/// Which objects of a kind wake the refresher.
#[derive(Clone)]
enum Interest {
    /// Every change (shares: rare, and any of them can change what a volume holds).
    All,
    /// Every change, and again a moment later: the apiserver answers access checks from its own
    /// RBAC cache, which can learn of a binding just after this watch does.
    Access,
    /// Changes to backing objects of this kind that some volume was served from.
    Served(ShareKind, Arc<Served>),
}

/// Watches everything a volume depends on with `client`, waking `wake` on each relevant change;
/// runs until dropped.
pub async fn watch_changes(client: Client, served: Arc<Served>, wake: Arc<Notify>, metrics: Arc<Metrics>) {
    let m = || metrics.clone();
    futures_util::future::join3(
        futures_util::future::join(
            wake_on::<SharedSecret>(Api::all(client.clone()), Interest::All, wake.clone(), m()),
            wake_on::<SharedConfigMap>(Api::all(client.clone()), Interest::All, wake.clone(), m()),
        ),
        futures_util::future::join(
            wake_on::<RoleBinding>(Api::all(client.clone()), Interest::Access, wake.clone(), m()),
            wake_on::<ClusterRoleBinding>(Api::all(client.clone()), Interest::Access, wake.clone(), m()),
        ),
        futures_util::future::join(
            wake_on::<Secret>(
                Api::all(client.clone()),
                Interest::Served(ShareKind::Secret, served.clone()),
                wake.clone(),
                m(),
            ),
            wake_on::<ConfigMap>(Api::all(client), Interest::Served(ShareKind::ConfigMap, served), wake, m()),
        ),
    )
    .await;
}

async fn wake_on<K>(api: Api<PartialObjectMeta<K>>, interest: Interest, wake: Arc<Notify>, metrics: Arc<Metrics>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    watch_stream(api, watcher::Config::default())
        .default_backoff()
        .for_each(|event| {
            match event {
                // The initial list says nothing changed; a relist after an error may have
                // missed a change, so it wakes too.
                Ok(Event::Init | Event::InitApply(_)) => {}
                Ok(Event::InitDone) => wake.notify_one(),
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    let relevant = match &interest {
                        Interest::All => true,
                        Interest::Access => {
                            let again = wake.clone();
                            tokio::spawn(async move {
                                for delay in AUTHORIZER_CATCH_UP {
                                    tokio::time::sleep(delay).await;
                                    again.notify_one();
                                }
                            });
                            true
                        }
                        Interest::Served(kind, served) => served.contains(
                            *kind,
                            object.metadata.namespace.as_deref().unwrap_or_default(),
                            object.metadata.name.as_deref().unwrap_or_default(),
                        ),
                    };
                    if relevant {
                        wake.notify_one();
                    }
                }
                Err(error) => {
                    metrics.watch_error(&K::kind(&()));
                    warn!(kind = %K::kind(&()), %error, "watch failed; retrying with backoff (the periodic refresh continues)");
                }
            }
            std::future::ready(())
        })
        .await;
}
