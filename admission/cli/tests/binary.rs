//! The real binary, as a shell runs it: exit codes and streams.

use std::io::Write;
use std::process::{Command, Stdio};

fn check(stdin: &str, extra: &[&str]) -> std::process::Output {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/examples/cluster-state.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission"))
        .args(["check", "--cluster-state", examples])
        .args(extra)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn pod(namespace: &str, driver: &str) -> String {
    format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"p\",\"namespace\":\"{namespace}\"}},\"spec\":{{\"containers\":[],\"volumes\":[{{\"name\":\"v\",\"csi\":{{\"driver\":\"{driver}\"}}}}]}}}}"
    )
}

#[test]
fn exit_zero_when_everything_is_admitted() {
    let output = check(&pod("enforce-baseline", "baseline.csi.example.com"), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn exit_one_when_something_is_denied() {
    let output = check(&pod("enforce-baseline", "privileged.csi.example.com"), &["-o", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let line = String::from_utf8(output.stdout).unwrap();
    assert!(line.contains("\"code\":403"), "{line}");
}

#[test]
fn exit_two_on_bad_input_with_the_reason_on_stderr() {
    let output = check("{\"apiVersion\":\"v1\"}", &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "csi-volume-admission check: <stdin>: document 1: missing `kind`: expected a Kubernetes object\n"
    );
}

#[test]
fn webhooks_prints_the_shipped_configurations_for_the_default_configuration() {
    let output = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission")).arg("webhooks").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/deploy/webhooks.yaml"));
    assert_eq!(String::from_utf8(output.stdout).unwrap(), shipped.unwrap());
}

#[test]
fn webhooks_names_the_configured_drivers_and_refuses_a_bad_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("admission.yaml");
    std::fs::write(&config, "readOnlyDrivers: [a.example.com, b.example.com]\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission"))
        .args(["webhooks", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let yaml = String::from_utf8(output.stdout).unwrap();
    // Read as YAML: how a long expression is quoted or folded is the printer's business.
    let documents = inline_guard_config::read_documents(std::path::Path::new("stdout"), &yaml).unwrap();
    let mutating = documents
        .iter()
        .find(|d| d.value["kind"] == "MutatingWebhookConfiguration")
        .unwrap_or_else(|| panic!("{yaml}"));
    let read_only = mutating.value["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "read-only.csi-volume-admission.inlineguard.dev")
        .expect("a read-only webhook entry");
    let condition = read_only["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(condition.contains(r#"v.csi.driver in ["a.example.com", "b.example.com"]"#), "{condition}");

    std::fs::write(&config, "readOnlyDrivers: [\"\"]\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission"))
        .args(["webhooks", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.starts_with("csi-volume-admission webhooks: ") && stderr.contains("readOnlyDrivers[0]"), "{stderr}");
}
