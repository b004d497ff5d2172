//! What makes a volume's content change, watched so that a change applies at once rather than at
//! the next periodic refresh: shares (created, edited, deleted), the Secrets and ConfigMaps they
//! name, and RoleBindings and ClusterRoleBindings (a grant given or taken). Metadata-only watches:
//! no Secret data ever reaches the driver through them. An event only notes which volumes to
//! refresh (a share's event: that share's volumes; a backing object's: the volumes of the shares
//! it served; a binding's: every volume), and the refresher computes those again through the same
//! path as the periodic refresh, so the two cannot disagree; the periodic refresh stays the
//! backstop for anything a watch misses.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use kube::{Client, Resource};
use tracing::warn;

use super::access::ShareKind;
use super::api::{SharedConfigMap, SharedSecret};
use super::source::{SHARED_CONFIG_MAP_ATTRIBUTE, SHARED_SECRET_ATTRIBUTE};
use crate::changes::Changes;
use crate::metrics::Metrics;

/// After a binding changes, when to look again (the apiserver's RBAC cache follows the same
/// watch, usually within milliseconds).
const AUTHORIZER_CATCH_UP: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(500), std::time::Duration::from_secs(2)];

/// The backing objects volumes were served from, and the shares that named them: only their
/// changes matter, and only those shares' volumes are refreshed.
#[derive(Debug, Default)]
pub struct Served(Mutex<HashMap<(ShareKind, String, String), HashSet<String>>>);

impl Served {
    /// Notes that share `share` of `kind` served its backing object `namespace/name`.
    pub fn note(&self, kind: ShareKind, namespace: &str, name: &str, share: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((kind, namespace.to_string(), name.to_string()))
            .or_default()
            .insert(share.to_string());
    }

    fn shares_of(&self, kind: ShareKind, namespace: &str, name: &str) -> Vec<String> {
        let served = self.0.lock().unwrap_or_else(|p| p.into_inner());
        served
            .get(&(kind, namespace.to_string(), name.to_string()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The volume attribute naming shares of `kind`.
fn attribute(kind: ShareKind) -> &'static str {
    match kind {
        ShareKind::Secret => SHARED_SECRET_ATTRIBUTE,
        ShareKind::ConfigMap => SHARED_CONFIG_MAP_ATTRIBUTE,
    }
}

/// What an event of a kind makes the refresher cover.
#[derive(Clone)]
enum Interest {
    /// The volumes of the share the object is (a SharedSecret or SharedConfigMap).
    Share(ShareKind),
    /// Every volume, and again a moment later: the apiserver answers access checks from its own
    /// RBAC cache, which can learn of a binding just after this watch does.
    Access,
    /// Changes to backing objects of this kind that some volume was served from.
    Served(ShareKind, Arc<Served>),
}

/// Watches everything a volume depends on with `client`, waking `wake` on each relevant change;
/// runs until dropped.
pub async fn watch_changes(client: Client, served: Arc<Served>, wake: Arc<Changes>, metrics: Arc<Metrics>) {
    let m = || metrics.clone();
    futures_util::future::join3(
        futures_util::future::join(
            wake_on::<SharedSecret>(Api::all(client.clone()), Interest::Share(ShareKind::Secret), wake.clone(), m()),
            wake_on::<SharedConfigMap>(
                Api::all(client.clone()),
                Interest::Share(ShareKind::ConfigMap),
                wake.clone(),
                m(),
            ),
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

async fn wake_on<K>(api: Api<PartialObjectMeta<K>>, interest: Interest, wake: Arc<Changes>, metrics: Arc<Metrics>)
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
                Ok(Event::InitDone) => wake.everything(),
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
                    let name = object.metadata.name.as_deref().unwrap_or_default();
                    match &interest {
                        Interest::Share(kind) => wake.share(attribute(*kind), name),
                        Interest::Access => {
                            wake.everything();
                            let again = wake.clone();
                            tokio::spawn(async move {
                                for delay in AUTHORIZER_CATCH_UP {
                                    tokio::time::sleep(delay).await;
                                    again.everything();
                                }
                            });
                        }
                        Interest::Served(kind, served) => {
                            for share in served.shares_of(*kind, namespace, name) {
                                wake.share(attribute(*kind), &share);
                            }
                        }
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
