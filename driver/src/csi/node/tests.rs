//! The Node service with a recording fake mounter, a static share directory and a file store:
//! publish, idempotency, ALREADY_EXISTS, ABORTED, the readonly refusal on the wire, cleanup after
//! failures of exactly what was made, foreign mounts left alone, unpublish.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use inline_guard_proto::csi::v1::VolumeCapability;
use inline_guard_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use tonic::Code;

use super::*;
use crate::content::ContentSource;
use crate::content::StaticDirSource;
use crate::content::ask::VolumeAsk;
use crate::content::error::{Error, Result};
use crate::metrics::Metrics;
use crate::volume::content_budget::LAZY_VOLUME_BYTES;
use crate::volume::error::Error as VolumeError;
use crate::volume::mounter::{FakeMounter, MountAction, MountSource};
use crate::volume::ownership::mount_tag;
use crate::volume::service::*;
use crate::volume::store::FileVolumeStore;
use crate::volume::store::VolumeStore;

struct Fixture {
    dir: tempfile::TempDir,
    mounter: Arc<FakeMounter>,
    store: Arc<FileVolumeStore>,
    node: NodeGrpc,
    service: Arc<NodeService>,
}

fn settings(host_read_only: bool) -> VolumeSettings {
    VolumeSettings::for_tests(PathBuf::new(), host_read_only)
}

fn fixture(mut settings: VolumeSettings) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    settings.kubelet_dir = dir.path().to_path_buf();
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
    request_at(fixture.dir.path(), volume_id, share)
}

/// kubelet's publish of `volume_id` showing `share`, at its target below `root`.
pub(crate) fn request_at(root: &Path, volume_id: &str, share: &str) -> NodePublishVolumeRequest {
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
        target_path: target_at(root, volume_id).to_string_lossy().into_owned(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 2 }),
        }),
        readonly: true,
        volume_context: context,
        ..Default::default()
    }
}

fn target_of(fixture: &Fixture, pod: &str) -> PathBuf {
    target_at(fixture.dir.path(), pod)
}

fn target_at(root: &Path, pod: &str) -> PathBuf {
    root.join("pods").join(pod).join("volumes/kubernetes.io~csi/shared/mount")
}

async fn publish(fixture: &Fixture, request: NodePublishVolumeRequest) -> std::result::Result<(), Status> {
    fixture.node.node_publish_volume(Request::new(request)).await.map(|_| ())
}

#[tokio::test]
async fn publish_mounts_fills_and_records_the_volume() {
    let fixture = fixture(settings(false));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    assert_eq!(
        fixture.mounter.actions(),
        [MountAction::MountTmpfs { target: target.clone(), size_bytes: 1 << 20, tag: mount_tag("csi-1") }]
    );
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "PEM");
    assert_eq!(fs::read_to_string(target.join("nested/extra")).unwrap(), "more");
    let (records, _) = fixture.store.load_all().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].pod.service_account, "web");
    let pods = fixture.dir.path().join("pods");
    let expected: Vec<PathBuf> = ["", "csi-1", "csi-1/volumes", "csi-1/volumes/kubernetes.io~csi"]
        .iter()
        .map(|p| if p.is_empty() { pods.clone() } else { pods.join(p) })
        .chain([target.parent().unwrap().to_path_buf(), target.clone()])
        .collect();
    assert_eq!(records[0].created_dirs, expected, "every directory it made, and only those");
}

#[tokio::test]
async fn directories_kubelet_made_are_not_recorded_as_the_drivers() {
    let fixture = fixture(settings(false));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    publish(&fixture, request).await.unwrap();
    assert_eq!(fixture.store.load_all().unwrap().0[0].created_dirs, [target]);
}

#[tokio::test]
async fn host_read_only_remounts_after_writing() {
    let fixture = fixture(settings(true));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    assert_eq!(fixture.mounter.actions()[1], MountAction::Remount { target, read_only: true });
}

#[tokio::test]
async fn the_same_publish_twice_is_ok_and_mounts_once() {
    let fixture = fixture(settings(false));
    publish(&fixture, request(&fixture, "csi-1", "cluster-ca")).await.unwrap();
    publish(&fixture, request(&fixture, "csi-1", "cluster-ca")).await.unwrap();
    assert_eq!(fixture.mounter.actions().len(), 1);
}

#[tokio::test]
async fn the_same_volume_with_other_arguments_already_exists() {
    let fixture = fixture(settings(false));
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
    let fixture = fixture(settings(false));
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
    let fixture = fixture(settings(false));
    fixture.mounter.fail_next_mount("tmpfs: out of memory");
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    let status = publish(&fixture, request).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::Internal, "tmpfs: out of memory"));
    assert!(!target.exists(), "the target directory it created is removed");
    assert!(!fixture.dir.path().join("pods").exists(), "and every parent it created");
    assert!(fixture.store.load_all().unwrap().0.is_empty());
}

#[tokio::test]
async fn a_failed_publish_keeps_what_was_there_before() {
    let fixture = fixture(settings(false));
    fixture.mounter.fail_next_mount("tmpfs: out of memory");
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    fs::create_dir_all(&target).unwrap();
    fs::write(target.join("precious"), "keep").unwrap();
    publish(&fixture, request).await.unwrap_err();
    assert_eq!(fs::read_to_string(target.join("precious")).unwrap(), "keep");
}

