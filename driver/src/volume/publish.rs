//! A publish that passed the CSI checks, in the volume layer's terms: where kubelet wants the
//! volume, the mount flags it asked for, and what the volume asks of its content source.

use std::fmt;

use crate::content::ask::VolumeAsk;
use crate::quote::quote;
use crate::volume::error::{Error, Result};
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

/// The longest volume id accepted: far above kubelet's (`csi-` and 64 hex digits) and CSI's
/// advised 128 bytes, low enough that a record stays small.
const MAX_VOLUME_ID_BYTES: usize = 4096;

/// A volume id is required, and bounded.
pub fn check_volume_id(volume_id: &str) -> Result<()> {
    if volume_id.is_empty() {
        return Err(Error::Refused("volume_id is required".into()));
    }
    if volume_id.len() > MAX_VOLUME_ID_BYTES {
        return Err(Error::Refused(format!(
            "volume_id {} is longer than {MAX_VOLUME_ID_BYTES} bytes",
            quote(volume_id)
        )));
    }
    Ok(())
}
