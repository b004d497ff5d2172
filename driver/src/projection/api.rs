//! The vocabulary of a projection's spec: the sources it names, the items that select and
//! rename keys, and the pod fields it may show. Field names follow kubelet's `projected`
//! volume, so a user who knows that API reads this one without a manual.

use serde::{Deserialize, Serialize};

/// What a projection is made of, in order: a later source's implicit keys win over an earlier
/// source's (see [`crate::projection::compose`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionSpec {
    /// The mode of files whose item names none; kubelet's default, 0644, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<u32>,
    /// The sources, in the order they are laid out.
    pub sources: Vec<ProjectionSource>,
}

/// One source of a projection. Exactly one of the fields is set, as in kubelet's
/// `VolumeProjection`; [`ProjectionSource::kind`] says which.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareProjection {
    /// The share's name (shares are cluster-scoped).
    pub name: String,
    /// The keys to show and where; every key under its own name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<KeyItem>>,
}

/// One key of a share, placed at a path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyItem {
    /// The key in the backing object.
    pub key: String,
    /// The relative path of the file in the volume.
    pub path: String,
    /// The file's mode; the projection's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// A key absent from the object is skipped instead of failing the volume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// Pod facts in a projection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfoProjection {
    /// The facts and where they go.
    pub items: Vec<FieldItem>,
}

/// One pod fact, placed at a path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldItem {
    /// The relative path of the file in the volume.
    pub path: String,
    /// The fact, as the downward API names it (`metadata.labels`, `metadata.annotations['a']`).
    pub field_path: String,
    /// The file's mode; the projection's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// The pod's token for one audience.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenProjection {
    /// The audience the token is for; the CSIDriver must request it (`tokenRequests`).
    pub audience: String,
    /// The relative path of the token file.
    pub path: String,
}