#[tokio::test]
async fn a_mount_it_did_not_make_is_never_replaced_or_unmounted() {
    let fixture = fixture(settings(false));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    fs::create_dir_all(&target).unwrap();
    let foreign = MountSource { fs_type: "ext4".into(), source: "/dev/sdb1".into() };
    fixture.mounter.mount_foreign(&target, foreign);
    let status = publish(&fixture, request).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(status.message(), format!("{target:?} has a \"ext4\" mount the driver did not make; it is left alone"));
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: "csi-unknown".into(),
        target_path: target.to_string_lossy().into_owned(),
    };
    fixture.node.node_unpublish_volume(Request::new(unpublish)).await.unwrap();
    assert!(fixture.mounter.is_mounted(&target));
    assert!(fixture.mounter.actions().iter().all(|a| !matches!(a, MountAction::Unmount { .. })), "never unmounted");
    assert!(target.exists());
}

#[tokio::test]
async fn its_own_tmpfs_found_without_a_record_is_written_again_not_mounted_over() {
    let fixture = fixture(settings(false));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    fs::create_dir_all(&target).unwrap();
    // What a publish whose record was lost leaves: the volume's own tagged tmpfs.
    let own = MountSource { fs_type: "tmpfs".into(), source: mount_tag("csi-1") };
    fixture.mounter.mount_foreign(&target, own);
    publish(&fixture, request).await.unwrap();
    assert!(
        fixture.mounter.actions().iter().all(|a| !matches!(a, MountAction::MountTmpfs { .. })),
        "no second tmpfs over its own: {:?}",
        fixture.mounter.actions()
    );
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "PEM", "its content written");
}

#[tokio::test]
async fn a_second_operation_on_a_busy_volume_or_target_is_aborted_and_touches_nothing() {
    let fixture = fixture(settings(false));
    let first = request(&fixture, "csi-1", "cluster-ca");
    let first_target = PathBuf::from(&first.target_path);
    let claim = fixture.service.claim("csi-1", &first_target).unwrap();
    // The same volume to another target, and another volume to the same target.
    let mut same_volume = request(&fixture, "csi-1", "cluster-ca");
    same_volume.target_path = target_of(&fixture, "other").to_string_lossy().into_owned();
    let mut same_target = request(&fixture, "csi-2", "cluster-ca");
    same_target.target_path = first.target_path.clone();
    for busy in [same_volume, same_target] {
        let status = publish(&fixture, busy).await.unwrap_err();
        assert_eq!(status.code(), Code::Aborted, "{}", status.message());
    }
    drop(claim);
    assert!(fixture.mounter.actions().is_empty());
    assert!(fixture.store.load_all().unwrap().0.is_empty());
    publish(&fixture, first).await.unwrap();
}

