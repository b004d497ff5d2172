//! What an admission plugin is told about a request, as kube-apiserver's `admission.Attributes`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::object::AdmissionObject;

/// The verb of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    /// Object creation.
    Create,
    /// Object replacement or patch (subresources included).
    Update,
    /// Object deletion.
    Delete,
    /// Proxy, exec, attach and other connect requests.
    Connect,
}

/// An API group, version and kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionKind {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

/// An API group, version and resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionResource {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
}

impl GroupVersionResource {
    /// A resource in the given group at version `v1`.
    pub fn v1(group: &str, resource: &str) -> GroupVersionResource {
        GroupVersionResource { group: group.into(), version: "v1".into(), resource: resource.into() }
    }
}

/// Who made the request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// The authenticated username.
    #[serde(default)]
    pub username: String,
    /// The user's UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Group memberships.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Additional authenticator attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The unauthenticated user, as kube-apiserver names it.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..Default::default()
        }
    }
}

/// Everything a plugin may read about one request. Mutating plugins change `object` in place.
#[derive(Debug, Clone)]
pub struct Attributes {
    /// The verb.
    pub operation: Operation,
    /// The kind of `object`.
    pub kind: GroupVersionKind,
    /// The resource requested.
    pub resource: GroupVersionResource,
    /// The subresource (`ephemeralcontainers`, `status`, ...), empty for the main resource.
    pub subresource: String,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The object name; empty when the server will generate it.
    pub name: String,
    /// The new object (absent for DELETE and CONNECT).
    pub object: Option<AdmissionObject>,
    /// The existing object (UPDATE and DELETE).
    pub old_object: Option<AdmissionObject>,
    /// The requesting user.
    pub user_info: UserInfo,
    /// True when the request will not be persisted.
    pub dry_run: bool,
}

impl Attributes {
    /// The name messages use: the request's name, else the object's name, else its
    /// `generateName` prefix (pods made by controllers have no name yet at admission).
    pub fn display_name(&self) -> &str {
        if !self.name.is_empty() {
            return &self.name;
        }
        let names = self.object.as_ref().map(|object| &object.names);
        names
            .and_then(|n| n.name.as_deref().filter(|name| !name.is_empty()))
            .or_else(|| names.and_then(|n| n.generate_name.as_deref()))
            .unwrap_or_default()
    }
}
