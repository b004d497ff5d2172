//! A Secrets Store provider's parameters from a `SecretProviderClass` (the Secrets Store CSI
//! Driver's CRD, `secrets-store.csi.x-k8s.io/v1`), as upstream's driver takes them: a volume
//! naming `secretProviderClass: NAME` gets the parameters of that object in the pod's namespace,
//! not its own attributes. The class must be for the volume's provider. Its `secretObjects`
//! (syncing to Kubernetes Secrets) are not used: this driver never writes Secrets.

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use super::helper_protocol::PROVIDER_ATTRIBUTE;
use crate::content::ask::VolumeAsk;
use crate::content::cluster::Cluster;
use crate::content::error::{Error, Result};
use crate::quote::quote;
use sharedresource_api::object_name::{NamespaceName, ObjectName};

pub use sharedresource_api::volume_attributes::CLASS_ATTRIBUTE;

/// The most parameters one class may give: more would be a class no provider reads.
const MAX_PARAMETERS: usize = 256;

/// The class `ask` names, if any. That it names nothing else for the provider is the
/// vocabulary's rule, checked with the other attributes before a provider is chosen.
pub fn named_class(ask: &VolumeAsk) -> Result<Option<ObjectName>> {
    let Some(name) = ask.attributes.get(CLASS_ATTRIBUTE) else {
        return Ok(None);
    };
    ObjectName::parse(name).map(Some).map_err(|error| Error::Invalid(format!("SecretProviderClass name {error}")))
}

/// The parameters of class `class` (its `spec`), checked to be for `provider`.
pub fn parameters(spec: &Value, class: &str, provider: &str) -> Result<BTreeMap<String, String>> {
    let named = spec.get("provider").and_then(Value::as_str).unwrap_or_default();
    if named != provider {
        return Err(Error::Invalid(format!(
            "SecretProviderClass {class} is for provider {}, not the volume's provider {}",
            quote(named),
            quote(provider)
        )));
    }
    let Some(parameters) = spec.get("parameters").filter(|p| !p.is_null()) else {
        return Ok(BTreeMap::new());
    };
    let Some(parameters) = parameters.as_object() else {
        return Err(Error::Invalid(format!("SecretProviderClass {class}: spec.parameters is not a map of strings")));
    };
    if parameters.len() > MAX_PARAMETERS {
        return Err(Error::Invalid(format!(
            "SecretProviderClass {class}: {} parameters, more than the {MAX_PARAMETERS} a volume takes",
            parameters.len()
        )));
    }
    parameters
        .iter()
        .map(|(key, value)| match value.as_str() {
            Some(text) => Ok((key.clone(), text.to_string())),
            None => Err(Error::Invalid(format!(
                "SecretProviderClass {class}: spec.parameters[{}] is not a string",
                quote(key)
            ))),
        })
        .collect()
}

/// `ask` with the attributes a class gives instead of its own: the provider, then the class's
/// parameters.
pub fn with_parameters(ask: &VolumeAsk, provider: &str, parameters: BTreeMap<String, String>) -> VolumeAsk {
    let mut attributes = parameters;
    attributes.insert(PROVIDER_ATTRIBUTE.to_string(), provider.to_string());
    VolumeAsk { attributes, ..ask.clone() }
}

/// The parameters of class `class` in the volume's pod's namespace, read from `cluster` and
/// checked to be for `provider`.
pub async fn class_parameters(
    cluster: &Cluster,
    volume: &VolumeAsk,
    class: &ObjectName,
    provider: &str,
) -> Result<BTreeMap<String, String>> {
    let namespace = NamespaceName::parse(&volume.pod.namespace)
        .map_err(|error| Error::Invalid(format!("the pod's namespace {error}")))?;
    let kind = GroupVersionKind::gvk("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClass");
    let resource = ApiResource::from_gvk_with_plural(&kind, "secretproviderclasses");
    let api = Api::<DynamicObject>::namespaced_with(cluster.client().clone(), namespace.as_str(), &resource);
    let shown = format!("{}/{}", namespace.as_str(), quote(class.as_str()));
    let what = || format!("reading SecretProviderClass {shown}");
    match cluster.ask(what, api.get_opt(class.as_str())).await? {
        Some(object) => parameters(object.data.get("spec").unwrap_or(&Value::Null), &shown, provider),
        None => Err(Error::Missing(format!(
            "SecretProviderClass {shown} does not exist (or the Secrets Store CSI Driver's CRD is not installed)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_class_gives_its_parameters_to_its_own_provider_only() {
        let spec = json!({"provider": "vault", "parameters": {"roleName": "db", "objects": "array: []"}});
        let got = parameters(&spec, "team-a/\"db\"", "vault").unwrap();
        assert_eq!(got, BTreeMap::from([("objects".into(), "array: []".into()), ("roleName".into(), "db".into())]));
        assert_eq!(
            parameters(&spec, "team-a/\"db\"", "aws").unwrap_err(),
            Error::Invalid(
                "SecretProviderClass team-a/\"db\" is for provider \"vault\", not the volume's provider \"aws\"".into()
            )
        );
        assert_eq!(parameters(&json!({"provider": "vault"}), "c", "vault").unwrap(), BTreeMap::new());
        assert_eq!(
            parameters(&json!({"provider": "vault", "parameters": {"n": 1}}), "c", "vault").unwrap_err(),
            Error::Invalid("SecretProviderClass c: spec.parameters[\"n\"] is not a string".into())
        );
    }

    #[test]
    fn a_volume_names_its_class_by_an_object_name() {
        let ask = VolumeAsk::example(&[("provider", "vault"), (CLASS_ATTRIBUTE, "db")]);
        assert_eq!(named_class(&ask).unwrap().map(|n| n.as_str().to_string()), Some("db".into()));
        assert_eq!(named_class(&VolumeAsk::example(&[("provider", "vault")])).unwrap(), None);
        let bad = VolumeAsk::example(&[("provider", "vault"), (CLASS_ATTRIBUTE, "Not_A_Name")]);
        assert!(
            matches!(named_class(&bad), Err(Error::Invalid(m)) if m.starts_with("SecretProviderClass name \"Not_A_Name\""))
        );
    }

    #[test]
    fn the_class_parameters_replace_the_volume_attributes() {
        let ask = VolumeAsk::example(&[("provider", "vault"), (CLASS_ATTRIBUTE, "db")]);
        let rewritten = with_parameters(&ask, "vault", BTreeMap::from([("roleName".into(), "db".into())]));
        assert_eq!(
            rewritten.attributes,
            BTreeMap::from([("provider".into(), "vault".into()), ("roleName".into(), "db".into())])
        );
        assert_eq!(rewritten.pod, ask.pod);
    }
}
