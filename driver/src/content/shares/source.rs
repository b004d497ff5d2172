//! The Kubernetes-backed content source: a volume names one share (`sharedSecret` or
//! `sharedConfigMap` in its attributes); its files are the share's backing Secret or ConfigMap,
//! served only while the pod's service account may `use` the share. Every publish and every
//! refresh computes the volume again: the share and its object's content from the watches'
//! caches (read when they have no current copy), the access check from an answer held until a
//! grant's change may concern it (`held_answers`), so an update reaches the volume at the next
//! refresh, and a revoked binding or a deleted share or backing object empties it; an apiserver
//! that cannot be reached changes nothing (the error is reported and the refresh retried).
//! Within one refresh pass, answers are shared between volumes: one access check per service
//! account and share, one read per share and backing object. Watches wake the refresher when
//! any of them changes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::warn;

use super::apiserver::{DEFAULT_REQUEST_TIMEOUT, ask};
use super::cache::ShareCache;
use super::held_answers::{DEFAULT_ACCESS_RECHECK, HeldAnswers};
use super::kind::{Share, ShareKind};
use super::status::{Seen, desired};
use super::watch::{Served, watch_changes};
use crate::apiserver_client::ApiserverClients;
use crate::content::ask::{PodInfo, VolumeAsk};
use crate::content::changes::Changes;
use crate::content::error::{Error, Result};
use crate::content::external::lazy_files::{HandedFiles, LazyFiles};
use crate::content::external::provider_class;
use crate::content::external::providers::Providers;
use crate::content::payload::Payload;
use crate::content::{ContentSource, PassId};
use crate::metrics::{AccessResult, Metrics};
use crate::quote::{Logged, quote};
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::access::{AccessQuestion, Guarded};
use sharedresource_api::missing::share_not_found;
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::projection::spec::ProjectionSpec;
use sharedresource_api::shares::{ObjectRef, SharedConfigMap, SharedSecret};
use sharedresource_api::volume_attributes::PROVIDER_ATTRIBUTE;
use sharedresource_api::volume_attributes::selection;
use sharedresource_api::{Selection, VolumeAttributes};

pub use super::kind::{SHARED_CONFIG_MAP_ATTRIBUTE, SHARED_SECRET_ATTRIBUTE};

/// A share found: the object it names and the conditions it reports.
type Found = (ObjectRef, Vec<Condition>);
/// What a pass saw of a share, by share.
type SeenShares = HashMap<(ShareKind, String), (ObjectRef, Vec<Condition>, Seen)>;

/// A share's backing object, its names checked: the only form in which it is ever asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Backing {
    namespace: NamespaceName,
    name: ObjectName,
}

impl Backing {
    /// The object `share` of `kind` names, when both its names are valid; otherwise the share is
    /// broken (FAILED_PRECONDITION), which empties its volumes as a deleted share would.
    fn of(kind: ShareKind, share: &ObjectName, named: &ObjectRef) -> Result<Backing> {
        let broken = |error: sharedresource_api::object_name::InvalidName| {
            Error::Unservable(format!(
                "{} {share} names a {} that cannot exist: {error}",
                kind.kind(),
                kind.backing_kind()
            ))
        };
        Ok(Backing {
            namespace: NamespaceName::parse(&named.namespace).map_err(broken)?,
            name: ObjectName::parse(&named.name).map_err(broken)?,
        })
    }
}

/// Answers shared by the volumes of one refresh pass, and what it saw of each share (written to
/// the shares' status when the pass ends).
#[derive(Default)]
pub(crate) struct Pass {
    shares: HashMap<(ShareKind, ObjectName), Option<Found>>,
    access: HashMap<AccessQuestion, bool>,
    backing: HashMap<(ShareKind, Backing), Option<Payload>>,
    /// Projections by namespace and name, `None` when absent.
    pub(crate) projections: HashMap<(NamespaceName, ObjectName), Option<ProjectionSpec>>,
    seen: SeenShares,
}

/// Shares read from the cluster with `client`.
pub struct KubernetesSource {
    client: kube::Client,
    // Publish and refresh run on the blocking pool; the client's calls run on this runtime.
    runtime: tokio::runtime::Handle,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    answers: Arc<HeldAnswers>,
    changes: Arc<Changes>,
    passes: Mutex<HashMap<PassId, Pass>>,
    metrics: Arc<Metrics>,
    request_timeout: Duration,
    /// Whether pods may be read for their labels and annotations (`podMetadata`).
    pub(crate) pod_metadata: bool,
    /// The most bytes one volume's content may hold (`tmpfsSize`): a projection composing more
    /// is refused before it is held.
    pub(crate) content_limit: u64,
    /// The providers of secrets kept outside Kubernetes this node runs.
    providers: Providers,
    watches: tokio::task::JoinHandle<()>,
}

