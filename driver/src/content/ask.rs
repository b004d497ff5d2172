//! What a volume asks of a content source: whose pod it is, the pod's volume attributes and the
//! tokens kubelet passed. The same ask serves a publish and every refresh of the volume, so the
//! content layer never sees the CSI wire. Where the volume is mounted is said as information
//! only, for providers whose protocol names it; the content layer does no I/O there.

use std::collections::BTreeMap;
use std::fmt;

use crate::content::tokens::Tokens;

/// The pod a volume is published for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodInfo {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's service account: the subject whose access to the share is checked.
    pub service_account: String,
}

/// A volume's request for content.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeAsk {
    /// The volume (what changes are registered under).
    pub volume_id: String,
    /// The pod's name for the volume (kubelet's directory name for it).
    pub volume_name: String,
    /// Where the volume is mounted (information for a provider's protocol; never written here).
    pub mount_point: std::path::PathBuf,
    /// Whose pod it is.
    pub pod: PodInfo,
    /// The pod's `volumeAttributes` (kubelet's own keys removed).
    pub attributes: BTreeMap<String, String>,
    /// The pod's service-account tokens kubelet passed (the CSIDriver's `tokenRequests`). Held in
    /// memory only: never in a record, a log line or a message.
    pub tokens: Tokens,
    /// The keys of the Secret the pod's `nodePublishSecretRef` names, as kubelet passed them.
    /// Held in memory only, like the tokens.
    pub secrets: PublishSecrets,
    /// What the volume's provider answered last, by object (recorded with the volume): a
    /// Secrets Store provider is sent them back. Empty at a first publish.
    pub object_versions: BTreeMap<String, String>,
}

/// The Secret data kubelet passes with a publish (`NodePublishVolumeRequest.secrets`, from the
/// volume's `nodePublishSecretRef`): handed to providers that take it, never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PublishSecrets(BTreeMap<String, String>);

impl PublishSecrets {
    /// The secrets of one publish.
    pub fn new(secrets: impl IntoIterator<Item = (String, String)>) -> PublishSecrets {
        PublishSecrets(secrets.into_iter().collect())
    }

    /// The secrets by key.
    pub fn by_key(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

// Keys are not secret; values are.
impl fmt::Debug for PublishSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishSecrets").field("keys", &self.0.keys().collect::<Vec<_>>()).finish()
    }
}

// Written by hand so that nothing but identifiers ever reaches a log line.
impl fmt::Debug for VolumeAsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeAsk")
            .field("volume_id", &self.volume_id)
            .field("volume_name", &self.volume_name)
            .field("pod", &self.pod)
            .field("attribute_keys", &self.attributes.keys().collect::<Vec<_>>())
            .field("tokens", &self.tokens)
            .field("secrets", &self.secrets)
            .finish()
    }
}

#[cfg(test)]
impl VolumeAsk {
    /// The ask of volume `secrets` of pod `team-a/web` (uid `u1`, service account `reader`)
    /// with `attributes`, for tests.
    pub(crate) fn example(attributes: &[(&str, &str)]) -> VolumeAsk {
        VolumeAsk {
            volume_id: "csi-1".into(),
            volume_name: "secrets".into(),
            mount_point: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/secrets/mount".into(),
            pod: PodInfo {
                name: "web".into(),
                namespace: "team-a".into(),
                uid: "u1".into(),
                service_account: "reader".into(),
            },
            attributes: attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            tokens: crate::content::tokens::Tokens::default(),
            secrets: PublishSecrets::default(),
            object_versions: BTreeMap::new(),
        }
    }
}