#[tokio::test]
async fn hostile_share_names_are_refused_before_anything_is_mounted() {
    let fixture = fixture(settings(false));
    for share in ["../state", "/etc", "a/b", "missing"] {
        let status = publish(&fixture, request(&fixture, "csi-1", share)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{share}");
    }
    assert!(fixture.mounter.actions().is_empty());
}

#[tokio::test]
async fn unpublish_unmounts_removes_and_forgets_and_is_idempotent() {
    let fixture = fixture(settings(false));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    let gauges = || {
        let metrics = fixture.node.service.metrics();
        (gauge(metrics, "volumes_published"), gauge(metrics, "content_bytes"))
    };
    assert_eq!(gauges(), (0, 0));
    publish(&fixture, request).await.unwrap();
    let (volumes, content) = gauges();
    assert_eq!(volumes, 1, "counted as published");
    assert!(content > 0, "its content counted: {content}");
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
    assert_eq!(gauges(), (0, 0), "neither counted once unpublished");
    assert_eq!(fixture.mounter.actions().last(), Some(&MountAction::Unmount { target: target.clone() }));
    assert!(!target.exists());
    assert!(!fixture.dir.path().join("pods").exists(), "the parents it made go too");
    assert!(fixture.store.load_all().unwrap().0.is_empty());
    fixture.node.node_unpublish_volume(Request::new(unpublish("csi-1", &target))).await.unwrap();
    fixture.node.node_unpublish_volume(Request::new(unpublish("unknown", &target))).await.unwrap();
    let status = fixture.node.node_unpublish_volume(Request::new(unpublish("", &target))).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = fixture.node.node_unpublish_volume(Request::new(unpublish("csi-1", Path::new("/etc")))).await;
    assert_eq!(status.unwrap_err().code(), Code::InvalidArgument);
}

#[tokio::test]
async fn node_info_and_capabilities() {
    let fixture = fixture(settings(false));
    let info = fixture.node.node_get_info(Request::new(NodeGetInfoRequest {})).await.unwrap().into_inner();
    assert_eq!(info.node_id, "node-1");
    assert!(info.accessible_topology.is_none());
    let capabilities =
        fixture.node.node_get_capabilities(Request::new(NodeGetCapabilitiesRequest {})).await.unwrap().into_inner();
    use inline_guard_proto::csi::v1::node_service_capability::{Rpc, Type, rpc};
    let kinds: Vec<_> = capabilities.capabilities.iter().map(|c| c.r#type).collect();
    assert_eq!(
        kinds,
        [Some(Type::Rpc(Rpc { r#type: rpc::Type::VolumeMountGroup as i32 }))],
        "only VOLUME_MOUNT_GROUP: kubelet then passes the pod's fsGroup"
    );
}

#[tokio::test]
async fn refresh_rewrites_changed_content_and_empties_a_withdrawn_share() {
    let fixture = fixture(settings(true));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();

    assert_eq!(settled(fixture.service.refresh_all()), [("csi-1".to_string(), false)], "nothing changed");
    fs::write(fixture.dir.path().join("shares/cluster-ca/ca.crt"), "ROTATED").unwrap();
    assert_eq!(settled(fixture.service.refresh_all()), [("csi-1".to_string(), true)]);
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
    assert_eq!(settled(fixture.service.refresh_all()), [("csi-1".to_string(), true)]);
    assert!(!target.join("ca.crt").exists(), "a withdrawn share leaves an empty volume");
}

/// Whether each volume of a refresh changed; a failed refresh fails the test, naming its error.
fn settled(results: Vec<(String, crate::volume::error::Result<bool>)>) -> Vec<(String, bool)> {
    results
        .into_iter()
        .map(|(volume, result)| match result {
            Ok(changed) => (volume, changed),
            Err(error) => panic!("the refresh of {volume} failed: {error}"),
        })
        .collect()
}

/// A content source answering what the test sets, as the Kubernetes source would: content,
/// NOT_FOUND (share or backing object gone), PERMISSION_DENIED (access revoked), UNAVAILABLE
/// (apiserver unreachable).
#[derive(Default)]
struct Scripted(std::sync::Mutex<Option<Result<crate::volume::atomic_writer::Payload>>>);

impl Scripted {
    fn set(&self, answer: Result<crate::volume::atomic_writer::Payload>) {
        *self.0.lock().unwrap() = Some(answer);
    }
}

impl Scripted {
    fn content(&self, _: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        self.0.lock().unwrap().clone().unwrap_or_else(|| Err(Error::Unavailable("nothing scripted".into())))
    }
}

impl ContentSource for Scripted {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        self.content(ask).map(crate::content::Opened::files)
    }
}

/// A payload of one file, `password`, holding `value`.
fn password(value: &str) -> crate::volume::atomic_writer::Payload {
    [("password".to_string(), crate::volume::atomic_writer::FileContent::new(value.as_bytes()))].into()
}

/// A Node service under `root` with a fake mounter and a scripted source.
fn scripted_service(root: &Path, source: Arc<Scripted>) -> NodeService {
    NodeService::new(
        "node-1".into(),
        VolumeSettings::for_tests(root.to_path_buf(), false),
        Arc::new(FakeMounter::default()),
        Arc::new(FileVolumeStore::open(root.join("state")).unwrap()),
        source,
        Vec::new(),
    )
}

#[tokio::test]
async fn a_refresh_empties_on_revocation_or_deletion_and_keeps_content_when_the_source_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(Scripted::default());
    source.set(Ok(password("s3cret")));
    let service = Arc::new(scripted_service(dir.path(), source.clone()));
    let node = NodeGrpc::new(service.clone());
    let request = request_at(dir.path(), "csi-1", "unused");
    let target = PathBuf::from(&request.target_path);
    node.node_publish_volume(Request::new(request)).await.unwrap();
    let read = || fs::read_to_string(target.join("password")).ok();
    assert_eq!(read().as_deref(), Some("s3cret"));

    source.set(Err(Error::Unavailable("apiserver unreachable".into())));
    let results = service.refresh_all();
    assert!(matches!(results[0].1, Err(VolumeError::Content(Error::Unavailable(_)))), "{results:?}");
    assert_eq!(read().as_deref(), Some("s3cret"), "an unreachable source never empties a volume");

    source.set(Err(Error::Denied("revoked".into())));
    service.refresh_all();
    assert_eq!(read(), None, "revoked access empties the volume");
    assert!(target.exists(), "and it stays mounted");

    source.set(Ok(password("back")));
    service.refresh_all();
    assert_eq!(read().as_deref(), Some("back"));

    source.set(Err(Error::Missing("SharedSecret \"db\" not found".into())));
    service.refresh_all();
    assert_eq!(read(), None, "a deleted share empties the volume");
}

#[tokio::test]
async fn a_failed_refresh_is_reported_at_the_next_republish_until_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(Scripted::default());
    source.set(Ok(password("s3cret")));
    let metrics = Arc::new(Metrics::new());
    let service = Arc::new(scripted_service(dir.path(), source.clone()).with_metrics(metrics.clone()));
    let node = NodeGrpc::new(service.clone());
    let request = request_at(dir.path(), "csi-1", "unused");
    node.node_publish_volume(Request::new(request.clone())).await.unwrap();
    node.node_publish_volume(Request::new(request.clone())).await.expect("a republish of a current volume");

    let unanswered = "reading SharedSecret \"db\": the apiserver did not answer within 5 s";
    source.set(Err(Error::Unavailable(unanswered.into())));
    assert!(matches!(service.refresh_all()[0].1, Err(VolumeError::Content(Error::Unavailable(_)))));
    assert!(metrics.encode().contains("sharedresource_csi_driver_volumes_stale 1"), "{}", metrics.encode());
    let status = node.node_publish_volume(Request::new(request.clone())).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::Unavailable, unanswered), "kubelet sees it");

    source.set(Ok(password("rotated")));
    node.node_publish_volume(Request::new(request.clone())).await.expect("the republish refreshed it");
    let target = PathBuf::from(&request.target_path);
    assert_eq!(fs::read_to_string(target.join("password")).unwrap(), "rotated");
    assert!(metrics.encode().contains("sharedresource_csi_driver_volumes_stale 0"));
}

#[tokio::test]
async fn a_volume_published_with_refresh_resource_false_keeps_its_content() {
    let fixture = fixture(settings(false));
    let mut request = request(&fixture, "csi-1", "cluster-ca");
    request.volume_context.insert("refreshResource".into(), "false".into());
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    fs::write(fixture.dir.path().join("shares/cluster-ca/ca.crt"), "ROTATED").unwrap();
    assert_eq!(settled(fixture.service.refresh_all()), [("csi-1".to_string(), false)]);
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "PEM", "kept as published");
    fs::remove_dir_all(fixture.dir.path().join("shares/cluster-ca")).unwrap();
    assert_eq!(settled(fixture.service.refresh_all()), [("csi-1".to_string(), true)]);
    assert!(!target.join("ca.crt").exists(), "a withdrawn share still empties it");
}

