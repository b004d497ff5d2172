//! kubelet for the node: its root, certificates, pod logs and configuration under the run's own
//! directory, talking to the suite's apiserver as its node (a client certificate of
//! `system:node:NAME`) and to the run's containerd. Serving on loopback only, with no readonly
//! port; nothing calls it over the network (the suite reads container logs from the pod log
//! files).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bounded::output_within;
use crate::cluster::{ChildProcess, free_ports};

/// The node's name.
pub const NODE_NAME: &str = "inline-guard-e2e-node";

/// Where kubelet keeps what.
pub struct KubeletDirs {
    /// `--root-dir`: pods, plugins, the plugin registry.
    pub root: PathBuf,
    /// `podLogsDir`: `<namespace>_<pod>_<uid>/<container>/<restart>.log`.
    pub pod_logs: PathBuf,
}

/// The first global IPv4 address of the machine: kubelet refuses a loopback node IP. Only
/// reported in the Node's status; nothing connects to it.
fn node_ip() -> Result<String, String> {
    let output = output_within(
        Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]),
        Duration::from_secs(10),
        "ip addr",
    )?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .and_then(|cidr| cidr.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| "this machine has no global IPv4 address for kubelet's node IP".to_string())
}

/// Makes `root` a shared mount point (a bind mount of itself, made `rshared`), as kubelet's root
/// is on a systemd host, where `/` is shared: a container's Bidirectional mount of a directory
/// below it (the driver's DaemonSet) needs it, and mounts made there reach the host and kubelet.
/// This machine's `/` is private. Undone with the node's other mounts at teardown.
fn share_mounts_under(root: &Path) -> Result<(), String> {
    for args in [
        vec!["--bind", root.to_str().unwrap_or_default(), root.to_str().unwrap_or_default()],
        vec!["--make-rshared", root.to_str().unwrap_or_default()],
    ] {
        let output = output_within(Command::new("mount").args(&args), Duration::from_secs(10), "mount")?;
        if !output.status.success() {
            return Err(format!("mount {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()));
        }
    }
    Ok(())
}

/// Starts kubelet in `dir` against `kubeconfig` and `runtime_socket`, registering its Node with
/// a `NoSchedule` taint of each key of `taints` (as a node pool's startup taints are).
pub fn start(
    kubelet: &Path,
    dir: &Path,
    kubeconfig: &Path,
    runtime_socket: &Path,
    taints: &[&str],
) -> Result<(ChildProcess, KubeletDirs), String> {
    let dirs = KubeletDirs { root: dir.join("root"), pod_logs: dir.join("pod-logs") };
    for created in [&dirs.root, &dirs.pod_logs] {
        std::fs::create_dir_all(created).map_err(|e| format!("{}: {e}", created.display()))?;
    }
    share_mounts_under(&dirs.root)?;
    let config = dir.join("kubelet.yaml");
    let [port, healthz] = free_ports()?;
    let text = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{runtime}
podLogsDir: {pod_logs}
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: ""
syncFrequency: 5s
nodeStatusUpdateFrequency: 2s
registerWithTaints: [{taints}]
"#,
        runtime = runtime_socket.display(),
        pod_logs = dirs.pod_logs.display(),
        taints =
            taints.iter().map(|key| format!("{{key: \"{key}\", effect: NoSchedule}}")).collect::<Vec<_>>().join(", "),
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let process = ChildProcess::spawn(
        "kubelet",
        kubelet,
        &[
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", dirs.root.display()),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--node-ip={}", node_ip()?),
            format!("--hostname-override={NODE_NAME}"),
            "--v=2".into(),
        ],
        &[],
        dir,
    )?;
    Ok((process, dirs))
}
