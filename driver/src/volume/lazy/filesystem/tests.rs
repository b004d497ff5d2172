//! Real FUSE mounts (as root): a lazy volume read through the kernel by root and by another
//! user, each file fetched at its first open and not before; a failing file is EIO alone; the
//! volume refuses writes; and a mount whose server is gone (what a driver restart leaves) is
//! recognised as the driver's, unmounted at recovery and its record dropped.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::content::external::lazy_files::tests::Helper;
use crate::volume::mounter::{LinuxMounter, Mounter, listed_in_mountinfo};
use crate::volume::ownership::mount_tag;
use crate::volume::target_dir::{self, OpenTarget};
use crate::volume::target_path::TargetPath;

const HOUR: Duration = Duration::from_secs(3600);
const NOBODY: u32 = 65534;

/// A kubelet target below a fresh root that any user may walk to.
fn created_target() -> (crate::test_util::mounted_dir::MountedDir, PathBuf, OpenTarget, Vec<PathBuf>) {
    assert!(nix::unistd::geteuid().is_root(), "mounting needs root: run the test command as root");
    // Whatever a failed test leaves mounted below it is unmounted with it.
    let dir = crate::test_util::mounted_dir::MountedDir::new();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let text = dir.path().join("pods/u/volumes/kubernetes.io~csi/v/mount");
    let target = TargetPath::parse(text.to_str().unwrap(), dir.path()).unwrap();
    let mut created = Vec::new();
    let opened = target_dir::create(dir.path(), &target, &mut created).unwrap();
    for made in &created {
        std::fs::set_permissions(made, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (dir, text, opened, created)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// `cat PATH` as user `uid`: its output, or its standard error.
fn cat_as(uid: u32, path: &Path) -> Result<String, String> {
    let output = Command::new("cat").arg(path).uid(uid).gid(uid).output().unwrap();
    match output.status.success() {
        true => Ok(String::from_utf8(output.stdout).unwrap()),
        false => Err(String::from_utf8(output.stderr).unwrap()),
    }
}

#[test]
fn a_lazy_volume_is_read_by_any_user_each_file_fetched_at_its_first_open() {
    let runtime = runtime();
    let helper = Helper::new(&[("db-password", "s3cret"), ("api-key", "k3y")]);
    let files = Arc::new(runtime.block_on(async { helper.files(HOUR) }));
    let (_dir, text, opened, _) = created_target();
    let device = LinuxMounter.mount_fuse(&opened.target, "inline-guard:lazy-test").unwrap();
    let mount = LazyMount::serve("csi-lazy", device, files.clone(), Some(2000)).unwrap();
    let root = opened.reopen().unwrap();
    let source = LinuxMounter.mount_source(&opened.parent, &root).unwrap().unwrap();
    assert!(source.is("inline-guard:lazy-test"), "the driver's own, by its tag: {source:?}");
    // Read-only and data only, as the kernel lists the mount's own flags.
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = text.to_str().unwrap();
    let flags = table.lines().map(|line| line.split(' ').collect::<Vec<_>>()).find(|f| f.len() > 5 && f[4] == point);
    let flags: Vec<&str> = flags.expect("the mount is listed")[5].split(',').collect();
    for wanted in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(flags.contains(&wanted), "{wanted} missing from {flags:?}");
    }

    let names: Vec<String> =
        std::fs::read_dir(&text).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["secrets"]);
    let file = text.join("secrets/db-password");
    let before = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!((before.mode() & 0o7777, before.uid(), before.len()), (0o444, 0, 0), "not fetched yet");
    assert_eq!(before.gid(), 2000, "the pod's fsGroup");
    assert!(helper.gets().is_empty(), "a listing and a stat fetch nothing: {:?}", helper.gets());

    assert_eq!(cat_as(NOBODY, &file), Ok("s3cret".into()), "another user reads it (allow_other)");
    assert_eq!(helper.gets(), ["get secrets/db-password web"]);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "s3cret");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 6, "its size once fetched");
    assert_eq!(helper.gets().len(), 1, "read again within the TTL: no call");
    assert_eq!(cat_as(NOBODY, &text.join("secrets/api-key")), Ok("k3y".into()));
    assert_eq!(helper.gets().len(), 2);

    let error = cat_as(NOBODY, &text.join("secrets/broken")).unwrap_err();
    assert!(error.contains("Input/output error"), "{error}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "s3cret", "the other files still read");
    let error = std::fs::OpenOptions::new().write(true).open(&file).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EROFS));
    let error = std::fs::write(text.join("secrets/new"), "x").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EROFS));

    files.set_withdrawn(true);
    let error = std::fs::read(&file).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EACCES), "withdrawn access");

    LinuxMounter.unmount(&root).unwrap();
    drop((root, mount));
    assert!(!listed_in_mountinfo(&text).unwrap());
    assert_eq!(std::fs::read_dir(&text).unwrap().count(), 0, "the directory under it is empty");
}

