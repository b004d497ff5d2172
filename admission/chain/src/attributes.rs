//! What an admission plugin is told about a request, as kube-apiserver's `admission.Attributes`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use inline_guard_policy::pod_spec::owned;
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
pub struct GroupVersionKind<'a> {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: Cow<'a, str>,
    /// API version.
    pub version: Cow<'a, str>,
    /// Kind.
    pub kind: Cow<'a, str>,
}

/// An API group, version and resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionResource<'a> {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: Cow<'a, str>,
    /// API version.
    pub version: Cow<'a, str>,
    /// Plural resource name.
    pub resource: Cow<'a, str>,
}

impl GroupVersionKind<'_> {
    /// The same kind, owning its text.
    pub fn into_owned(self) -> GroupVersionKind<'static> {
        GroupVersionKind { group: owned(self.group), version: owned(self.version), kind: owned(self.kind) }
    }
}

impl GroupVersionResource<'_> {
    /// The same resource, owning its text.
    pub fn into_owned(self) -> GroupVersionResource<'static> {
        GroupVersionResource { group: owned(self.group), version: owned(self.version), resource: owned(self.resource) }
    }
}

impl<'a> GroupVersionResource<'a> {
    /// A resource in the given group at version `v1`.
    pub fn v1(group: &'a str, resource: &'a str) -> GroupVersionResource<'a> {
        GroupVersionResource { group: group.into(), version: "v1".into(), resource: resource.into() }
    }
}

/// Who made the request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo<'a> {
    /// The authenticated username.
    #[serde(default)]
    pub username: Cow<'a, str>,
    /// The user's UID.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub uid: Cow<'a, str>,
    /// Group memberships.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<Cow<'a, str>>,
    /// Additional authenticator attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo<'_> {
    /// The same user, owning its text.
    pub fn into_owned(self) -> UserInfo<'static> {
        UserInfo {
            username: owned(self.username),
            uid: owned(self.uid),
            groups: self.groups.into_iter().map(owned).collect(),
            extra: self.extra,
        }
    }
}

impl UserInfo<'static> {
    /// The unauthenticated user, as kube-apiserver names it.
    pub fn anonymous() -> UserInfo<'static> {
        UserInfo {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..Default::default()
        }
    }
}

/// Everything a plugin may read about one request. Mutating plugins change `object` in place.
///
/// Its text borrows from the request body for `'a` (the webhook decodes without copying a string
/// that has no escapes); [`Attributes::into_owned`] frees it from the body for a caller that keeps
/// it longer. Text decoded by serde is owned from the start.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// The verb.
    pub operation: Operation,
    /// The kind of `object`.
    pub kind: GroupVersionKind<'a>,
    /// The resource requested.
    pub resource: GroupVersionResource<'a>,
    /// The subresource (`ephemeralcontainers`, `status`, ...), empty for the main resource.
    pub subresource: Cow<'a, str>,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: Cow<'a, str>,
    /// The object name; empty when the server will generate it.
    pub name: Cow<'a, str>,
    /// The new object (absent for DELETE and CONNECT).
    pub object: Option<AdmissionObject<'a>>,
    /// The existing object (UPDATE and DELETE).
    pub old_object: Option<AdmissionObject<'a>>,
    /// The requesting user.
    pub user_info: UserInfo<'a>,
    /// True when the request will not be persisted.
    pub dry_run: bool,
}

impl<'a> Attributes<'a> {
    /// A CREATE of `object` by `system:anonymous` in `namespace`, under no request name: what a
    /// host evaluates for an object that came without a request (`check`, `audit`, tests and
    /// benchmarks set the kind or name they know on top).
    pub fn anonymous_create(
        resource: GroupVersionResource<'a>,
        namespace: impl Into<Cow<'a, str>>,
        object: AdmissionObject<'a>,
    ) -> Attributes<'a> {
        Attributes {
            operation: Operation::Create,
            kind: GroupVersionKind::default(),
            resource,
            subresource: "".into(),
            namespace: namespace.into(),
            name: "".into(),
            object: Some(object),
            old_object: None,
            user_info: UserInfo::anonymous(),
            dry_run: false,
        }
    }
}

impl Attributes<'_> {
    /// The same request, owning its text: for a caller that keeps it past the body it was read
    /// from (`check` keeps every input until it prints the table).
    pub fn into_owned(self) -> Attributes<'static> {
        Attributes {
            operation: self.operation,
            kind: self.kind.into_owned(),
            resource: self.resource.into_owned(),
            subresource: owned(self.subresource),
            namespace: owned(self.namespace),
            name: owned(self.name),
            object: self.object.map(AdmissionObject::into_owned),
            old_object: self.old_object.map(AdmissionObject::into_owned),
            user_info: self.user_info.into_owned(),
            dry_run: self.dry_run,
        }
    }

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
