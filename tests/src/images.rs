//! `images/build`, run as a user runs it: both container images as OCI layout tars.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::repo_root;

/// Runs `images/build OUT` (with `IMAGE_VERSION` when `version` is given, and
/// `IMAGE_PLATFORMS` when `platforms` is) and returns what it printed. A cold build compiles the
/// release programs with link-time optimisation: minutes.
pub fn build_images(out: &Path, version: Option<&str>, platforms: Option<&str>) -> Result<String, String> {
    let mut command = Command::new(repo_root().join("images/build"));
    // As a user runs it, not with what cargo test sets for this test: cargo's own variables
    // reach the build scripts' fingerprints, and the build would start over each time.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO") && key != "CARGO_HOME") || key.starts_with("RUSTC") || key.starts_with("__CARGO") {
            command.env_remove(key.as_ref());
        }
    }
    command.env_remove("IMAGE_VERSION").env_remove("IMAGE_PLATFORMS");
    if let Some(version) = version {
        command.env("IMAGE_VERSION", version);
    }
    if let Some(platforms) = platforms {
        command.env("IMAGE_PLATFORMS", platforms);
    }
    command.arg(out);
    let output = crate::bounded::output_within(&mut command, Duration::from_secs(3600), "images/build")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!("images/build failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    }
    Ok(stdout)
}