#[test]
fn a_helper_written_from_the_design_alone_is_served_lazily_unchanged() {
    use crate::content::external::design_helper;
    use crate::content::external::exec::ExecProviders;
    use crate::content::external::provider::{ExecProvider, FetchMode};
    let runtime = runtime();
    let dir = tempfile::tempdir().unwrap();
    let provider = ExecProvider {
        name: sharedresource_api::object_name::ObjectName::parse("hashicorp-cli").unwrap(),
        helper: design_helper::write(dir.path(), false),
        mode: FetchMode::Lazy,
        timeout: Duration::from_secs(60),
        cache_ttl: HOUR,
        max_file_bytes: 1 << 20,
        run_as: crate::content::external::provider::HelperUser::this_process(),
    };
    let providers = ExecProviders::new([("hashicorp-cli".to_string(), provider.clone())].into(), 4);
    let ask = crate::content::ask::VolumeAsk::example(&[("provider", "hashicorp-cli")]);
    let files = Arc::new(runtime.block_on(providers.lazy_files(&provider, &ask)).unwrap());
    let (_dir, text, opened, _) = created_target();
    let device = LinuxMounter.mount_fuse(&opened.target, "inline-guard:lazy-design").unwrap();
    let mount = LazyMount::serve("csi-lazy-design", device, files, None).unwrap();
    let root = opened.reopen().unwrap();

    let names: Vec<String> =
        std::fs::read_dir(&text).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["db"], "the design's `/db` is db under the mount point");
    assert_eq!(
        cat_as(NOBODY, &text.join("db/password")),
        Ok("read -field=password secret/pod-secrets/team-a/web//db".into())
    );
    let calls = design_helper::calls(dir.path());
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].starts_with("mount /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/secrets/mount {"));
    assert_eq!(calls[1], "get /db/password team-a web", "the path as the design's driver passes it");

    LinuxMounter.unmount(&root).unwrap();
    drop((root, mount));
    assert!(!listed_in_mountinfo(&text).unwrap());
}

/// Reads all of the open file `file` from its start.
fn read_from_start(file: &std::fs::File) -> Vec<u8> {
    use std::os::unix::fs::FileExt as _;
    let mut content = Vec::new();
    let mut buffer = [0u8; 3000];
    loop {
        let read = file.read_at(&mut buffer, content.len() as u64).unwrap();
        if read == 0 {
            return content;
        }
        content.extend_from_slice(&buffer[..read]);
    }
}

/// Checks that opening `file` anew reads `expected`, quoting at most its start when not.
fn assert_reads(file: &Path, expected: &[u8], why: &str) {
    let read = std::fs::read(file).unwrap();
    let start = |bytes: &[u8]| String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned();
    assert!(
        read == expected,
        "{why}: read {} bytes starting {:?}, expected {} starting {:?}",
        read.len(),
        start(&read),
        expected.len(),
        start(expected)
    );
}

