//! kubelet's side of plugin registration, with real grpc-go: the `registration-probe` peer dials
//! the driver's registration socket as kubelet 1.35's plugin watcher does (the bare socket path
//! as target, so as the HTTP/2 `:authority`, which h2 alone refuses with PROTOCOL_ERROR), asks
//! GetInfo and reports the registration. A real kubelet doing the same is the real-node issue's.

use std::process::Command;
use std::time::{Duration, Instant};

use inline_guard_tests::bounded::output_within;
use serde_json::Value;
use sharedresource_csi_driver::plugin::Plugin;

use crate::support::{Outcome, Suite};

pub async fn grpc_go_dialled_as_kubelet_registers_the_driver(suite: &Suite) -> Outcome {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.path().join("shares")).map_err(|e| e.to_string())?;
    let csi_socket = dir.path().join("csi.sock");
    let registration = dir.path().join("registry/sharedresource.csi.inlineguard.dev-reg.sock");
    let plugin = Plugin { register: true, ..Plugin::in_directory(dir.path(), csi_socket.clone()) };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(plugin.run(async {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&registration).is_err() {
        if Instant::now() > deadline {
            return Err("the driver never listened on its registration socket".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let probe = suite.peers.registration_probe.clone();
    let output = tokio::task::spawn_blocking({
        let registration = registration.clone();
        move || output_within(Command::new(probe).arg(&registration), Duration::from_secs(30), "registration-probe")
    })
    .await
    .map_err(|e| e.to_string())??;
    let _ = stop.send(());
    running.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;

    if !output.status.success() {
        return Err(format!("kubelet's dial failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let info: Value = serde_json::from_slice(&output.stdout).map_err(|e| format!("probe output: {e}"))?;
    let expected = serde_json::json!({
        "type": "CSIPlugin",
        "name": "sharedresource.csi.inlineguard.dev",
        "endpoint": csi_socket.to_string_lossy(),
        "supported_versions": ["1.0.0"],
    });
    if info != expected {
        return Err(format!("GetInfo answered {info}, expected {expected}"));
    }
    println!("kubelet-style registration dial answered: {info}");
    Ok(())
}