#[tokio::test]
async fn the_static_source_takes_the_shared_names_as_aliases() {
    let fixture = fixture(settings(false));
    let mut request = request(&fixture, "csi-1", "unused");
    request.volume_context.remove("share");
    request.volume_context.insert("sharedSecret".into(), "cluster-ca".into());
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "PEM");
}

#[tokio::test]
async fn with_refresh_off_volumes_keep_their_content_but_not_a_withdrawn_share() {
    let mut settings = settings(false);
    settings.refresh_content = false;
    let fixture = fixture(settings);
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    publish(&fixture, request).await.unwrap();
    fs::write(fixture.dir.path().join("shares/cluster-ca/ca.crt"), "ROTATED").unwrap();
    fixture.service.refresh_all();
    assert_eq!(fs::read_to_string(target.join("ca.crt")).unwrap(), "PEM");
    fs::remove_dir_all(fixture.dir.path().join("shares/cluster-ca")).unwrap();
    fixture.service.refresh_all();
    assert!(!target.join("ca.crt").exists());
}

/// The Node service over the fixture's mounter and store, its content from `source`.
fn node_over(fixture: &Fixture, source: Arc<dyn ContentSource>) -> NodeGrpc {
    let node = NodeService::new(
        "node-1".into(),
        VolumeSettings { kubelet_dir: fixture.dir.path().to_path_buf(), ..settings(false) },
        fixture.mounter.clone(),
        fixture.store.clone(),
        source,
        Vec::new(),
    );
    NodeGrpc::new(Arc::new(node))
}

/// The value of gauge `name` in what `metrics` reports.
fn gauge(metrics: &crate::metrics::Metrics, name: &str) -> i64 {
    let text = metrics.encode();
    let prefix = format!("sharedresource_csi_driver_{name} ");
    let line = text.lines().find(|line| line.starts_with(&prefix)).unwrap_or_else(|| panic!("no {name} in {text}"));
    line[prefix.len()..].trim().parse().unwrap()
}

/// A source whose one file is the `password` of the publish's secrets (nodePublishSecretRef),
/// `none` without one: what a Secrets Store provider authenticating with them does.
struct SecretSource;

impl SecretSource {
    fn content(&self, ask: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        let password = ask.secrets.by_key().get("password").map_or("none", String::as_str);
        Ok([("password".to_string(), crate::volume::atomic_writer::FileContent::new(password))].into())
    }
}

impl ContentSource for SecretSource {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        self.content(ask).map(crate::content::Opened::files)
    }
}

#[tokio::test]
async fn a_refresh_asks_with_the_secrets_of_the_last_publish() {
    let fixture = fixture(settings(false));
    let node = node_over(&fixture, Arc::new(SecretSource));
    let mut request = request(&fixture, "csi-1", "unused");
    request.secrets.insert("password".into(), "P1".into());
    let file = PathBuf::from(&request.target_path).join("password");
    node.node_publish_volume(Request::new(request)).await.unwrap();
    assert_eq!(fs::read_to_string(&file).unwrap(), "P1");
    assert_eq!(settled(node.service.refresh_all()), [("csi-1".to_string(), false)], "unchanged: the held secrets");
    assert_eq!(fs::read_to_string(&file).unwrap(), "P1");
}

/// A source whose one file is the token kubelet passed for audience `a`: what a projection's
/// serviceAccountToken source does, without a cluster.
struct TokenSource;

impl TokenSource {
    fn content(&self, request: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        if request.tokens.is_lost() {
            return Err(Error::Unavailable("tokens lost".into()));
        }
        let token = request.tokens.get("a").unwrap_or("none");
        if token == "REFUSED" {
            return Err(Error::Unavailable("the token was refused".into()));
        }
        Ok([("token".to_string(), crate::volume::atomic_writer::FileContent::new(token))].into())
    }
}

impl ContentSource for TokenSource {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        self.content(ask).map(crate::content::Opened::files)
    }
}

