//! csi-sanity, the CSI conformance suite, against the driver on a real unix socket with real
//! mounts.
//!
//! Skipped specs, and why: everything naming the Controller (a node-only plugin has no
//! CONTROLLER_SERVICE), and "NodeUnpublishVolume should remove target path", which creates its
//! volume through the controller's CreateVolume and so cannot run against a node-only plugin.

use std::process::Command;
use std::time::Duration;

use sharedresource_csi_driver::plugin::Plugin;

use crate::support::{Outcome, Suite};

const SKIPPED_SPECS: &str = "Controller|should remove target path";

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|status| {
            status.lines().any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

pub async fn passes_with_the_controller_suite_skipped(suite: &Suite) -> Outcome {
    if !is_root() {
        eprintln!(
            "SKIPPED LOUDLY: csi-sanity publishes real mounts and needs root; run the test command as root (CI does)"
        );
        return Ok(());
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let shares = dir.path().join("shares");
    std::fs::create_dir_all(shares.join("cluster-ca")).map_err(|e| e.to_string())?;
    std::fs::write(shares.join("cluster-ca/ca.crt"), "pem").map_err(|e| e.to_string())?;
    let socket = dir.path().join("csi.sock");
    let plugin = Plugin::in_directory(dir.path(), socket.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(plugin.run(async {
        let _ = stopped.await;
    }));
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let sanity = suite.peers.csi_sanity.clone();
    let output = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || {
            Command::new(sanity)
                .arg("--csi.endpoint")
                .arg(&socket)
                .arg("--csi.mountdir")
                .arg(dir.join("mount"))
                .arg("--csi.stagingdir")
                .arg(dir.join("staging"))
                .args(["--ginkgo.skip", SKIPPED_SPECS, "--ginkgo.no-color"])
                .output()
        }
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("running csi-sanity: {e}"))?;
    let _ = stop.send(());
    running.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;

    let report = String::from_utf8_lossy(&output.stdout);
    let summary = report.lines().rev().find(|line| line.contains("Passed")).unwrap_or_default().to_string();
    println!("csi-sanity: {summary}");
    if !output.status.success() || !summary.contains("0 Failed") {
        return Err(format!("csi-sanity failed: {summary}\n{report}\n{}", String::from_utf8_lossy(&output.stderr)));
    }
    Ok(())
}
