//! A volume of one share: its files are the share's backing Secret or ConfigMap, served only
//! while the pod's service account may `use` the share. Every publish and every refresh computes
//! the volume again: the share and its object's content from the cluster floor's cache (read
//! when it has no current copy), the access check from an answer held until a grant's change may
//! concern it, so an update reaches the volume at the next refresh, and a revoked binding or a
//! deleted share or backing object empties it; an apiserver that cannot be reached changes
//! nothing (the error is reported and the refresh retried). Within one refresh pass, answers are
//! shared between volumes: one access check per service account and share, one read per share
//! and backing object. Everything is asked through the [`Cluster`]. A volume marking the share
//! optional is served no files, instead of failing, while the share or its object does not
//! exist: never while its pod may not use the share.

use kube::Resource as _;
use kube::api::Api;

use crate::content::PassId;
use crate::content::ask::PodInfo;
use crate::content::cluster::Cluster;
use crate::content::cluster::pass::Found;
use crate::content::cluster::pass::Seen;
use crate::content::cluster::share_types::Share;
use crate::content::error::{Error, Result};
use crate::content::payload::Payload;
use crate::quote::quote;
use sharedresource_api::ShareKind;
use sharedresource_api::access::{AccessQuestion, Guarded};
use sharedresource_api::missing::share_not_found;
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::shares::{ObjectRef, SharedConfigMap, SharedSecret};

/// A share's backing object, its names checked: the only form in which it is ever asked for.
type Backing = (NamespaceName, ObjectName);

/// The object `share` of `kind` names, when both its names are valid; otherwise the share is
/// broken (an Unservable error), which empties its volumes as a deleted share would.
fn backing_of(kind: ShareKind, share: &ObjectName, named: &ObjectRef) -> Result<Backing> {
    let broken = |error: sharedresource_api::object_name::InvalidName| {
        Error::Unservable(format!("{} {share} names a {} that cannot exist: {error}", kind.kind(), kind.backing_kind()))
    };
    Ok((NamespaceName::parse(&named.namespace).map_err(broken)?, ObjectName::parse(&named.name).map_err(broken)?))
}

/// What a share gives a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareFiles {
    /// Its backing object's files.
    Read(Payload),
    /// No files: the volume marks the share optional and it, or its backing object, does not
    /// exist (said as the error would have said it).
    Absent(String),
}

/// The files of share `share` of `kind` for `pod`, once its service account is allowed to use
/// it. When `optional`, a share or backing object that does not exist is [`ShareFiles::Absent`]
/// instead of an error, but only to a pod allowed to use the share: a denial stays a denial.
pub async fn payload(
    cluster: &Cluster,
    pod: &PodInfo,
    kind: ShareKind,
    share: &ObjectName,
    optional: bool,
    pass: Option<PassId>,
) -> Result<ShareFiles> {
    let question = AccessQuestion {
        namespace: pod.namespace.clone(),
        service_account: pod.service_account.clone(),
        kind: Guarded::Share(kind),
        name: share.as_str().to_string(),
    };
    // The share and the access check do not depend on each other: asked at once, one round
    // trip to the apiserver instead of two (a missing share still answers NOT_FOUND first).
    let (found, allowed) = tokio::join!(
        cluster.shared(pass, (kind, share.clone()), |p| &mut p.shares, find_share(cluster, kind, share)),
        cluster.allowed_in(&question, pass),
    );
    let Some((named, conditions)) = found? else {
        let missing = share_not_found(kind, share);
        if !optional {
            return Err(Error::Missing(missing));
        }
        // An optional volume is refused what its pod could not have once the share exists
        // (that is what its user must fix), and an apiserver that cannot answer the access
        // question fails it, as ever.
        return match allowed? {
            true => Ok(ShareFiles::Absent(missing)),
            false => Err(Error::Denied(question.denial())),
        };
    };
    if !allowed? {
        return Err(Error::Denied(question.denial()));
    }
    let (namespace, name) = backing_of(kind, share, &named)?;
    cluster.served().note(kind, &named.namespace, &named.name, share.as_str());
    let key = (kind, namespace.clone(), name.clone());
    let payload = cluster.shared(pass, key, |p| &mut p.backing, backing(cluster, kind, &namespace, &name)).await;
    let seen = match &payload {
        Ok(Some(_)) => Seen::Read,
        Ok(None) => Seen::Missing,
        Err(error) => Seen::Unreadable(error.to_string()),
    };
    cluster.with_pass(pass, |p| p.seen.insert((kind, share.as_str().to_string()), (named, conditions, seen)));
    if let Some(files) = payload? {
        return Ok(ShareFiles::Read(files));
    }
    let missing = format!(
        "{} {namespace}/{name}, shared by {} {}, not found",
        kind.backing_kind(),
        kind.kind(),
        quote(share.as_str())
    );
    match optional {
        true => Ok(ShareFiles::Absent(missing)),
        false => Err(Error::Missing(missing)),
    }
}

