//! The node's content budget as kubelet meets it: publishes over the real socket into real
//! tmpfs mounts, one namespace filling its part until it is refused (RESOURCE_EXHAUSTED naming
//! the budget), a second and a third namespace served meanwhile (two cannot fill the node),
//! what an unpublish gives back and to whom, and a restarted driver holding what it finds
//! mounted.

use std::path::{Path, PathBuf};

use inline_guard_proto::csi::v1::NodePublishVolumeRequest;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use sharedresource_csi_driver::plugin::Plugin;
use sharedresource_csi_driver::volume::mounter::listed_in_mountinfo;
use support::{channel, kubelet_target, publish_request, unpublish_request};
use tonic::Code;
use tonic::transport::Channel;

mod support;

const MIB: u64 = 1 << 20;

/// A plugin under `dir` whose volumes hold at most 2 MiB each, 8 MiB on the node and 4 MiB per
/// namespace, serving the static share `big` (one file of 1 MiB).
fn plugin(dir: &Path) -> Plugin {
    let mut plugin = Plugin::in_directory(dir, dir.join("plugins/csi.sock"));
    plugin.config.tmpfs_size = 2 * MIB;
    plugin.config.content_budget = 8 * MIB;
    plugin.config.namespace_content_budget = 4 * MIB;
    plugin
}

/// A plugin serving on its socket until stopped.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<sharedresource_csi_driver::error::Result<()>>,
}

impl Running {
    /// Starts `plugin` and connects to its socket.
    async fn start(plugin: Plugin) -> (NodeClient<Channel>, Running) {
        let socket = plugin.csi_socket.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        (NodeClient::new(channel(socket).await), Running { stop, task })
    }

