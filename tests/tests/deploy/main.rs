//! Installed as shipped: the images built by `images/build` and imported into the node's
//! containerd (the example providers' image installing the example helper through the
//! example-providers Component, for a lazy volume read across the DaemonSet's rolls), the shipped manifests applied with a real `kubectl apply -k` through a test
//! overlay (`overlay.rs` writes what it changes and why into the overlay itself), on a control
//! plane with production authorization (Node and RBAC; NodeRestriction and ServiceAccount
//! admission) and a real node (kubelet and containerd). The serving certificate comes from
//! `csi-volume-admission certificate`, the README's path without cert-manager. A Secrets Store
//! CSI provider (the suite's, on upstream's provider API) runs on the node, its socket in the
//! shipped DaemonSet's providers directory.
//!
//! One scenario in steps that build on each other, in a binary of its own: its driver (the
//! DaemonSet) and the end-to-end suite's (a host process) would claim one driver name on a node.

mod attack;
mod connections;
mod handover_ask;
mod helm;
mod kubectl;
mod lazy;
mod overlay;
mod restart_on_change;
mod rollout;
mod startup_taint;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inline_guard_tests::cluster::{ChildProcess, Cluster, POD_NETWORK_GATEWAY};
use inline_guard_tests::images::build_images;
use inline_guard_tests::node::kubelet::NODE_NAME;
use inline_guard_tests::node::{Node, delete_and_wait};
use inline_guard_tests::peers::peers;
use inline_guard_tests::repo_root;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;
use sharedresource_csi_driver::controllers::startup_taint::STARTUP_TAINT_KEY;

use kubectl::Kubectl;
use overlay::Overlay;
use workload::{CONSUMER, DRIVER, share_reader, wait_for_content};

type Outcome = Result<(), String>;

const SYSTEM: &str = "inline-guard-system";
const DRIVER_NAMESPACE: &str = "inline-guard-driver";
const DRIVER_LABEL: &str = "app.kubernetes.io/name=sharedresource-csi-driver";
/// The read-grants controller's pods.
const READ_GRANTS_LABEL: &str = "app.kubernetes.io/name=sharedresource-read-grants";
const DRIVER_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-csi-driver";
const READ_GRANTS_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-read-grants";
/// The read-grants controller's Role and RoleBinding, in each namespace a share points into.
const GRANT: &str = "sharedresource-csi-driver-reads";
const WEBHOOK_USER: &str = "system:serviceaccount:inline-guard-system:csi-volume-admission";

/// No step may hang the run: the cold image build is the longest part (both architectures'
/// release builds with link-time optimisation: tens of minutes on two busy cores).
const BOUND: Duration = Duration::from_secs(3600);

#[test]
fn installed_as_shipped_serves_survives_restarts_rolls_upgrades_and_leaves_nothing() {
    // Before anything is made on the machine: sweeps what a killed run left, and tears this run
    // down on SIGINT/SIGTERM/SIGHUP.
    inline_guard_tests::run_root::claim().expect("a run directory");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    let outcome = runtime.block_on(async { tokio::time::timeout(BOUND, run()).await });
    drop(runtime);
    // Swept even when the scenario failed, so a failure leaves nothing either; a leak of a green
    // scenario fails it.
    let leftovers = inline_guard_tests::run_root::finish();
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => panic!("{error}"),
        Err(_) => panic!("the deployment scenario took longer than {BOUND:?}"),
    }
    if let Err(leak) = leftovers {
        panic!("{leak}");
    }
}

/// The control plane, the node and kubectl; the node is torn down before the control plane.
struct Installation {
    node: Node,
    cluster: Cluster,
    admin: kube::Client,
    kubectl: Kubectl,
    dir: PathBuf,
    /// The Secrets Store provider on the node, its socket in `dir/providers`.
    provider: ChildProcess,
}

async fn run() -> Outcome {
    let peers = peers()?;
    let cluster = Cluster::start_with_scheduler(&peers).await?;
    let admin = cluster.client().await?;
    // Registered with the startup taint, which the overlay opts in to (startup_taint.rs).
    let node = Node::start_without_driver(&cluster, &peers, &admin, &[STARTUP_TAINT_KEY]).await?;
    let kubectl = Kubectl { binary: peers.kubectl.clone(), kubeconfig: cluster.kubeconfig().to_path_buf() };
    let dir = cluster.run_dir().join("deploy");
    std::fs::create_dir_all(dir.join("overlay")).map_err(|e| e.to_string())?;
    let provider = workload::start_provider(&peers.secrets_store_provider, &dir)?;
    let installation = Installation { node, cluster, admin, kubectl, dir, provider };
    let outcome = steps(&installation).await;
    if outcome.is_err() {
        eprintln!("{}", installation.diagnostics().await);
    }
    outcome
}

/// The scenario, step by step; each step says what it proves.
async fn steps(this: &Installation) -> Outcome {
    let installed = installed_behind_the_startup_taint(this).await?;
    let mut reader = a_share_served_kept_fresh_revoked_and_restored(this, &installed).await?;
    the_denial_the_rollout_on_change_and_a_provider(this).await?;
    tenants_cannot_take_the_node(this, &mut reader).await?;
    the_driver_pod_recreated_and_the_controller_down(this, &installed, reader).await?;
    the_webhook_restarted_under_load(this).await?;
    let across = a_lazy_volume_across_rollback_upgrade_and_restart(this).await?;
    removed_then_installed_by_helm(this, across).await
}

/// What the install leaves for the steps after it: the pods the startup taint held off (their
/// uids) and the first driver pod.
struct Installed {
    early: String,
    tolerant: String,
    first_driver: String,
}

/// The reader pod of the share (its uid) and how many lines of its log were read.
struct Reader {
    pod: String,
    seen: usize,
}