/// The object a share names and the conditions it reports, `None` when the share does not
/// exist.
async fn find_share(cluster: &Cluster, kind: ShareKind, share: &ObjectName) -> Result<Option<Found>> {
    // The copy held since it was last read, until this node is told the share changed; else it
    // is asked for.
    if let Some(found) = cluster.cache().share(kind, share.as_str()) {
        return Ok(Some(found));
    }
    let read = cluster.cache().read_begins();
    let found = match kind {
        ShareKind::Secret => read_share::<SharedSecret>(cluster, share).await?,
        ShareKind::ConfigMap => read_share::<SharedConfigMap>(cluster, share).await?,
    };
    cluster.cache().keep_share(read, kind, share.as_str(), found.clone());
    if found.is_none() {
        cluster.served().forget_share(kind, share.as_str());
    }
    Ok(found)
}

/// Share `share` of kind `S` as the apiserver has it now; whether its status lists this node
/// among those serving what they had is noted for the node's entries.
async fn read_share<S: Share>(cluster: &Cluster, share: &ObjectName) -> Result<Option<Found>> {
    let what = || format!("reading {} {}", S::KIND.kind(), quote(share.as_str()));
    let found = cluster.ask(&what, Api::<S>::all(cluster.client().clone()).get_opt(share.as_str())).await?;
    if let (Some(node), Some(found)) = (cluster.node(), &found) {
        cluster.written_entries().read_status((S::KIND, share.as_str().to_string()), found.lists_node(node));
    }
    Ok(found.map(|share| (share.backing_ref().clone(), share.conditions())))
}

/// The files of backing object `namespace/name` of a share of `kind`, `None` when it does not
/// exist.
async fn backing(
    cluster: &Cluster,
    kind: ShareKind,
    namespace: &NamespaceName,
    name: &ObjectName,
) -> Result<Option<Payload>> {
    let (namespace, name) = (namespace.as_str(), name.as_str());
    if let Some(payload) = cluster.cache().content(kind, namespace, name) {
        return Ok(Some(payload));
    }
    let read = match kind {
        ShareKind::Secret => read_backing::<SharedSecret>(cluster, namespace, name).await?,
        ShareKind::ConfigMap => read_backing::<SharedConfigMap>(cluster, namespace, name).await?,
    };
    let Some((payload, version)) = read else {
        return Ok(None);
    };
    if let Some(version) = version {
        cluster.cache().store_content(kind, namespace, name, version, payload.clone());
    }
    Ok(Some(payload))
}

/// The files of backing object `namespace/name` of a share of kind `S` and its
/// resourceVersion, as the apiserver has them now; `None` when it does not exist. The names
/// are checked ones (`NamespaceName`, `ObjectName`).
async fn read_backing<S: Share>(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> Result<Option<(Payload, Option<String>)>> {
    let what = || format!("reading {} {namespace}/{name}", S::KIND.backing_kind());
    let not_granted = |NotGranted| {
        Error::Unavailable(format!(
            "the driver may not read {} {namespace}/{name} yet: the read-grants controller \
             (sharedresource-read-grants) grants it to the driver once a share names it",
            S::KIND.backing_kind()
        ))
    };
    let api = Api::<S::Backing>::namespaced(cluster.client().clone(), namespace);
    let Some(object) = cluster.ask(what, granted(api.get_opt(name))).await?.map_err(not_granted)? else {
        return Ok(None);
    };
    let version = object.meta().resource_version.clone();
    Ok(Some((S::files(object), version)))
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
