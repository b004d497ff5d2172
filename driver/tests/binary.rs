//! The driver binary's start-up refusals: a bad configuration file names the field and line.

use std::process::Command;

#[test]
fn a_bad_configuration_stops_the_driver_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("driver.yaml");
    std::fs::write(&config, "stateDir: /tmp/x\ntmpfsSize: lots\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
        .args(["--endpoint", "unix:///tmp/never.sock", "--node-id", "n1", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!(
            "sharedresource-csi-driver: {}: tmpfsSize: invalid size \"lots\": use bytes or a Ki, Mi or Gi quantity at line 2, column 12",
            config.display()
        )
    );
}

#[test]
fn a_relative_endpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("driver.yaml");
    std::fs::write(
        &config,
        format!("stateDir: {}\nstaticSharesDir: {}\n", dir.path().join("s").display(), dir.path().display()),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sharedresource-csi-driver"))
        .args(["--endpoint", "unix://csi.sock", "--node-id", "n1", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("is not unix:///absolute/path"));
}
