//! The two kinds of share, SharedSecret and SharedConfigMap, as types: for code generic over the
//! kind, the object a share names and the files that object holds ([`Share`]). Their names in
//! attributes, RBAC and messages are the vocabulary crate's [`ShareKind`].

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::Resource;
use serde::de::DeserializeOwned;
use sharedresource_api::ShareKind;

use crate::content::payload::{FileContent, Payload};
use sharedresource_api::shares::{ObjectRef, ShareStatus, SharedConfigMap, SharedSecret};

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
    /// Whether its status lists `node` among the nodes whose volumes serve what they had.
    fn lists_node(&self, node: &str) -> bool;
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

    fn lists_node(&self, node: &str) -> bool {
        lists(self.status.as_ref(), node)
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

    fn lists_node(&self, node: &str) -> bool {
        lists(self.status.as_ref(), node)
    }

    fn files(config_map: ConfigMap) -> Payload {
        let text = config_map.data.unwrap_or_default().into_iter().map(|(key, value)| (key, value.into_bytes()));
        let binary = config_map.binary_data.unwrap_or_default().into_iter().map(|(key, value)| (key, value.0));
        text.chain(binary).map(|(key, bytes)| (key, FileContent::new(bytes))).collect()
    }
}

/// Whether `status` lists `node` among the nodes whose volumes serve what they had.
fn lists(status: Option<&ShareStatus>, node: &str) -> bool {
    status.is_some_and(|status| status.nodes_not_updated.iter().any(|entry| entry.node == node))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn each_kinds_names_are_those_of_its_type() {
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
