//! A real node for the end-to-end suite: Debian's containerd and runc, kubelet built from the same
//! Kubernetes release as the apiserver, and the driver as a host process in kubelet's plugin
//! directories, so kubelet discovers it through its registration socket as in a cluster. Pods
//! name the node directly (`spec.nodeName`: no scheduler runs) and use images imported from OCI
//! layouts (`imagePullPolicy: Never`).
//!
//! One node per machine at a time: the pods' bridge has one name. Everything else of the node
//! (containerd's and runc's state, the pods' network namespaces, kubelet's root) lives under its
//! directory, inside the test process's run directory (`run_root`). Teardown removes the pods
//! through the CRI, as kubelet would, then sweeps the directory.

pub mod image;
pub mod kubelet;
mod observe;
pub mod plugin;
pub mod runtime;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;

pub use observe::delete_and_wait;

use crate::cluster::{ChildProcess, Cluster};
use crate::peers::Peers;
use crate::run_root::{mounts_under, sweep};
use kubelet::{KubeletDirs, NODE_NAME};
use plugin::PluginFiles;
use runtime::Containerd;

/// The busybox image the node's pods run.
pub const BUSYBOX_IMAGE: &str = "inline-guard.test/busybox:e2e";

/// A pod as the restricted Pod Security level allows it, run by the service account `reader`,
/// whose container `reader` runs `script` in [`BUSYBOX_IMAGE`] with the inline volume `csi`
/// (named `shared`) mounted at `mount_path`.
pub fn reader_pod(name: &str, script: &str, csi: serde_json::Value, mount_path: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": "reader",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "reader",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "shared", "mountPath": mount_path}],
            }],
            "volumes": [{"name": "shared", "csi": csi}],
        },
    })
}

/// A running node. Dropping it tears it down.
pub struct Node {
    /// kubelet's directories.
    pub kubelet_dirs: KubeletDirs,
    /// The driver's files.
    pub plugin: PluginFiles,
    driver: Mutex<Option<ChildProcess>>,
    kubelet: Option<ChildProcess>,
    containerd: Option<Containerd>,
    /// The CRI client that removes the pods at teardown ([`Peers::cri_pods`]).
    cri_pods: PathBuf,
    /// The pods whose volume [`Node::volume_present`] has seen.
    seen_volumes: Mutex<std::collections::HashSet<String>>,
    dir: Option<tempfile::TempDir>,
}

