//! The container runtime of the node: Debian's containerd and runc, with a root, state, socket and
//! CNI configuration of the run's own.
//!
//! containerd insists on an `eth0` with an address in every sandbox, so pods get one on an
//! isolated bridge with addresses from TEST-NET-2 (198.51.100.0/24, reserved for
//! documentation). The host has the bridge's first address ([`POD_NETWORK_GATEWAY`]), so that
//! kubelet's probes and the apiserver's webhook calls reach pods and pods reach the apiserver,
//! as on a real node; but no forwarding, masquerading or route is added, so pods reach nothing
//! beyond the host, and nothing on the machine's own networks changes. Teardown deletes the
//! bridge.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::bounded::output_within;
use crate::cluster::{ChildProcess, POD_NETWORK_GATEWAY};
use crate::run_root::RUNC_ROOT;

/// A running containerd.
pub struct Containerd {
    /// The process.
    pub process: ChildProcess,
    /// Its CRI and API socket.
    pub socket: PathBuf,
    /// Its state directory (the shims' sockets live here).
    pub state: PathBuf,
}

/// The isolated bridge the pods' `eth0` hang on.
pub const BRIDGE: &str = "ig-e2e0";

/// Creates the pods' bridge with the host's address on it, before the CNI plugin (which would
/// create it without one: `isGateway` would also turn on the host's IP forwarding).
fn create_bridge() -> Result<(), String> {
    let ip = |args: &[&str]| {
        let output = output_within(Command::new("ip").args(args), Duration::from_secs(10), "ip")?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
        }
    };
    // A bridge left by a killed run is reused.
    let _ = ip(&["link", "add", BRIDGE, "type", "bridge"]);
    ip(&["addr", "replace", &format!("{POD_NETWORK_GATEWAY}/24"), "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])
}

/// Deletes the pods' bridge (nothing else removes it).
pub fn delete_bridge() {
    let _ =
        output_within(Command::new("ip").args(["link", "delete", BRIDGE]), Duration::from_secs(10), "ip link delete");
}

/// The image every pod sandbox runs.
pub const PAUSE_IMAGE: &str = "inline-guard.test/pause:e2e";

impl Containerd {
    /// Starts containerd under `dir` and waits until it answers.
    pub fn start(dir: &Path) -> Result<Containerd, String> {
        let write =
            |path: &Path, text: &str| std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()));
        let (root, state, cni) = (dir.join("root"), dir.join("state"), dir.join("cni"));
        for created in [&root, &state, &cni] {
            std::fs::create_dir_all(created).map_err(|e| format!("{}: {e}", created.display()))?;
        }
        let socket = state.join("containerd.sock");
        create_bridge()?;
        write(
            &cni.join("10-isolated.conflist"),
            &serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "inline-guard-e2e",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": false,
                        "ipMasq": false,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": "198.51.100.0/24", "gateway": POD_NETWORK_GATEWAY}]],
                            "dataDir": dir.join("ipam"),
                        },
                    },
                    {"type": "loopback"},
                ],
            })
            .to_string(),
        )?;
        let config = dir.join("config.toml");
        write(
            &config,
            &format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{state}/containerd.sock.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The pods' network namespaces under the state directory (not /var/run/netns), so that every
  # trace of a run is below its run directory.
  netns_mounts_under_state_dir = true
  # This sandbox lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below the parent's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state of the containers here too (not /run/containerd/runc): a sweep of a run
        # whose containerd is gone finds its containers there (run_root).
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
                root = root.display(),
                state = state.display(),
                socket = socket.display(),
                cni = cni.display(),
                runc = dir.join(RUNC_ROOT).display(),
            ),
        )?;
        let mut process = ChildProcess::spawn(
            "containerd",
            Path::new("/usr/bin/containerd"),
            &["--config".into(), config.display().to_string()],
            &[],
            dir,
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            process.ensure_running()?;
            if Instant::now() > deadline {
                return Err(format!("containerd did not listen within 30 s\n{}", process.log_tail(20)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Containerd { process, socket, state })
    }

    /// `ctr -n k8s.io ARGS` against this containerd.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        let output = output_within(
            Command::new("/usr/bin/ctr").arg("--address").arg(&self.socket).args(["-n", "k8s.io"]).args(args),
            Duration::from_secs(120),
            "ctr",
        )?;
        if !output.status.success() {
            return Err(format!("ctr {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr)));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Imports an OCI layout tar.
    pub fn import(&self, archive: &Path) -> Result<(), String> {
        self.ctr(&["images", "import", &archive.display().to_string()]).map(drop)
    }

    /// Removes every pod through the CRI (`cri_pods`), as kubelet would, so the network plugin's
    /// DEL runs. Whatever that leaves (a shim, a container) is the node directory's sweep's
    /// (`run_root::sweep`: the shims name the state directory, runc's root is below it).
    pub fn remove_pods(&self, cri_pods: &Path) {
        match output_within(Command::new(cri_pods).arg(&self.socket), Duration::from_secs(90), "cri-pods") {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!("node teardown: cri-pods: {}", String::from_utf8_lossy(&output.stderr).trim()),
            Err(error) => eprintln!("node teardown: {error}"),
        }
    }
}
