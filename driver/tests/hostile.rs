//! The driver tried as an attacker and a flaky node would, over its real socket with real mounts
//! (as root): symlinked, relative, aliased and foreign targets, foreign mounts, one volume raced
//! to two targets, long volume ids and megabyte inputs. After each, nothing outside the driver's
//! own creations has changed.

use std::path::{Path, PathBuf};

use inline_guard_proto::csi::v1::node_client::NodeClient;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::volume::mounter::listed_in_mountinfo;
use support::{channel, kubelet_target, publish_request, snapshot, unpublish_request};
use tonic::Code;
use tonic::transport::Channel;

mod support;

/// A running plugin whose kubelet root is `dir/kubelet`, with a bystander directory beside it.
struct Node {
    dir: support::NodeDir,
    client: NodeClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Option<tokio::task::JoinHandle<sharedresource_csi_driver::error::Result<()>>>,
}

impl Node {
    async fn start() -> Node {
        assert!(support::is_root(), "real mounts need root: run the test command as root");
        // Unmounts whatever is still mounted below it when the test ends, failed or not.
        let dir = support::NodeDir::new();
        std::fs::create_dir_all(dir.path().join("shares/cluster-ca")).unwrap();
        std::fs::write(dir.path().join("shares/cluster-ca/ca.crt"), "pem").unwrap();
        std::fs::create_dir_all(dir.path().join("kubelet/pods")).unwrap();
        std::fs::create_dir_all(dir.path().join("bystander/etc")).unwrap();
        std::fs::write(dir.path().join("bystander/etc/passwd"), "root:x:0:0").unwrap();
        let (client, stop, running) = Self::run(dir.path()).await;
        Node { dir, client, stop: Some(stop), running: Some(running) }
    }

    async fn run(
        dir: &Path,
    ) -> (
        NodeClient<Channel>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<sharedresource_csi_driver::error::Result<()>>,
    ) {
        let socket = dir.join("csi.sock");
        let mut plugin = Plugin::in_directory(dir, socket.clone());
        plugin.config.kubelet_dir = dir.join("kubelet");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        (NodeClient::new(channel(socket).await), stop, running)
    }

    async fn restart(&mut self) {
        self.stop().await;
        let (client, stop, running) = Self::run(self.dir.path()).await;
        (self.client, self.stop, self.running) = (client, Some(stop), Some(running));
    }

    async fn stop(&mut self) {
        if let (Some(stop), Some(running)) = (self.stop.take(), self.running.take()) {
            stop.send(()).unwrap();
            running.await.unwrap().unwrap();
        }
    }

    fn kubelet(&self) -> PathBuf {
        self.dir.path().join("kubelet")
    }

    fn bystander(&self) -> PathBuf {
        self.dir.path().join("bystander")
    }

    fn target(&self, uid: &str) -> PathBuf {
        kubelet_target(&self.kubelet(), uid, "shared")
    }

    async fn publish(&mut self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.client.node_publish_volume(publish_request(volume_id, target, true)).await.map(drop)
    }

    async fn unpublish(&mut self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.client.node_unpublish_volume(unpublish_request(volume_id, target)).await.map(drop)
    }
}

fn mount_foreign_tmpfs(at: &Path, file: &str) {
    mount(Some("foreign"), at, Some("tmpfs"), MsFlags::empty(), Some("size=64k")).unwrap();
    std::fs::write(at.join(file), "theirs").unwrap();
}