fn with_token(mut request: NodePublishVolumeRequest, token: Option<&str>) -> NodePublishVolumeRequest {
    let key = crate::content::tokens::TOKENS_KEY.to_string();
    match token {
        Some(token) => request.volume_context.insert(key, format!(r#"{{"a":{{"token":"{token}"}}}}"#)),
        None => request.volume_context.remove(&key),
    };
    request
}

#[tokio::test]
async fn a_republish_with_new_tokens_rewrites_the_volume_and_a_restart_waits_for_one() {
    let fixture = fixture(settings(false));
    let service = |records| {
        let node = NodeService::new(
            "node-1".into(),
            VolumeSettings { kubelet_dir: fixture.dir.path().to_path_buf(), ..settings(false) },
            fixture.mounter.clone(),
            fixture.store.clone(),
            Arc::new(TokenSource),
            records,
        );
        NodeGrpc::new(Arc::new(node))
    };
    let node = service(Vec::new());
    let mut request = request(&fixture, "csi-1", "unused");
    // A projection's volume, kept as published, except that new tokens are written: they expire.
    request.volume_context.insert("projection".into(), "app".into());
    request.volume_context.insert(REFRESH_ATTRIBUTE.into(), "false".into());
    let token_file = PathBuf::from(&request.target_path).join("token");
    let republish = |token| node.node_publish_volume(Request::new(with_token(request.clone(), token)));
    republish(Some("T1")).await.unwrap();
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T1");
    republish(Some("T1")).await.unwrap();
    republish(Some("T2")).await.unwrap();
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T2", "rewritten by the republish");
    assert_eq!(settled(node.service.refresh_all()), [("csi-1".to_string(), false)], "the held tokens are used");
    // New tokens that cannot be written: the republish fails, and the tokens held are still
    // the last written (kubelet's retry brings the new ones again).
    let status = republish(Some("REFUSED")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(settled(node.service.refresh_all()), [("csi-1".to_string(), false)], "T2 still held, unchanged");
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T2");

    // A restart: the tokens were never stored, so a refresh changes nothing until kubelet's
    // next republish brings them; one without tokens has nothing to write.
    let (records, _) = fixture.store.load_all().unwrap();
    for record in fs::read_dir(fixture.dir.path().join("state")).unwrap() {
        let text = fs::read(record.unwrap().path()).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&text).contains("T2"), "a token reached the state directory");
    }
    let (kept, dropped) = crate::volume::recovery::recover(
        records,
        fixture.mounter.as_ref(),
        fixture.store.as_ref(),
        fixture.dir.path(),
        &Default::default(),
    );
    assert!(dropped.is_empty(), "{dropped:?}");
    let restarted = service(kept);
    let refreshed = restarted.service.refresh_all();
    assert!(matches!(refreshed[0].1, Err(VolumeError::Content(Error::Unavailable(_)))), "{refreshed:?}");
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T2", "kept");
    restarted.node_publish_volume(Request::new(with_token(request.clone(), None))).await.unwrap();
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T2");
    restarted.node_publish_volume(Request::new(with_token(request.clone(), Some("T3")))).await.unwrap();
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T3");

    // A share's volume kept as published stays so through a republish with new tokens.
    let mut share = with_token(request_at(fixture.dir.path(), "csi-2", "unused"), Some("T1"));
    share.volume_context.insert(REFRESH_ATTRIBUTE.into(), "false".into());
    let share_file = PathBuf::from(&share.target_path).join("token");
    restarted.node_publish_volume(Request::new(share.clone())).await.unwrap();
    restarted.node_publish_volume(Request::new(with_token(share, Some("T2")))).await.unwrap();
    assert_eq!(fs::read_to_string(&share_file).unwrap(), "T1", "kept as published");
}

/// [`TokenSource`] that, the first time it answers while `race` holds a republish, runs that
/// republish to its end before answering: kubelet's republish with new tokens lands while a
/// refresh's content is being fetched with the old ones.
#[derive(Default)]
struct RacedTokenSource {
    race: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl RacedTokenSource {
    fn content(&self, request: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        let answer = TokenSource.content(request);
        let race = self.race.lock().unwrap().take();
        if let Some(race) = race {
            race();
        }
        answer
    }
}

impl ContentSource for RacedTokenSource {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        self.content(ask).map(crate::content::Opened::files)
    }
}

#[tokio::test]
async fn a_refresh_fetched_with_old_tokens_never_rolls_back_a_republish_s_new_ones() {
    let fixture = fixture(settings(false));
    let source = Arc::new(RacedTokenSource::default());
    let node = Arc::new(node_over(&fixture, source.clone()));
    let mut request = request(&fixture, "csi-1", "unused");
    request.volume_context.insert("projection".into(), "app".into());
    let token_file = PathBuf::from(&request.target_path).join("token");
    node.node_publish_volume(Request::new(with_token(request.clone(), Some("T1")))).await.unwrap();
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T1");

    let (racing, renewed) = (node.clone(), with_token(request.clone(), Some("T2")));
    *source.race.lock().unwrap() = Some(Box::new(move || {
        let republished = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(racing.node_publish_volume(Request::new(renewed))).map(drop)
        });
        republished.join().unwrap().unwrap();
    }));
    let refreshed = node.service.refresh_all();
    assert!(source.race.lock().unwrap().is_none(), "the positive control: the republish ran during the refresh");
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T2", "the republish's token stays: {refreshed:?}");
    // The next refresh uses the new tokens.
    assert_eq!(settled(node.service.refresh_all()), [("csi-1".to_string(), false)]);
    assert_eq!(fs::read_to_string(&token_file).unwrap(), "T2");
}

/// [`Scripted`], refusing the attributes of a new publish while `picky` is set.
#[derive(Default)]
struct Picky {
    scripted: Scripted,
    picky: std::sync::atomic::AtomicBool,
}

impl Picky {
    fn content(&self, ask: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        self.scripted.content(ask)
    }

    fn check_attributes(&self, _: &VolumeAsk) -> Result<()> {
        if self.picky.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Invalid(
                "volumeAttributes[\"refreshResouce\"] is not an attribute of this driver".into(),
            ));
        }
        Ok(())
    }
}

impl ContentSource for Picky {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, opening: crate::content::Opening) -> Result<crate::content::Opened> {
        if opening == crate::content::Opening::Publish {
            self.check_attributes(ask)?;
        }
        self.content(ask).map(crate::content::Opened::files)
    }
}

#[tokio::test]
async fn attributes_are_judged_at_a_new_publish_and_never_empty_a_published_volume() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(Picky::default());
    source.scripted.set(Ok(password("s3cret")));
    source.picky.store(true, std::sync::atomic::Ordering::SeqCst);
    let service = Arc::new(NodeService::new(
        "node-1".into(),
        VolumeSettings::for_tests(dir.path().to_path_buf(), false),
        Arc::new(FakeMounter::default()),
        Arc::new(FileVolumeStore::open(dir.path().join("state")).unwrap()),
        source.clone(),
        Vec::new(),
    ));
    let node = NodeGrpc::new(service.clone());
    let request = request_at(dir.path(), "csi-1", "unused");
    let target = PathBuf::from(&request.target_path);
    let refused = node.node_publish_volume(Request::new(request.clone())).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("refreshResouce"), "{}", refused.message());
    assert!(!target.join("password").exists(), "nothing published");

    // Published while the rule did not apply (an older driver): refreshes keep it.
    source.picky.store(false, std::sync::atomic::Ordering::SeqCst);
    node.node_publish_volume(Request::new(request)).await.unwrap();
    source.picky.store(true, std::sync::atomic::Ordering::SeqCst);
    source.scripted.set(Ok(password("rotated")));
    service.refresh_all();
    assert_eq!(fs::read_to_string(target.join("password")).unwrap(), "rotated");
}