/// What the versions step leaves: the reader across the upgrade (its uid), the lazy volume's
/// pod (its uid), the previous release's manifests and the upgrade's tag.
struct AcrossVersions {
    reader: String,
    lazy_pod: String,
    released: PathBuf,
    upgraded: String,
}

/// Installed with `apply -k` as shipped, with pods made before it held off by the startup
/// taint until the driver registers.
async fn installed_behind_the_startup_taint(this: &Installation) -> Result<Installed, String> {
    let version = env!("CARGO_PKG_VERSION");
    this.images(version, None).await?;
    let overlay = this.dir.join("overlay");
    println!("deploy: {}", overlay::write_certificate(&overlay)?.trim());

    // The read-grants controller runs on control-plane nodes only (it holds every Secret's
    // read): this node is the cluster's only one, so it is labelled as one, as a cluster
    // bootstrapper labels its control-plane nodes (kubelet may not label itself so).
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(this.admin.clone());
    let label = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}});
    nodes
        .patch(NODE_NAME, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&label))
        .await
        .map_err(|e| format!("labelling node {NODE_NAME} as a control-plane node: {e}"))?;

    // A pod reading a share, created before anything is installed: the startup taint holds it.
    let early = startup_taint::pod_held_off_by_the_taint(&this.admin).await?;
    // One that tolerates the taint is placed, and kubelet cannot mount its volume yet (made last
    // before the install: kubelet's retries back off while it waits).
    let tolerant = startup_taint::pod_placed_before_the_driver(&this.admin).await?;

    // Installed and Ready through the shipped probes (the webhook's and the controller's pods
    // only once the driver has taken the startup taint off).
    this.write_overlay(None, &repo_root())?;
    let started = Instant::now();
    let applied = this.kubectl.run(&["apply", "-k", &path(&overlay)]).await?;
    this.wait_rolled_out().await?;
    println!("deploy: apply -k to driver, webhook and read-grants Ready in {:?}", started.elapsed());
    print!("deploy: kubectl apply -k said:\n{applied}");
    let pods = ["get", "pods", "-n", SYSTEM, "-o", "wide"];
    print!("{}", this.kubectl.run(&pods).await?);
    print!("{}", this.kubectl.run(&["get", "pods", "-n", DRIVER_NAMESPACE, "-o", "wide"]).await?);

    // Registered with kubelet from inside its container; nothing else runs a driver here.
    this.wait_registered().await?;
    let first_driver = this.driver_pod().await?;
    startup_taint::removed_after_kubelet_listed_the_driver(&this.admin, &this.cluster).await?;
    startup_taint::told_the_driver_is_registered(&this.admin, &tolerant).await?;

    Ok(Installed { early, tolerant, first_driver })
}

/// A share served to a pod the scheduler placed, patched read-only by the webhook through its
/// Service, kept fresh, revoked and restored; the pods the taint held off served too.
async fn a_share_served_kept_fresh_revoked_and_restored(
    this: &Installation,
    installed: &Installed,
) -> Result<Reader, String> {
    let Installed { early, tolerant, .. } = installed;
    workload::share_and_grant(&this.admin, "first").await?;
    let pod = this.create_reader("reader").await?;
    let mut seen = wait_for_content(&this.node, "reader", "first", 0).await?;
    // The pod made before the driver was placed once the taint went, and reads the share too.
    wait_for_content(&this.node, startup_taint::EARLY, "first", 0).await?;
    this.node.volume_present(early)?;
    delete_and_wait(&this.admin, CONSUMER, startup_taint::EARLY).await?;
    this.node.nothing_left(early)?;
    // The pod placed before the driver mounts at kubelet's retry (whose backoff, grown while
    // there was no driver and then no share, reaches about two minutes).
    startup_taint::wait_running(&this.admin, startup_taint::TOLERANT).await?;
    wait_for_content(&this.node, startup_taint::TOLERANT, "first", 0).await?;
    this.node.volume_present(tolerant)?;
    delete_and_wait(&this.admin, CONSUMER, startup_taint::TOLERANT).await?;
    this.node.nothing_left(tolerant)?;
    this.driver_acted_as_its_service_account()?;
    let updated = Instant::now();
    workload::set_content(&this.admin, "second").await?;
    seen = wait_for_content(&this.node, "reader", "second", seen).await?;
    // The pod is told by the shipped driver, as its ServiceAccount (the time it took printed).
    let note = startup_taint::wait_for_driver_event(&this.admin, &pod, "ContentUpdated").await?;
    println!("deploy: reader told ContentUpdated {:?} after the Secret's update: {note}", updated.elapsed());
    workload::revoke(&this.admin).await?;
    seen = wait_for_content(&this.node, "reader", "", seen).await?;
    workload::grant(&this.admin).await?;
    seen = wait_for_content(&this.node, "reader", "second", seen).await?;
    // The shipped driver's metrics, scraped as Prometheus would (its pod's health port, through
    // the apiserver's proxy): a publish, a refresh that changed content, a revocation, and the
    // share's gauges with their labels.
    this.driver_metrics_count_what_happened().await?;

    Ok(Reader { pod, seen })
}

/// The denial through the Service, the rollout on change and a Secrets Store provider's object.
async fn the_denial_the_rollout_on_change_and_a_provider(this: &Installation) -> Outcome {
    // Denied through the Service with the exact message.
    this.denied_with_the_exact_message().await?;

    // Rollout on change, opted in by the overlay: a labelled Deployment reading the share is
    // restarted once when its Secret changes, and its new pod reads the new content.
    restart_on_change::restarted_once_when_its_share_changes(&this.admin, &this.node, "second", "rolled").await?;

    // A Secrets Store provider's object read by a pod granted `use` of it: the driver dials the
    // provider's socket through the shipped providers directory.
    this.provider_served().await?;

    Ok(())
}

