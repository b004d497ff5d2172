//! A provider's volume asked through the cluster: the pod's service account must be allowed to
//! `use` the provider (the same check as a share's, for resource `providers`), and a volume that
//! names a SecretProviderClass gets the class's parameters, read at each publish and refresh so
//! that a change to the class reaches the next refresh.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::provider_class;
use super::providers::Providers;
use crate::content::PassId;
use crate::content::ask::VolumeAsk;
use crate::content::cluster::Cluster;
use crate::content::error::{Error, Result};
use crate::content::lazy::LazyFiles;
use crate::content::payload::Payload;
use crate::quote::quote;
use sharedresource_api::access::{AccessQuestion, Guarded};
use sharedresource_api::object_name::ObjectName;

/// The files of `request`'s volume from provider `name`, once the pod's service account is
/// allowed to use it, with what the provider answered of each object's version.
pub async fn payload(
    cluster: &Cluster,
    providers: &Providers,
    request: &VolumeAsk,
    name: &ObjectName,
    pass: Option<PassId>,
) -> Result<(Payload, BTreeMap<String, String>)> {
    may_use_provider(cluster, providers, request, name, pass).await?;
    let request = provider_ask(cluster, providers, request, name).await?;
    providers.files(name.as_str(), &request).await
}

/// The files of `request`'s volume of lazy provider `name`, fetched when opened, once the pod's
/// service account is allowed to use it.
pub async fn lazy_files(
    cluster: &Cluster,
    providers: &Providers,
    request: &VolumeAsk,
    name: &ObjectName,
) -> Result<Arc<dyn LazyFiles>> {
    may_use_provider(cluster, providers, request, name, None).await?;
    let request = provider_ask(cluster, providers, request, name).await?;
    let files = providers.lazy_files(name.as_str(), &request).await?;
    Ok(Arc::new(files))
}

/// What provider `name` is asked for `request`'s volume: its own attributes, or those of the
/// SecretProviderClass it names (read now, so a change to the class reaches the next refresh).
async fn provider_ask<'a>(
    cluster: &Cluster,
    providers: &Providers,
    request: &'a VolumeAsk,
    name: &ObjectName,
) -> Result<Cow<'a, VolumeAsk>> {
    let Some(class) = provider_class::named_class(request)? else {
        return Ok(Cow::Borrowed(request));
    };
    if !providers.is_secrets_store(name.as_str()) {
        return Err(Error::Invalid(format!(
            "volumeAttributes[{:?}] is for providers of kind secrets-store; provider {} is not one",
            provider_class::CLASS_ATTRIBUTE,
            quote(name.as_str())
        )));
    }
    let parameters = provider_class::class_parameters(cluster, request, &class, name.as_str()).await?;
    Ok(Cow::Owned(provider_class::with_parameters(request, name.as_str(), parameters)))
}

/// Nothing when `request`'s pod may use provider `name`, a node's provider; otherwise why not.
async fn may_use_provider(
    cluster: &Cluster,
    providers: &Providers,
    request: &VolumeAsk,
    name: &ObjectName,
    pass: Option<PassId>,
) -> Result<()> {
    providers.known(name.as_str())?;
    let question = AccessQuestion {
        namespace: request.pod.namespace.clone(),
        service_account: request.pod.service_account.clone(),
        kind: Guarded::Provider,
        name: name.as_str().to_string(),
    };
    cluster.may_use(&question, pass).await
}