/// A source whose every volume is the lazy files `0` (a provider's, fetched when opened), to
/// which access is denied while `1` says so (what a refresh asks of a lazy volume).
struct LazySource(Arc<dyn crate::content::lazy::LazyFiles>, std::sync::atomic::AtomicBool);

impl LazySource {
    fn content(&self, _: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        match self.1.load(std::sync::atomic::Ordering::SeqCst) {
            true => Err(Error::Denied("access to the provider was withdrawn".into())),
            false => Ok(Default::default()),
        }
    }

    fn lazy(&self, _: &VolumeAsk) -> Result<Option<Arc<dyn crate::content::lazy::LazyFiles>>> {
        Ok(Some(self.0.clone()))
    }
}

impl ContentSource for LazySource {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, opening: crate::content::Opening) -> Result<crate::content::Opened> {
        if opening == crate::content::Opening::Publish
            && let Some(files) = self.lazy(ask)?
        {
            return Ok(crate::content::Opened {
                shown: crate::content::Shown::Lazy(files),
                versions: Default::default(),
                absent: Vec::new(),
            });
        }
        self.content(ask).map(crate::content::Opened::files)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_volume_is_recorded_as_lazy_and_a_refresh_withdraws_and_gives_back_its_files() {
    assert!(nix::unistd::geteuid().is_root(), "mounting FUSE needs root: run the test command as root");
    let helper = crate::content::external::lazy_files::tests::Helper::new(&[("db-password", "s3cret")]);
    let files = Arc::new(helper.files(std::time::Duration::from_secs(3600)));
    let source = Arc::new(LazySource(files.clone(), Default::default()));
    // Real mounts below a directory that unmounts whatever a failure leaves.
    let dir = crate::test_util::mounted_dir::MountedDir::new();
    let store = Arc::new(FileVolumeStore::open(dir.path().join("state")).unwrap());
    let metrics = Arc::new(Metrics::new());
    let service = NodeService::new(
        "node-1".into(),
        VolumeSettings { kubelet_dir: dir.path().to_path_buf(), ..settings(false) },
        Arc::new(crate::volume::mounter::LinuxMounter),
        store.clone(),
        source.clone(),
        Vec::new(),
    );
    let node = NodeGrpc::new(Arc::new(service.with_metrics(metrics.clone())));
    let request = request_at(dir.path(), "csi-lazy", "unused");
    let target = PathBuf::from(&request.target_path);
    node.node_publish_volume(Request::new(request)).await.unwrap();
    let charged = format!("sharedresource_csi_driver_content_bytes {LAZY_VOLUME_BYTES}\n");
    assert!(metrics.encode().contains(&charged), "the mount is charged before any file is read: {}", metrics.encode());
    let (records, _) = store.load_all().unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].lazy, "recorded as lazy: a restart detaches its dead mount instead of keeping it");
    let refresh = || settled(node.service.refresh_all());
    assert_eq!(refresh(), [("csi-lazy".to_string(), false)], "access unchanged");
    source.1.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(refresh(), [("csi-lazy".to_string(), true)], "withdrawn");
    assert!(files.withdrawn(), "its files no longer open");
    assert_eq!(refresh(), [("csi-lazy".to_string(), false)], "withdrawn already");
    source.1.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(refresh(), [("csi-lazy".to_string(), true)], "given back");
    assert!(!files.withdrawn());
    let target_path = target.to_string_lossy().into_owned();
    let unpublish = NodeUnpublishVolumeRequest { volume_id: "csi-lazy".into(), target_path };
    node.node_unpublish_volume(Request::new(unpublish)).await.unwrap();
    assert!(!crate::volume::mounter::listed_in_mountinfo(&target).unwrap());
    assert!(metrics.encode().contains("sharedresource_csi_driver_content_bytes 0\n"), "given back at unpublish");
}

#[tokio::test]
async fn a_lazy_volume_whose_mount_fails_gives_its_charge_back_and_one_over_its_part_makes_nothing() {
    let helper = crate::content::external::lazy_files::tests::Helper::new(&[("db-password", "s3cret")]);
    let files = Arc::new(helper.files(std::time::Duration::from_secs(3600)));
    let source = Arc::new(LazySource(files, Default::default()));
    // The fake mounter fails every FUSE mount.
    let fixture = fixture(settings(false));
    let metrics = Arc::new(Metrics::new());
    let limits =
        |namespace_bytes| crate::volume::content_budget::BudgetLimits { node_bytes: u64::MAX, namespace_bytes };
    for (budget, wanted) in [(LAZY_VOLUME_BYTES, "FUSE"), (LAZY_VOLUME_BYTES - 1, "namespaceContentBudget")] {
        let service = NodeService::new(
            "node-1".into(),
            VolumeSettings {
                kubelet_dir: fixture.dir.path().to_path_buf(),
                content_budget: limits(budget),
                ..settings(false)
            },
            fixture.mounter.clone(),
            fixture.store.clone(),
            source.clone(),
            Vec::new(),
        );
        let node = NodeGrpc::new(Arc::new(service.with_metrics(metrics.clone())));
        let request = request(&fixture, "csi-lazy", "unused");
        let refused = node.node_publish_volume(Request::new(request)).await.expect_err("not published");
        assert!(refused.message().contains(wanted), "{wanted}: {}", refused.message());
        assert!(metrics.encode().contains("sharedresource_csi_driver_content_bytes 0\n"), "{}", metrics.encode());
    }
    assert!(
        !fixture.mounter.actions().iter().any(|action| matches!(action, MountAction::Unmount { .. })),
        "nothing of its own was there to take down: {:?}",
        fixture.mounter.actions()
    );
}