#[tokio::test]
async fn symlinked_targets_are_refused_and_nothing_is_mounted_through_them() {
    let mut node = Node::start().await;
    let (kubelet, bystander) = (node.kubelet(), node.bystander());
    // The target itself a link to a host directory, and a parent element a link.
    std::fs::create_dir_all(node.target("a").parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(bystander.join("etc"), node.target("a")).unwrap();
    std::os::unix::fs::symlink(&bystander, kubelet.join("pods/b")).unwrap();
    let before = snapshot(node.dir.path());
    for (uid, link) in [("a", node.target("a")), ("b", kubelet.join("pods/b"))] {
        let status = node.publish("csi-1", &node.target(uid)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
        assert_eq!(status.message(), format!("{link:?} is a symbolic link; refused"));
    }
    assert!(!listed_in_mountinfo(&bystander.join("etc")).unwrap(), "nothing mounted on the link's destination");
    assert_eq!(snapshot(node.dir.path()), before, "nothing changed anywhere");
    // Unpublish through a link is refused the same way, and removes nothing.
    let status = node.unpublish("csi-1", &node.target("a")).await;
    assert!(status.is_ok(), "no record: nothing to do");
    assert_eq!(snapshot(node.dir.path()), before);
    node.stop().await;
}

#[tokio::test]
async fn relative_aliased_and_outside_targets_are_refused_naming_the_path() {
    let mut node = Node::start().await;
    let kubelet = node.kubelet();
    let first = node.target("a");
    node.publish("csi-1", &first).await.unwrap();
    let before = snapshot(node.dir.path());
    let alias = kubelet.join("pods/a/volumes/kubernetes.io~csi/x/../shared/mount");
    let cases = [
        PathBuf::from("pods/a/volumes/kubernetes.io~csi/shared/mount"),
        alias.clone(),
        kubelet.join("pods/a/volumes/kubernetes.io~csi/./shared/mount"),
        node.bystander().join("etc"),
        PathBuf::from("/etc"),
        kubelet.join("plugins/x"),
    ];
    for target in &cases {
        let status = node.publish("csi-2", target).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{target:?}: {}", status.message());
        assert!(status.message().starts_with(&format!("target_path {target:?} ")), "{}", status.message());
        let status = node.unpublish("csi-1", target).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "unpublish {target:?}");
    }
    assert_eq!(snapshot(node.dir.path()), before, "the first volume is intact, nothing else made");
    assert_eq!(std::fs::read_to_string(first.join("ca.crt")).unwrap(), "pem");
    node.unpublish("csi-1", &first).await.unwrap();
    node.stop().await;
}

#[tokio::test]
async fn a_mount_the_driver_did_not_make_is_never_unmounted() {
    let mut node = Node::start().await;
    let target = node.target("a");
    std::fs::create_dir_all(&target).unwrap();
    mount_foreign_tmpfs(&target, "data");
    let status = node.publish("csi-1", &target).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{}", status.message());
    assert_eq!(status.message(), format!("{target:?} has a \"tmpfs\" mount the driver did not make; it is left alone"));
    assert_eq!(std::fs::read_to_string(target.join("data")).unwrap(), "theirs", "still mounted, data intact");
    // An unpublish of a volume the driver does not hold there touches nothing.
    node.unpublish("csi-unknown", &target).await.unwrap();
    node.unpublish("csi-1", &target).await.unwrap();
    assert_eq!(std::fs::read_to_string(target.join("data")).unwrap(), "theirs");
    umount2(&target, MntFlags::empty()).unwrap();

    // A mount stacked on top of the driver's own volume: unpublish refuses, both stay.
    let second = node.target("b");
    node.publish("csi-2", &second).await.unwrap();
    mount_foreign_tmpfs(&second, "data");
    let status = node.unpublish("csi-2", &second).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{}", status.message());
    assert_eq!(std::fs::read_to_string(second.join("data")).unwrap(), "theirs");
    umount2(&second, MntFlags::empty()).unwrap();
    assert_eq!(std::fs::read_to_string(second.join("ca.crt")).unwrap(), "pem", "the driver's volume was kept too");
    node.unpublish("csi-2", &second).await.unwrap();
    assert!(!second.exists());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_volume_raced_to_two_targets_keeps_exactly_one_record() {
    let mut node = Node::start().await;
    for round in 0..20 {
        let id = format!("csi-race-{round}");
        let (a, b) = (node.target(&format!("a{round}")), node.target(&format!("b{round}")));
        let (mut one, mut two) = (node.client.clone(), node.client.clone());
        let (first, second) = tokio::join!(
            one.node_publish_volume(publish_request(&id, &a, true)),
            two.node_publish_volume(publish_request(&id, &b, true)),
        );
        let (won, lost, status) = match (first, second) {
            (Ok(_), Err(status)) => (a, b, status),
            (Err(status), Ok(_)) => (b, a, status),
            other => panic!("round {round}: exactly one publish must win: {other:?}"),
        };
        assert!(matches!(status.code(), Code::Aborted | Code::AlreadyExists), "{status:?}");
        assert_eq!(std::fs::read_to_string(won.join("ca.crt")).unwrap(), "pem");
        assert!(!lost.exists() && !lost.parent().unwrap().exists(), "the loser left nothing");
        // The winner's record survived: another volume cannot take its target.
        let status = node.publish("csi-intruder", &won).await.unwrap_err();
        assert_eq!(status.code(), Code::AlreadyExists, "{}", status.message());
        node.unpublish(&id, &won).await.unwrap();
        assert!(!won.exists());
    }
    node.stop().await;
}

#[tokio::test]
async fn long_and_strange_volume_ids_publish_survive_a_restart_and_unpublish() {
    let mut node = Node::start().await;
    let ids = ["%2F/".repeat(32), "é".repeat(64), format!("csi-{}", "f".repeat(124)), "../../etc".into()];
    for (i, id) in ids.iter().enumerate() {
        node.publish(id, &node.target(&format!("u{i}"))).await.unwrap();
    }
    node.restart().await;
    for (i, id) in ids.iter().enumerate() {
        let target = node.target(&format!("u{i}"));
        node.publish(id, &target).await.unwrap();
        assert!(listed_in_mountinfo(&target).unwrap(), "kept across the restart");
        node.unpublish(id, &target).await.unwrap();
        assert!(!target.exists());
    }
    let mut left: Vec<String> = std::fs::read_dir(node.dir.path().join("state"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["driver.lock", "handover.sock"], "no record left: only the lock and the running driver's offer");
    node.stop().await;
}

#[tokio::test]
async fn megabyte_inputs_get_bounded_messages() {
    let mut node = Node::start().await;
    let huge = "x".repeat(1 << 20);
    let mut request = publish_request("csi-1", &node.target("a"), true);
    request.volume_context.insert("share".into(), huge.clone());
    let status = node.client.node_publish_volume(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().len() <= 320, "{} bytes", status.message().len());
    assert!(status.message().ends_with("... (1048576 bytes) is not a plain name"), "{}", status.message());
    let mut request = publish_request("csi-1", &node.target("a"), true);
    request.target_path = format!("/{huge}");
    let status = node.client.node_publish_volume(request).await.unwrap_err();
    assert!(status.message().len() <= 320, "{} bytes", status.message().len());
    let status = node.client.node_unpublish_volume(unpublish_request(&huge, Path::new(&huge))).await.unwrap_err();
    assert!(status.message().len() <= 320, "{} bytes", status.message().len());
    assert!(!node.kubelet().join("pods/a").exists());
    node.stop().await;
}

#[tokio::test]
async fn unpublish_removes_only_the_directories_the_driver_made() {
    let mut node = Node::start().await;
    // kubelet made the volume directory and wrote its own file there; the driver makes `mount`.
    let target = node.target("a");
    let volume_dir = target.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&volume_dir).unwrap();
    std::fs::write(volume_dir.join("vol_data.json"), "{}").unwrap();
    node.publish("csi-1", &target).await.unwrap();
    node.unpublish("csi-1", &target).await.unwrap();
    assert!(!target.exists(), "the target it made is gone");
    assert_eq!(std::fs::read_to_string(volume_dir.join("vol_data.json")).unwrap(), "{}", "kubelet's is kept");

    // A target that existed before, with content: unmounted, never removed or emptied.
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("precious"), "keep").unwrap();
    node.publish("csi-1", &target).await.unwrap();
    assert_eq!(std::fs::read_to_string(target.join("ca.crt")).unwrap(), "pem");
    node.unpublish("csi-1", &target).await.unwrap();
    assert_eq!(std::fs::read_to_string(target.join("precious")).unwrap(), "keep");
    node.stop().await;
}

#[tokio::test]
async fn records_pointing_at_directories_with_content_remove_nothing_at_restart() {
    let mut node = Node::start().await;
    node.stop().await;
    // Records as a crash, an older version or a hand could leave them: an interrupted publish
    // at a host directory, and one at a kubelet target that holds someone's data, each claiming
    // to have created directories it did not.
    let bystander = node.bystander().join("etc");
    let target = node.target("a");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("data"), "theirs").unwrap();
    let state = node.dir.path().join("state");
    for (name, at, claims) in [
        ("etc.json", &bystander, vec![bystander.clone(), node.bystander()]),
        ("pod.json", &target, vec![target.clone(), target.parent().unwrap().to_path_buf(), node.kubelet()]),
    ] {
        let record = serde_json::json!({
            "volume_id": name, "target_path": at, "complete": false, "host_read_only": false,
            "pod": {"name": "p", "namespace": "n", "uid": "u", "service_account": "s"},
            "attributes": {}, "created_dirs": claims,
        });
        std::fs::write(state.join(name), record.to_string()).unwrap();
    }
    let before = snapshot(node.dir.path());
    node.restart().await;
    let after = snapshot(node.dir.path());
    let changed: Vec<_> = after.iter().filter(|(path, what)| before.get(*path) != Some(*what)).collect();
    let gone: Vec<_> = before.keys().filter(|path| !after.contains_key(*path)).collect();
    let own = |path: &Path| path.starts_with(&state) || path == node.dir.path().join("csi.sock");
    assert!(changed.iter().all(|(path, _)| own(path)), "only the driver's state and socket changed: {changed:?}");
    assert!(gone.iter().all(|path| own(path)), "nothing else removed: {gone:?}");
    assert_eq!(std::fs::read_to_string(bystander.join("passwd")).unwrap(), "root:x:0:0");
    assert_eq!(std::fs::read_to_string(target.join("data")).unwrap(), "theirs");
    assert!(!state.join("etc.json").exists() && !state.join("pod.json").exists(), "the records are dropped");
    node.stop().await;
}

#[tokio::test]
async fn a_volume_whose_record_was_lost_is_still_taken_down_by_its_own_tag_only() {
    let mut node = Node::start().await;
    let (ours, theirs) = (node.target("a"), node.target("b"));
    node.publish("csi-1", &ours).await.unwrap();
    node.stop().await;
    // The state directory is wiped (a misconfigured DaemonSet, a disk replaced).
    for entry in std::fs::read_dir(node.dir.path().join("state")).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    std::fs::create_dir_all(&theirs).unwrap();
    mount_foreign_tmpfs(&theirs, "data");
    node.restart().await;
    node.unpublish("csi-1", &ours).await.unwrap();
    assert!(!listed_in_mountinfo(&ours).unwrap(), "its own tagged tmpfs is unmounted");
    assert!(ours.exists(), "no directory is removed without a record saying it is the driver's");
    node.unpublish("csi-1", &theirs).await.unwrap();
    assert_eq!(std::fs::read_to_string(theirs.join("data")).unwrap(), "theirs", "another tag is never ours");
    umount2(&theirs, MntFlags::empty()).unwrap();
    node.stop().await;
}
