//! Two drivers on one node, as a DaemonSet's rolling update with `maxSurge: 1` runs them: the
//! second finds the first holding the node and takes its lazy volumes and its listening sockets
//! over a real socket (real FUSE mounts, real descriptors passed, the CSI and registration
//! sockets' files never changed), while a container reads its secret in a loop and keeps a
//! file open; or, unable to serve them, it refuses and stops, and the first serves on as before.
//! Either version of the handover meets the other: a version-1 successor (its bytes as that
//! version wrote them) is handed no socket, and a successor meeting a version-1 predecessor
//! asks again in version 1 and replaces the sockets in place.

use std::collections::BTreeMap;
use std::os::fd::AsFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inline_guard_proto::csi::v1::identity_client::IdentityClient;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_proto::csi::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest, ProbeRequest};

use super::*;
use crate::content::external::exec::ExecProviders;
use crate::content::external::lazy_files::tests::Helper;
use crate::content::external::lazy_only::LazyOnlySource;
use crate::content::external::provider::ExecProvider;
use crate::volume::lazy::filesystem::tests::LoopingReader;
use crate::volume::mounter::listed_in_mountinfo;

const HOUR: Duration = Duration::from_secs(3600);

/// A driver running on a thread of its own, until stopped.
struct RunningDriver {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<std::result::Result<(), String>>,
    /// Whether it holds kubelet's registration (told by kubelet, or handed over).
    registered: watch::Receiver<bool>,
}

impl RunningDriver {
    /// A driver on `root` whose providers are `providers` (none: it cannot serve lazy volumes).
    fn start(root: &Path, providers: &[(String, ExecProvider)], runtime: &tokio::runtime::Handle) -> RunningDriver {
        RunningDriver::start_with_health(root, providers, runtime, None)
    }

    /// The same, with its health port on `health`.
    fn start_with_health(
        root: &Path,
        providers: &[(String, ExecProvider)],
        runtime: &tokio::runtime::Handle,
        health: Option<std::net::SocketAddr>,
    ) -> RunningDriver {
        let mut plugin = Plugin::in_directory(root, root.join("csi.sock"));
        plugin.config.health_address = health;
        // Its registration socket too, as on a node (nobody dials it here).
        plugin.register = true;
        let registered = plugin.registered.subscribe();
        // Every volume a lazy volume of provider `vault-cli`, when this driver has it.
        plugin.content = Arc::new(LazyOnlySource {
            providers: ExecProviders::new(providers.iter().cloned().collect::<BTreeMap<_, _>>(), 4),
            provider: "vault-cli".into(),
            runtime: runtime.clone(),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime
                .block_on(plugin.run(async {
                    let _ = stopped.await;
                }))
                .map_err(|error| error.to_string())
        });
        RunningDriver { stop, thread, registered }
    }

    /// Stops it (its SIGTERM): how its run ended.
    fn stop(self) -> std::result::Result<(), String> {
        let _ = self.stop.send(());
        self.thread.join().unwrap()
    }
}

/// The identity of the file at `path`, once there is one, with the time it was made: a socket
/// bound where another was just removed often gets the removed one's inode number (ext4 reuses
/// it at once), so the number alone would call a replaced socket the same file.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|metadata| (metadata.dev(), metadata.ino(), metadata.ctime(), metadata.ctime_nsec()))
}

/// The registration socket's path on the node under `root`.
fn registration(root: &Path) -> PathBuf {
    root.join("registry").join(format!("{DRIVER_NAME}-reg.sock"))
}

/// The files under `root`'s socket directories whose names start with `.` (a temporary socket).
fn hidden_sockets(root: &Path) -> Vec<PathBuf> {
    [root.to_path_buf(), root.join("registry")]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().path()))
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.')))
        .collect()
}

/// Waits (a minute at most) for `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn target(root: &Path) -> PathBuf {
    root.join("pods/csi-lazy/volumes/kubernetes.io~csi/shared/mount")
}