#[test]
fn reopening_unchanged_content_reads_from_the_page_cache_and_a_change_is_never_torn_or_cut() {
    const TTL: Duration = Duration::from_secs(1);
    let past_ttl = || std::thread::sleep(TTL + Duration::from_millis(100));
    let runtime = runtime();
    let helper = Helper::new(&[("key", "short")]);
    let files = Arc::new(runtime.block_on(async { helper.files(TTL) }));
    let (_dir, text, opened, _) = created_target();
    let device = LinuxMounter.mount_fuse(&opened.target, "inline-guard:lazy-pages").unwrap();
    let mount = LazyMount::serve("csi-lazy-pages", device, files.clone(), None).unwrap();
    let file = text.join("secrets/key");
    let long: String = (0..10_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();

    // Held open across the change: it reads what it opened, through the page cache.
    let held = std::fs::File::open(&file).unwrap();
    assert_eq!(read_from_start(&held), b"short");
    let reads = mount.reads_served();
    assert_eq!(reads, 0, "the content opened is stored in the kernel's page cache with it: no read asks the driver");
    assert_reads(&file, b"short", "opened again");
    assert_eq!(mount.reads_served(), reads, "opened again with the same content: read from the page cache");

    // Grown past two pages while `held` is open: a new open reads all of it (direct I/O, past
    // the size the kernel keeps for `held`), and `held` still reads its own content.
    std::fs::write(helper.path("files/key"), &long).unwrap();
    past_ttl();
    assert_reads(&file, long.as_bytes(), "never cut to the old size");
    assert_eq!(read_from_start(&held), b"short", "never torn by the new content");
    drop(held);

    // Nothing paged is open: the next open pages the new content, its size is the new size.
    assert_reads(&file, long.as_bytes(), "the new content paged");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 10_000);
    let reads = mount.reads_served();
    assert_reads(&file, long.as_bytes(), "read again");
    assert_eq!(mount.reads_served(), reads, "the new content is kept in the page cache too");

    // Shrunk: no stale page, no tail of the old content.
    std::fs::write(helper.path("files/key"), "tiny").unwrap();
    past_ttl();
    assert_reads(&file, b"tiny", "shrunk");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 4);
    let gets = helper.gets().len();
    assert!(gets >= 3, "one get per content at least: {:?}", helper.gets());

    let root = opened.reopen().unwrap();
    LinuxMounter.unmount(&root).unwrap();
    drop((root, mount));
    assert!(!listed_in_mountinfo(&text).unwrap());
}

/// The complete record of lazy volume `volume_id` at `target`, which made `created`.
fn lazy_record(
    volume_id: &str,
    target: &Path,
    created: Vec<PathBuf>,
    device: Option<u64>,
) -> crate::volume::store::VolumeRecord {
    crate::volume::store::VolumeRecord {
        volume_id: volume_id.into(),
        target_path: target.to_path_buf(),
        pod: crate::content::ask::PodInfo {
            name: "p".into(),
            namespace: "n".into(),
            uid: "u".into(),
            service_account: "s".into(),
        },
        attributes: Default::default(),
        host_read_only: false,
        created_dirs: created,
        device,
        complete: true,
        object_versions: Default::default(),
        lazy: true,
        mount_group: None,
    }
}

#[test]
fn a_lazy_volume_whose_server_is_gone_is_unmounted_at_recovery_and_its_record_dropped() {
    use crate::volume::recovery::recover;
    use crate::volume::store::{FileVolumeStore, VolumeStore};

    let (dir, text, opened, created) = created_target();
    let volume_id = "csi-lazy-gone";
    // Mounted, then its descriptor closed without serving: what a killed driver leaves.
    drop(LinuxMounter.mount_fuse(&opened.target, &mount_tag(volume_id)).unwrap());
    drop(opened);
    let error = std::fs::read_dir(&text).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::ENOTCONN), "a dead FUSE mount answers nothing");

    let store = FileVolumeStore::open(dir.path().join("state")).unwrap();
    store.put(&lazy_record(volume_id, &text, created, Some(1)), true).unwrap();
    let (kept, dropped) = recover(store.load_all().unwrap().0, &LinuxMounter, &store, dir.path(), &Default::default());
    assert!(kept.is_empty(), "{kept:?}");
    assert_eq!(dropped.len(), 1);
    assert!(
        dropped[0].contains("was served lazily by the driver's previous run, whose FUSE session ended with it; unmounted; record dropped"),
        "{}",
        dropped[0]
    );
    assert!(!listed_in_mountinfo(&text).unwrap());
    assert!(!dir.path().join("pods").exists(), "the directories it made are gone");
    assert!(store.load_all().unwrap().0.is_empty());
}

