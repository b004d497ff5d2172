//! The Kubernetes-backed content source: a volume names one share (`sharedSecret` or
//! `sharedConfigMap` in its attributes); its files are the share's backing Secret or ConfigMap,
//! served only while the pod's service account may `use` the share. Every publish and every
//! refresh asks the apiserver afresh, so an update reaches the volume at the next refresh, and a
//! revoked binding or a deleted share or backing object empties it; an apiserver that cannot be
//! reached changes nothing (the error is reported and the refresh retried). Within one refresh
//! pass, answers are shared between volumes: one access check per service account and share,
//! one read per share and backing object. Watches wake the refresher when any of them changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::warn;

use super::access::{AccessQuestion, ShareKind};
use super::api::{ObjectRef, ShareStatus, SharedConfigMap, SharedSecret};
use super::cache::ShareCache;
use super::status::{Seen, desired};
use super::watch::{Served, watch_changes};
use crate::atomic_writer::{FileContent, Payload};
use crate::changes::Changes;
use crate::content::ContentSource;
use crate::error::{Error, Result};
use crate::metrics::{AccessResult, Metrics};
use crate::projection::api::{PROJECTION_ATTRIBUTE, ProjectionSpec};
use crate::publish_request::{PodInfo, PublishRequest};
use crate::quote::quote;

/// The volume attribute naming a SharedSecret.
pub const SHARED_SECRET_ATTRIBUTE: &str = "sharedSecret";
/// The volume attribute naming a SharedConfigMap.
pub const SHARED_CONFIG_MAP_ATTRIBUTE: &str = "sharedConfigMap";

/// A share found: the object it names and the conditions it reports.
type Found = (ObjectRef, Vec<Condition>);
/// What a pass saw of a share, by share.
type SeenShares = HashMap<(ShareKind, String), (ObjectRef, Vec<Condition>, Seen)>;

/// Answers shared by the volumes of one refresh pass, and what it saw of each share (written to
/// the shares' status when the pass ends).
#[derive(Default)]
pub(crate) struct Pass {
    shares: HashMap<(ShareKind, String), Option<Found>>,
    access: HashMap<AccessQuestion, bool>,
    backing: HashMap<(ShareKind, String, String), Option<Payload>>,
    /// Projections by namespace and name, `None` when absent.
    pub(crate) projections: HashMap<(String, String), Option<ProjectionSpec>>,
    seen: SeenShares,
}

/// Shares read from the cluster with `client`.
pub struct KubernetesSource {
    client: kube::Client,
    // Publish and refresh run on the blocking pool; the client's calls run on this runtime.
    runtime: tokio::runtime::Handle,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    changes: Arc<Changes>,
    pass: Mutex<Option<Pass>>,
    metrics: Arc<Metrics>,
    watches: tokio::task::JoinHandle<()>,
}

impl Drop for KubernetesSource {
    fn drop(&mut self) {
        self.watches.abort();
    }
}

impl KubernetesSource {
    /// A source asking the cluster `client` talks to, on `runtime`, counting into `metrics`,
    /// whose watches start now.
    pub fn new(client: kube::Client, runtime: tokio::runtime::Handle, metrics: Arc<Metrics>) -> KubernetesSource {
        let served = Arc::new(Served::default());
        let cache = Arc::new(ShareCache::default());
        let changes = Arc::new(Changes::default());
        let watches = runtime.spawn(watch_changes(
            client.clone(),
            served.clone(),
            cache.clone(),
            changes.clone(),
            metrics.clone(),
        ));
        KubernetesSource { client, runtime, served, cache, changes, pass: Mutex::new(None), metrics, watches }
    }

    /// The client the source asks with.
    pub(crate) fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Where the source notes what changed.
    pub(crate) fn change_log(&self) -> &Changes {
        &self.changes
    }