impl Drop for KubernetesSource {
    fn drop(&mut self) {
        self.watches.abort();
    }
}

impl KubernetesSource {
    /// A source asking the cluster `clients` talk to (requests on one client, watches on the
    /// other), on `runtime`, counting into `metrics`, whose watches start now. Each request is given up after 10 s
    /// ([`KubernetesSource::with_request_timeout`] changes it).
    pub fn new(
        clients: impl Into<ApiserverClients>,
        runtime: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
    ) -> KubernetesSource {
        let ApiserverClients { requests: client, watches: watch_connections } = clients.into();
        let served = Arc::new(Served::default());
        let cache = Arc::new(ShareCache::default());
        let changes = Arc::new(Changes::default());
        let answers = Arc::new(HeldAnswers::new(DEFAULT_ACCESS_RECHECK));
        changes.on_grant_looks({
            let answers = answers.clone();
            move |look| answers.look(look)
        });
        let watches = runtime.spawn(watch_changes(
            watch_connections,
            served.clone(),
            cache.clone(),
            changes.clone(),
            metrics.clone(),
        ));
        KubernetesSource {
            client,
            runtime,
            served,
            cache,
            answers,
            changes,
            passes: Mutex::default(),
            metrics,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pod_metadata: false,
            content_limit: u64::MAX,
            providers: Providers::default(),
            watches,
        }
    }

    /// The same source, refusing a projection whose files would hold more than `bytes` (the
    /// volume's tmpfsSize) before composing further.
    pub fn with_content_limit(mut self, bytes: u64) -> KubernetesSource {
        self.content_limit = bytes;
        self
    }

