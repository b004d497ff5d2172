//! Container images without a registry: an OCI image layout (one uncompressed layer, a config, a
//! manifest, an index naming the image) written as a tar that `ctr images import` loads. The
//! node's pods use `imagePullPolicy: Never`, so nothing is ever pulled.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::bounded::output_within;

/// One file of a layer; paths are relative to the image's root.
pub enum Entry {
    /// A regular file copied from the host.
    File {
        /// Where in the image.
        path: &'static str,
        /// The host file.
        from: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A symlink.
    Link {
        /// Where in the image.
        path: String,
        /// What it points at.
        target: &'static str,
    },
    /// A directory.
    Dir {
        /// Where in the image.
        path: &'static str,
        /// Its mode.
        mode: u32,
    },
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = output_within(command, Duration::from_secs(120), what)?;
    if !output.status.success() {
        return Err(format!("{what} failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    Ok(())
}

/// Writes the image `name` (e.g. `inline-guard.test/busybox:e2e`), whose root holds `entries`
/// and whose entrypoint is `entrypoint`, as an OCI layout tar in `work`, and returns its path.
pub fn build(work: &Path, name: &str, entries: &[Entry], entrypoint: &[&str]) -> Result<PathBuf, String> {
    let stem: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let root = work.join(format!("{stem}-root"));
    let io = |e: std::io::Error| format!("building image {name}: {e}");
    std::fs::create_dir_all(&root).map_err(io)?;
    for entry in entries {
        match entry {
            Entry::Dir { path, mode } => {
                let dir = root.join(path);
                std::fs::create_dir_all(&dir).map_err(io)?;
                std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(*mode)).map_err(io)?;
            }
            Entry::File { path, from, mode } => {
                let file = root.join(path);
                std::fs::copy(from, &file).map_err(io)?;
                std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(*mode)).map_err(io)?;
            }
            Entry::Link { path, target } => std::os::unix::fs::symlink(target, root.join(path)).map_err(io)?,
        }
    }
    let layer_tar = work.join(format!("{stem}-layer.tar"));
    run(
        Command::new("tar")
            .arg("--owner=0")
            .arg("--group=0")
            .arg("--numeric-owner")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&layer_tar)
            .arg("."),
        "tar (layer)",
    )?;
    let layer = std::fs::read(&layer_tar).map_err(io)?;
    let layer_digest = sha256_hex(&layer);
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    })
    .to_string();
    let config_digest = sha256_hex(config.as_bytes());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{config_digest}"), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{layer_digest}"), "size": layer.len()}],
    })
    .to_string();
    let manifest_digest = sha256_hex(manifest.as_bytes());
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
        }],
    })
    .to_string();
    let layout = work.join(format!("{stem}-layout"));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(io)?;
    std::fs::write(blobs.join(&layer_digest), &layer).map_err(io)?;
    std::fs::write(blobs.join(&config_digest), &config).map_err(io)?;
    std::fs::write(blobs.join(&manifest_digest), &manifest).map_err(io)?;
    std::fs::write(layout.join("index.json"), &index).map_err(io)?;
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io)?;
    let archive = work.join(format!("{stem}.tar"));
    run(Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&archive).arg("."), "tar (layout)")?;
    Ok(archive)
}

/// A busybox image: the static busybox of Debian's `busybox-static` as `/bin/busybox`, a link
/// for every applet it has, and a world-writable `/tmp`.
pub fn busybox(work: &Path, name: &str) -> Result<PathBuf, String> {
    let busybox = PathBuf::from("/bin/busybox");
    let output = output_within(Command::new(&busybox).arg("--list"), Duration::from_secs(10), "busybox --list")?;
    let applets = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut entries = vec![
        Entry::Dir { path: "bin", mode: 0o755 },
        Entry::Dir { path: "tmp", mode: 0o1777 },
        Entry::File { path: "bin/busybox", from: busybox, mode: 0o755 },
    ];
    for applet in applets.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        entries.push(Entry::Link { path: format!("bin/{applet}"), target: "/bin/busybox" });
    }
    build(work, name, &entries, &["/bin/sh"])
}

/// The sandbox image: the `pause` peer as `/pause`.
pub fn pause(work: &Path, name: &str, pause: &Path) -> Result<PathBuf, String> {
    build(work, name, &[Entry::File { path: "pause", from: pause.to_path_buf(), mode: 0o755 }], &["/pause"])
}
