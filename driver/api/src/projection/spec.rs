//! The `SharedProjection` API (namespaced, in the pod's namespace, same group and version as the
//! shares): the sources a projection names, the items that select and rename keys, and the pod
//! fields it may show. Field names follow kubelet's `projected` volume, so a user who knows that
//! API reads this one without a manual. The CRD (`config/deploy/driver/crds.yaml`) is generated
//! from these types; its schema refuses what can be judged without data (a source of no kind or
//! of two, a mode out of range, an empty path), and publish checks the rest
//! ([`crate::projection::check::check_spec`], at creation by the admission plugin as well).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The largest mode: 0777.
const MAX_MODE: i64 = 0o777;

/// What a projection is made of, in order: where two sources give the same file without naming
/// its path, the later source's wins.
#[derive(CustomResource, KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "sharedresource.inlineguard.dev",
    version = "v1alpha1",
    kind = "SharedProjection",
    plural = "sharedprojections",
    namespaced,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionSpec {
    /// The mode of files whose item names none; kubelet's default, 0644, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_MODE))]
    pub default_mode: Option<u32>,
    /// The sources, in the order they are laid out (at most 64: the bound lets the apiserver
    /// afford the per-source rule).
    #[schemars(length(min = 1, max = 64))]
    pub sources: Vec<ProjectionSource>,
}

/// One source of a projection. Exactly one of the fields is set, as in kubelet's
/// `VolumeProjection`.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new(
    "[has(self.sharedSecret), has(self.sharedConfigMap), has(self.podInfo), has(self.serviceAccountToken)].filter(set, set).size() == 1"
).message("a source sets exactly one of sharedSecret, sharedConfigMap, podInfo, serviceAccountToken"))]
#[serde(rename_all = "camelCase")]
pub struct ProjectionSource {
    /// The keys of a `SharedSecret`'s backing Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_secret: Option<ShareProjection>,
    /// The keys of a `SharedConfigMap`'s backing ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_config_map: Option<ShareProjection>,
    /// Facts about the pod the volume is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_info: Option<PodInfoProjection>,
    /// The pod's service-account token for one audience, as kubelet hands it to the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<TokenProjection>,
}

/// Which kind a [`ProjectionSource`] is, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind<'a> {
    /// `sharedSecret`.
    SharedSecret(&'a ShareProjection),
    /// `sharedConfigMap`.
    SharedConfigMap(&'a ShareProjection),
    /// `podInfo`.
    PodInfo(&'a PodInfoProjection),
    /// `serviceAccountToken`.
    ServiceAccountToken(&'a TokenProjection),
}

impl ProjectionSource {
    /// The one kind set, or `None` when zero or several are (an invalid source).
    pub fn kind(&self) -> Option<SourceKind<'_>> {
        let set = [
            self.shared_secret.as_ref().map(SourceKind::SharedSecret),
            self.shared_config_map.as_ref().map(SourceKind::SharedConfigMap),
            self.pod_info.as_ref().map(SourceKind::PodInfo),
            self.service_account_token.as_ref().map(SourceKind::ServiceAccountToken),
        ];
        let mut set = set.into_iter().flatten();
        match (set.next(), set.next()) {
            (Some(kind), None) => Some(kind),
            _ => None,
        }
    }
}

/// A share's keys in a projection.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareProjection {
    /// The share's name (shares are cluster-scoped).
    #[schemars(length(min = 1))]
    pub name: String,
    /// The keys to show and where; every key under its own name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<KeyItem>>,
    /// A share, or its backing object, that does not exist contributes no files instead of
    /// failing the volume, and a key an item names that the object lacks is skipped (kubelet's
    /// projected `secret` source's `optional`); the files appear when the object does. The pod
    /// must still be allowed to use the share.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// One key of a share, placed at a path.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyItem {
    /// The key in the backing object.
    pub key: String,
    /// The relative path of the file in the volume.
    #[schemars(length(min = 1))]
    pub path: String,
    /// The file's mode; the projection's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_MODE))]
    pub mode: Option<u32>,
    /// A key absent from the object is skipped instead of failing the volume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// Pod facts in a projection.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfoProjection {
    /// The facts and where they go.
    pub items: Vec<FieldItem>,
}

/// One pod fact, placed at a path.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldItem {
    /// The relative path of the file in the volume.
    #[schemars(length(min = 1))]
    pub path: String,
    /// The fact, as the downward API names it (`metadata.labels`, `metadata.annotations['a']`).
    pub field_path: String,
    /// The file's mode; the projection's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_MODE))]
    pub mode: Option<u32>,
}

/// The pod's token for one audience.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenProjection {
    /// The audience the token is for; the CSIDriver must request it (`tokenRequests`).
    pub audience: String,
    /// The relative path of the token file.
    #[schemars(length(min = 1))]
    pub path: String,
}
