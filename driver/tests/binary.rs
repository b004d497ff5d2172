//! The driver binary as a node runs it: start-up refusals (a bad configuration names the field
//! and line; a second instance stops before touching anything), SIGKILL in the middle of a large
//! publish followed by a restart that undoes exactly what was made, and a SIGTERM that completes
//! within its bound whatever a client does.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use inline_guard_proto::csi::v1::ProbeRequest;
use inline_guard_proto::csi::v1::identity_client::IdentityClient;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sharedresource_csi_driver::volume::mounter::listed_in_mountinfo;
use support::{NodeDir, channel, kubelet_target, publish_request, snapshot};

mod support;

#[test]
fn the_read_grants_controller_refuses_a_driver_account_that_is_not_namespace_slash_name() {
    for (account, why) in [
        ("just-a-name", "\"just-a-name\" is not NAMESPACE/NAME"),
        (
            "Bad_NS/driver",
            "the driver's ServiceAccount: \"Bad_NS\" is not a valid namespace name: a namespace name is at \
             most 63 characters of lowercase letters, digits and '-', starting and ending with a letter or digit",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_sharedresource-read-grants"))
            .args(["--kubeconfig", "/nonexistent", "--driver-service-account", account])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{account}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(stderr.trim_end(), format!("sharedresource-read-grants: {why}"));
    }
}

#[test]
fn a_bad_configuration_stops_the_driver_naming_the_field() {
    let dir = support::NodeDir::new();
    let config = dir.path().join("driver.yaml");
    std::fs::write(&config, "stateDir: /tmp/x\ntmpfsSize: lots\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
        .args(["--endpoint", "unix:///tmp/never.sock", "--node-id", "n1", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!(
            "sharedresource-csi-driver: {}: tmpfsSize: invalid size \"lots\": use bytes or a Ki, Mi or Gi quantity at line 2, column 12",
            config.display()
        )
    );
}

#[test]
fn a_relative_endpoint_is_refused() {
    let dir = support::NodeDir::new();
    let config = dir.path().join("driver.yaml");
    std::fs::write(
        &config,
        format!("stateDir: {}\nstaticSharesDir: {}\n", dir.path().join("s").display(), dir.path().display()),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
        .args(["--endpoint", "unix://csi.sock", "--node-id", "n1", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("is not unix:///absolute/path"));
}

/// The release binary on a configuration under `dir`: kubelet root `dir/kubelet`, shares in
/// `dir/shares`, state in `dir/state`, registration in `dir/registry`.
struct Driver {
    dir: PathBuf,
    child: std::process::Child,
}

impl Driver {
    fn config(dir: &Path, extra: &str) -> PathBuf {
        let config = dir.join("driver.yaml");
        let text = format!(
            "stateDir: {d}/state\nregistryDir: {d}/registry\nkubeletDir: {d}/kubelet\nstaticSharesDir: {d}/shares\n{extra}",
            d = dir.display()
        );
        std::fs::write(&config, text).unwrap();
        config
    }

    fn spawn(dir: &Path, extra: &str) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
            .args(["--endpoint", &format!("unix://{}/csi.sock", dir.display()), "--node-id", "n1", "--config"])
            .arg(Self::config(dir, extra))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn start(dir: &Path, extra: &str) -> Driver {
        Driver { dir: dir.to_path_buf(), child: Self::spawn(dir, extra) }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("csi.sock")
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits up to `bound` for the process to exit; its status and standard error.
    fn wait(mut self, bound: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut stderr = String::new();
                let _ = self.child.stderr.take().unwrap().read_to_string(&mut stderr);
                return (status.code(), stderr);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        panic!("the driver did not exit within {bound:?}");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn node_dir() -> NodeDir {
    assert!(support::is_root(), "real mounts need root: run the test command as root");
    let dir = support::NodeDir::new();
    std::fs::create_dir_all(dir.path().join("kubelet/pods")).unwrap();
    std::fs::create_dir_all(dir.path().join("shares/cluster-ca")).unwrap();
    std::fs::write(dir.path().join("shares/cluster-ca/ca.crt"), "pem").unwrap();
    dir
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The driver's answer to Probe over `socket`.
fn probe(socket: &Path) -> Option<bool> {
    runtime().block_on(async {
        let mut identity = IdentityClient::new(channel(socket.to_path_buf()).await);
        identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready
    })
}

#[test]
fn a_sigkill_in_the_middle_of_a_large_publish_is_undone_at_restart_and_nothing_else_changes() {
    let dir = node_dir();
    let root = dir.path();
    // A share large enough that its write takes a while: the kill lands while it is written.
    let share = root.join("shares/cluster-ca");
    for i in 0..4000 {
        std::fs::write(share.join(format!("file-{i:05}")), format!("content {i}")).unwrap();
    }
    // What kubelet and others left on the node: the pod's volume directory with kubelet's file,
    // another pod's data, and a target directory that already exists with content.
    let target = kubelet_target(&root.join("kubelet"), "pod-a", "shared");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(target.parent().unwrap().join("vol_data.json"), "{\"kubelet\":true}").unwrap();
    std::fs::create_dir_all(root.join("kubelet/pods/pod-b/etc-hosts")).unwrap();
    std::fs::write(root.join("kubelet/pods/pod-b/etc-hosts/hosts"), "127.0.0.1 localhost").unwrap();
    let before = snapshot(&root.join("kubelet"));

    let extra = "tmpfsSize: 64Mi\n";
    let driver = Driver::start(root, extra);
    let runtime = runtime();
    let publishing = {
        let socket = driver.socket();
        let target = target.clone();
        std::thread::spawn(move || {
            runtime.block_on(async {
                let mut node = NodeClient::new(channel(socket).await);
                node.node_publish_volume(publish_request("csi-big", &target, true)).await
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listed_in_mountinfo(&target).unwrap() {
        assert!(Instant::now() < deadline, "the publish never mounted");
        std::thread::sleep(Duration::from_micros(200));
    }
    driver.signal(Signal::SIGKILL);
    let (code, _) = driver.wait(Duration::from_secs(5));
    assert_eq!(code, None, "killed by the signal");
    assert!(publishing.join().unwrap().is_err(), "the publish was cut off");
    let records: Vec<String> = std::fs::read_dir(root.join("state"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(records.len(), 1);
    assert!(records[0].contains("\"complete\": false"), "killed mid-publish: {}", records[0]);
    assert!(listed_in_mountinfo(&target).unwrap(), "the half volume is still mounted before the restart");

    // The restart undoes the half publish: its tmpfs and the target it made go, nothing else.
    let driver = Driver::start(root, extra);
    // Served only once recovery is done.
    assert_eq!(probe(&driver.socket()), Some(true));
    assert!(!listed_in_mountinfo(&target).unwrap(), "the interrupted volume is unmounted");
    assert_eq!(snapshot(&root.join("kubelet")), before, "everything else is exactly as it was");
    driver.signal(Signal::SIGTERM);
    assert_eq!(driver.wait(Duration::from_secs(15)).0, Some(0));
    assert!(
        !root.join("state").read_dir().unwrap().any(|e| e.unwrap().path().extension().is_some_and(|e| e == "json"))
    );
}

/// The identity of the file at `path`, if any.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path).ok().map(|metadata| (metadata.dev(), metadata.ino()))
}

#[test]
fn a_second_instance_takes_the_node_over_and_the_first_waits_for_its_sigterm() {
    let dir = node_dir();
    let first = Driver::start(dir.path(), "");
    let socket = first.socket();
    assert_eq!(probe(&socket), Some(true));
    let first_socket = identity(&socket).expect("the first driver's socket");

    // Same configuration, as a DaemonSet's rolling update starts it: it asks the first for a
    // handover (no lazy volume to take) and serves the node in its place, accepting on the
    // very socket the first listened on (its file untouched). The lock file names its holder.
    let mut second = Driver::start(dir.path(), "");
    let lock = dir.path().join("state/driver.lock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&lock).unwrap_or_default().trim() != second.child.id().to_string() {
        assert!(second.child.try_wait().unwrap().is_none(), "the second driver exited");
        assert!(Instant::now() < deadline, "the second driver never took the node");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(identity(&socket), Some(first_socket), "the socket's file is the one the first bound");
    assert_eq!(probe(&socket), Some(true), "the second driver serves");
    let mut first = first;
    assert!(first.child.try_wait().unwrap().is_none(), "the first driver waits for its SIGTERM");
    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait(Duration::from_secs(15)).0, Some(0));
    assert_eq!(identity(&socket), Some(first_socket), "the socket the second accepts on stays");
    assert_eq!(probe(&socket), Some(true), "and answers");
    let offer = dir.path().join("state/handover.sock");
    assert!(
        std::os::unix::net::UnixStream::connect(&offer).is_ok(),
        "and so does its offer, which the first left alone"
    );

    // Another state directory, the same endpoint: the live socket is not taken over.
    let other = Driver::config(dir.path(), "");
    let text = std::fs::read_to_string(&other).unwrap().replace("/state", "/state-2");
    std::fs::write(&other, text).unwrap();
    let mut third = Command::new(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
        .args(["--endpoint", &format!("unix://{}", socket.display()), "--node-id", "n1", "--config"])
        .arg(&other)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = third.wait().unwrap();
    let mut stderr = String::new();
    third.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is served by a live process (another instance of the driver?); refusing to take it over"),
        "{stderr}"
    );
    assert_eq!(probe(&socket), Some(true), "the second driver still answers");
    second.signal(Signal::SIGTERM);
    assert_eq!(second.wait(Duration::from_secs(15)).0, Some(0));
    assert!(!socket.exists(), "its own socket is removed on exit");
    assert!(!offer.exists(), "and its offer");
}

#[test]
fn a_lock_holder_that_offers_no_handover_keeps_the_node_and_a_second_instance_stops() {
    let dir = node_dir();
    // What a driver from before handovers holds: the lock, and no offer socket.
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    let file = std::fs::File::create(dir.path().join("state/driver.lock")).unwrap();
    let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let (code, stderr) = Driver::start(dir.path(), "").wait(Duration::from_secs(10));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("another sharedresource-csi-driver (pid unknown) is running on the state directory")
            && stderr.contains("; refusing to start (it offers no handover)"),
        "{stderr}"
    );
    assert!(!dir.path().join("csi.sock").exists(), "nothing bound");
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .filter(|name| name.to_string_lossy().starts_with('~'))
        .collect();
    assert!(beside.is_empty(), "nothing left beside where its sockets would go: {beside:?}");
    drop(held);
}

#[test]
fn sigterm_completes_within_the_bound_while_a_client_holds_a_silent_connection() {
    let dir = node_dir();
    let driver = Driver::start(dir.path(), "shutdownTimeoutSeconds: 1\n");
    assert_eq!(probe(&driver.socket()), Some(true), "serving");
    // A client that opens HTTP/2 (preface and an empty SETTINGS frame) and then never reads or
    // answers: graceful shutdown's GOAWAY and PING go unacknowledged, so it never completes.
    let mut silent = std::os::unix::net::UnixStream::connect(driver.socket()).unwrap();
    std::io::Write::write_all(&mut silent, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let socket = driver.socket();
    let started = Instant::now();
    driver.signal(Signal::SIGTERM);
    let (code, stderr) = driver.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(stderr.contains("connections still open after the grace period"), "{stderr}");
    assert!(!socket.exists(), "the socket is removed");
    drop(silent);
}

#[test]
fn a_2000_level_path_publishes_refreshes_and_unpublishes_under_256_open_files() {
    let dir = node_dir();
    let root = dir.path();
    let deep: PathBuf = std::iter::repeat_n("a", 2000).collect();
    let share = root.join("shares/cluster-ca");
    std::fs::create_dir_all(share.join(&deep)).unwrap();
    std::fs::write(share.join(&deep).join("f"), "one").unwrap();
    let config = Driver::config(root, "refreshSeconds: 1\n");
    // Hard and soft at 256: the driver's raise at start cannot lift it.
    let child = Command::new("sh")
        .args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
        .args(["--endpoint", &format!("unix://{}/csi.sock", root.display()), "--node-id", "n1", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let driver = Driver { dir: root.to_path_buf(), child };
    assert_eq!(probe(&driver.socket()), Some(true));
    let limit = std::fs::read_to_string(format!("/proc/{}/limits", driver.child.id())).unwrap();
    let open_files = limit.lines().find(|l| l.starts_with("Max open files")).unwrap_or_default().to_string();
    assert!(open_files.split_whitespace().filter(|w| *w == "256").count() == 2, "{open_files}");

    let target = kubelet_target(&root.join("kubelet"), "pod-a", "shared");
    let runtime = runtime();
    let published = runtime.block_on(async {
        let mut node = NodeClient::new(channel(driver.socket()).await);
        node.node_publish_volume(publish_request("csi-deep", &target, true)).await
    });
    if let Err(status) = published {
        driver.signal(Signal::SIGTERM);
        panic!("publish: {status:?}; the driver said: {:?}", driver.wait(Duration::from_secs(15)));
    }
    let file = target.join(&deep).join("f");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "one");

    // The periodic refresh rewrites it (a new version beside the old, the old removed).
    std::fs::write(share.join(&deep).join("f"), "two").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&file).ok().as_deref() != Some("two") {
        assert!(Instant::now() < deadline, "the refresh never wrote the new content");
        std::thread::sleep(Duration::from_millis(50));
    }
    let versions = || {
        std::fs::read_dir(&target)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
                name.starts_with("..") && name[2..].starts_with(|c: char| c.is_ascii_digit())
            })
            .count()
    };
    // The old version goes right after the swap, in the same refresh.
    let deadline = Instant::now() + Duration::from_secs(30);
    while versions() != 1 {
        assert!(Instant::now() < deadline, "old versions pile up: {} version directories", versions());
        std::thread::sleep(Duration::from_millis(50));
    }

    runtime.block_on(async {
        let mut node = NodeClient::new(channel(driver.socket()).await);
        // The refresh runs every second and holds the volume while it writes the deep tree: an
        // unpublish meanwhile is told ABORTED, which kubelet retries, and so does this.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match node.node_unpublish_volume(support::unpublish_request("csi-deep", &target)).await {
                Err(status) if status.code() == tonic::Code::Aborted && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answer => break answer.unwrap(),
            };
        }
    });
    assert!(!listed_in_mountinfo(&target).unwrap(), "unmounted");
    assert!(!target.exists(), "the target the driver made is gone");
    driver.signal(Signal::SIGTERM);
    let (code, stderr) = driver.wait(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    assert!(!stderr.contains("refresh failed"), "{stderr}");
}
