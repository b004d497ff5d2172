//! A projection's sources fetched from the cluster: the `SharedProjection` in the pod's
//! namespace, each share it names through the same access check and read as a volume of one
//! share, the pod's labels and annotations when a `podInfo` item shows them, and the tokens
//! kubelet passed; then composed into one payload. All or nothing, as kubelet's projected
//! volume: one source refused, missing or unreadable fails the whole volume, naming it; a
//! source marked optional whose share or object does not exist shows nothing instead.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::compose::{SourceData, check_spec, compose};
use super::downward::{PodFacts, PodField};
use crate::content::PassId;
use crate::content::ask::VolumeAsk;
use crate::content::cluster::Cluster;
use crate::content::error::{Error, Result};
use crate::content::payload::Payload;
use crate::content::shares;
use crate::content::shares::source::ShareFiles;
use crate::quote::quote;
use sharedresource_api::ShareKind;
use sharedresource_api::missing::projection_not_found;
use sharedresource_api::node_view::NoticedObject;
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::projection::spec::{ProjectionSpec, SharedProjection, SourceKind};

/// What this node's driver allows a projection.
#[derive(Debug, Clone, Copy)]
pub struct ProjectionOptions {
    /// Whether pods may be read for their labels and annotations (`podMetadata`).
    pub pod_metadata: bool,
    /// The most bytes one volume's content may hold (`tmpfsSize`): a projection composing more
    /// is refused before it is held.
    pub content_limit: u64,
}

/// The files of projection `name` for the pod of `request`, read from `cluster` within
/// `options`, and what its optional sources lacked (each said as the error would have said it).
pub async fn payload(
    cluster: &Cluster,
    options: &ProjectionOptions,
    request: &VolumeAsk,
    name: &ObjectName,
    pass: Option<PassId>,
) -> Result<(Payload, Vec<String>)> {
    let namespace = pod_namespace(request)?;
    let key = (namespace.clone(), name.clone());
    let spec = cluster.shared(pass, key, |pass| &mut pass.projections, projection(cluster, &namespace, name)).await?;
    let Some(spec) = spec else {
        return Err(Error::Missing(projection_not_found(namespace.as_str(), name)));
    };
    // Checked before anything else is asked: a share name that is not an object name is
    // refused here, never spelled into a request, and before any access check.
    if let Err(error) = check_spec(&spec) {
        cluster.changes().projection_uses(namespace.as_str(), name.as_str(), std::iter::empty());
        return Err(in_projection(&namespace, name, error.into()));
    }
    let named_shares = shares_of(&spec)?;
    // Noted before anything is fetched: a share that fails now must still wake this
    // projection's volumes when it changes.
    let named = named_shares.keys().map(|(kind, share)| (kind.attribute(), share.as_str()));
    cluster.changes().projection_uses(namespace.as_str(), name.as_str(), named);
    let shown = named_shares.keys().map(|(kind, share)| NoticedObject::Share(*kind, share.as_str().to_string()));
    cluster.node_view().shows(namespace.as_str(), name.as_str(), shown.collect());

    let fetched = futures_util::future::join_all(named_shares.iter().map(|((kind, share), optional)| {
        shares::source::payload(cluster, &request.pod, *kind, share, *optional, pass)
    }))
    .await;
    let mut data = SourceData { tokens: request.tokens.clone(), ..SourceData::default() };
    let mut failures = Vec::new();
    let mut absent = Vec::new();
    for (((kind, share), _), payload) in named_shares.into_iter().zip(fetched) {
        let object = match payload {
            Ok(ShareFiles::Read(payload)) => payload.into_iter().map(|(key, file)| (key, file.data)).collect(),
            // Its sources are all optional: they show no key of it.
            Ok(ShareFiles::Absent(what)) => {
                absent.push(what);
                BTreeMap::new()
            }
            Err(error) => {
                failures.push(error);
                continue;
            }
        };
        data.shares.insert((kind, share.as_str().to_string()), object);
    }
    // A source withdrawn (refused, gone) outranks one that could not be read now: the
    // volume is emptied rather than kept on the strength of another source's outage.
    if let Some(error) = failures.iter().position(Error::withdraws_content).or((!failures.is_empty()).then_some(0)) {
        return Err(failures.swap_remove(error));
    }
    data.pod = pod_facts(cluster, options, request, &spec).await.map_err(|e| in_projection(&namespace, name, e))?;
    let files = compose(&spec, &data, options.content_limit).map_err(|e| in_projection(&namespace, name, e))?;
    Ok((files, absent))
}