impl Node {
    /// The node's name.
    pub fn name(&self) -> &'static str {
        NODE_NAME
    }

    /// Starts containerd, imports the images, starts kubelet and the driver (serving the
    /// cluster's shares as the identity in `driver_kubeconfig`), and waits until the Node is
    /// Ready.
    pub async fn start(
        cluster: &Cluster,
        peers: &Peers,
        admin: &kube::Client,
        driver_kubeconfig: &Path,
    ) -> Result<Node, String> {
        Node::start_with(cluster, peers, admin, driver_kubeconfig, true, &[]).await
    }

    /// Starts containerd, imports the images and starts kubelet, without the driver: for the
    /// driver installed as its DaemonSet. [`Node::plugin`] says where that one's files go.
    /// Its Node registers with a `NoSchedule` taint of each key of `taints`.
    pub async fn start_without_driver(
        cluster: &Cluster,
        peers: &Peers,
        admin: &kube::Client,
        taints: &[&str],
    ) -> Result<Node, String> {
        // The layout's kubeconfig is never read: no driver process is started from it.
        Node::start_with(cluster, peers, admin, Path::new("/nonexistent"), false, taints).await
    }

    async fn start_with(
        cluster: &Cluster,
        peers: &Peers,
        admin: &kube::Client,
        driver_kubeconfig: &Path,
        run_driver: bool,
        taints: &[&str],
    ) -> Result<Node, String> {
        let dir = tempfile::Builder::new().prefix("node-").tempdir().map_err(|e| e.to_string())?;
        let root = dir.path().to_path_buf();
        let containerd = Containerd::start(&root.join("containerd"))?;
        let images = root.join("images");
        std::fs::create_dir_all(&images).map_err(|e| e.to_string())?;
        containerd.import(&image::pause(&images, runtime::PAUSE_IMAGE, &peers.pause)?)?;
        containerd.import(&image::busybox(&images, BUSYBOX_IMAGE)?)?;
        // kubelet's own identity, not the admin's: the Node authorizer and NodeRestriction hold it.
        let kubelet_kubeconfig = cluster.node_kubeconfig(NODE_NAME)?;
        let (kubelet, kubelet_dirs) =
            kubelet::start(&peers.kubelet, &root.join("kubelet"), &kubelet_kubeconfig, &containerd.socket, taints)?;
        let health = format!("127.0.0.1:{}", crate::cluster::free_port()?).parse().map_err(|e| format!("{e}"))?;
        let plugin = PluginFiles::kubernetes(&root.join("driver"), &kubelet_dirs.root, driver_kubeconfig, 60, health)?;
        let driver = if run_driver { Some(plugin.start(&root, "driver")?) } else { None };
        let mut node = Node {
            kubelet_dirs,
            plugin,
            driver: Mutex::new(driver),
            kubelet: Some(kubelet),
            containerd: Some(containerd),
            cri_pods: peers.cri_pods.clone(),
            seen_volumes: Mutex::default(),
            dir: Some(dir),
        };
        node.wait_ready(admin).await?;
        Ok(node)
    }

    async fn wait_ready(&mut self, admin: &kube::Client) -> Result<(), String> {
        let nodes = Api::<NodeObject>::all(admin.clone());
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut last = String::from("no Node object yet");
        while Instant::now() < deadline {
            if let Some(kubelet) = self.kubelet.as_mut() {
                kubelet.ensure_running()?;
            }
            if let Ok(node) = nodes.get(NODE_NAME).await {
                let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
                match conditions.iter().find(|c| c.type_ == "Ready") {
                    Some(ready) if ready.status == "True" => return Ok(()),
                    Some(ready) => {
                        last = format!("Ready={}: {}", ready.status, ready.message.clone().unwrap_or_default())
                    }
                    None => last = "no Ready condition yet".into(),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("node {NODE_NAME} not Ready within 90 s: {last}\n{}", self.log_tails()))
    }

    /// The drivers the node's CSINode lists, with their node ids (none while kubelet has not made
    /// the CSINode yet; an API error is an error, never "none").
    pub async fn csi_node_drivers(&self, admin: &kube::Client) -> Result<Vec<(String, String)>, String> {
        match Api::<CSINode>::all(admin.clone()).get_opt(NODE_NAME).await {
            Ok(Some(node)) => Ok(node.spec.drivers.into_iter().map(|d| (d.name, d.node_id)).collect()),
            Ok(None) => Ok(Vec::new()),
            Err(e) => Err(format!("reading CSINode {NODE_NAME}: {e}")),
        }
    }

    /// Imports an OCI image layout tar into the node's containerd (`ctr images import`), as an
    /// operator without a registry would.
    pub fn import_image(&self, archive: &Path) -> Result<(), String> {
        self.containerd.as_ref().ok_or("the node is torn down")?.import(archive)
    }

    /// The images containerd holds, by name.
    pub fn image_names(&self) -> Result<Vec<String>, String> {
        let listed = self.containerd.as_ref().ok_or("the node is torn down")?.ctr(&["images", "list", "-q"])?;
        Ok(listed.lines().map(str::to_string).collect())
    }

    /// The driver's resident memory now.
    pub fn driver_resident_bytes(&self) -> Result<u64, String> {
        let driver = self.driver.lock().unwrap_or_else(|p| p.into_inner());
        driver.as_ref().ok_or("no driver runs on the node")?.resident_bytes()
    }

    /// SIGKILLs the driver.
    pub fn kill_driver(&self) {
        if let Some(mut driver) = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take() {
            driver.kill();
        }
    }

    /// Starts the driver again (after [`Node::kill_driver`]).
    pub fn restart_driver(&self) -> Result<(), String> {
        let dir = self.dir.as_ref().ok_or("the node is torn down")?.path();
        let driver = self.plugin.start(dir, "driver-restarted")?;
        *self.driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(driver);
        Ok(())
    }

    /// A planned restart, as a DaemonSet's rolling update with `maxSurge: 1` makes it: a new
    /// driver starts beside the running one and takes the node over (its lazy volumes among
    /// it); once the old one says it has let go of the node, it is stopped with SIGTERM and must
    /// exit 0 within its shutdown bound.
    pub fn hand_over_driver(&self) -> Result<(), String> {
        let dir = self.dir.as_ref().ok_or("the node is torn down")?.path();
        let mut guard = self.driver.lock().unwrap_or_else(|p| p.into_inner());
        let mut old = guard.take().ok_or("no driver runs on the node")?;
        let mut successor = self.plugin.start_beside(dir, "driver-successor")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !old.log_text().contains("this driver has let go of the node") {
            successor.ensure_running()?;
            old.ensure_running()?;
            if Instant::now() > deadline {
                return Err(format!(
                    "the running driver did not hand the node over within 60 s\n{}\n{}",
                    old.log_tail(20),
                    successor.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = old.terminate(Duration::from_secs(20))?;
        if !status.success() {
            return Err(format!("the driver that handed the node over exited {status}\n{}", old.log_tail(20)));
        }
        *guard = Some(successor);
        Ok(())
    }

    /// Stops the driver (SIGKILL), rewrites its configuration with the YAML lines `extra` added
    /// ([`PluginFiles::configure`]; `""` is the node's own) and starts it again.
    pub fn restart_driver_with(&self, extra: &str) -> Result<(), String> {
        self.kill_driver();
        self.plugin.configure(extra)?;
        self.restart_driver()
    }

    /// What the container `container` of pod `namespace/pod` has written so far, one line per
    /// write (the CRI log format's prefix removed).
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Vec<String> {
        let prefix = format!("{namespace}_{pod}_");
        let Ok(entries) = std::fs::read_dir(&self.kubelet_dirs.pod_logs) else { return Vec::new() };
        let mut lines = Vec::new();
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(entry.path().join(container)) else { continue };
            let mut files: Vec<PathBuf> = files.flatten().map(|f| f.path()).collect();
            files.sort();
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                // `<time> stdout F <line>`
                lines.extend(text.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).map(str::to_string));
            }
        }
        lines
    }

    /// Mount points under kubelet's pods directory (what a published volume leaves).
    pub fn pod_mounts(&self) -> Vec<String> {
        mounts_under(&self.kubelet_dirs.root.join("pods"))
    }

    /// The per-mount options (`rw,nosuid,...`) of the mount at `point` in this process's mount
    /// table: of the topmost one when mounts are stacked there.
    pub fn mount_options(&self, point: &str) -> Option<String> {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        table
            .lines()
            .rev()
            .map(|line| line.split(' ').collect::<Vec<_>>())
            .find(|fields| fields.len() > 5 && fields[4].replace("\\040", " ") == point)
            .map(|fields| fields[5].to_string())
    }

    /// The driver's volume records. An unreadable (or missing) state directory is an error, never
    /// "no records".
    pub fn driver_records(&self) -> Result<Vec<PathBuf>, String> {
        let entries = std::fs::read_dir(&self.plugin.state)
            .map_err(|e| format!("the driver's state directory {}: {e}", self.plugin.state.display()))?;
        let mut records = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| format!("the driver's state directory: {e}"))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                records.push(path);
            }
        }
        Ok(records)
    }

    /// How many times kubelet's log so far says it registered the CSI driver `driver`, and
    /// deregistered it (its CSI plugin's own lines, logged at every verbosity).
    pub fn kubelet_registrations(&self, driver: &str) -> (usize, usize) {
        let log = self.kubelet.as_ref().map(ChildProcess::log_text).unwrap_or_default();
        let registered = format!("Register new plugin with name: {driver} ");
        let deregistered = format!("DeRegisterPlugin request for plugin {driver},");
        (log.matches(&registered).count(), log.matches(&deregistered).count())
    }

    /// The last lines of kubelet's, containerd's and the driver's logs, for failure messages.
    pub fn log_tails(&self) -> String {
        let mut tails = Vec::new();
        if let Some(kubelet) = &self.kubelet {
            tails.push(kubelet.log_tail(25));
        }
        if let Some(containerd) = &self.containerd {
            tails.push(containerd.process.log_tail(10));
        }
        if let Some(driver) = self.driver.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            tails.push(driver.log_tail(15));
        }
        tails.join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // kubelet first, so it restarts nothing; then every pod through the CRI, containerd, the
        // driver; then the sweep of the node's directory:
        // its shims and any process still naming it, runc's leftovers, every mount the run made
        // (netns included), deepest first, and the files.
        drop(self.kubelet.take());
        if let Some(containerd) = self.containerd.take() {
            containerd.remove_pods(&self.cri_pods);
            drop(containerd);
            runtime::delete_bridge();
        }
        self.kill_driver();
        if let Some(dir) = self.dir.take() {
            let _ = sweep(dir.path());
            drop(dir);
        }
    }
}