    /// The same source, giving up each request after `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> KubernetesSource {
        self.request_timeout = timeout;
        self
    }

    /// The same source, holding an access answer for about `recheck` (±10%) unless a grant's
    /// change concerns it first (`accessRecheckSeconds`; 600 s unless changed).
    pub fn with_access_recheck(self, recheck: Duration) -> KubernetesSource {
        self.answers.set_recheck(recheck);
        self
    }

    /// The same source, reading pods for projections that show their labels or annotations
    /// when `allowed` (off unless asked: it needs `get pods` cluster-wide).
    pub fn with_pod_metadata(mut self, allowed: bool) -> KubernetesSource {
        self.pod_metadata = allowed;
        self
    }

    /// The same source, serving volumes that name one of `providers`.
    pub fn with_providers(mut self, providers: Providers) -> KubernetesSource {
        self.providers = providers;
        self
    }

    /// The client the source asks with.
    pub(crate) fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Where the source notes what changed.
    pub(crate) fn change_log(&self) -> &Changes {
        &self.changes
    }

    /// `call`'s answer within the request timeout, its failure in the driver's words.
    pub(crate) async fn ask<T>(
        &self,
        what: impl FnOnce() -> String,
        call: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
    ) -> Result<T> {
        ask(self.request_timeout, what, call).await
    }

    fn with_pass<T>(&self, pass: Option<PassId>, use_it: impl FnOnce(&mut Pass) -> T) -> Option<T> {
        let pass = pass?;
        self.passes.locked().get_mut(&pass).map(use_it)
    }

    /// `compute`'s answer for `key`, shared within pass `pass` through the map `field` picks.
    pub(crate) async fn shared<K, V, F>(
        &self,
        pass: Option<PassId>,
        key: K,
        field: fn(&mut Pass) -> &mut HashMap<K, V>,
        compute: F,
    ) -> Result<V>
    where
        K: std::hash::Hash + Eq,
        V: Clone,
        F: std::future::Future<Output = Result<V>>,
    {
        if let Some(Some(value)) = self.with_pass(pass, |p| field(p).get(&key).cloned()) {
            return Ok(value);
        }
        let value = compute.await?;
        self.with_pass(pass, |p| field(p).insert(key, value.clone()));
        Ok(value)
    }

    async fn payload(&self, request: &VolumeAsk, pass: Option<PassId>) -> Result<Payload> {
        match volume_of(request)? {
            Selection::Share(kind, share) => self.share_payload(&request.pod, kind, &share, pass).await,
            Selection::Projection(name) => self.projection_payload(request, &name, pass).await,
            Selection::Provider(name) => self.provider_payload(request, &name, pass).await,
        }
    }

    /// The files of `request`'s volume from provider `name`, once the pod's service account is
    /// allowed to use it (the same check as a share's, for resource `providers`).
    async fn provider_payload(&self, request: &VolumeAsk, name: &ObjectName, pass: Option<PassId>) -> Result<Payload> {
        self.may_use_provider(request, name, pass).await?;
        let request = self.provider_ask(request, name).await?;
        self.providers.files(name.as_str(), &request).await
    }

    /// What provider `name` is asked for `request`'s volume: its own attributes, or those of
    /// the SecretProviderClass it names (read now, so a change to the class reaches the next
    /// refresh).
    async fn provider_ask<'a>(&self, request: &'a VolumeAsk, name: &ObjectName) -> Result<Cow<'a, VolumeAsk>> {
        let Some(class) = provider_class::named_class(request)? else {
            return Ok(Cow::Borrowed(request));
        };
        if !self.providers.is_secrets_store(name.as_str()) {
            return Err(Error::Invalid(format!(
                "volumeAttributes[{:?}] is for providers of kind secrets-store; provider {} is not one",
                provider_class::CLASS_ATTRIBUTE,
                quote(name.as_str())
            )));
        }
        let parameters =
            provider_class::class_parameters(&self.client, self.request_timeout, request, &class, name.as_str())
                .await?;
        Ok(Cow::Owned(provider_class::with_parameters(request, name.as_str(), parameters)))
    }

    /// Nothing when `request`'s pod may use provider `name`, a node's provider; otherwise why not.
    async fn may_use_provider(&self, request: &VolumeAsk, name: &ObjectName, pass: Option<PassId>) -> Result<()> {
        self.providers.known(name.as_str())?;
        let question = AccessQuestion {
            namespace: request.pod.namespace.clone(),
            service_account: request.pod.service_account.clone(),
            kind: Guarded::Provider,
            name: name.as_str().to_string(),
        };
        if !self.shared(pass, question.clone(), |p| &mut p.access, self.allowed(&question)).await? {
            return Err(Error::Denied(question.denial()));
        }
        Ok(())
    }

    /// The files of `request`'s volume when its provider fetches them only when opened.
    async fn lazy_files(&self, request: &VolumeAsk) -> Result<Option<Arc<LazyFiles>>> {
        let Some(name) = request.attributes.get(PROVIDER_ATTRIBUTE).filter(|name| self.providers.is_lazy(name)) else {
            return Ok(None);
        };
        // The whole attribute check, as for any volume: a lazy volume naming a share too is
        // refused alike.
        let Selection::Provider(name) = volume_of(request)? else {
            return Err(Error::Internal(format!("volume of provider {} read as another kind", quote(name))));
        };
        self.may_use_provider(request, &name, None).await?;
        let request = self.provider_ask(request, &name).await?;
        self.providers.lazy_files(name.as_str(), &request).await.map(|files| Some(Arc::new(files)))
    }

    /// The files of share `share` of `kind` for `pod`, once its service account is allowed to
    /// use it.
    pub(crate) async fn share_payload(
        &self,
        pod: &PodInfo,
        kind: ShareKind,
        share: &ObjectName,
        pass: Option<PassId>,
    ) -> Result<Payload> {
        let question = AccessQuestion {
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            kind: Guarded::Share(kind),
            name: share.as_str().to_string(),
        };
        // The share and the access check do not depend on each other: asked at once, one round
        // trip to the apiserver instead of two (a missing share still answers NOT_FOUND first).
        let (found, allowed) = tokio::join!(
            self.shared(pass, (kind, share.clone()), |p| &mut p.shares, self.share(kind, share)),
            self.shared(pass, question.clone(), |p| &mut p.access, self.allowed(&question)),
        );
        let (named, conditions) = found?.ok_or_else(|| Error::Missing(share_not_found(kind, share)))?;
        if !allowed? {
            return Err(Error::Denied(question.denial()));
        }
        let backing = Backing::of(kind, share, &named)?;
        self.served.note(kind, &named.namespace, &named.name, share.as_str());
        let payload =
            self.shared(pass, (kind, backing.clone()), |p| &mut p.backing, self.backing(kind, &backing)).await;
        let seen = match &payload {
            Ok(Some(_)) => Seen::Read,
            Ok(None) => Seen::Missing,
            Err(error) => Seen::Unreadable(error.to_string()),
        };
        self.with_pass(pass, |p| p.seen.insert((kind, share.as_str().to_string()), (named, conditions, seen)));
        payload?.ok_or_else(|| {
            Error::Missing(format!(
                "{} {}/{}, shared by {} {}, not found",
                kind.backing_kind(),
                backing.namespace,
                backing.name,
                kind.kind(),
                quote(share.as_str())
            ))
        })
    }

    /// The object a share names and the conditions it reports, `None` when the share does not
    /// exist.
    async fn share(&self, kind: ShareKind, share: &ObjectName) -> Result<Option<Found>> {
        // The watch's copy when it has one; a share it has not delivered yet (created a moment
        // ago) is asked for.
        if let Some(found) = self.cache.share(kind, share.as_str()) {
            return Ok(Some(found));
        }
        match kind {
            ShareKind::Secret => self.read_share::<SharedSecret>(share).await,
            ShareKind::ConfigMap => self.read_share::<SharedConfigMap>(share).await,
        }
    }

    /// Share `share` of kind `S` as the apiserver has it now.
    async fn read_share<S: Share>(&self, share: &ObjectName) -> Result<Option<Found>> {
        let what = || format!("reading {} {}", S::KIND.kind(), quote(share.as_str()));
        let found = self.ask(&what, Api::<S>::all(self.client.clone()).get_opt(share.as_str())).await?;
        Ok(found.map(|share| (share.backing_ref().clone(), share.conditions())))
    }

    /// Whether the apiserver says the pod's service account may use the share: its answer
    /// held from before when no grant's change has concerned it since (and it is not due).
    async fn allowed(&self, question: &AccessQuestion) -> Result<bool> {
        if let Some(allowed) = self.answers.answer(question) {
            return Ok(allowed);
        }
        let asked = self.answers.asking();
        let what = || "asking the apiserver whether the pod may use the share".to_string();
        let api = Api::<SubjectAccessReview>::all(self.client.clone());
        let review =
            self.ask(what, api.create(&PostParams::default(), &question.review())).await.inspect_err(|_| {
                self.metrics.access_check(AccessResult::Failed);
            })?;
        let allowed = review.status.is_some_and(|s| s.allowed);
        self.metrics.access_check(if allowed { AccessResult::Allowed } else { AccessResult::Denied });
        self.answers.hold(question, allowed, asked);
        Ok(allowed)
    }

    /// The files of a backing object, `None` when it does not exist.
    async fn backing(&self, kind: ShareKind, backing: &Backing) -> Result<Option<Payload>> {
        let (namespace, name) = (backing.namespace.as_str(), backing.name.as_str());
        if let Some(payload) = self.cache.content(kind, namespace, name) {
            return Ok(Some(payload));
        }
        let read = match kind {
            ShareKind::Secret => self.read_backing::<SharedSecret>(backing).await?,
            ShareKind::ConfigMap => self.read_backing::<SharedConfigMap>(backing).await?,
        };
        let Some((payload, version)) = read else {
            return Ok(None);
        };
        if let Some(version) = version {
            self.cache.store_content(kind, namespace, name, version, payload.clone());
        }
        Ok(Some(payload))
    }

    /// The files of backing object `backing` of a share of kind `S` and its resourceVersion,
    /// as the apiserver has them now; `None` when it does not exist.
    async fn read_backing<S: Share>(&self, backing: &Backing) -> Result<Option<(Payload, Option<String>)>> {
        let (namespace, name) = (backing.namespace.as_str(), backing.name.as_str());
        let what = || format!("reading {} {namespace}/{name}", S::KIND.backing_kind());
        let not_granted = |NotGranted| {
            Error::Unavailable(format!(
                "the driver may not read {} {namespace}/{name} yet: the read-grants controller \
                 (sharedresource-read-grants) grants it to the driver once a share names it",
                S::KIND.backing_kind()
            ))
        };
        let api = Api::<S::Backing>::namespaced(self.client.clone(), namespace);
        let Some(object) = self.ask(what, granted(api.get_opt(name))).await?.map_err(not_granted)? else {
            return Ok(None);
        };
        let version = object.meta().resource_version.clone();
        Ok(Some((S::files(object), version)))
    }
}

