//! The requests that passed the CSI checks (`csi::request`), in the volume layer's terms: a
//! publish (where kubelet wants the volume, the mount flags it asked for, what the volume asks
//! of its content source) and an unpublish (which volume, from where).

use std::fmt;

use crate::content::ask::VolumeAsk;
use crate::volume::target_path::TargetPath;

/// A checked publish.
#[derive(Clone, PartialEq, Eq)]
pub struct Publish {
    /// Where kubelet wants the volume mounted.
    pub target: TargetPath,
    /// Mount flags from the volume capability.
    pub mount_flags: Vec<String>,
    /// The group the volume's files belong to (the pod's `fsGroup`, which kubelet passes as
    /// the volume capability's `volume_mount_group`), if any.
    pub mount_group: Option<u32>,
    /// The volume, its pod, attributes and tokens.
    pub ask: VolumeAsk,
}

impl Publish {
    /// The volume's id.
    pub fn volume_id(&self) -> &str {
        &self.ask.volume_id
    }
}

// Written by hand so that nothing from the request but identifiers ever reaches a log line.
impl fmt::Debug for Publish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publish")
            .field("target_path", &self.target.as_path())
            .field("mount_group", &self.mount_group)
            .field("ask", &self.ask)
            .finish()
    }
}

/// A checked unpublish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpublish {
    /// The volume kubelet takes down.
    pub volume_id: String,
    /// Where kubelet had it mounted.
    pub target: TargetPath,
}
