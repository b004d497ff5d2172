//! csi-sanity, the CSI conformance suite, against the driver on a real unix socket.
//!
//! What it can prove here, and what it cannot:
//! - It runs the Identity specs and the Node specs that need no volume: argument checks of
//!   NodePublishVolume and NodeUnpublishVolume, NodeGetCapabilities, NodeGetInfo. The exact list
//!   of specs that must pass is [`EXPECTED_PASSED`]; a run where any of them is skipped, or where
//!   anything else passes or fails, fails this scenario.
//! - It cannot publish anything to this driver. Every csi-sanity spec that publishes first
//!   creates its volume with the Controller's CreateVolume (a node-only plugin has none), and
//!   publishes with `readonly: false`, which this driver refuses by design. Publishing is proven
//!   by the driver's own tests over the socket (`driver/tests/`) and by the kubelet-publish
//!   scenario.
//! - Skipped on purpose: everything naming the Controller, and "should remove target path"
//!   (it creates its volume through the Controller).

use std::process::Command;
use std::time::{Duration, Instant};

use inline_guard_tests::bounded::output_within;
use sharedresource_csi_driver::plugin::Plugin;

use crate::support::{Outcome, Suite};

const SKIPPED_SPECS: &str = "Controller|should remove target path";

/// No hang of csi-sanity may stall the run.
const SANITY_BOUND: Duration = Duration::from_secs(120);

/// Every spec that must run and pass, by its full Ginkgo name.
const EXPECTED_PASSED: [&str; 10] = [
    "Node Service NodeGetCapabilities should return appropriate capabilities",
    "Node Service NodeGetInfo should return appropriate values",
    "Node Service NodePublishVolume should fail when no volume id is provided",
    "Node Service NodePublishVolume should fail when no target path is provided",
    "Node Service NodePublishVolume should fail when no volume capability is provided",
    "Node Service NodeUnpublishVolume should fail when no volume id is provided",
    "Node Service NodeUnpublishVolume should fail when no target path is provided",
    "Identity Service GetPluginCapabilities should return appropriate capabilities",
    "Identity Service Probe should return appropriate information",
    "Identity Service GetPluginInfo should return appropriate information",
];

pub async fn passes_its_node_and_identity_specs(suite: &Suite) -> Outcome {
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            return Err("the driver never listened on its socket".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let sanity = suite.peers.csi_sanity.clone();
    let report = dir.path().join("junit.xml");
    let output = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        let report = report.clone();
        move || {
            output_within(
                Command::new(sanity)
                    .arg("--csi.endpoint")
                    .arg(&socket)
                    .arg("--csi.mountdir")
                    .arg(dir.join("mount"))
                    .arg("--csi.stagingdir")
                    .arg(dir.join("staging"))
                    .arg(format!("--ginkgo.junit-report={}", report.display()))
                    .args(["--ginkgo.skip", SKIPPED_SPECS, "--ginkgo.no-color"]),
                SANITY_BOUND,
                "csi-sanity",
            )
        }
    })
    .await
    .map_err(|e| e.to_string())??;
    let _ = stop.send(());
    running.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;

    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let summary = stdout.lines().rev().find(|line| line.contains("Passed")).unwrap_or_default().to_string();
    println!("csi-sanity: {summary}");
    let junit = std::fs::read_to_string(&report).map_err(|e| format!("csi-sanity wrote no report: {e}\n{stdout}"))?;
    let cases = test_cases(&junit);
    let passed: Vec<&str> = cases.iter().filter(|c| c.state == State::Passed).map(|c| c.name.as_str()).collect();
    let failed: Vec<&str> = cases.iter().filter(|c| c.state == State::Failed).map(|c| c.name.as_str()).collect();
    let mut missing: Vec<&str> = EXPECTED_PASSED.iter().copied().filter(|name| !passed.contains(name)).collect();
    let unexpected: Vec<&str> = passed.iter().copied().filter(|name| !EXPECTED_PASSED.contains(name)).collect();
    missing.sort_unstable();
    if !output.status.success() || !failed.is_empty() || !missing.is_empty() || !unexpected.is_empty() {
        return Err(format!(
            "csi-sanity: {summary}\nfailed: {failed:?}\nexpected but not passed: {missing:?}\npassed but not expected: {unexpected:?}\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    println!("csi-sanity: exactly the {} expected specs ran and passed", passed.len());
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Passed,
    Failed,
    Skipped,
}

struct TestCase {
    name: String,
    state: State,
}

/// The `<testcase name=".." status="..">` elements of a Ginkgo JUnit report (Ginkgo writes the
/// spec's state in `status`: passed, failed, skipped, pending...).
fn test_cases(junit: &str) -> Vec<TestCase> {
    junit
        .split("<testcase ")
        .skip(1)
        .filter_map(|element| {
            let attribute = |key: &str| {
                let start = element.find(&format!("{key}=\""))? + key.len() + 2;
                let end = element[start..].find('"')? + start;
                Some(unescape_xml(&element[start..end]))
            };
            let name = attribute("name")?;
            let name = name.strip_prefix("[It] ").unwrap_or(&name).to_string();
            let state = match attribute("status").as_deref() {
                Some("passed") => State::Passed,
                Some("failed" | "panicked" | "interrupted" | "timedout" | "aborted") => State::Failed,
                _ => State::Skipped,
            };
            Some(TestCase { name, state })
        })
        .collect()
}

fn unescape_xml(text: &str) -> String {
    text.replace("&quot;", "\"").replace("&apos;", "'").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}
