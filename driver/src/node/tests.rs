//! The Node service with a recording fake mounter, a static share directory and a file store:
//! publish, idempotency, ALREADY_EXISTS, the readonly refusal on the wire, cleanup after failures,
//! unpublish.

use std::collections::HashMap;

use inline_guard_proto::csi::v1::VolumeCapability;
use inline_guard_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use tonic::Code;

use super::*;
use crate::content::StaticDirSource;
use crate::mounter::{FakeMounter, MountAction};
use crate::volume_store::FileVolumeStore;

struct Fixture {
    dir: tempfile::TempDir,
    mounter: Arc<FakeMounter>,
    store: Arc<FileVolumeStore>,
    node: NodeGrpc,
    service: Arc<NodeService>,
}

const SETTINGS: VolumeSettings = VolumeSettings { tmpfs_bytes: 1 << 20, host_read_only: false };

fn fixture(settings: VolumeSettings) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let shares = dir.path().join("shares");
    fs::create_dir_all(shares.join("cluster-ca/nested")).unwrap();
    fs::write(shares.join("cluster-ca/ca.crt"), "PEM").unwrap();
    fs::write(shares.join("cluster-ca/nested/extra"), "more").unwrap();
    let mounter = Arc::new(FakeMounter::default());
    let store = Arc::new(FileVolumeStore::open(dir.path().join("state")).unwrap());
    let service = Arc::new(NodeService::new(
        "node-1".into(),
        settings,
        mounter.clone(),
        store.clone(),
        Arc::new(StaticDirSource::new(shares)),
        Vec::new(),
    ));
    Fixture { dir, mounter, store, node: NodeGrpc::new(service.clone()), service }
}

fn request(fixture: &Fixture, volume_id: &str, share: &str) -> NodePublishVolumeRequest {
    let context: HashMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "web"),
        ("csi.storage.k8s.io/pod.namespace", "apps"),
        ("csi.storage.k8s.io/pod.uid", "u-1"),
        ("csi.storage.k8s.io/serviceAccount.name", "web"),
        ("share", share),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: fixture.dir.path().join("pods").join(volume_id).join("mount").to_string_lossy().into_owned(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 2 }),
        }),
        readonly: true,
        volume_context: context,
        ..Default::default()
    }
}

async fn publish(fixture: &Fixture, request: NodePublishVolumeRequest) -> std::result::Result<(), Status> {
    fixture.node.node_publish_volume(Request::new(request)).await.map(|_| ())
}

#[tokio::test]
async fn publish_mounts_fills_and_records_the_volume() {
    let fixture = fixture(SETTINGS);
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    assert_eq!(
        fixture.mounter.actions(),
        [MountAction::MountTmpfs { target: target.clone(), size_bytes: 1 << 20, read_only: false }]
    );
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "PEM");
    assert_eq!(fs::read_to_string(target.join("nested/extra")).unwrap(), "more");
    let (records, _) = fixture.store.load_all().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].pod.service_account, "web");
}

#[tokio::test]
async fn host_read_only_remounts_after_writing() {
    let fixture = fixture(VolumeSettings { host_read_only: true, ..SETTINGS });
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    assert_eq!(fixture.mounter.actions()[1], MountAction::Remount { target, read_only: true });
}

#[tokio::test]
async fn the_same_publish_twice_is_ok_and_mounts_once() {
    let fixture = fixture(SETTINGS);
    publish(&fixture, request(&fixture, "csi-1", "cluster-ca")).await.unwrap();
    publish(&fixture, request(&fixture, "csi-1", "cluster-ca")).await.unwrap();
    assert_eq!(fixture.mounter.actions().len(), 1);
}

#[tokio::test]
async fn the_same_volume_with_other_arguments_already_exists() {
    let fixture = fixture(SETTINGS);
    publish(&fixture, request(&fixture, "csi-1", "cluster-ca")).await.unwrap();
    fs::create_dir_all(fixture.dir.path().join("shares/other")).unwrap();
    let status = publish(&fixture, request(&fixture, "csi-1", "other")).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    let mut other_volume = request(&fixture, "csi-2", "cluster-ca");
    other_volume.target_path = request(&fixture, "csi-1", "cluster-ca").target_path;
    assert_eq!(publish(&fixture, other_volume).await.unwrap_err().code(), Code::AlreadyExists);
}