    /// `compute`'s answer for `key`, shared within a pass through the map `field` picks.
    pub(crate) async fn shared<K, V, F>(
        &self,
        key: K,
        field: fn(&mut Pass) -> &mut HashMap<K, V>,
        compute: F,
    ) -> Result<V>
    where
        K: std::hash::Hash + Eq,
        V: Clone,
        F: std::future::Future<Output = Result<V>>,
    {
        if let Some(pass) = self.pass.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
            && let Some(value) = field(pass).get(&key)
        {
            return Ok(value.clone());
        }
        let value = compute.await?;
        if let Some(pass) = self.pass.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            field(pass).insert(key, value.clone());
        }
        Ok(value)
    }

    async fn payload(&self, request: &PublishRequest) -> Result<Payload> {
        match volume_of(request)? {
            Volume::Share(kind, share) => self.share_payload(&request.pod, kind, &share).await,
            Volume::Projection(name) => self.projection_payload(request, &name).await,
        }
    }

    /// The files of share `share` of `kind` for `pod`, once its service account is allowed to
    /// use it.
    pub(crate) async fn share_payload(&self, pod: &PodInfo, kind: ShareKind, share: &str) -> Result<Payload> {
        let share = share.to_string();
        let question = AccessQuestion {
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            kind,
            share: share.clone(),
        };
        // The share and the access check do not depend on each other: asked at once, one round
        // trip to the apiserver instead of two (a missing share still answers NOT_FOUND first).
        let (found, allowed) = tokio::join!(
            self.shared((kind, share.clone()), |p| &mut p.shares, self.share(kind, &share)),
            self.shared(question.clone(), |p| &mut p.access, self.allowed(&question)),
        );
        let (backing, conditions) =
            found?.ok_or_else(|| Error::NotFound(format!("{} {} not found", kind.kind(), quote(&share))))?;
        if !allowed? {
            return Err(Error::PermissionDenied(question.denial()));
        }
        self.served.note(kind, &backing.namespace, &backing.name, &share);
        let key = (kind, backing.namespace.clone(), backing.name.clone());
        let payload = self.shared(key, |p| &mut p.backing, self.backing(kind, &backing)).await;
        let seen = match &payload {
            Ok(Some(_)) => Seen::Read,
            Ok(None) => Seen::Missing,
            Err(error) => Seen::Unreadable(error.to_string()),
        };
        if let Some(pass) = self.pass.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            pass.seen.insert((kind, share.clone()), (backing.clone(), conditions, seen));
        }
        payload?.ok_or_else(|| {
            Error::NotFound(format!(
                "{} {}/{}, shared by {} {}, not found",
                kind.backing_kind(),
                backing.namespace,
                backing.name,
                kind.kind(),
                quote(&share)
            ))
        })
    }

    /// The object a share names and the conditions it reports, `None` when the share does not
    /// exist.
    async fn share(&self, kind: ShareKind, share: &str) -> Result<Option<Found>> {
        // The watch's copy when it has one; a share it has not delivered yet (created a moment
        // ago) is asked for.
        if let Some(found) = self.cache.share(kind, share) {
            return Ok(Some(found));
        }
        let unavailable = |e: kube::Error| Error::Unavailable(format!("reading {} {}: {e}", kind.kind(), quote(share)));
        let conditions = |status: Option<ShareStatus>| status.map(|s| s.conditions).unwrap_or_default();
        Ok(match kind {
            ShareKind::Secret => Api::<SharedSecret>::all(self.client.clone())
                .get_opt(share)
                .await
                .map_err(unavailable)?
                .map(|s| (s.spec.secret_ref, conditions(s.status))),
            ShareKind::ConfigMap => Api::<SharedConfigMap>::all(self.client.clone())
                .get_opt(share)
                .await
                .map_err(unavailable)?
                .map(|s| (s.spec.config_map_ref, conditions(s.status))),
        })
    }

    /// Writes the status of every share a pass saw whose conditions changed.
    async fn write_statuses(&self, seen: SeenShares) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for ((kind, share), (backing, current, seen)) in seen {
            let what = format!("{} {}/{}", kind.backing_kind(), backing.namespace, backing.name);
            let Some(conditions) = desired(&current, &seen, &what, now.clone()) else { continue };
            let patch = Patch::Merge(serde_json::json!({"status": {"conditions": conditions}}));
            let params = PatchParams::default();
            let written = match kind {
                ShareKind::Secret => {
                    Api::<SharedSecret>::all(self.client.clone()).patch_status(&share, &params, &patch).await.map(drop)
                }
                ShareKind::ConfigMap => Api::<SharedConfigMap>::all(self.client.clone())
                    .patch_status(&share, &params, &patch)
                    .await
                    .map(drop),
            };
            if let Err(error) = written {
                warn!(share = %quote(&share), kind = kind.kind(), %error, "could not write the share's status");
            }
        }
    }

    /// Whether the apiserver says the pod's service account may use the share.
    async fn allowed(&self, question: &AccessQuestion) -> Result<bool> {
        let review = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &question.review())
            .await
            .map_err(|e| {
                self.metrics.access_check(AccessResult::Failed);
                Error::Unavailable(format!("asking the apiserver whether the pod may use the share: {e}"))
            })?;
        let allowed = review.status.is_some_and(|s| s.allowed);
        self.metrics.access_check(if allowed { AccessResult::Allowed } else { AccessResult::Denied });
        Ok(allowed)
    }

    /// The files of a backing object, `None` when it does not exist.
    async fn backing(&self, kind: ShareKind, backing: &ObjectRef) -> Result<Option<Payload>> {
        let unavailable = |e: kube::Error| {
            Error::Unavailable(format!("reading {} {}/{}: {e}", kind.backing_kind(), backing.namespace, backing.name))
        };
        if let Some(payload) = self.cache.content(kind, &backing.namespace, &backing.name) {
            return Ok(Some(payload));
        }
        let mut payload = Payload::new();
        let version = match kind {
            ShareKind::Secret => {
                let api = Api::<Secret>::namespaced(self.client.clone(), &backing.namespace);
                let Some(secret) = api.get_opt(&backing.name).await.map_err(unavailable)? else {
                    return Ok(None);
                };
                for (key, value) in secret.data.unwrap_or_default() {
                    payload.insert(key, FileContent::new(value.0));
                }
                secret.metadata.resource_version
            }
            ShareKind::ConfigMap => {
                let api = Api::<ConfigMap>::namespaced(self.client.clone(), &backing.namespace);
                let Some(config_map) = api.get_opt(&backing.name).await.map_err(unavailable)? else {
                    return Ok(None);
                };
                for (key, value) in config_map.data.unwrap_or_default() {
                    payload.insert(key, FileContent::new(value.into_bytes()));
                }
                for (key, value) in config_map.binary_data.unwrap_or_default() {
                    payload.insert(key, FileContent::new(value.0));
                }
                config_map.metadata.resource_version
            }
        };
        if let Some(version) = version {
            self.cache.store_content(kind, &backing.namespace, &backing.name, version, payload.clone());
        }
        Ok(Some(payload))
    }
}