/// kubelet's publish of volume `csi-lazy` of provider `vault-cli`.
fn publish_request(root: &Path) -> NodePublishVolumeRequest {
    let mut request = crate::csi::node::tests::request_at(root, "csi-lazy", "unused");
    request.volume_context.remove("share");
    request.volume_context.insert("provider".into(), "vault-cli".into());
    request
}

/// What kubelet would call on the node's CSI socket, as a client of its own.
struct Kubelet {
    runtime: tokio::runtime::Runtime,
    socket: PathBuf,
}

impl Kubelet {
    fn new(root: &Path) -> Kubelet {
        // A worker of its own, as kubelet's connections have: a current-thread runtime would
        // leave each dropped connection open until the next call (the server would then wait
        // out its shutdown grace for a client that is long gone, which kubelet never makes it do).
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        Kubelet { runtime, socket: root.join("csi.sock") }
    }

    fn channel(&self) -> tonic::transport::Channel {
        let channel = crate::test_util::client::unix_channel(self.socket.clone(), Duration::from_secs(60));
        self.runtime.block_on(channel).unwrap()
    }

    fn probe(&self) -> Option<bool> {
        let mut identity = IdentityClient::new(self.channel());
        self.runtime.block_on(identity.probe(ProbeRequest {})).unwrap().into_inner().ready
    }

    fn publish(&self, root: &Path) -> std::result::Result<(), tonic::Status> {
        let mut node = NodeClient::new(self.channel());
        self.runtime.block_on(node.node_publish_volume(publish_request(root))).map(drop)
    }

    fn unpublish(&self, root: &Path) -> std::result::Result<(), tonic::Status> {
        let mut node = NodeClient::new(self.channel());
        let request = NodeUnpublishVolumeRequest {
            volume_id: "csi-lazy".into(),
            target_path: target(root).to_string_lossy().into_owned(),
        };
        self.runtime.block_on(node.node_unpublish_volume(request)).map(drop)
    }
}

/// A node (whatever a failed test leaves mounted below its directory is unmounted with it)
/// whose first driver serves the lazy volume of a helper serving `db-password` and `api-key`,
/// read in a loop by a container (20 reads made).
struct Serving {
    dir: crate::test_util::mounted_dir::MountedDir,
    helper: Helper,
    providers: Vec<(String, ExecProvider)>,
    // The runtime the providers' helpers run on.
    runtime: tokio::runtime::Runtime,
    kubelet: Kubelet,
    first: RunningDriver,
    reader: LoopingReader,
    first_socket: (u64, u64, i64, i64),
}

fn serving() -> Serving {
    assert!(nix::unistd::geteuid().is_root(), "mounting needs root: run the test command as root");
    let dir = crate::test_util::mounted_dir::MountedDir::new();
    let root = dir.path();
    std::fs::create_dir_all(root.join("shares")).unwrap();
    let helper = Helper::new(&[("db-password", "s3cret"), ("api-key", "k3y")]);
    let providers = vec![("vault-cli".to_string(), helper.provider(HOUR))];
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let kubelet = Kubelet::new(root);
    let first = RunningDriver::start(root, &providers, runtime.handle());
    kubelet.publish(root).unwrap();
    assert_eq!(records(root), 1, "the positive control: the volume's record");
    let reader = LoopingReader::start(target(root).join("secrets/db-password"));
    reader.wait_for(20, "before anything else starts");
    let first_socket = identity(&root.join("csi.sock")).expect("the first driver's socket");
    Serving { dir, helper, providers, runtime, kubelet, first, reader, first_socket }
}

/// The offer socket's path on the node under `root`.
fn offer(root: &Path) -> PathBuf {
    root.join("state").join(crate::volume::lazy::handover::SOCKET_FILE)
}

/// The records in the node's state directory.
fn records(root: &Path) -> usize {
    let entries = std::fs::read_dir(root.join("state")).unwrap();
    entries.filter(|entry| entry.as_ref().unwrap().path().extension().is_some_and(|e| e == "json")).count()
}

