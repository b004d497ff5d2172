//! The CSI requests the driver benchmarks send: volume `index` published read-only at a target,
//! as an inline ephemeral volume of the pod the context describes, and unpublished again.

use std::path::Path;

use inline_guard_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use inline_guard_proto::csi::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability};

/// The id of volume `index`.
fn volume_id(index: usize) -> String {
    format!("csi-{index:04}")
}

/// NodePublishVolume of volume `index` at `target`, read-only and ephemeral, with the pod
/// information and attributes of `context`.
pub fn publish_request(index: usize, target: &Path, context: &[(&str, String)]) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id(index),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        readonly: true,
        volume_context: std::iter::once(("csi.storage.k8s.io/ephemeral", "true".to_string()))
            .chain(context.iter().cloned())
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ..Default::default()
    }
}

/// NodeUnpublishVolume of volume `index` at `target`.
pub fn unpublish_request(index: usize, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest { volume_id: volume_id(index), target_path: target.to_string_lossy().into_owned() }
}