/// Tenants against the node, the reader the victim.
async fn tenants_cannot_take_the_node(this: &Installation, reader: &mut Reader) -> Outcome {
    let seen = &mut reader.seen;
    // Tenants against the node: content, connections and slots, two namespaces filling it,
    // while the reader above is the victim (its update and revocation within 10 s, during the
    // attack and after) and a new pod of its namespace mounts during it.
    let report = attack::tenants_cannot_take_the_node(&this.admin, &this.cluster, &this.node, seen).await?;
    println!(
        "deploy: attack: {} volumes of the two attackers' {} mounted, {} publishes refused for the content budget (first: {})",
        report.mounted,
        2 * attack::ATTACKER_VOLUMES,
        report.refused.len(),
        report.refused.first().map(|m| m.chars().take(400).collect::<String>()).unwrap_or_default()
    );
    for (what, waited) in &report.victim_waits {
        println!("deploy: attack: the victim waited {waited:?} for {what}");
    }

    Ok(())
}

/// The driver pod deleted and recreated; a share deleted while the read-grants controller is
/// down; the reader deleted leaves nothing.
async fn the_driver_pod_recreated_and_the_controller_down(
    this: &Installation,
    installed: &Installed,
    reader: Reader,
) -> Outcome {
    let (first_driver, pod, mut seen) = (&installed.first_driver, reader.pod, reader.seen);
    // The driver pod deleted: recreated by the DaemonSet; the workload keeps reading and
    // refresh resumes; the workload deleted afterwards leaves nothing.
    this.kubectl.run(&["delete", "pod", "-n", DRIVER_NAMESPACE, "-l", DRIVER_LABEL, "--wait=false"]).await?;
    let second_driver = this.wait_for_new_driver_pod(first_driver).await?;
    println!("deploy: driver pod {first_driver} deleted, {second_driver} Ready in its place");
    seen = wait_for_content(&this.node, "reader", "after-attack", seen).await?;
    seen = this.share_deleted_while_the_read_grants_controller_is_down(seen).await?;
    workload::set_content(&this.admin, "third").await?;
    wait_for_content(&this.node, "reader", "third", seen).await?;
    this.node.volume_present(&pod)?;
    delete_and_wait(&this.admin, CONSUMER, "reader").await?;
    this.node.nothing_left(&pod)?;

    Ok(())
}

/// A rolling restart of the webhook under a create loop changes no answer.
async fn the_webhook_restarted_under_load(this: &Installation) -> Outcome {
    // A rolling restart of the webhook under a create loop.
    let tally = rollout::restart_under_load(&this.admin, &this.kubectl, this.probes().await?).await?;
    println!("deploy: during the webhook's rollout restart: {}", tally.summary());
    // Each of the two old pods closes its idle keep-alive connections once, at the end of its
    // drain: a handful of creates can meet one as it closes. More than that is not that race.
    if !tally.lost.is_empty()
        || !tally.wrongly_admitted.is_empty()
        || !tally.refused_otherwise.is_empty()
        || tally.retried.len() > 6
    {
        return Err(format!("the rollout restart changed answers: {}", tally.summary()));
    }

    Ok(())
}

/// A lazy volume of the example exec provider being read, and how far.
struct LazyReading {
    file: lazy::LazyFile,
    reads: u64,
    pod: String,
}

/// A lazy volume read across a rollback to the previous release, an upgrade from it and a
/// `kubectl rollout restart`, with a workload reading a share across the upgrade.
async fn a_lazy_volume_across_rollback_upgrade_and_restart(this: &Installation) -> Result<AcrossVersions, String> {
    let mut lazy = a_lazy_volume_a_stranger_cannot_ask_for(this).await?;
    let (released, rolled_back) = rolled_back_to_the_previous_release(this, &mut lazy).await?;
    let (reader, upgraded, upgraded_driver) = upgraded_from_it(this, &mut lazy).await?;
    restarted_with_the_sockets_handed_on(this, &mut lazy, rolled_back, &upgraded_driver).await?;
    Ok(AcrossVersions { reader, lazy_pod: lazy.pod, released, upgraded })
}

/// A lazy volume being read; a root pod asking the driver for it is refused.
async fn a_lazy_volume_a_stranger_cannot_ask_for(this: &Installation) -> Result<LazyReading, String> {
    // A lazy volume of the example exec provider, its helper installed from its own image by
    // the example-providers Component, read five times a second across the upgrade and the
    // rollout restart below (lazy.rs): each roll hands its FUSE connection to the new driver.
    workload::grant_provider(&this.admin, lazy::PROVIDER).await?;
    let mut file = lazy::LazyFile::new(&this.example_vault(), "lazy-first")?;
    let lazy_pod = this.create_patched(lazy::pod()).await?;
    let mut reads = file.read_after(&this.node, 0).await?;
    // A root pod mounting the state directory read-only asks the driver for that volume: it is
    // refused before anything is paused, and the volume is read on and serves its next value.
    handover_ask::refused(&this.admin, &this.node).await?;
    file.set("lazy-after-the-ask")?;
    reads = file.read_after(&this.node, reads).await?;

    Ok(LazyReading { file, reads, pod: lazy_pod })
}

