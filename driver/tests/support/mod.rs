//! What the driver's integration tests share: a client over the unix socket, the request kubelet
//! sends, and a snapshot of a directory tree to prove that nothing outside the driver's own
//! creations changed.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use inline_guard_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use inline_guard_proto::csi::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability};
use sharedresource_csi_driver::test_util::client::unix_channel;
use tonic::transport::Channel;

/// A channel to the socket at `path`, once something listens there (waits up to 5 s: the
/// file may not exist yet, or be a dead predecessor's).
pub async fn channel(path: PathBuf) -> Channel {
    unix_channel(path, Duration::from_secs(5)).await.unwrap_or_else(|error| panic!("{error}"))
}

/// kubelet's target for volume `volume` of pod `uid` under the kubelet root `root`.
pub fn kubelet_target(root: &Path, uid: &str, volume: &str) -> PathBuf {
    root.join("pods").join(uid).join("volumes/kubernetes.io~csi").join(volume).join("mount")
}

/// The NodePublishVolumeRequest kubelet sends for an inline volume of share `cluster-ca`.
pub fn publish_request(volume_id: &str, target: &Path, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        readonly,
        volume_context: [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.name", "web"),
            ("csi.storage.k8s.io/pod.namespace", "apps"),
            ("csi.storage.k8s.io/pod.uid", "u-1"),
            ("csi.storage.k8s.io/serviceAccount.name", "web"),
            ("share", "cluster-ca"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    }
}

/// The NodeUnpublishVolumeRequest for `volume_id` at `target`.
pub fn unpublish_request(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest { volume_id: volume_id.into(), target_path: target.to_string_lossy().into_owned() }
}

/// Every entry under `root` (symlinks not followed, mounts crossed): its kind, mode, link
/// target or content, and the device it lies on (so a mount appearing or vanishing shows).
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            let mode = metadata.permissions().mode();
            let what = if metadata.file_type().is_symlink() {
                format!("link {:?}", std::fs::read_link(&path).unwrap())
            } else if metadata.is_dir() {
                pending.push(path.clone());
                "dir".to_string()
            } else {
                format!("file {:?}", String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()))
            };
            entries.insert(path, format!("{what} mode {mode:o} dev {}", metadata.dev()));
        }
    }
    entries
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A node's directory; whatever is still mounted below it when the test ends (a failed
/// assertion between a kill and the restart that undoes it) is unmounted with it.
pub use sharedresource_csi_driver::test_util::mounted_dir::MountedDir as NodeDir;