/// The apiserver refused the driver a backing object: RBAC does not (yet) grant it.
struct NotGranted;

/// `call`'s answer, with a refusal (403) told apart from other failures: the driver reads a
/// backing object only once the read-grants controller has granted it, which follows a new
/// share by moments, and that is worth saying in the driver's own words.
async fn granted<T>(
    call: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
) -> std::result::Result<std::result::Result<T, NotGranted>, kube::Error> {
    match call.await {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Err(NotGranted)),
        answer => answer.map(Ok),
    }
}

/// Writes the status of every share a pass saw whose conditions changed, with `client`, each
/// request given up after `timeout`.
async fn write_statuses(client: kube::Client, timeout: Duration, seen: SeenShares) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for ((kind, share), (backing, current, seen)) in seen {
        let what = format!("{} {}/{}", kind.backing_kind(), backing.namespace, backing.name);
        let Some(conditions) = desired(&current, &seen, &what, now.clone()) else { continue };
        // Only shares a pass found are seen, so the name is one the apiserver gave.
        let Ok(name) = ObjectName::parse(&share) else { continue };
        let patch = Patch::Merge(serde_json::json!({"status": {"conditions": conditions}}));
        let request = || format!("writing the status of {} {}", kind.kind(), quote(&share));
        let written = match kind {
            ShareKind::Secret => write_status::<SharedSecret>(&client, &name, &patch, (timeout, request)).await,
            ShareKind::ConfigMap => write_status::<SharedConfigMap>(&client, &name, &patch, (timeout, request)).await,
        };
        if let Err(error) = written {
            warn!(error = %Logged(&error), "could not write the share's status");
        }
    }
}