/// What a volume shows: one share, or a projection of several sources.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Volume {
    /// A share of a kind, by name.
    Share(ShareKind, String),
    /// A `SharedProjection` in the pod's namespace, by name.
    Projection(String),
}

/// What a request names: exactly one of the three attributes, with a valid object name.
fn volume_of(request: &PublishRequest) -> Result<Volume> {
    let named: Vec<(&str, &String)> = [SHARED_SECRET_ATTRIBUTE, SHARED_CONFIG_MAP_ATTRIBUTE, PROJECTION_ATTRIBUTE]
        .into_iter()
        .filter_map(|key| request.attributes.get(key).map(|value| (key, value)))
        .collect();
    let (attribute, name) = match named.as_slice() {
        [one] => *one,
        [] => {
            return Err(Error::InvalidArgument(format!(
                "volumeAttributes lacks {SHARED_SECRET_ATTRIBUTE:?}, {SHARED_CONFIG_MAP_ATTRIBUTE:?} or {PROJECTION_ATTRIBUTE:?}: name what to mount"
            )));
        }
        [(first, _), (second, _), ..] => {
            return Err(Error::InvalidArgument(format!(
                "volumeAttributes names both {first:?} and {second:?}: name one share, or one projection"
            )));
        }
    };
    let plain = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let volume = match attribute {
        SHARED_SECRET_ATTRIBUTE => Volume::Share(ShareKind::Secret, name.clone()),
        SHARED_CONFIG_MAP_ATTRIBUTE => Volume::Share(ShareKind::ConfigMap, name.clone()),
        _ => Volume::Projection(name.clone()),
    };
    if !plain {
        let kind = match &volume {
            Volume::Share(kind, _) => kind.kind(),
            Volume::Projection(_) => "SharedProjection",
        };
        return Err(Error::InvalidArgument(format!("{kind} name {} is not a valid object name", quote(name))));
    }
    Ok(volume)
}