    /// Stops the plugin; it must have served without error.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// A volume published: its id and target.
type Published = (String, PathBuf);

/// A publish of share `big` for volume `n` of a pod in `namespace`.
fn publish(dir: &Path, namespace: &str, n: usize) -> (NodePublishVolumeRequest, Published) {
    let uid = format!("{namespace}-{n}");
    let target = kubelet_target(dir, &uid, "big");
    let volume_id = format!("csi-{uid}");
    let mut request = publish_request(&volume_id, &target, true);
    request.volume_context.insert("csi.storage.k8s.io/pod.namespace".into(), namespace.into());
    request.volume_context.insert("csi.storage.k8s.io/pod.uid".into(), uid);
    request.volume_context.insert("share".into(), "big".into());
    (request, (volume_id, target))
}

/// Publishes volumes of `namespace` numbered from `from` until one is refused; the targets
/// published and the refusal.
async fn fill(
    node: &mut NodeClient<Channel>,
    dir: &Path,
    namespace: &str,
    from: usize,
) -> (Vec<Published>, tonic::Status) {
    let mut published = Vec::new();
    for n in from..from + 64 {
        let (request, volume) = publish(dir, namespace, n);
        match node.node_publish_volume(request).await {
            Ok(_) => published.push(volume),
            Err(status) => {
                let pod = dir.join("pods").join(format!("{namespace}-{n}"));
                assert!(!pod.exists(), "a refused publish leaves nothing: {}", pod.display());
                return (published, status);
            }
        }
    }
    panic!("64 volumes of 1 MiB were published for {namespace}: the budget refused none");
}

/// What the tmpfs mounts at `targets` hold, as the kernel counts their pages.
fn used_by_mounts(volumes: &[Published]) -> u64 {
    volumes
        .iter()
        .map(|(_, target)| {
            let stat = nix::sys::statvfs::statvfs(target).unwrap();
            (stat.blocks() - stat.blocks_free()) * stat.fragment_size()
        })
        .sum()
}

/// What the driver's metrics say its volumes' content costs.
fn content_bytes(metrics: &sharedresource_csi_driver::metrics::Metrics) -> u64 {
    let text = metrics.encode();
    let line = text.lines().find_map(|line| line.strip_prefix("sharedresource_csi_driver_content_bytes "));
    line.and_then(|value| value.trim().parse().ok()).unwrap_or_else(|| panic!("no content_bytes in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespace_is_refused_beyond_its_part_while_another_is_served_and_a_restart_keeps_the_count() {
    assert!(support::is_root(), "real mounts need root: run the test command as root");
    // Whatever is still mounted below it when the test ends, failed or not, is unmounted.
    let dir = support::NodeDir::new();
    let root = dir.path();
    std::fs::create_dir_all(root.join("shares/big")).unwrap();
    std::fs::write(root.join("shares/big/blob"), vec![7u8; MIB as usize]).unwrap();

    let (mut node, running) = Running::start(plugin(root)).await;

    // 1 MiB of data and a few inodes each: three fit the namespace's 4 MiB, a fourth does not.
    let (attacker, refused) = fill(&mut node, root, "attacker", 0).await;
    assert_eq!(attacker.len(), 3, "{}", refused.message());
    assert_eq!(refused.code(), Code::ResourceExhausted, "{}", refused.message());
    assert!(refused.message().contains("namespace \"attacker\""), "{}", refused.message());
    assert!(refused.message().contains("of the 4194304 bytes it may hold on this node now"), "{}", refused.message());
    assert!(refused.message().contains("namespaceContentBudget"), "{}", refused.message());
    for (_, target) in &attacker {
        assert_eq!(std::fs::read(target.join("blob")).unwrap().len(), MIB as usize, "served in full");
    }

    // A second namespace may hold half of what the first leaves (about 4.8 MiB): two volumes.
    let (victim, refused) = fill(&mut node, root, "victim", 0).await;
    assert_eq!(victim.len(), 2, "{}", refused.message());
    assert!(refused.message().contains("half of what other namespaces leave"), "{}", refused.message());
    // Two namespaces do not fill the node: a third still mounts (half of about 2.7 MiB left).
    let (third, refused) = fill(&mut node, root, "third", 0).await;
    assert_eq!(third.len(), 1, "{}", refused.message());
    assert_eq!(refused.code(), Code::ResourceExhausted);
    // A fourth finds less than a volume's worth (half of about 1.7 MiB).
    let (fourth, refused) = fill(&mut node, root, "fourth", 0).await;
    assert!(fourth.is_empty(), "{}", refused.message());
    assert!(refused.message().contains("namespace \"fourth\" already hold 0 of the"), "{}", refused.message());

    // The budget counts at least what the kernel charges: pages of every mount, below the node's.
    let all: Vec<Published> = attacker.iter().chain(&victim).chain(&third).cloned().collect();
    let kernel = used_by_mounts(&all);
    assert!(kernel >= 6 * MIB, "the positive control: the mounts hold the files ({kernel} bytes)");
    assert!(kernel <= 8 * MIB, "the mounts hold {kernel} bytes, more than the budget");

    // An unpublish gives its part back, and the others' parts grow: the first namespace, still
    // over half of what the others leave, gets nothing; the fourth gets a volume.
    let (volume_id, target) = &attacker[0];
    node.node_unpublish_volume(unpublish_request(volume_id, target)).await.unwrap();
    assert!(!listed_in_mountinfo(target).unwrap_or(false));
    let (again, _) = fill(&mut node, root, "attacker", 100).await;
    assert!(again.is_empty(), "the first namespace grew back past its part");
    let (fourth, _) = fill(&mut node, root, "fourth", 100).await;
    assert_eq!(fourth.len(), 1, "the freed MiB went to the namespace holding nothing");

    // Restarted, the driver holds what it finds mounted, measured (not each volume's whole
    // tmpfsSize, which would make 12 MiB of these 6 volumes): the first namespace is still full.
    running.stop().await;
    let restarted = plugin(root);
    let metrics = restarted.metrics.clone();
    let (mut node, running) = Running::start(restarted).await;
    let mounted: Vec<Published> = attacker[1..].iter().chain(&victim).chain(&third).chain(&fourth).cloned().collect();
    let (kernel, held) = (used_by_mounts(&mounted), content_bytes(&metrics));
    assert!(kernel >= 6 * MIB, "the positive control: the mounts hold the files ({kernel} bytes)");
    assert!(held >= kernel && held <= 8 * MIB, "held {held} bytes for mounts holding {kernel}");
    let (after, refused) = fill(&mut node, root, "attacker", 200).await;
    assert!(after.is_empty(), "a restart forgot what the namespace holds");
    assert_eq!(refused.code(), Code::ResourceExhausted);

    // Everything taken down again: nothing of the test stays mounted.
    for (volume_id, target) in &mounted {
        assert!(listed_in_mountinfo(target).unwrap(), "the positive control: {} is mounted", target.display());
        node.node_unpublish_volume(unpublish_request(volume_id, target)).await.unwrap();
        assert!(!listed_in_mountinfo(target).unwrap_or(false), "{} unmounted", target.display());
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_budgets_hold_110_pods_of_one_namespace_each_mounting_a_1_mib_share() {
    assert!(support::is_root(), "real mounts need root: run the test command as root");
    let dir = support::NodeDir::new();
    let root = dir.path();
    // A Secret's data is below 1 MiB (etcd's limit is on the whole object): 1 MiB less 4 KiB.
    std::fs::create_dir_all(root.join("shares/big")).unwrap();
    std::fs::write(root.join("shares/big/ca-bundle.pem"), vec![b'x'; (MIB - 4096) as usize]).unwrap();
    let mut plugin = plugin(root);
    let shipped = sharedresource_csi_driver::config::DriverConfig::default();
    plugin.config.content_budget = shipped.content_budget;
    plugin.config.namespace_content_budget = shipped.namespace_content_budget;
    let (mut node, running) = Running::start(plugin).await;
    let mut published = Vec::new();
    for n in 0..110 {
        let (request, volume) = publish(root, "apps", n);
        node.node_publish_volume(request).await.unwrap_or_else(|status| panic!("volume {n}: {status:?}"));
        published.push(volume);
    }
    assert!(used_by_mounts(&published) >= 110 * (MIB - 4096), "the positive control: every volume holds its file");
    for (volume_id, target) in &published {
        node.node_unpublish_volume(unpublish_request(volume_id, target)).await.unwrap();
    }
    running.stop().await;
}
