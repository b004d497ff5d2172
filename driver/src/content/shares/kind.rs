//! The two kinds of share, SharedSecret and SharedConfigMap, and everything that differs between
//! them said once: the names messages and RBAC use ([`ShareKind`]), and, for code generic over
//! the kind, the object a share names and the files that object holds ([`Share`]).

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::Resource;
use serde::de::DeserializeOwned;

use super::api::{ObjectRef, SharedConfigMap, SharedSecret};
use crate::content::payload::{FileContent, Payload};

/// The volume attribute naming a SharedSecret.
pub const SHARED_SECRET_ATTRIBUTE: &str = "sharedSecret";
/// The volume attribute naming a SharedConfigMap.
pub const SHARED_CONFIG_MAP_ATTRIBUTE: &str = "sharedConfigMap";

/// Which kind of share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShareKind {
    /// `SharedSecret`.
    Secret,
    /// `SharedConfigMap`.
    ConfigMap,
}

impl ShareKind {
    /// The resource name RBAC rules use.
    pub fn resource(self) -> &'static str {
        match self {
            ShareKind::Secret => "sharedsecrets",
            ShareKind::ConfigMap => "sharedconfigmaps",
        }
    }

    /// The kind, for messages.
    pub fn kind(self) -> &'static str {
        match self {
            ShareKind::Secret => "SharedSecret",
            ShareKind::ConfigMap => "SharedConfigMap",
        }
    }

    /// The kind of the backing object, for messages.
    pub fn backing_kind(self) -> &'static str {
        match self {
            ShareKind::Secret => "Secret",
            ShareKind::ConfigMap => "ConfigMap",
        }
    }

    /// The volume attribute naming shares of this kind.
    pub fn attribute(self) -> &'static str {
        match self {
            ShareKind::Secret => SHARED_SECRET_ATTRIBUTE,
            ShareKind::ConfigMap => SHARED_CONFIG_MAP_ATTRIBUTE,
        }
    }

    /// The kind a volume attribute names, `None` for any other attribute.
    pub fn of_attribute(attribute: &str) -> Option<ShareKind> {
        match attribute {
            SHARED_SECRET_ATTRIBUTE => Some(ShareKind::Secret),
            SHARED_CONFIG_MAP_ATTRIBUTE => Some(ShareKind::ConfigMap),
            _ => None,
        }
    }
}

/// A kind of share as a type, for code that reads, watches or writes shares and their objects
/// without caring which kind: [`SharedSecret`] and [`SharedConfigMap`].
pub trait Share:
    Resource<DynamicType = (), Scope = ClusterResourceScope>
    + Clone
    + std::fmt::Debug
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The backing object's type (cluster data of one namespace).
    type Backing: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static;
    /// Which kind this is.
    const KIND: ShareKind;
    /// The object the share names.
    fn backing_ref(&self) -> &ObjectRef;
    /// The conditions its status reports.
    fn conditions(&self) -> Vec<Condition>;
    /// The files a backing object holds, one per key.
    fn files(backing: Self::Backing) -> Payload;
}

impl Share for SharedSecret {
    type Backing = Secret;
    const KIND: ShareKind = ShareKind::Secret;

    fn backing_ref(&self) -> &ObjectRef {
        &self.spec.secret_ref
    }

    fn conditions(&self) -> Vec<Condition> {
        self.status.as_ref().map(|status| status.conditions.clone()).unwrap_or_default()
    }

    fn files(secret: Secret) -> Payload {
        secret.data.unwrap_or_default().into_iter().map(|(key, value)| (key, FileContent::new(value.0))).collect()
    }
}

impl Share for SharedConfigMap {
    type Backing = ConfigMap;
    const KIND: ShareKind = ShareKind::ConfigMap;

    fn backing_ref(&self) -> &ObjectRef {
        &self.spec.config_map_ref
    }

    fn conditions(&self) -> Vec<Condition> {
        self.status.as_ref().map(|status| status.conditions.clone()).unwrap_or_default()
    }

    fn files(config_map: ConfigMap) -> Payload {
        let text = config_map.data.unwrap_or_default().into_iter().map(|(key, value)| (key, value.into_bytes()));
        let binary = config_map.binary_data.unwrap_or_default().into_iter().map(|(key, value)| (key, value.0));
        text.chain(binary).map(|(key, bytes)| (key, FileContent::new(bytes))).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn each_kind_is_found_again_from_its_attribute() {
        for kind in [ShareKind::Secret, ShareKind::ConfigMap] {
            assert_eq!(ShareKind::of_attribute(kind.attribute()), Some(kind));
        }
        assert_eq!(ShareKind::of_attribute("projection"), None);
        assert_eq!(<SharedSecret as Share>::KIND.kind(), SharedSecret::kind(&()));
        assert_eq!(<SharedConfigMap as Share>::KIND.kind(), SharedConfigMap::kind(&()));
        assert_eq!(ShareKind::Secret.resource(), SharedSecret::plural(&()));
        assert_eq!(ShareKind::ConfigMap.resource(), SharedConfigMap::plural(&()));
    }

    #[test]
    fn a_config_map_gives_its_text_and_its_binary_keys() {
        let config_map = ConfigMap {
            data: Some(BTreeMap::from([("a.txt".to_string(), "text".to_string())])),
            binary_data: Some(BTreeMap::from([("b.bin".to_string(), ByteString(vec![0, 1]))])),
            ..ConfigMap::default()
        };
        let files = SharedConfigMap::files(config_map);
        assert_eq!(files.keys().collect::<Vec<_>>(), ["a.txt", "b.bin"]);
        assert_eq!(files["b.bin"], FileContent::new(vec![0, 1]));
    }
}