/// Writes `patch` to the status of share `name` of kind `S`, given up after `timeout`.
async fn write_status<S: Share>(
    client: &kube::Client,
    name: &ObjectName,
    patch: &Patch<serde_json::Value>,
    (timeout, what): (Duration, impl Fn() -> String),
) -> Result<()> {
    let api = Api::<S>::all(client.clone());
    ask(timeout, what, api.patch_status(name.as_str(), &PatchParams::default(), patch)).await.map(drop)
}

/// What a request's volume mounts: the one thing it names, by the vocabulary's rules. The other
/// attributes are checked at publish ([`ContentSource::check_attributes`]), not at each refresh.
fn volume_of(request: &VolumeAsk) -> Result<Selection> {
    Ok(selection(&request.attributes)?)
}

impl ContentSource for KubernetesSource {
    fn ready(&self) -> bool {
        true
    }

    fn content(&self, request: &VolumeAsk) -> Result<Payload> {
        self.runtime.block_on(self.payload(request, None))
    }

    fn check_attributes(&self, request: &VolumeAsk) -> Result<()> {
        VolumeAttributes::parse(&request.attributes)?;
        Ok(())
    }

    fn content_in_pass(&self, request: &VolumeAsk, pass: PassId) -> Result<Payload> {
        self.runtime.block_on(self.payload(request, Some(pass)))
    }

    fn lazy(&self, request: &VolumeAsk) -> Result<Option<Arc<LazyFiles>>> {
        self.runtime.block_on(self.lazy_files(request))
    }

    fn lazy_handed(&self, handed: HandedFiles) -> Result<Arc<LazyFiles>> {
        // On the source's runtime: the files' gets run there.
        let _entered = self.runtime.enter();
        self.providers.lazy_handed(handed).map(Arc::new)
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        Some(self.changes.clone())
    }

    fn released(&self, volume_id: &str) {
        self.providers.release(volume_id);
    }

    fn object_versions(&self, volume_id: &str) -> std::collections::BTreeMap<String, String> {
        self.providers.object_versions(volume_id)
    }

    fn start_pass(&self, pass: PassId) {
        self.passes.locked().insert(pass, Pass::default());
    }

    fn end_pass(&self, pass: PassId) {
        let pass = self.passes.locked().remove(&pass);
        if let Some(pass) = pass {
            // Spawned, not awaited: a pass may end anywhere (its last volume's task, shutdown),
            // and the statuses are a report, not part of any volume's refresh.
            self.runtime.spawn(write_statuses(self.client.clone(), self.request_timeout, pass.seen));
        }
    }
}

#[cfg(test)]
mod tests;
