//! `images/build`, run as a user runs it: the container images as OCI layout tars, of this
//! checkout or of the previous release (built from its tag's source, cached).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::repo_root;
use crate::run_root::OwnedDir;

/// The release the suite upgrades from and rolls back to: its tag (the images' tag too) and
/// commit. The commit is named as well as the tag, so a clone without tags still finds it.
pub const PREVIOUS_RELEASE: (&str, &str) = ("v0.1.0", "3c1947abad95f6d3417225dce3e50ac51031336e");

/// The image archives every build writes, by name.
pub const IMAGE_NAMES: [&str; 3] = ["csi-volume-admission", "sharedresource-csi-driver", "example-providers"];

/// Runs `images/build OUT` (with `IMAGE_VERSION` when `version` is given, and
/// `IMAGE_PLATFORMS` when `platforms` is) and returns what it printed. A cold build compiles the
/// release programs with link-time optimisation: minutes.
pub fn build_images(out: &Path, version: Option<&str>, platforms: Option<&str>) -> Result<String, String> {
    build_images_of(&repo_root(), out, version, platforms, None)
}

/// [`build_images`] compiling in `target` (`IMAGE_TARGET_DIR`) instead of `target/images`.
pub fn build_images_in(
    out: &Path,
    version: Option<&str>,
    platforms: Option<&str>,
    target: Option<&Path>,
) -> Result<String, String> {
    build_images_of(&repo_root(), out, version, platforms, target)
}

/// The previous release's images for amd64, tagged with its tag: built once from its commit's
/// source (`git archive` of this repository, its own `images/build` without link-time
/// optimisation, its own target directory, removed afterwards) and kept in the peers' cache,
/// keyed by the commit. Fails naming the commit when this clone lacks it (a shallow clone:
/// `git fetch --unshallow`).
pub fn previous_release_images() -> Result<PathBuf, String> {
    let (tag, commit) = PREVIOUS_RELEASE;
    let name = format!("release-{tag}-{}", &commit[..12]);
    let cached = crate::peers::cache_root()?.join(&name);
    if IMAGE_NAMES.iter().all(|name| cached.join(format!("{name}.tar")).is_file()) {
        return Ok(cached);
    }
    let source = tempfile::Builder::new()
        .prefix("inline-guard-release-")
        .tempdir()
        .map_err(|e| format!("a directory for {tag}'s source: {e}"))?;
    extract_release(source.path(), &[])?;
    without_link_time_optimisation(source.path())?;
    // Built in a directory this process owns beside the cache's entries: a run killed mid-build
    // leaves it to the next one's sweep (OwnedDir), never a half-built entry under the cache key.
    let cache = cached.parent().ok_or("the peers' cache has no directory")?;
    let building = OwnedDir::new_in(cache)?;
    let images = building.path().join("images");
    build_images_of(source.path(), &images, Some(tag), Some("amd64"), None)?;
    building.keep(&images, &cached).map_err(|e| format!("keeping {tag}'s images: {e}"))?;
    Ok(cached)
}

/// The line of the previous release's `images/build` that asks for one codegen unit and fat
/// link-time optimisation, and what the suite builds it with instead: cargo's release defaults.
const RELEASE_LTO: (&str, &str) = (
    "export CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1\n",
    "export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16\n",
);

/// Rewrites the one line of `tree`'s `images/build` that asks for fat link-time optimisation
/// (`RELEASE_LTO`). The programs are the release's code, compiled by the same compiler at the
/// same optimisation level; link-time optimisation only makes them a sixth smaller, and on two
/// cores it is most of a cold build's time (the upgrade's first run waits on it). Fails, naming
/// the file, unless the line is there exactly once: another release's script is read, not
/// guessed at.
fn without_link_time_optimisation(tree: &Path) -> Result<(), String> {
    let script = tree.join("images/build");
    let text = std::fs::read_to_string(&script).map_err(|e| format!("{}: {e}", script.display()))?;
    let (asked, instead) = RELEASE_LTO;
    if text.matches(asked).count() != 1 {
        return Err(format!(
            "{}: expected the line `{}` once, to build the previous release without link-time optimisation",
            script.display(),
            asked.trim_end()
        ));
    }
    std::fs::write(&script, text.replacen(asked, instead, 1)).map_err(|e| format!("{}: {e}", script.display()))
}