/// Rolled back to the previous release as it was released, the lazy volume read across it:
/// the previous release's manifests, and kubelet's (registrations, deregistrations) after.
async fn rolled_back_to_the_previous_release(
    this: &Installation,
    lazy: &mut LazyReading,
) -> Result<(PathBuf, (usize, usize)), String> {
    let overlay = this.dir.join("overlay");
    // A rollback to the previous release, as it was released: its own manifests (CRDs,
    // RBAC, workloads) and its images, built from its tag's source: every program rolls back,
    // and its driver, speaking version 1 of the handover, takes the lazy volume from this
    // build's while it is read (handed no socket, it replaces them in place, so kubelet
    // registers the driver again).
    let (previous, _) = inline_guard_tests::images::PREVIOUS_RELEASE;
    this.previous_release_images().await?;
    let released = inline_guard_tests::images::previous_release_manifests(&this.dir.join("release"))?;
    let before_rollback = this.driver_pod().await?;
    let registrations = this.node.kubelet_registrations(DRIVER);
    this.write_overlay(Some(previous), &released)?;
    this.kubectl.run(&["apply", "-k", &path(&overlay)]).await?;
    this.wait_rolled_out().await?;
    this.wait_for_new_driver_pod(&before_rollback).await?;
    this.driver_runs(previous).await?;
    lazy.file.set("lazy-on-the-previous-release")?;
    lazy.reads = lazy.file.read_after(&this.node, lazy.reads).await?;
    let rolled_back = this.node.kubelet_registrations(DRIVER);
    println!(
        "deploy: rolled back to {previous}; the lazy volume was read across it; kubelet's (registrations, \
         deregistrations) of the driver went from {registrations:?} to {rolled_back:?}"
    );

    Ok((released, rolled_back))
}

/// Upgraded from the previous release to this build, a workload and the lazy volume read
/// across it: the workload's pod, the upgrade's tag and its driver pod.
async fn upgraded_from_it(this: &Installation, lazy: &mut LazyReading) -> Result<(String, String, String), String> {
    let version = env!("CARGO_PKG_VERSION");
    let overlay = this.dir.join("overlay");
    // An upgrade from it: this build's manifests, and its images tagged with a new version,
    // `apply -k` again; the DaemonSet rolls while a workload keeps its volume and the lazy
    // volume is read. The new
    // driver asks in version 2, is refused by the old one, asks again in version 1.
    let upgraded = format!("{version}-upgrade");
    let pod = this.create_reader("across-upgrade").await?;
    let mut seen = wait_for_content(&this.node, "across-upgrade", "third", 0).await?;
    this.images(version, Some(&upgraded)).await?;
    let before_upgrade = this.driver_pod().await?;
    this.write_overlay(Some(&upgraded), &repo_root())?;
    this.kubectl.run(&["apply", "-k", &path(&overlay)]).await?;
    this.wait_rolled_out().await?;
    let upgraded_driver = this.wait_for_new_driver_pod(&before_upgrade).await?;
    let image = this.driver_runs(&upgraded).await?;
    seen = wait_for_content(&this.node, "across-upgrade", "third", seen).await?;
    workload::set_content(&this.admin, "fourth").await?;
    wait_for_content(&this.node, "across-upgrade", "fourth", seen).await?;
    println!("deploy: upgraded to {image}; the workload read on and saw the next change");
    lazy.file.set("lazy-second")?;
    lazy.reads = lazy.file.read_after(&this.node, lazy.reads).await?;
    println!("deploy: the lazy volume was read across the upgrade; the new driver served its next value");

    Ok((pod, upgraded, upgraded_driver))
}

/// `kubectl rollout restart`: the sockets handed on, so kubelet neither deregisters the
/// driver nor registers it again, and the lazy volume is read across it.
async fn restarted_with_the_sockets_handed_on(
    this: &Installation,
    lazy: &mut LazyReading,
    rolled_back: (usize, usize),
    upgraded_driver: &str,
) -> Outcome {
    let (previous, _) = inline_guard_tests::images::PREVIOUS_RELEASE;
    // `kubectl rollout restart` of the DaemonSet: the same image, both drivers of version 2:
    // the new one accepts on the old one's sockets, and kubelet neither deregisters the driver
    // nor registers it again (the upgrade's rename above is the control: kubelet's log shows a
    // registration when one happens).
    let upgraded_registrations = this.node.kubelet_registrations(DRIVER);
    if upgraded_registrations.0 <= rolled_back.0 {
        return Err(format!(
            "the upgrade from {previous} replaced the sockets, yet kubelet's (registrations, deregistrations) \
             stayed {rolled_back:?} -> {upgraded_registrations:?}"
        ));
    }
    let restart = ["rollout", "restart", "daemonset/sharedresource-csi-driver", "-n", DRIVER_NAMESPACE];
    this.kubectl.run(&restart).await?;
    this.wait_rolled_out().await?;
    this.wait_for_new_driver_pod(upgraded_driver).await?;
    lazy.file.set("lazy-third")?;
    lazy.file.read_after(&this.node, lazy.reads).await?;
    let restarted_registrations = this.node.kubelet_registrations(DRIVER);
    if restarted_registrations != upgraded_registrations {
        return Err(format!(
            "across kubectl rollout restart kubelet's (registrations, deregistrations) of the driver went from \
             {upgraded_registrations:?} to {restarted_registrations:?}: the socket was not handed over"
        ));
    }
    this.wait_registered().await?;
    println!(
        "deploy: the lazy volume was read across kubectl rollout restart; the new driver served its next value; \
         kubelet's (registrations, deregistrations) of the driver stayed {restarted_registrations:?}"
    );

    Ok(())
}

/// Removed (the workloads first, as a user would), then installed again with the Helm chart,
/// upgraded and removed.
async fn removed_then_installed_by_helm(this: &Installation, across: AcrossVersions) -> Outcome {
    let AcrossVersions { reader: pod, lazy_pod, released, upgraded } = across;
    let overlay = this.dir.join("overlay");
    // Removed: the workloads first (as a user would), then everything `apply -k` made.
    this.node.volume_present(&pod)?;
    delete_and_wait(&this.admin, CONSUMER, "across-upgrade").await?;
    this.node.nothing_left(&pod)?;
    this.node.volume_present(&lazy_pod)?;
    delete_and_wait(&this.admin, CONSUMER, lazy::POD).await?;
    this.node.nothing_left(&lazy_pod)?;
    this.uninstalled_leaves_nothing(&overlay).await?;

    // The same node and control plane, installed again with the Helm chart, upgraded and
    // removed (helm.rs).
    helm::installed_upgraded_and_removed(this, &released, &upgraded).await
}