#[test]
fn a_dead_fuse_mount_the_driver_did_not_make_is_left_alone_at_recovery() {
    use crate::volume::recovery::recover;
    use crate::volume::store::{FileVolumeStore, VolumeStore};

    let (dir, text, opened, created) = created_target();
    // Someone else's FUSE mount at the target, its server gone: it answers nothing either.
    drop(LinuxMounter.mount_fuse(&opened.target, "someone-else").unwrap());
    drop(opened);
    let store = FileVolumeStore::open(dir.path().join("state")).unwrap();
    store.put(&lazy_record("csi-lazy-mine", &text, created, None), true).unwrap();
    let (kept, dropped) = recover(store.load_all().unwrap().0, &LinuxMounter, &store, dir.path(), &Default::default());
    let still_mounted = listed_in_mountinfo(&text).unwrap();
    nix::mount::umount2(&text, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert!(kept.is_empty(), "{kept:?}");
    assert!(dropped[0].contains("holds a mount the driver did not make, left alone"), "{}", dropped[0]);
    assert!(still_mounted, "another's mount is never unmounted");
}

/// The FUSE connection mounted at `mount`, as fusectl names it: its device number's minor (the
/// major is 0). Asked while the volume is served: a stat of a paused volume waits.
fn connection_of(mount: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    nix::sys::stat::minor(std::fs::metadata(mount).unwrap().dev()).to_string()
}

/// The kernel's count of requests of FUSE connection `connection` that wait for an answer
/// (queued or read), from a fusectl mounted in `control` for the test.
fn waiting_requests(control: &Path, connection: &str) -> u64 {
    let text = std::fs::read_to_string(control.join(connection).join("waiting")).unwrap();
    text.trim().parse().unwrap()
}

/// Waits (a minute at most, then fails saying `what`) until the count of requests waiting on
/// `connection` is as `wanted` says.
fn wait_for_waiting(control: &Path, connection: &str, wanted: impl Fn(u64) -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let waiting = waiting_requests(control, connection);
        if wanted(waiting) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: never so ({waiting} waiting)");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Mounts fusectl (the kernel's view of FUSE connections) at a fresh directory below `dir`.
fn fuse_control(dir: &Path) -> PathBuf {
    let control = dir.join("fusectl");
    std::fs::create_dir(&control).unwrap();
    nix::mount::mount(Some("fusectl"), &control, Some("fusectl"), nix::mount::MsFlags::empty(), None::<&str>).unwrap();
    control
}

/// A lazy volume serving `secrets/db-password` (`s3cret`) through a helper, mounted at a
/// kubelet target of its own, its entries belonging to `group`.
struct Served {
    runtime: tokio::runtime::Runtime,
    helper: Helper,
    dir: crate::test_util::mounted_dir::MountedDir,
    text: PathBuf,
    root: crate::volume::target_dir::OpenDir,
    mount: LazyMount,
}

impl Served {
    fn new(volume_id: &str, group: Option<u32>) -> Served {
        let runtime = runtime();
        let helper = Helper::new(&[("db-password", "s3cret")]);
        let files = Arc::new(runtime.block_on(async { helper.files(HOUR) }));
        let (dir, text, opened, _) = created_target();
        let device = LinuxMounter.mount_fuse(&opened.target, &format!("inline-guard:{volume_id}")).unwrap();
        let mount = LazyMount::serve(volume_id, device, files, group).unwrap();
        let root = opened.reopen().unwrap();
        Served { runtime, helper, dir, text, root, mount }
    }

    fn file(&self) -> PathBuf {
        self.text.join("secrets/db-password")
    }

    /// Unmounts the volume and checks that nothing is left mounted.
    fn unmount(self) {
        LinuxMounter.unmount(&self.root).unwrap();
        drop((self.root, self.mount));
        assert!(!listed_in_mountinfo(&self.text).unwrap());
    }
}

/// A container reading its secret in a loop on a thread of its own, each read a new open (a
/// request every time), until stopped; the first read that is not `s3cret` ends it.
pub(crate) struct LoopingReader {
    stop: Arc<std::sync::atomic::AtomicBool>,
    reads: Arc<std::sync::atomic::AtomicU64>,
    result: std::sync::mpsc::Receiver<Result<u64, String>>,
    thread: std::thread::JoinHandle<()>,
}

impl LoopingReader {
    pub(crate) fn start(file: PathBuf) -> LoopingReader {
        use std::sync::atomic::Ordering;
        let (stop, reads) =
            (Arc::new(std::sync::atomic::AtomicBool::new(false)), Arc::new(std::sync::atomic::AtomicU64::new(0)));
        let (finished, result) = std::sync::mpsc::channel();
        let thread = {
            let (stop, reads) = (stop.clone(), reads.clone());
            std::thread::spawn(move || {
                let outcome = loop {
                    if stop.load(Ordering::Relaxed) {
                        break Ok(reads.load(Ordering::Relaxed));
                    }
                    match std::fs::read_to_string(&file) {
                        Ok(content) if content == "s3cret" => reads.fetch_add(1, Ordering::Relaxed),
                        other => break Err(format!("read {} answered {other:?}", reads.load(Ordering::Relaxed))),
                    };
                };
                let _ = finished.send(outcome);
            })
        };
        LoopingReader { stop, reads, result, thread }
    }

    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits (a minute at most) until the reader has read `count` times in all.
    pub(crate) fn wait_for(&self, count: u64, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.reads() < count {
            assert!(!self.finished(), "{what}: the reader ended");
            assert!(std::time::Instant::now() < deadline, "{what}: the reader is stuck at {}", self.reads());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops it: how many reads it made, or the first that failed. Bounded, so a volume that
    /// answers nothing fails the test instead of hanging it.
    pub(crate) fn stop(self) -> Result<u64, String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let outcome = self.result.recv_timeout(Duration::from_secs(60)).expect("the reader stops");
        self.thread.join().unwrap();
        outcome
    }
}

#[test]
fn a_paused_volume_keeps_its_callers_waiting_in_the_kernel_and_resumed_answers_them() {
    let mut served = Served::new("csi-lazy-pause", None);
    let file = served.file();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "s3cret");
    let (control, connection) = (fuse_control(served.dir.path()), connection_of(&served.text));
    // The read's close (RELEASE) is sent after it returns: answered while served.
    wait_for_waiting(&control, &connection, |waiting| waiting == 0, "nothing left waiting while the volume is served");

    served.mount.pause(Duration::from_secs(30)).unwrap();
    let reads_served = served.mount.reads_served();
    let (answered, answer) = std::sync::mpsc::channel();
    let reader = {
        let file = file.clone();
        std::thread::spawn(move || answered.send(std::fs::read_to_string(file)))
    };
    // The positive control: the reader's request is in the kernel, waiting for a reader.
    wait_for_waiting(&control, &connection, |waiting| waiting >= 1, "the reader's request reached the kernel's queue");
    assert!(!reader.is_finished(), "nothing answers a paused volume");
    assert_eq!(served.mount.reads_served(), reads_served, "nothing was read while paused");

    served.mount.resume().unwrap();
    // Bounded, so a resume that serves nothing fails the test instead of hanging it.
    let read = answer.recv_timeout(Duration::from_secs(60)).expect("the read is answered once resumed");
    assert_eq!(read.unwrap(), "s3cret", "answered once resumed, not failed");
    reader.join().unwrap().unwrap();
    wait_for_waiting(&control, &connection, |waiting| waiting == 0, "nothing left waiting once resumed");
    served.unmount();
}

#[test]
fn a_volume_paused_and_resumed_again_and_again_never_fails_a_read() {
    let mut served = Served::new("csi-lazy-pauses", None);
    let reader = LoopingReader::start(served.file());
    let (control, connection) = (fuse_control(served.dir.path()), connection_of(&served.text));
    let mut pauses = 0;
    while pauses < 50 && !reader.finished() {
        served.mount.pause(Duration::from_secs(30)).unwrap();
        // Each pause holds at least one of the reader's requests (its open, or its close).
        wait_for_waiting(&control, &connection, |waiting| waiting > 0, "a request waits on the paused volume");
        served.mount.resume().unwrap();
        pauses += 1;
    }
    let reads = reader.stop().unwrap();
    assert_eq!(pauses, 50);
    assert!(reads > 0, "the reader read ({reads} reads across {pauses} pauses)");
    served.unmount();
}

#[test]
fn a_lazy_volume_handed_over_a_real_socket_is_served_on_by_its_successor_with_no_failed_read() {
    use crate::volume::lazy::handover;
    use std::os::fd::AsFd as _;
    let mut served = Served::new("csi-lazy-handover", Some(2000));
    let file = served.file();
    // A handle the container keeps open across the handover.
    let held = std::fs::File::open(&file).unwrap();
    assert_eq!(read_from_start(&held), b"s3cret");
    assert_eq!(served.helper.gets().len(), 1);
    let reader = LoopingReader::start(file);
    reader.wait_for(20, "before the handover");

    // The predecessor hands the volume over a real socket; the successor takes it with files
    // of its own (a fresh cache: its first open of a file asks the helper again).
    let (sending, receiving) = std::os::unix::net::UnixStream::pair().unwrap();
    let (handed, device) = served.mount.hand_over(Duration::from_secs(30)).unwrap();
    assert_eq!(handed.group, 2000);
    let volume = handover::HandedVolume {
        volume_id: "csi-lazy-handover".into(),
        mount: handed,
        files: served.mount.files().handed(),
    };
    handover::send(&sending, &volume, device.as_fd(), 256 << 20).unwrap();
    handover::send_end(&sending).unwrap();
    drop(device);
    let (volume, device) = handover::receive(&receiving, 256 << 20).unwrap().unwrap();
    assert!(handover::receive(&receiving, 256 << 20).unwrap().is_none());
    let files = Arc::new(served.runtime.block_on(async { served.helper.files(HOUR) }));
    let successor = LazyMount::take_over(&volume.volume_id, volume.mount, device, files.clone()).unwrap();
    // The predecessor goes, closing its descriptors: the connection lives on in the successor's.
    drop(std::mem::replace(&mut served.mount, successor));
    reader.wait_for(reader.reads() + 20, "after the handover");
    assert!(files.gets() >= 1, "the successor serves: its own helper calls");
    reader.stop().unwrap();

    // The handle kept open reads through the successor: its pages dropped (the loop, which
    // paged them again, has stopped), the kernel asks for them by the handle's number, which
    // only the state handed over tells the successor.
    nix::fcntl::posix_fadvise(held.as_fd(), 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
    let reads_served = served.mount.reads_served();
    assert_eq!(read_from_start(&held), b"s3cret");
    assert!(served.mount.reads_served() > reads_served, "the read reached the successor");
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(held.metadata().unwrap().gid(), 2000, "the attributes are the predecessor's");
    drop(held);
    served.unmount();
}

#[test]
fn a_files_first_read_by_sendfile_gets_its_content() {
    // busybox's cat copies with sendfile(2), which the kernel serves from the page cache up to
    // the size it holds, without asking the filesystem for a newer one (unlike read(2)).
    assert!(std::path::Path::new("/bin/busybox").exists(), "busybox-static (tests/node-packages installs it)");
    let served = Served::new("csi-lazy-sendfile", None);
    let first = Command::new("/bin/busybox").arg("cat").arg(served.file()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&first.stdout), "s3cret", "{first:?}");
    served.unmount();
}

#[test]
fn a_handed_over_volume_that_does_not_hold_together_is_taken_down_and_an_unrecorded_one_is_not_served() {
    use crate::volume::lazy::handover::take::TakenVolume;
    use crate::volume::recovery::recover;
    use crate::volume::service::{NodeService, VolumeSettings};
    use crate::volume::store::{FileVolumeStore, VolumeStore};

    let runtime = runtime();
    let helper = Helper::new(&[("db-password", "s3cret")]);
    let (dir, text, opened, created) = created_target();
    let volume_id = "csi-lazy-broken";
    // Mounted by the predecessor and handed over: this process holds the connection.
    let device = LinuxMounter.mount_fuse(&opened.target, &mount_tag(volume_id)).unwrap();
    drop(opened);
    let store = Arc::new(FileVolumeStore::open(dir.path().join("state")).unwrap());
    store.put(&lazy_record(volume_id, &text, created, None), true).unwrap();
    let handed = [volume_id.to_string()].into();
    let (kept, dropped) = recover(store.load_all().unwrap().0, &LinuxMounter, store.as_ref(), dir.path(), &handed);
    assert_eq!((kept.len(), dropped.len()), (1, 0), "kept, unseen: {dropped:?}");
    let service = NodeService::new(
        "node-1".into(),
        VolumeSettings::for_tests(dir.path().to_path_buf(), false),
        Arc::new(LinuxMounter),
        store.clone(),
        Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
        kept,
    );
    // Its state does not hold together (one path, two inodes); another volume has no record.
    let broken = HandedLazyVolume {
        negotiated: crate::volume::lazy::fuse::wire::Negotiated { minor: 31 },
        mounted: (0, 0),
        group: 0,
        inodes: vec!["secrets".into(), "secrets".into()],
        open_files: crate::volume::lazy::open_files::OpenFilesState { handles: vec![], pages: vec![], next_handle: 1 },
        contents: vec![],
    };
    let files = || Arc::new(runtime.block_on(async { helper.files(HOUR) }));
    let unrecorded = std::fs::File::open("/dev/null").unwrap().into();
    let lines = service.adopt_lazy(vec![
        TakenVolume { volume_id: volume_id.into(), mount: broken.clone(), files: files(), device },
        TakenVolume { volume_id: "csi-nobody".into(), mount: broken, files: files(), device: unrecorded },
    ]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("volume \"csi-lazy-broken\": handed over but not served (the handed-over lazy volume \"csi-lazy-broken\": the path \"secrets\" has two inodes); taken down"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "volume \"csi-nobody\": handed over but not recorded as lazy here; not served");
    assert!(!listed_in_mountinfo(&text).unwrap(), "its mount is taken down");
    assert!(store.load_all().unwrap().0.is_empty(), "and its record");
    assert!(service.volume_ids_where(|_| true).is_empty(), "and the service forgot it");
}

#[test]
fn a_failed_read_answers_the_errno_that_says_why() {
    // What the reader's program sees: EACCES for withdrawn access, ENOENT for a file the helper
    // does not have, ENOMEM for a volume full of what it holds, EIO for anything else.
    let reason = || "why".to_string();
    let cases = [
        (ContentError::Denied(reason()), Errno::EACCES),
        (ContentError::Missing(reason()), Errno::ENOENT),
        (ContentError::TooLarge(reason()), Errno::ENOMEM),
        (ContentError::Unavailable(reason()), Errno::EIO),
        (ContentError::Internal(reason()), Errno::EIO),
    ];
    for (error, errno) in cases {
        assert_eq!(errno_of(&error), errno, "{error:?}");
    }
}

#[test]
fn handed_content_says_its_size_in_debug_and_never_its_bytes() {
    let content = HandedContent::of(7, b"hunter2-the-password");
    let told = format!("{content:?}");
    assert_eq!(told, "content 7 (28 base64 characters)");
    let mut volume = crate::volume::lazy::handover::tests::mount();
    volume.contents = vec![content];
    let told = format!("{volume:?}");
    assert!(!told.contains("aHVudGVy") && !told.contains("hunter2"), "{told}");
}

#[test]
fn handed_inodes_keep_their_numbers_and_a_list_that_cannot_be_the_kernels_is_refused() {
    let paths: Vec<String> = (0..MAX_INODES).map(|n| format!("secrets/file-{n}")).collect();
    let inodes = Inodes::handed(&paths).expect("as many as a volume may number");
    assert_eq!(inodes.path(2), Some("secrets/file-0"));
    assert_eq!(inodes.path(MAX_INODES as u64 + 1), Some(format!("secrets/file-{}", MAX_INODES - 1).as_str()));
    assert_eq!(inodes.path(1), Some(""), "the root");

    let one_more: Vec<String> = (0..=MAX_INODES).map(|n| format!("f{n}")).collect();
    assert_eq!(Inodes::handed(&one_more).err(), Some(format!("{} inodes, more than {MAX_INODES}", MAX_INODES + 1)));
    let twice = ["a".to_string(), "b".into(), "a".into()];
    assert_eq!(Inodes::handed(&twice).err(), Some("the path \"a\" has two inodes".into()));
    let root = ["a".to_string(), String::new(), "b".into()];
    assert_eq!(Inodes::handed(&root).err(), Some("the root's path is among its inodes".into()));
}

#[test]
fn a_lazy_volumes_root_lists_its_entries_with_their_kinds() {
    let served = Served::new("csi-lazy-listing", None);
    let list = |dir: &Path| {
        let mut entries: Vec<(String, bool)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                (entry.file_name().to_string_lossy().into_owned(), entry.file_type().unwrap().is_dir())
            })
            .collect();
        entries.sort();
        entries
    };
    assert_eq!(list(&served.text), [("secrets".to_string(), true)]);
    // The helper's directory is open: it lists nothing, and a name looked up in it is a file.
    assert_eq!(list(&served.text.join("secrets")), []);
    assert!(std::fs::metadata(served.file()).unwrap().is_file());
    served.unmount();
}

#[test]
fn a_listing_page_holds_what_fits_and_stops_at_the_first_entry_that_does_not() {
    let entry = |ino: u64, name: &str| (ino, Kind::File, name.to_string());
    let reply_of = |entries: &Entries| entries.reply(7);
    let by_hand = |added: &[(u64, u64, &str)], size: u32| {
        let mut entries = Entries::new(size);
        for (ino, offset, name) in added {
            assert!(entries.add(*ino, *offset, Kind::File, name.as_bytes()));
        }
        reply_of(&entries)
    };
    let all = || vec![entry(2, "a"), entry(3, "b"), entry(4, "c"), entry(5, "d"), entry(6, "e")];

    // Room for all: every entry in one page.
    let mut entries = Entries::new(4096);
    fill(&mut entries, all(), 0);
    assert_eq!(reply_of(&entries), by_hand(&[(2, 1, "a"), (3, 2, "b"), (4, 3, "c"), (5, 4, "d"), (6, 5, "e")], 4096));
    // From an offset: the rest.
    let mut entries = Entries::new(4096);
    fill(&mut entries, all(), 3);
    assert_eq!(reply_of(&entries), by_hand(&[(5, 4, "d"), (6, 5, "e")], 4096));
    // Room for two short entries (32 bytes each): a long name that does not fit ends the page,
    // and the short one after it waits for the next page rather than jumping it.
    let long = "l".repeat(40);
    let mut entries = Entries::new(64);
    fill(&mut entries, vec![entry(2, "a"), entry(3, &long), entry(4, "c")], 0);
    assert_eq!(reply_of(&entries), by_hand(&[(2, 1, "a")], 64));
}

#[test]
fn a_mount_time_travels_whole_and_one_past_any_time_is_refused() {
    let mounted = std::time::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    assert_eq!(as_handed(mounted), (1_700_000_000, 123_456_789));
    assert_eq!(mounted_at(as_handed(mounted)), Some(mounted));
    assert_eq!(mounted_at((0, 0)), Some(std::time::UNIX_EPOCH));
    assert_eq!(mounted_at((u64::MAX, 999_999_999)), None);
}

#[test]
fn a_directorys_attributes_are_kept_for_the_cache_ttl_and_an_unfetched_files_not_at_all() {
    // The kernel keeps what it was told of a directory for the volume's cache TTL (an hour here),
    // and nothing of a file whose content was never fetched (its size is not known yet).
    let served = Served::new("csi-lazy-ttl", Some(2000));
    let (root, ttl) = served.mount.filesystem.attributes(ROOT, "", EntryKind::Directory);
    assert_eq!((ttl, root.kind, root.perm, root.gid), (HOUR, Kind::Directory, 0o555, 2000));
    let (file, ttl) = served.mount.filesystem.attributes(2, "secrets/db-password", EntryKind::File);
    assert_eq!((ttl, file.size, file.perm), (Duration::ZERO, 0, 0o444));
    served.unmount();
}

#[test]
fn a_pause_waits_for_the_answers_owed_and_says_so_when_they_do_not_come() {
    let mut served = Served::new("csi-lazy-owed", None);
    // A file whose fetch waits until the test lets it go: the helper reads it from a FIFO.
    let fifo = served.helper.path("files").join("slow");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = {
        let file = served.text.join("secrets/slow");
        std::thread::spawn(move || std::fs::read_to_string(file))
    };
    // The positive control: the open reached the helper, which waits on the FIFO. (Bounded,
    // so a fetch that never starts fails the test instead of hanging it.)
    let asked = std::time::Instant::now();
    while !served.helper.gets().iter().any(|get| get.contains("slow")) {
        assert!(asked.elapsed() < Duration::from_secs(60), "the helper was never asked for the file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let error = served.mount.pause(Duration::from_millis(300)).unwrap_err().to_string();
    assert!(error.ends_with("1 FUSE answers were still owed after 300ms"), "{error}");
    // The fetch ends: its answer goes out though the volume is paused, and the pause settles.
    std::fs::write(&fifo, "late").unwrap();
    served.mount.pause(Duration::from_secs(60)).unwrap();
    served.mount.resume().unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), "late", "the open and its read answered, none failed");
    served.unmount();
}