/// The spec of projection `name` in `namespace`, `None` when it does not exist.
async fn projection(cluster: &Cluster, namespace: &NamespaceName, name: &ObjectName) -> Result<Option<ProjectionSpec>> {
    let what = || format!("reading SharedProjection {namespace}/{}", quote(name.as_str()));
    let api = Api::<SharedProjection>::namespaced(cluster.client().clone(), namespace.as_str());
    let found = cluster.ask(what, api.get_opt(name.as_str())).await?;
    Ok(found.map(|projection| projection.spec))
}

/// What the driver knows of the pod: names from kubelet; labels and annotations from the
/// apiserver, read only when an item shows them, only from the pod of this uid, and only when
/// reading pods is allowed (`podMetadata`), refused naming the item otherwise.
async fn pod_facts(
    cluster: &Cluster,
    options: &ProjectionOptions,
    request: &VolumeAsk,
    spec: &ProjectionSpec,
) -> Result<PodFacts> {
    let pod = &request.pod;
    let mut facts = PodFacts {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        uid: pod.uid.clone(),
        service_account_name: pod.service_account.clone(),
        ..PodFacts::default()
    };
    let needs_object = spec.sources.iter().enumerate().find_map(|(index, source)| {
        let items = &source.pod_info.as_ref()?.items;
        let item = items.iter().find(|i| PodField::parse(&i.field_path).is_ok_and(|f| f.needs_pod_object()))?;
        Some((index, item))
    });
    let Some((index, item)) = needs_object else {
        return Ok(facts);
    };
    if !options.pod_metadata {
        return Err(Error::Unservable(format!(
            "sources[{index}] (podInfo) shows {} of the pod, and this node's driver does not read pods \
             (podMetadata is off in its configuration; config/deploy/driver/pod-metadata.yaml opts in)",
            quote(&item.field_path)
        )));
    }
    let namespace = pod_namespace(request)?;
    let name = ObjectName::parse(&pod.name)
        .map_err(|error| Error::Invalid(format!("the pod's name from kubelet: {error}")))?;
    let what = || format!("reading pod {namespace}/{name} for its labels and annotations");
    let api = Api::<Pod>::namespaced(cluster.client().clone(), namespace.as_str());
    let found = cluster.ask(what, api.get_opt(name.as_str())).await?;
    // A pod of the same name but another uid is a successor: its labels are not this one's.
    let Some(object) = found.filter(|found| found.metadata.uid.as_deref() == Some(pod.uid.as_str())) else {
        return Err(Error::Missing(format!("pod {namespace}/{name} (uid {}) not found", quote(&pod.uid))));
    };
    facts.labels = object.metadata.labels.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>();
    facts.annotations = object.metadata.annotations.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>();
    Ok(facts)
}

/// The pod's namespace from kubelet, checked before it goes into a request.
fn pod_namespace(request: &VolumeAsk) -> Result<NamespaceName> {
    NamespaceName::parse(&request.pod.namespace)
        .map_err(|error| Error::Invalid(format!("the pod's namespace from kubelet: {error}")))
}

/// The shares a projection names, each once, in a fixed order, with whether it may be absent
/// (every source naming it is optional); a name that is not an object name is refused naming
/// its source (`check_spec` refuses it first, with the same words).
pub fn shares_of(spec: &ProjectionSpec) -> Result<BTreeMap<(ShareKind, ObjectName), bool>> {
    let mut shares = BTreeMap::new();
    for (index, source) in spec.sources.iter().enumerate() {
        let (kind, share) = match source.kind() {
            Some(SourceKind::SharedSecret(share)) => (ShareKind::Secret, share),
            Some(SourceKind::SharedConfigMap(share)) => (ShareKind::ConfigMap, share),
            _ => continue,
        };
        let name = ObjectName::parse(&share.name).map_err(|error| {
            Error::Invalid(format!("sources[{index}] ({}): the share name {error}", kind.attribute()))
        })?;
        *shares.entry((kind, name)).or_insert(true) &= share.optional;
    }
    Ok(shares)
}

/// `error`, saying which projection it is about. Refusals of what the projection asks for
/// get the projection's name; the others already name their share or say the apiserver did
/// not answer.
fn in_projection(namespace: &NamespaceName, name: &ObjectName, error: Error) -> Error {
    match error {
        Error::Invalid(_) | Error::Unservable(_) => {
            error.in_context(|message| format!("SharedProjection {namespace}/{}: {message}", quote(name.as_str())))
        }
        other => other,
    }
}
