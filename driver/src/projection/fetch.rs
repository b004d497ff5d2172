//! A projection's sources fetched from the cluster: the `SharedProjection` in the pod's
//! namespace, each share it names through the same access check and read as a volume of one
//! share, the pod's labels and annotations when a `podInfo` item shows them, and the tokens
//! kubelet passed; then composed into one payload. All or nothing, as kubelet's projected
//! volume: one source refused, missing or unreadable fails the whole volume, naming it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::api::{ProjectionSpec, SharedProjection, SourceKind};
use super::compose::{SourceData, check_spec, compose};
use super::downward::{PodFacts, PodField};
use crate::atomic_writer::Payload;
use crate::error::{Error, Result};
use crate::publish_request::PublishRequest;
use crate::quote::quote;
use crate::shares::access::ShareKind;
use crate::shares::source::KubernetesSource;
use crate::shares::watch::attribute;

impl KubernetesSource {
    /// The files of projection `name` for the pod of `request`.
    pub(crate) async fn projection_payload(&self, request: &PublishRequest, name: &str) -> Result<Payload> {
        let namespace = &request.pod.namespace;
        let key = (namespace.clone(), name.to_string());
        let spec = self.shared(key, |pass| &mut pass.projections, self.projection(namespace, name)).await?;
        let Some(spec) = spec else {
            return Err(Error::NotFound(format!("SharedProjection {namespace}/{} not found", quote(name))));
        };
        let shares = shares_of(&spec);
        // Noted before anything is fetched: a share that fails now must still wake this
        // projection's volumes when it changes.
        let named = shares.iter().map(|(kind, share)| (attribute(*kind), share.as_str()));
        self.change_log().projection_uses(namespace, name, named);
        check_spec(&spec).map_err(|e| in_projection(namespace, name, e))?;

        let fetched = futures_util::future::join_all(
            shares.iter().map(|(kind, share)| self.share_payload(&request.pod, *kind, share)),
        )
        .await;
        let mut data = SourceData { tokens: request.tokens.clone(), ..SourceData::default() };
        let mut failures = Vec::new();
        for ((kind, share), payload) in shares.into_iter().zip(fetched) {
            match payload {
                Ok(payload) => {
                    let object = payload.into_iter().map(|(key, file)| (key, file.data)).collect();
                    data.shares.insert((kind, share), object);
                }
                Err(error) => failures.push(error),
            }
        }
        // A source withdrawn (refused, gone) outranks one that could not be read now: the
        // volume is emptied rather than kept on the strength of another source's outage.
        if let Some(error) = failures.iter().position(withdraws).or((!failures.is_empty()).then_some(0)) {
            return Err(failures.swap_remove(error));
        }
        data.pod = self.pod_facts(request, &spec).await?;
        compose(&spec, &data).map_err(|e| in_projection(namespace, name, e))
    }

    /// The spec of projection `name` in `namespace`, `None` when it does not exist.
    async fn projection(&self, namespace: &str, name: &str) -> Result<Option<ProjectionSpec>> {
        let found = Api::<SharedProjection>::namespaced(self.client().clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| Error::Unavailable(format!("reading SharedProjection {namespace}/{}: {e}", quote(name))))?;
        Ok(found.map(|projection| projection.spec))
    }

    /// What the driver knows of the pod: names from kubelet; labels and annotations from the
    /// apiserver, read only when an item shows them, and only from the pod of this uid.
    async fn pod_facts(&self, request: &PublishRequest, spec: &ProjectionSpec) -> Result<PodFacts> {
        let pod = &request.pod;
        let mut facts = PodFacts {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: pod.uid.clone(),
            service_account_name: pod.service_account.clone(),
            ..PodFacts::default()
        };
        let needs_object = spec.sources.iter().filter_map(|source| source.pod_info.as_ref()).any(|info| {
            info.items.iter().any(|item| PodField::parse(&item.field_path).is_ok_and(|f| f.needs_pod_object()))
        });
        if !needs_object {
            return Ok(facts);
        }
        let what = format!("pod {}/{}", pod.namespace, quote(&pod.name));
        let found = Api::<Pod>::namespaced(self.client().clone(), &pod.namespace)
            .get_opt(&pod.name)
            .await
            .map_err(|e| Error::Unavailable(format!("reading {what} for its labels and annotations: {e}")))?;
        // A pod of the same name but another uid is a successor: its labels are not this one's.
        let Some(object) = found.filter(|found| found.metadata.uid.as_deref() == Some(pod.uid.as_str())) else {
            return Err(Error::NotFound(format!("{what} (uid {}) not found", quote(&pod.uid))));
        };
        facts.labels = object.metadata.labels.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>();
        facts.annotations = object.metadata.annotations.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>();
        Ok(facts)
    }
}

/// The shares a projection names, each once, in a fixed order.
pub fn shares_of(spec: &ProjectionSpec) -> BTreeSet<(ShareKind, String)> {
    spec.sources
        .iter()
        .filter_map(|source| match source.kind()? {
            SourceKind::SharedSecret(share) => Some((ShareKind::Secret, share.name.clone())),
            SourceKind::SharedConfigMap(share) => Some((ShareKind::ConfigMap, share.name.clone())),
            SourceKind::PodInfo(_) | SourceKind::ServiceAccountToken(_) => None,
        })
        .collect()
}

/// Whether `error` says the content may no longer be had (rather than: not now).
fn withdraws(error: &Error) -> bool {
    matches!(error, Error::PermissionDenied(_) | Error::NotFound(_) | Error::InvalidArgument(_))
}

/// `error`, saying which projection it is about.
fn in_projection(namespace: &str, name: &str, error: Error) -> Error {
    let context = |message: String| format!("SharedProjection {namespace}/{}: {message}", quote(name));
    match error {
        Error::InvalidArgument(message) => Error::InvalidArgument(context(message)),
        Error::FailedPrecondition(message) => Error::FailedPrecondition(context(message)),
        other => other,
    }
}