/// The previous release's own manifests: its `config/` extracted under `into` (`into/config/…`),
/// to install it as it was released. Returns `into`.
pub fn previous_release_manifests(into: &Path) -> Result<PathBuf, String> {
    extract_release(into, &["config"])?;
    Ok(into.to_path_buf())
}

/// Extracts `paths` (all of it if none) of [`PREVIOUS_RELEASE`]'s commit into `into`. Fails
/// naming the commit when this clone lacks it (a shallow clone: `git fetch --unshallow`).
fn extract_release(into: &Path, paths: &[&str]) -> Result<(), String> {
    let (tag, commit) = PREVIOUS_RELEASE;
    let root = repo_root();
    let known = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .output()
        .map_err(|e| format!("running git: {e}"))?;
    if !known.status.success() {
        return Err(format!(
            "the previous release {tag} (commit {commit}) is not in this clone: the upgrade from it cannot be \
             built (in a shallow clone, `git fetch --unshallow`)"
        ));
    }
    std::fs::create_dir_all(into).map_err(|e| format!("{}: {e}", into.display()))?;
    let archive = Command::new("sh")
        .arg("-c")
        .arg(r#"root=$1 commit=$2 into=$3; shift 3; git -C "$root" archive "$commit" "$@" | tar -x -C "$into""#)
        .args(["sh", &root.to_string_lossy(), commit, &into.to_string_lossy()])
        .args(paths)
        .output()
        .map_err(|e| format!("extracting {tag}'s source: {e}"))?;
    if !archive.status.success() {
        return Err(format!("extracting {tag}'s source: {}", String::from_utf8_lossy(&archive.stderr)));
    }
    Ok(())
}

/// `images/build OUT` of the source tree at `tree`, as [`build_images`].
fn build_images_of(
    tree: &Path,
    out: &Path,
    version: Option<&str>,
    platforms: Option<&str>,
    target: Option<&Path>,
) -> Result<String, String> {
    let mut command = Command::new(tree.join("images/build"));
    // As a user runs it, not with what cargo test sets for this test: cargo's own variables
    // reach the build scripts' fingerprints, and the build would start over each time.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO") && key != "CARGO_HOME") || key.starts_with("RUSTC") || key.starts_with("__CARGO") {
            command.env_remove(key.as_ref());
        }
    }
    command.env_remove("IMAGE_VERSION").env_remove("IMAGE_PLATFORMS").env_remove("IMAGE_TARGET_DIR");
    if let Some(target) = target {
        command.env("IMAGE_TARGET_DIR", target);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_releases_build_is_rewritten_once_to_skip_link_time_optimisation() {
        let tree = tempfile::tempdir().unwrap();
        extract_release(tree.path(), &["images/build"]).unwrap();
        let released = std::fs::read_to_string(tree.path().join("images/build")).unwrap();
        without_link_time_optimisation(tree.path()).unwrap();
        let built = std::fs::read_to_string(tree.path().join("images/build")).unwrap();
        let (asked, instead) = RELEASE_LTO;
        assert_ne!(built, released, "the release's script was not rewritten");
        // The release's script but for that one line.
        assert_eq!(built, released.replacen(asked, instead, 1));
        // A script without the line (this one, now) is refused, naming the line.
        let refused = without_link_time_optimisation(tree.path()).unwrap_err();
        assert!(refused.contains("CARGO_PROFILE_RELEASE_LTO=fat"), "{refused}");
    }
}