impl ContentSource for KubernetesSource {
    fn ready(&self) -> bool {
        true
    }

    fn content(&self, request: &PublishRequest) -> Result<Payload> {
        self.runtime.block_on(self.payload(request))
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        Some(self.changes.clone())
    }

    fn start_pass(&self) {
        *self.pass.lock().unwrap_or_else(|p| p.into_inner()) = Some(Pass::default());
    }

    fn end_pass(&self) {
        let pass = self.pass.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(pass) = pass {
            self.runtime.block_on(self.write_statuses(pass.seen));
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod attribute_tests {
    use std::path::Path;

    use super::*;
    use crate::publish_request::PodInfo;
    use crate::target_path::TargetPath;

    fn request(attributes: &[(&str, &str)]) -> PublishRequest {
        PublishRequest {
            volume_id: "csi-1".into(),
            target: TargetPath::parse("/k/pods/u/volumes/kubernetes.io~csi/v/mount", Path::new("/k")).unwrap(),
            pod: PodInfo { name: "p".into(), namespace: "n".into(), uid: "u".into(), service_account: "s".into() },
            attributes: attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            mount_flags: Vec::new(),
            tokens: Default::default(),
        }
    }

    #[test]
    fn a_volume_names_exactly_one_valid_share_or_projection() {
        let share = |kind, name: &str| Volume::Share(kind, name.into());
        assert_eq!(volume_of(&request(&[("sharedSecret", "db")])).unwrap(), share(ShareKind::Secret, "db"));
        assert_eq!(
            volume_of(&request(&[("sharedConfigMap", "ca.bundle")])).unwrap(),
            share(ShareKind::ConfigMap, "ca.bundle")
        );
        assert_eq!(volume_of(&request(&[("projection", "app")])).unwrap(), Volume::Projection("app".into()));
        for (attributes, message) in [
            (
                vec![],
                "volumeAttributes lacks \"sharedSecret\", \"sharedConfigMap\" or \"projection\": name what to mount",
            ),
            (
                vec![("sharedSecret", "a"), ("sharedConfigMap", "b")],
                "volumeAttributes names both \"sharedSecret\" and \"sharedConfigMap\": name one share, or one projection",
            ),
            (
                vec![("projection", "a"), ("sharedConfigMap", "b")],
                "volumeAttributes names both \"sharedConfigMap\" and \"projection\": name one share, or one projection",
            ),
            (vec![("sharedSecret", "../x")], "SharedSecret name \"../x\" is not a valid object name"),
            (vec![("sharedConfigMap", "")], "SharedConfigMap name \"\" is not a valid object name"),
            (vec![("projection", "A")], "SharedProjection name \"A\" is not a valid object name"),
        ] {
            assert_eq!(volume_of(&request(&attributes)), Err(Error::InvalidArgument(message.into())));
        }
    }
}