fn path(path: &Path) -> String {
    path.display().to_string()
}

impl Installation {
    /// `images/build` (tagged `tag` when given) and `ctr images import` of the tars: linux/amd64
    /// only, the node's (both platforms are `tests/images.rs`'s, which tests/run runs after
    /// this scenario, while the arm64 build it starts uses what this scenario leaves idle).
    async fn images(&self, version: &str, tag: Option<&str>) -> Outcome {
        let out = self.dir.join(format!("images-{}", tag.unwrap_or(version)));
        let owned_tag = tag.map(str::to_string);
        let out_for_build = out.clone();
        let said =
            tokio::task::spawn_blocking(move || build_images(&out_for_build, owned_tag.as_deref(), Some("amd64")))
                .await
                .map_err(|e| e.to_string())??;
        print!("{said}");
        self.import_images(&out, tag.unwrap_or(version))
    }

    /// The previous release's images (built from its tag's source once, then cached), imported.
    async fn previous_release_images(&self) -> Outcome {
        let started = Instant::now();
        let out = tokio::task::spawn_blocking(inline_guard_tests::images::previous_release_images)
            .await
            .map_err(|e| e.to_string())??;
        println!("deploy: the previous release's images at {} after {:?}", out.display(), started.elapsed());
        self.import_images(&out, inline_guard_tests::images::PREVIOUS_RELEASE.0)
    }

    /// Imports the image archives in `out` into the node's containerd; each must then be listed
    /// under `tag`.
    fn import_images(&self, out: &Path, tag: &str) -> Outcome {
        for name in inline_guard_tests::images::IMAGE_NAMES {
            self.node.import_image(&out.join(format!("{name}.tar")))?;
            let reference = format!("ghcr.io/inline-guard/{name}:{tag}");
            if !self.node.image_names()?.contains(&reference) {
                return Err(format!("containerd does not list {reference} after the import"));
            }
        }
        Ok(())
    }

    /// The driver's image, once it is the one tagged `tag`.
    async fn driver_runs(&self, tag: &str) -> Result<String, String> {
        let image = self.driver_image().await?;
        if !image.ends_with(&format!(":{tag}")) {
            return Err(format!("the driver runs {image}, not the {tag} image"));
        }
        Ok(image)
    }

    /// A pod of `reader`, granted `use` of the provider, reads its object; deleted, it leaves
    /// nothing.
    async fn provider_served(&self) -> Outcome {
        workload::grant_provider(&self.admin, "e2e").await?;
        let pods = Api::<Pod>::namespaced(self.admin.clone(), CONSUMER);
        let name = "store-reader";
        let pod: Pod = serde_json::from_value(workload::provider_reader(name)).map_err(|e| e.to_string())?;
        let created = pods.create(&Default::default(), &pod).await.map_err(|e| format!("creating {name}: {e}"))?;
        let uid = created.metadata.uid.unwrap_or_default();
        wait_for_content(&self.node, name, workload::PROVIDER_OBJECT, 0)
            .await
            .map_err(|e| format!("{e}\n{}", self.provider.log_tail(20)))?;
        self.node.volume_present(&uid)?;
        delete_and_wait(&self.admin, CONSUMER, name).await?;
        self.node.nothing_left(&uid)
    }

    /// The host directory the example helper serves from: made before the DaemonSet mounts it.
    fn example_vault(&self) -> PathBuf {
        self.dir.join("example-vault")
    }

    /// The overlay of `manifests`' `config/deploy` (this checkout, or a release's own) with the
    /// images tagged `image_tag`.
    fn write_overlay(&self, image_tag: Option<&str>, manifests: &Path) -> Outcome {
        let port = self.cluster.url().rsplit(':').next().and_then(|p| p.parse().ok()).ok_or("the apiserver's port")?;
        let vault = self.example_vault();
        std::fs::create_dir_all(&vault).map_err(|e| format!("{}: {e}", vault.display()))?;
        let overlay = Overlay {
            kubelet_root: &self.node.kubelet_dirs.root,
            state_dir: &self.node.plugin.state,
            providers_dir: &self.dir.join("providers"),
            example_vault: &vault,
            apiserver: (POD_NETWORK_GATEWAY, port),
            image_tag,
            manifests,
        };
        overlay::write(&self.dir.join("overlay"), &overlay)
    }

    /// `kubectl rollout status` of the DaemonSet and both Deployments: every pod of the newest
    /// revision Ready through the shipped probes.
    async fn wait_rolled_out(&self) -> Outcome {
        for (kind, namespace) in [
            ("daemonset/sharedresource-csi-driver", DRIVER_NAMESPACE),
            ("deployment/csi-volume-admission", SYSTEM),
            ("deployment/sharedresource-read-grants", DRIVER_NAMESPACE),
        ] {
            self.kubectl.run(&["rollout", "status", kind, "-n", namespace, "--timeout=240s"]).await?;
        }
        Ok(())
    }