#[tokio::test]
async fn a_writable_publish_is_refused_on_the_wire() {
    let fixture = fixture(SETTINGS);
    let mut writable = request(&fixture, "csi-1", "cluster-ca");
    writable.readonly = false;
    let status = publish(&fixture, writable).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "this driver only publishes read-only volumes: set readOnly: true on the pod's csi volume"
    );
    assert!(fixture.mounter.actions().is_empty());
}

#[tokio::test]
async fn a_failed_mount_leaves_no_directory_or_record() {
    let fixture = fixture(SETTINGS);
    fixture.mounter.fail_next_mount("tmpfs: out of memory");
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    let status = publish(&fixture, request).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::Internal, "tmpfs: out of memory"));
    assert!(!target.exists(), "the target directory it created is removed");
    assert!(fixture.store.load_all().unwrap().0.is_empty());
}

#[tokio::test]
async fn hostile_share_names_are_refused_before_anything_is_mounted() {
    let fixture = fixture(SETTINGS);
    for share in ["../state", "/etc", "a/b", "missing"] {
        let status = publish(&fixture, request(&fixture, "csi-1", share)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{share}");
    }
    assert!(fixture.mounter.actions().is_empty());
}

#[tokio::test]
async fn unpublish_unmounts_removes_and_forgets_and_is_idempotent() {
    let fixture = fixture(SETTINGS);
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    // The fake mounts nothing, so empty the directory as a real unmount would.
    for entry in fs::read_dir(&target).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.is_symlink() {
            fs::remove_dir_all(&path).unwrap()
        } else {
            fs::remove_file(&path).unwrap()
        }
    }
    let unpublish = |volume_id: &str, target: &Path| NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.to_string_lossy().into_owned(),
    };
    fixture.node.node_unpublish_volume(Request::new(unpublish("csi-1", &target))).await.unwrap();
    assert_eq!(fixture.mounter.actions().last(), Some(&MountAction::Unmount { target: target.clone() }));
    assert!(!target.exists());
    assert!(fixture.store.load_all().unwrap().0.is_empty());
    fixture.node.node_unpublish_volume(Request::new(unpublish("csi-1", &target))).await.unwrap();
    fixture.node.node_unpublish_volume(Request::new(unpublish("unknown", &target))).await.unwrap();
    let status = fixture.node.node_unpublish_volume(Request::new(unpublish("", &target))).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn node_info_and_capabilities() {
    let fixture = fixture(SETTINGS);
    let info = fixture.node.node_get_info(Request::new(NodeGetInfoRequest {})).await.unwrap().into_inner();
    assert_eq!(info.node_id, "node-1");
    assert!(info.accessible_topology.is_none());
    let capabilities =
        fixture.node.node_get_capabilities(Request::new(NodeGetCapabilitiesRequest {})).await.unwrap().into_inner();
    assert!(capabilities.capabilities.is_empty());
}

#[tokio::test]
async fn refresh_rewrites_changed_content_and_empties_a_withdrawn_share() {
    let fixture = fixture(VolumeSettings { host_read_only: true, ..SETTINGS });
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();

    assert_eq!(fixture.service.refresh_all(), [("csi-1".to_string(), Ok(false))], "nothing changed");
    fs::write(fixture.dir.path().join("shares/cluster-ca/ca.crt"), "ROTATED").unwrap();
    assert_eq!(fixture.service.refresh_all(), [("csi-1".to_string(), Ok(true))]);
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "ROTATED");
    let actions = fixture.mounter.actions();
    assert_eq!(
        actions[actions.len() - 2..],
        [
            MountAction::Remount { target: target.clone(), read_only: false },
            MountAction::Remount { target: target.clone(), read_only: true }
        ],
        "a read-only host mount is opened only for the write"
    );

    fs::remove_dir_all(fixture.dir.path().join("shares/cluster-ca")).unwrap();
    assert_eq!(fixture.service.refresh_all(), [("csi-1".to_string(), Ok(true))]);
    assert!(!target.join("ca.crt").exists(), "a withdrawn share leaves an empty volume");
}