#[test]
fn successors_take_the_lazy_volumes_over_rollout_after_rollout_while_a_container_reads_on() {
    let Serving { dir, helper, providers, runtime, kubelet, first, reader, first_socket } = serving();
    let root = dir.path();
    let registration_socket = identity(&registration(root)).expect("the first driver's registration socket");
    // A handle the container keeps open across the handover.
    let held = std::fs::File::open(target(root).join("secrets/db-password")).unwrap();
    let mut first_read = String::new();
    std::io::Read::read_to_string(&mut &held, &mut first_read).unwrap();
    assert_eq!(first_read, "s3cret");

    let second = RunningDriver::start(root, &providers, runtime.handle());
    // The successor holds the node once it has the registration socket the first handed over.
    wait_until("the successor to take the node", || {
        assert!(!second.thread.is_finished(), "the successor stopped");
        *second.registered.borrow()
    });
    wait_until("the successor's offer", || identity(&offer(root)).is_some());
    // It accepts on the very sockets the first listened on: kubelet's plugin watcher sees no
    // file change (no new registration, no deregistration), and no temporary socket is left.
    assert_eq!(identity(&root.join("csi.sock")), Some(first_socket), "the CSI socket's file is the first's");
    assert_eq!(identity(&registration(root)), Some(registration_socket), "and the registration socket's");
    assert_eq!(hidden_sockets(root), Vec::<PathBuf>::new(), "no temporary socket left");
    assert_eq!(kubelet.probe(), Some(true), "the successor serves the node's socket");
    reader.wait_for(reader.reads() + 20, "after the handover");
    assert!(!first.thread.is_finished(), "the first driver stays up, not ready, until it is stopped");

    // A file never opened before is fetched by the successor (the first let go of its side).
    let gets = helper.gets().len();
    assert_eq!(std::fs::read_to_string(target(root).join("secrets/api-key")).unwrap(), "k3y");
    assert_eq!(helper.gets().len(), gets + 1, "fetched through the successor");
    // The handle kept open reads through the successor, its pages dropped first so that the
    // kernel asks for them by the handle's number.
    nix::fcntl::posix_fadvise(held.as_fd(), 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
    let mut again = Vec::new();
    std::io::Seek::rewind(&mut &held).unwrap();
    std::io::Read::read_to_end(&mut &held, &mut again).unwrap();
    assert_eq!(again, b"s3cret");
    drop(held);

    // Stopped, the first driver leaves the sockets the successor accepts on where they are.
    first.stop().unwrap();
    assert_eq!(identity(&root.join("csi.sock")), Some(first_socket));
    assert_eq!(identity(&registration(root)), Some(registration_socket));
    assert_eq!(kubelet.probe(), Some(true), "the successor still serves");

    // The next rollout: the successor offers a handover in turn (the first left its offer
    // alone), and a third driver takes the volume and the same sockets from it.
    let third = RunningDriver::start(root, &providers, runtime.handle());
    wait_until("the third driver to take the node", || *third.registered.borrow());
    assert_eq!(identity(&root.join("csi.sock")), Some(first_socket));
    reader.wait_for(reader.reads() + 20, "after the second handover");
    second.stop().unwrap();
    assert_eq!(kubelet.probe(), Some(true), "the third driver serves");
    let reads = reader.stop().expect("no read failed across either handover");
    assert!(reads >= 60, "{reads} reads");

    // The last driver owns the volume: kubelet's unpublish reaches it and takes it down.
    kubelet.unpublish(root).unwrap();
    assert!(!listed_in_mountinfo(&target(root)).unwrap(), "unmounted by the last driver");
    third.stop().unwrap();
    assert!(!root.join("csi.sock").exists(), "the last driver removes the socket it served on exit");
    assert!(!registration(root).exists(), "and the registration socket");
    assert_eq!(records(root), 0, "no record left");
}

#[test]
fn a_successor_that_cannot_serve_a_lazy_volume_refuses_it_and_the_first_driver_serves_on() {
    let Serving { dir, helper, runtime, kubelet, first, reader, first_socket, .. } = serving();
    let root = dir.path();

    // A successor configured without the volume's provider.
    let refused = RunningDriver::start(root, &[], runtime.handle()).thread.join().unwrap().unwrap_err();
    assert!(
        refused.contains(
            "the lazy volume \"csi-lazy\" cannot be served by this driver: provider \"vault-cli\" is not \
             configured in this driver; the running driver keeps serving it"
        ),
        "{refused}"
    );
    reader.wait_for(reader.reads() + 20, "after the refused handover");
    assert_eq!(identity(&root.join("csi.sock")), Some(first_socket), "the first driver's socket is untouched");
    // The first driver serves on: a file never opened is fetched, and kubelet's unpublish
    // reaches it.
    assert_eq!(std::fs::read_to_string(target(root).join("secrets/api-key")).unwrap(), "k3y");
    assert!(helper.gets().iter().any(|get| get.starts_with("get secrets/api-key")), "{:?}", helper.gets());
    reader.stop().expect("no read failed across the refused handover");
    assert_eq!(kubelet.probe(), Some(true));
    kubelet.unpublish(root).unwrap();
    assert!(!listed_in_mountinfo(&target(root)).unwrap());
    first.stop().unwrap();
    assert!(!root.join("csi.sock").exists());
}

#[test]
fn a_successor_that_cannot_start_stops_before_it_takes_anything() {
    let Serving { dir, providers, runtime, kubelet, first, reader, first_socket, .. } = serving();
    let root = dir.path();

    // Its health port is taken (two drivers sharing a network, a port in use): it stops before
    // asking for anything, so the volume stays with the first driver.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = Some(taken.local_addr().unwrap());
    let stopped = RunningDriver::start_with_health(root, &providers, runtime.handle(), port).thread.join().unwrap();
    assert!(stopped.unwrap_err().starts_with("binding the health port"), "it stops at its health port");
    reader.wait_for(reader.reads() + 20, "after the successor stopped");
    assert_eq!(identity(&root.join("csi.sock")), Some(first_socket), "the first driver's socket is untouched");
    reader.stop().expect("no read failed");
    kubelet.unpublish(root).unwrap();
    first.stop().unwrap();
}

/// Reads the next 8 bytes from `socket`.
fn word_from(mut socket: &std::os::unix::net::UnixStream) -> [u8; 8] {
    let mut word = [0u8; 8];
    std::io::Read::read_exact(&mut socket, &mut word).unwrap();
    word
}

fn say_raw(mut socket: &std::os::unix::net::UnixStream, bytes: &[u8]) {
    std::io::Write::write_all(&mut socket, bytes).unwrap();
}

#[test]
fn a_version_1_successor_is_handed_the_node_without_a_socket() {
    assert!(nix::unistd::geteuid().is_root(), "mounting needs root: run the test command as root");
    let dir = crate::test_util::mounted_dir::MountedDir::new();
    let root = dir.path();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let first = RunningDriver::start(root, &[], runtime.handle());
    wait_until("the driver's offer", || identity(&offer(root)).is_some());
    let kubelet = Kubelet::new(root);
    assert_eq!(kubelet.probe(), Some(true), "the positive control: the driver serves its socket");
    let csi_socket = identity(&root.join("csi.sock")).unwrap();

    // What a driver of version 1 sends and expects, byte for byte.
    let asking = std::os::unix::net::UnixStream::connect(offer(root)).unwrap();
    asking.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    say_raw(&asking, b"IGH1ASK_");
    assert_eq!(&word_from(&asking), b"IGH1PROV");
    let mut challenge = [0u8; 32];
    std::io::Read::read_exact(&mut &asking, &mut challenge).unwrap();
    let proof = root.join("state").join(format!(".handover-proof-{}", std::str::from_utf8(&challenge).unwrap()));
    std::fs::write(&proof, b"").unwrap();
    say_raw(&asking, b"IGH1PRVD");
    // No volume, and no socket: the end comes first (a socket's frame would read IGH2SOCK).
    assert_eq!(word_from(&asking), [0u8; 8], "a version-1 successor is sent the end, nothing else");
    say_raw(&asking, b"IGH1TAKE");
    assert_eq!(&word_from(&asking), b"IGH1GONE");

    // The first let go: it accepts no more, and leaves the socket's file for the successor to
    // replace in place.
    wait_until("the first driver to stop accepting", || {
        std::os::unix::net::UnixStream::connect(root.join("csi.sock")).is_err()
    });
    assert_eq!(identity(&root.join("csi.sock")), Some(csi_socket), "the file is left for the successor");
    first.stop().unwrap();
    assert_eq!(identity(&root.join("csi.sock")), Some(csi_socket));
}

/// A driver of version 1 holding the node under `root`, written from that version's bytes: it
/// closes the connection at a word it does not know; to `IGH1ASK_` it asks for a proof, hands
/// no volume, and lets go once told the node is taken. Returns every first word it heard.
fn version_1_predecessor(root: &Path) -> std::thread::JoinHandle<Vec<[u8; 8]>> {
    let state = root.join("state");
    std::fs::create_dir_all(root.join("registry")).unwrap();
    let lock = StateLock::acquire(&state).unwrap();
    let csi = std::os::unix::net::UnixListener::bind(root.join("csi.sock")).unwrap();
    let reg = std::os::unix::net::UnixListener::bind(registration(root)).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(offer(root)).unwrap();
    std::thread::spawn(move || {
        let mut heard = Vec::new();
        let mut lock = Some(lock);
        for socket in listener.incoming() {
            let socket = socket.unwrap();
            let first = word_from(&socket);
            heard.push(first);
            if &first != b"IGH1ASK_" {
                continue;
            }
            let challenge = "0123456789abcdef0123456789abcdef";
            say_raw(&socket, format!("IGH1PROV{challenge}").as_bytes());
            assert_eq!(&word_from(&socket), b"IGH1PRVD");
            let proof = state.join(format!(".handover-proof-{challenge}"));
            assert!(proof.is_file(), "the successor wrote its proof");
            std::fs::remove_file(proof).unwrap();
            say_raw(&socket, &[0u8; 8]);
            assert_eq!(&word_from(&socket), b"IGH1TAKE");
            drop((csi, reg, lock.take()));
            say_raw(&socket, b"IGH1GONE");
            break;
        }
        heard
    })
}

#[test]
fn a_successor_asks_a_version_1_predecessor_again_in_version_1_and_replaces_its_sockets() {
    assert!(nix::unistd::geteuid().is_root(), "mounting needs root: run the test command as root");
    let dir = crate::test_util::mounted_dir::MountedDir::new();
    let root = dir.path();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let predecessor = version_1_predecessor(root);
    let (old_socket, old_registration) = (identity(&root.join("csi.sock")), identity(&registration(root)));
    assert!(old_socket.is_some() && old_registration.is_some(), "the positive control: the old driver's sockets");

    let successor = RunningDriver::start(root, &[], runtime.handle());
    let heard = predecessor.join().unwrap();
    assert_eq!(heard, [*b"IGH2ASK_", *b"IGH1ASK_"], "asked in version 2, then again in version 1");
    wait_until("the successor's sockets in place of the old driver's", || {
        identity(&root.join("csi.sock")).is_some_and(|now| Some(now) != old_socket)
            && identity(&registration(root)).is_some_and(|now| Some(now) != old_registration)
    });
    assert_eq!(Kubelet::new(root).probe(), Some(true), "the successor serves");
    assert_eq!(hidden_sockets(root), Vec::<PathBuf>::new(), "the temporary sockets were renamed in place");
    assert!(!*successor.registered.borrow(), "a replaced registration socket waits for kubelet's notice");

    // The next rollout hands the renamed sockets on (they keep the temporary name they were
    // bound under): a third driver accepts on them, their files unchanged.
    let renamed = (identity(&root.join("csi.sock")), identity(&registration(root)));
    let third = RunningDriver::start(root, &[], runtime.handle());
    wait_until("the third driver to take the node", || {
        assert!(!third.thread.is_finished(), "the third driver stopped");
        *third.registered.borrow()
    });
    assert_eq!((identity(&root.join("csi.sock")), identity(&registration(root))), renamed);
    successor.stop().unwrap();
    assert_eq!(Kubelet::new(root).probe(), Some(true), "the third driver serves");
    third.stop().unwrap();
    assert!(!root.join("csi.sock").exists() && !registration(root).exists());
}