    /// The read-grants controller scaled to zero, then the share deleted: its grant stays (no one
    /// removes it) but the driver stops serving the share all the same, within the notices'
    /// fallback (no renewal of their lease for `LEASE_SECONDS`, then every share read again
    /// within the shipped `accessFallbackSeconds`, plus one refresh pass); the share made again
    /// and the controller back, the reader is served again. The lines the reader had printed
    /// afterwards.
    async fn share_deleted_while_the_read_grants_controller_is_down(&self, seen: usize) -> Result<usize, String> {
        let grants = ["deployment/sharedresource-read-grants", "-n", DRIVER_NAMESPACE];
        self.kubectl.run(&[&["scale", "--replicas=0"][..], &grants[..]].concat()).await?;
        let controller = ListParams::default().labels(READ_GRANTS_LABEL);
        let pods = Api::<Pod>::namespaced(self.admin.clone(), DRIVER_NAMESPACE);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !pods.list(&controller).await.map_err(|e| format!("listing the controller's pods: {e}"))?.items.is_empty()
        {
            if Instant::now() > deadline {
                return Err("the read-grants controller's pod was still there 120 s after scaling to zero".into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(self.admin.clone(), workload::OWNER);
        let grant = "sharedresource-csi-driver-reads";
        let present = |role: Option<k8s_openapi::api::rbac::v1::Role>| role.is_some();
        if !present(roles.get_opt(grant).await.map_err(|e| e.to_string())?) {
            return Err(format!("the positive control: Role {}/{grant} is not there before", workload::OWNER));
        }
        workload::delete_share(&self.admin).await?;
        let started = Instant::now();
        let seen = wait_for_content(&self.node, "reader", "", seen).await?;
        let waited = started.elapsed();
        println!(
            "deploy: with the read-grants controller down, the deleted share was no longer served after {waited:?}"
        );
        let bound = Duration::from_secs(sharedresource_api::node_view::LEASE_SECONDS)
            + sharedresource_csi_driver::content::cluster::DEFAULT_ACCESS_FALLBACK
            + Duration::from_secs(10);
        if waited > bound {
            return Err(format!("the deleted share was served {waited:?} after its deletion, more than {bound:?}"));
        }
        if !present(roles.get_opt(grant).await.map_err(|e| e.to_string())?) {
            return Err("the grant went while its controller was down: the step proves nothing".into());
        }
        workload::make_share(&self.admin).await?;
        self.kubectl.run(&[&["scale", "--replicas=1"][..], &grants[..]].concat()).await?;
        self.kubectl.run(&["rollout", "status", grants[0], "-n", DRIVER_NAMESPACE, "--timeout=240s"]).await?;
        wait_for_content(&self.node, "reader", "after-attack", seen).await
    }

    async fn wait_registered(&self) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let drivers = self.node.csi_node_drivers(&self.admin).await?;
            if drivers.contains(&(DRIVER.to_string(), self.node.name().to_string())) {
                println!("deploy: CSINode {} lists {drivers:?}", self.node.name());
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("CSINode never listed {DRIVER}: {drivers:?}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn driver_pods(&self) -> Result<Vec<Pod>, String> {
        let pods = Api::<Pod>::namespaced(self.admin.clone(), DRIVER_NAMESPACE);
        let listed = pods.list(&ListParams::default().labels(DRIVER_LABEL)).await.map_err(|e| e.to_string())?;
        Ok(listed.items)
    }

    /// Scrapes the driver pod's `/metrics` (its `health` port, through the apiserver's pod proxy)
    /// until it shows a publish, a refresh that changed content, a revocation and the reader's
    /// share in the gauges (written every few seconds); prints the failures it counted by kind.
    async fn driver_metrics_count_what_happened(&self) -> Result<(), String> {
        let pods = self.driver_pods().await?;
        let name = pods.first().and_then(|pod| pod.metadata.name.clone()).ok_or("no driver pod")?;
        let path = format!("/api/v1/namespaces/{DRIVER_NAMESPACE}/pods/{name}:9808/proxy/metrics");
        let share = format!("{{kind=\"SharedSecret\",namespace=\"\",name=\"{}\"}}", workload::SHARE);
        let wanted = [
            ("sharedresource_csi_driver_publishes_total{result=\"ok\"}".to_string(), 1.0),
            ("sharedresource_csi_driver_refreshes_total{result=\"changed\"}".to_string(), 1.0),
            ("sharedresource_csi_driver_revocations_total".to_string(), 1.0),
            (format!("sharedresource_csi_driver_share_volumes{share}"), 1.0),
            (format!("sharedresource_csi_driver_share_last_refresh_timestamp_seconds{share}"), 1.0),
        ];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let request = http::Request::get(&path).body(Vec::new()).map_err(|e| e.to_string())?;
            let text = self.admin.request_text(request).await.map_err(|e| format!("GET {path}: {e}"))?;
            let value = |series: &str| -> Option<f64> {
                text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
            };
            let missing: Vec<&String> = wanted
                .iter()
                .filter(|(series, least)| value(series).is_none_or(|v| v < *least))
                .map(|(s, _)| s)
                .collect();
            if missing.is_empty() {
                let failures: Vec<&str> = text.lines().filter(|l| l.contains("_errors_total{")).collect();
                println!("deploy: the driver's metrics counted what happened; failures by kind: {failures:?}");
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the driver's metrics lack {missing:?} after 60 s:\n{text}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The uid of the driver's one pod, which must be Ready.
    async fn driver_pod(&self) -> Result<String, String> {
        let pods = self.driver_pods().await?;
        match pods.as_slice() {
            [pod] if ready(pod) => Ok(pod.metadata.uid.clone().unwrap_or_default()),
            other => Err(format!("expected one Ready driver pod, found {}", other.len())),
        }
    }

    async fn driver_image(&self) -> Result<String, String> {
        let pods = self.driver_pods().await?;
        let pod =
            pods.iter().find(|p| ready(p) && p.metadata.deletion_timestamp.is_none()).ok_or("no Ready driver pod")?;
        let spec = pod.spec.as_ref().ok_or("a pod without a spec")?;
        Ok(spec.containers[0].image.clone().unwrap_or_default())
    }

    async fn wait_for_new_driver_pod(&self, old: &str) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pods = self.driver_pods().await?;
            if let [pod] = pods.as_slice() {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if uid != old && ready(pod) {
                    return Ok(uid);
                }
            }
            if Instant::now() > deadline {
                return Err("the DaemonSet did not replace its deleted pod with a Ready one within 120 s".into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Creates a reader pod; it must come back patched read-only (the mutating webhook, called
    /// through its Service). Returns its uid.
    async fn create_reader(&self, name: &str) -> Result<String, String> {
        self.create_patched(share_reader(name)).await
    }

    /// Creates `pod` (one CSI volume, no `readOnly`) in the consumer's namespace; it must come
    /// back patched read-only. Returns its uid.
    async fn create_patched(&self, pod: serde_json::Value) -> Result<String, String> {
        let pods = Api::<Pod>::namespaced(self.admin.clone(), CONSUMER);
        let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let created = pods.create(&Default::default(), &pod).await.map_err(|e| format!("creating {name}: {e}"))?;
        let spec = created.spec.as_ref().ok_or("a pod without a spec")?;
        let read_only = spec.volumes.as_ref().and_then(|v| v[0].csi.as_ref()).and_then(|c| c.read_only);
        if read_only != Some(true) {
            return Err(format!(
                "{name} was stored with csi.readOnly {read_only:?}: the mutating webhook did not patch it"
            ));
        }
        Ok(created.metadata.uid.unwrap_or_default())
    }

    /// The driver read the share as its own ServiceAccount, with its projected token: no
    /// impersonation, no admin credentials.
    fn driver_acted_as_its_service_account(&self) -> Outcome {
        let events = self.cluster.audit_events()?;
        // Reads of SharedSecrets: the driver gets, lists and watches them (one object each).
        let reads: Vec<_> = events
            .iter()
            .filter(|e| e.object_ref.as_ref().is_some_and(|o| o.resource == "sharedsecrets"))
            .filter(|e| matches!(e.verb.as_str(), "get" | "list" | "watch"))
            .collect();
        if reads.is_empty() {
            return Err("the audit log has no read of a SharedSecret".into());
        }
        // Only the two shipped identities read them (the read-grants controller lists and
        // watches them all), each as itself: no impersonation, no admin. The control plane's
        // own kube-controller-manager lists and watches every resource once its discovery
        // finds the CRD (the garbage collector's and quota's metadata informers, on their own
        // 30 s schedule): a reader of the cluster itself, not ours, whichever run sees it.
        let control_plane = |e: &inline_guard_tests::cluster::AuditEvent| {
            e.user.username == "system:kube-controller-manager"
                && e.impersonated_user.is_none()
                && matches!(e.verb.as_str(), "list" | "watch")
        };
        // The webhook gets the share a pod names, by name, to refuse a pod naming none at
        // creation; it never lists or watches them.
        let webhook_get = |e: &inline_guard_tests::cluster::AuditEvent| {
            e.user.username == WEBHOOK_USER && e.impersonated_user.is_none() && e.verb == "get"
        };
        let strangers: Vec<_> = reads
            .iter()
            .filter(|e| !control_plane(e) && !webhook_get(e))
            .filter(|e| {
                ![DRIVER_USER, READ_GRANTS_USER].contains(&e.user.username.as_str()) || e.impersonated_user.is_some()
            })
            .map(|e| e.acting_user().to_string())
            .collect();
        if !strangers.is_empty() {
            return Err(format!(
                "SharedSecrets were read by {strangers:?}, not only {DRIVER_USER} and {READ_GRANTS_USER} (and got by name by {WEBHOOK_USER})"
            ));
        }
        let by_driver: std::collections::BTreeSet<&str> =
            reads.iter().filter(|e| e.user.username == DRIVER_USER).map(|e| e.verb.as_str()).collect();
        if by_driver.is_empty() {
            return Err(format!("no read of a SharedSecret by {DRIVER_USER}"));
        }
        println!("deploy: the driver read SharedSecrets ({by_driver:?}) as {DRIVER_USER} itself");
        Ok(())
    }

    /// A restricted namespace and a CSIDriver labelled privileged: a pod using it is refused.
    async fn denied_probe(&self) -> Result<(String, serde_json::Value, String), String> {
        let namespace = "deploy-restricted";
        let driver = "privileged.deploy.e2e.inlineguard.dev";
        self.kubectl.run(&["create", "namespace", namespace]).await.or_else(already_exists)?;
        self.kubectl
            .run(&["label", "--overwrite", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"])
            .await?;
        inline_guard_tests::cluster::namespace_defaults(&self.admin, namespace, Duration::from_secs(60)).await?;
        let object = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": driver, "labels": {"security.openshift.io/csi-ephemeral-volume-profile": "privileged"}},
            "spec": {"podInfoOnMount": true, "attachRequired": false, "volumeLifecycleModes": ["Ephemeral"]}
        });
        let file = self.dir.join("privileged-driver.json");
        std::fs::write(&file, object.to_string()).map_err(|e| e.to_string())?;
        self.kubectl.run(&["apply", "-f", &path(&file)]).await?;
        let mut pod = share_reader("refused");
        pod["spec"]["serviceAccountName"] = json!("default");
        pod["spec"]["volumes"][0]["csi"]["driver"] = json!(driver);
        let message = format!(
            "admission webhook \"pods.csi-volume-admission.inlineguard.dev\" denied the request: refused uses an inline volume provided by CSIDriver {driver} and namespace {namespace} has a pod security enforce level that is lower than privileged"
        );
        Ok((namespace.to_string(), pod, message))
    }

    async fn denied_with_the_exact_message(&self) -> Outcome {
        let (namespace, pod, message) = self.denied_probe().await?;
        let pods = Api::<Pod>::namespaced(self.admin.clone(), &namespace);
        let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
        match pods.create(&Default::default(), &pod).await {
            Err(kube::Error::Api(status)) if status.code == 403 && status.message == message => Ok(()),
            Err(kube::Error::Api(status)) => Err(format!("refused, but with {} {:?}", status.code, status.message)),
            Err(error) => Err(error.to_string()),
            Ok(_) => Err(format!("{namespace}/refused was admitted")),
        }
    }

    async fn probes(&self) -> Result<rollout::Probes, String> {
        let (namespace, pod, message) = self.denied_probe().await?;
        let mut admitted = share_reader("admitted");
        admitted["metadata"]["name"] = json!("admitted");
        Ok(rollout::Probes { admitted: (CONSUMER.to_string(), admitted), denied: (namespace, pod, message) })
    }

    /// `kubectl delete -k` leaves no driver socket, registration, record or mount, after the
    /// same checks saw each while installed.
    async fn uninstalled_leaves_nothing(&self, overlay: &Path) -> Outcome {
        self.only_the_sockets_while_installed()?;
        self.grant_present().await?;
        self.kubectl.run(&["delete", "-k", &path(overlay), "--wait=true", "--timeout=240s"]).await?;
        self.node_left_clean("delete -k").await?;
        self.grants_gone("delete -k").await
    }

    /// The read-grants controller's Role and RoleBinding in the share's namespace: there while
    /// installed (the positive control of [`Self::grants_gone`]).
    async fn grant_present(&self) -> Outcome {
        let args = ["get", "role,rolebinding", GRANT, "-n", workload::OWNER, "-o", "name"];
        let found = self.kubectl.run(&args).await?;
        if found.lines().count() != 2 {
            return Err(format!("while installed, the read grant in {} is not both there: {found:?}", workload::OWNER));
        }
        Ok(())
    }

    /// After `removal`, the garbage collector removes the grants with the driver's namespace,
    /// their owner: nothing the controller made outlives it.
    async fn grants_gone(&self, removal: &str) -> Outcome {
        let args = ["get", "role,rolebinding", GRANT, "-n", workload::OWNER, "--ignore-not-found", "-o", "name"];
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let found = self.kubectl.run(&args).await?;
            if found.trim().is_empty() {
                println!("deploy: {removal}: the read grants went with the driver's namespace");
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("120 s after {removal}, the read grants are still there: {found:?}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The driver's sockets, records and volume mounts on the node.
    fn node_traces(&self) -> Result<Vec<String>, String> {
        let root = &self.node.kubelet_dirs.root;
        let socket = root.join("plugins/sharedresource.csi.inlineguard.dev/csi.sock");
        let registration = root.join("plugins_registry/sharedresource.csi.inlineguard.dev-reg.sock");
        let mut found: Vec<String> =
            [&socket, &registration].into_iter().filter(|p| p.exists()).map(|p| path(p)).collect();
        found.extend(self.node.driver_records()?.iter().map(|p| path(p)));
        found.extend(self.node.pod_mounts().into_iter().filter(|m| m.contains("kubernetes.io~csi")));
        Ok(found)
    }

    /// Installed, with no workload: the positive control of the removal's check.
    fn only_the_sockets_while_installed(&self) -> Outcome {
        let installed = self.node_traces()?;
        if installed.len() != 2 {
            return Err(format!("while installed (no workload), expected the two sockets only: {installed:?}"));
        }
        Ok(())
    }

    /// Waits until no driver pod, socket, record or volume mount is left and the CSINode no
    /// longer lists the driver, after `removal`.
    async fn node_left_clean(&self, removal: &str) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            // An API error is not "no driver pods": it is no answer, and the wait goes on.
            let pods = self.driver_pods().await;
            let left = self.node_traces()?;
            let registered = self.node.csi_node_drivers(&self.admin).await?.iter().any(|(name, _)| name == DRIVER);
            if pods.as_ref().is_ok_and(Vec::is_empty) && left.is_empty() && !registered {
                println!("deploy: {removal} left nothing on the node");
                return Ok(());
            }
            if Instant::now() > deadline {
                let pods = pods
                    .map(|p| format!("{} driver pods", p.len()))
                    .unwrap_or_else(|e| format!("listing driver pods: {e}"));
                return Err(format!(
                    "120 s after {removal}: {pods}, left on the node {left:?}, CSINode lists the driver: {registered}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// What the cluster and node looked like, for a failure.
    async fn diagnostics(&self) -> String {
        let mut text = String::from("--- diagnostics ---\n");
        for args in [
            &["get", "pods", "-A", "-o", "wide"][..],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
            &["get", "daemonsets,deployments", "-A"][..],
        ] {
            text += &self.kubectl.run(args).await.unwrap_or_else(|e| e);
        }
        for pod in self.driver_pods().await.unwrap_or_default() {
            let name = pod.metadata.name.unwrap_or_default();
            text += &format!("--- driver pod {name} ---\n");
            text += &self.node.container_log(DRIVER_NAMESPACE, &name, "driver").join("\n");
        }
        // The read-grants controller's too: a share the driver may not read yet is its to grant.
        let pods = Api::<Pod>::namespaced(self.admin.clone(), DRIVER_NAMESPACE);
        let controllers = ListParams::default().labels(READ_GRANTS_LABEL);
        for pod in pods.list(&controllers).await.map(|listed| listed.items).unwrap_or_default() {
            let name = pod.metadata.name.unwrap_or_default();
            text += &format!("\n--- read-grants pod {name} ---\n");
            let log = self.node.container_log(DRIVER_NAMESPACE, &name, "controller");
            text += &log[log.len().saturating_sub(60)..].join("\n");
        }
        text + "\n" + &self.provider.log_tail(20) + "\n" + &self.node.log_tails()
    }
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn already_exists(error: String) -> Result<String, String> {
    if error.contains("AlreadyExists") || error.contains("already exists") { Ok(String::new()) } else { Err(error) }
}