/// The fake mounter, reading the volume records as each tmpfs is mounted: what a driver killed
/// at that moment would leave its successor.
struct Peeking {
    mounter: Arc<FakeMounter>,
    store: Arc<FileVolumeStore>,
    seen: std::sync::Mutex<Vec<Vec<crate::volume::store::VolumeRecord>>>,
}

impl crate::volume::mounter::Mounter for Peeking {
    fn mount_tmpfs(&self, at: &crate::volume::target_dir::OpenDir, size: u64, tag: &str) -> VolumeResult<()> {
        self.seen.lock().unwrap().push(self.store.load_all().unwrap().0);
        self.mounter.mount_tmpfs(at, size, tag)
    }
    fn mount_fuse(&self, at: &crate::volume::target_dir::OpenDir, tag: &str) -> VolumeResult<std::os::fd::OwnedFd> {
        self.mounter.mount_fuse(at, tag)
    }
    fn remount(&self, root: &crate::volume::target_dir::OpenDir, read_only: bool) -> VolumeResult<()> {
        self.mounter.remount(root, read_only)
    }
    fn unmount(&self, root: &crate::volume::target_dir::OpenDir) -> VolumeResult<()> {
        self.mounter.unmount(root)
    }
    fn mount_source(
        &self,
        parent: &crate::volume::target_dir::OpenDir,
        dir: &crate::volume::target_dir::OpenDir,
    ) -> VolumeResult<Option<MountSource>> {
        self.mounter.mount_source(parent, dir)
    }
    fn mount_device(
        &self,
        parent: &crate::volume::target_dir::OpenDir,
        dir: &crate::volume::target_dir::OpenDir,
    ) -> VolumeResult<Option<u64>> {
        self.mounter.mount_device(parent, dir)
    }
}

type VolumeResult<T> = crate::volume::error::Result<T>;

#[tokio::test]
async fn a_volume_published_again_over_a_lost_mount_names_every_directory_it_made_before_mounting() {
    let fixture = fixture(settings(false));
    let peeking =
        Arc::new(Peeking { mounter: fixture.mounter.clone(), store: fixture.store.clone(), seen: Default::default() });
    let service = NodeService::new(
        "node-1".into(),
        VolumeSettings { kubelet_dir: fixture.dir.path().to_path_buf(), ..settings(false) },
        peeking.clone(),
        fixture.store.clone(),
        Arc::new(StaticDirSource::new(fixture.dir.path().join("shares"))),
        Vec::new(),
    );
    let node = NodeGrpc::new(Arc::new(service));
    let request = request(&fixture, "csi-1", "cluster-ca");
    let target = PathBuf::from(&request.target_path);
    node.node_publish_volume(Request::new(request.clone())).await.unwrap();
    let made = fixture.store.load_all().unwrap().0[0].created_dirs.clone();
    assert!(!made.is_empty());
    // Its tmpfs goes behind the driver's back; kubelet publishes it again: the directories
    // stand, made by the first publish, and the record in place before the new mount still
    // names them (a driver killed then would take them back at its next start).
    fixture.mounter.lose(&target);
    node.node_publish_volume(Request::new(request)).await.unwrap();
    let seen = peeking.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "two mounts");
    assert_eq!(seen[1].len(), 1);
    assert!(!seen[1][0].complete, "the record before the mount is the incomplete one");
    assert_eq!(seen[1][0].created_dirs, made);
}

/// A source that notes the passes it is told of and the pass each volume is asked within.
#[derive(Default)]
struct PassRecorder {
    noted: std::sync::Mutex<Vec<String>>,
}

impl PassRecorder {
    fn content(&self, _: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        Ok([("f".to_string(), crate::volume::atomic_writer::FileContent::new("x"))].into())
    }

    fn content_in_pass(
        &self,
        ask: &VolumeAsk,
        pass: crate::content::PassId,
    ) -> Result<crate::volume::atomic_writer::Payload> {
        self.noted.lock().unwrap().push(format!("{} in {}", ask.volume_id, pass.0));
        self.content(ask)
    }
}

impl ContentSource for PassRecorder {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, opening: crate::content::Opening) -> Result<crate::content::Opened> {
        if let crate::content::Opening::Refresh(Some(pass)) = opening {
            return self.content_in_pass(ask, pass).map(crate::content::Opened::files);
        }
        self.content(ask).map(crate::content::Opened::files)
    }

    fn start_pass(&self, pass: crate::content::PassId) {
        self.noted.lock().unwrap().push(format!("start {}", pass.0));
    }

    fn end_pass(&self, pass: crate::content::PassId, _: Option<crate::content::share_entries::ShareEntries>) {
        self.noted.lock().unwrap().push(format!("end {}", pass.0));
    }
}

#[tokio::test]
async fn a_refresh_pass_is_started_and_ended_at_the_source_around_its_volumes() {
    let fixture = fixture(settings(false));
    let source = Arc::new(PassRecorder::default());
    let node = node_over(&fixture, source.clone());
    node.node_publish_volume(Request::new(request(&fixture, "csi-1", "unused"))).await.unwrap();
    node.service.refresh_all();
    node.service.refresh_all();
    // The source's shared answers live for one pass: it must hear each pass end.
    assert_eq!(*source.noted.lock().unwrap(), ["start 0", "csi-1 in 0", "end 0", "start 1", "csi-1 in 1", "end 1"]);
}

