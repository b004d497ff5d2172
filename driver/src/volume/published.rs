//! A volume the driver serves, as it holds it in memory: its record, and its target parsed once
//! (at publish, or by recovery when it found the target still kubelet's), so that no later
//! operation reads the path as text again.

use crate::volume::store::VolumeRecord;
use crate::volume::target_path::TargetPath;

/// A published volume: what is recorded of it, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedVolume {
    /// What the driver remembers of it (on disk too).
    pub record: VolumeRecord,
    /// Its target, checked against kubelet's layout under the configured root.
    pub target: TargetPath,
}