/// A provider-like source whose one object is at version `0`, its file saying that version.
#[derive(Default)]
struct Versioned(std::sync::Mutex<String>);

impl Versioned {
    fn content(&self, _: &VolumeAsk) -> Result<crate::volume::atomic_writer::Payload> {
        let version = self.0.lock().unwrap().clone();
        Ok([("db".to_string(), crate::volume::atomic_writer::FileContent::new(version))].into())
    }

    fn object_versions(&self) -> std::collections::BTreeMap<String, String> {
        [("db".to_string(), self.0.lock().unwrap().clone())].into()
    }
}

impl ContentSource for Versioned {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        Ok(crate::content::Opened {
            shown: crate::content::Shown::Files(self.content(ask)?),
            versions: self.object_versions(),
            absent: Vec::new(),
        })
    }
}

#[tokio::test]
async fn the_providers_object_versions_are_recorded_as_a_refresh_changes_them() {
    let fixture = fixture(settings(false));
    let source = Arc::new(Versioned::default());
    *source.0.lock().unwrap() = "v1".into();
    let node = node_over(&fixture, source.clone());
    node.node_publish_volume(Request::new(request(&fixture, "csi-1", "unused"))).await.unwrap();
    let recorded = || fixture.store.load_all().unwrap().0[0].object_versions.clone();
    assert_eq!(recorded(), [("db".to_string(), "v1".to_string())].into());
    *source.0.lock().unwrap() = "v2".into();
    assert_eq!(settled(node.service.refresh_all()), [("csi-1".to_string(), true)]);
    // What a restarted driver sends the provider back: the versions of the content it shows.
    assert_eq!(recorded(), [("db".to_string(), "v2".to_string())].into());
}

/// A source whose every volume lacks what `absent` says, noting what it tells in `changes`.
#[derive(Default)]
struct Lacking {
    absent: std::sync::Mutex<Vec<String>>,
    changes: Arc<crate::content::changes::Changes>,
}

impl ContentSource for Lacking {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, _: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        let absent = self.absent.lock().unwrap().clone();
        Ok(crate::content::Opened { absent, ..crate::content::Opened::files(Default::default()) })
    }

    fn changes(&self) -> Option<Arc<crate::content::changes::Changes>> {
        Some(self.changes.clone())
    }
}

#[tokio::test]
async fn a_pod_hears_of_what_its_volume_lacks_when_the_absence_begins_not_while_it_lasts() {
    let fixture = fixture(settings(false));
    let source = Arc::new(Lacking::default());
    *source.absent.lock().unwrap() = vec!["Secret infra/db-creds not found".into()];
    let node = node_over(&fixture, source.clone());
    node.node_publish_volume(Request::new(request(&fixture, "csi-1", "unused"))).await.unwrap();
    let told = || source.changes.take().absences.into_iter().map(|absence| absence.absent).collect::<Vec<_>>();
    assert_eq!(told(), [["Secret infra/db-creds not found"]], "at publish");
    settled(node.service.refresh_all());
    assert!(told().is_empty(), "a refresh while it lasts");
    source.absent.lock().unwrap().push("Secret infra/ca not found".into());
    settled(node.service.refresh_all());
    assert_eq!(told(), [["Secret infra/ca not found"]], "only what began");
    source.absent.lock().unwrap().clear();
    settled(node.service.refresh_all());
    *source.absent.lock().unwrap() = vec!["Secret infra/ca not found".into()];
    settled(node.service.refresh_all());
    assert_eq!(told(), [["Secret infra/ca not found"]], "whole again, then gone again: told again");
}

#[tokio::test]
async fn a_handover_refuses_every_operation_once_done_and_none_when_it_failed() {
    let fixture = fixture(settings(false));
    publish(&fixture, request(&fixture, "csi-1", "cluster-ca")).await.unwrap();
    let target = target_of(&fixture, "csi-1").to_string_lossy().into_owned();

    // A handover that fails (the successor refused) leaves every operation open.
    let failed = fixture.service.hand_over_lazy(|_| Err(crate::volume::error::Error::Handover("refused".into())));
    assert_eq!(failed.unwrap_err().to_string(), "refused");
    publish(&fixture, request(&fixture, "csi-2", "cluster-ca")).await.unwrap();
    assert_eq!(settled(fixture.service.refresh_all()).len(), 2, "refreshed");

    // Done: publishes and unpublishes are UNAVAILABLE (kubelet's retry reaches the successor),
    // refreshes are not made and not counted as failures, and nothing is taken down.
    fixture.service.hand_over_lazy(|_| Ok(())).unwrap();
    let refused = publish(&fixture, request(&fixture, "csi-3", "cluster-ca")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("handing its volumes to its successor"), "{}", refused.message());
    let unpublish = NodeUnpublishVolumeRequest { volume_id: "csi-1".into(), target_path: target.clone() };
    let refused = fixture.node.node_unpublish_volume(Request::new(unpublish)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    for (volume, result) in fixture.service.refresh_all() {
        assert!(matches!(result, Err(crate::volume::error::Error::Busy(_))), "{volume}: {result:?}");
    }
    let metrics = fixture.service.metrics().encode();
    assert!(metrics.contains("sharedresource_csi_driver_volumes_stale 0"), "a refresh not made is no failure");
    assert!(fs::read_to_string(PathBuf::from(&target).join("ca.crt")).is_ok(), "the volume is still there");
    assert!(!PathBuf::from(request(&fixture, "csi-3", "cluster-ca").target_path).exists(), "nothing published");
}
