//! The cgroups a run's containers leave: runc makes one per container (and per pod sandbox),
//! named by its id, and a container killed with its shim or deleted while runc's state was
//! half gone can leave its cgroup behind, empty, in every controller's hierarchy. The ids are
//! the run's own, read from its containerd's and runc's directories, so the sweep removes only
//! cgroups the run's containers had.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// Where the kernel's cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The ids of every container and sandbox the run under `dir` made: the directories containerd's
/// CRI plugin keeps per container and sandbox (`io.containerd.grpc.v1.cri/{containers,sandboxes}/ID`)
/// and runc's per container (`runc/NAMESPACE/ID`), at most a few levels below `dir`.
pub fn container_ids_under(dir: &Path) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    collect(dir, 5, &mut ids);
    ids
}

fn collect(dir: &Path, depth: usize, ids: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == "io.containerd.grpc.v1.cri" {
            for kind in ["containers", "sandboxes"] {
                ids.extend(ids_in(&path.join(kind)));
            }
        } else if name == crate::RUNC_ROOT {
            for namespace in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                ids.extend(ids_in(&namespace.path()));
            }
        } else if depth > 0 && !name.starts_with("io.containerd.") {
            // Not into containerd's content and snapshots: they are large and hold no ids.
            collect(&path, depth - 1, ids);
        }
    }
}

/// The names in `dir` that are container ids (64 hexadecimal digits).
fn ids_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| is_id(name))
        .collect()
}

fn is_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Removes every cgroup named by one of `ids` (in any hierarchy, at most three levels down),
/// once empty: the processes of a container just killed leave it a moment later, so an rmdir
/// refused as busy is tried again for up to 5 s. Returns the cgroups removed.
pub fn remove_container_cgroups(ids: &BTreeSet<String>) -> Vec<String> {
    let mut removed = Vec::new();
    if ids.is_empty() {
        return removed;
    }
    let mut left = cgroups_named(Path::new(CGROUP_ROOT), 3, ids);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !left.is_empty() {
        left.retain(|path| match std::fs::remove_dir(path) {
            Ok(()) => {
                removed.push(path.display().to_string());
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(_) => true,
        });
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    removed
}

/// The cgroups of every container id (64 hexadecimal digits) on the machine, at most three
/// levels down: what a run could leave.
pub fn container_cgroups() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    walk(Path::new(CGROUP_ROOT), 3, &mut |path, name| {
        if is_id(name) {
            found.insert(path.display().to_string());
        }
    });
    found
}

fn cgroups_named(root: &Path, depth: usize, ids: &BTreeSet<String>) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    walk(root, depth, &mut |path, name| {
        if ids.contains(name) {
            found.push(path.to_path_buf());
        }
    });
    found
}

fn walk(dir: &Path, depth: usize, visit: &mut dyn FnMut(&Path, &str)) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        visit(&entry.path(), &name);
        if depth > 0 {
            walk(&entry.path(), depth - 1, visit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ids_are_read_from_the_cri_plugins_and_runcs_directories_only() {
        let run = tempfile::tempdir().unwrap();
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let cri = run.path().join("node/containerd/root/io.containerd.grpc.v1.cri");
        std::fs::create_dir_all(cri.join("containers").join(&a)).unwrap();
        std::fs::create_dir_all(cri.join("sandboxes").join(&b)).unwrap();
        std::fs::create_dir_all(run.path().join("node/containerd/runc/k8s.io").join(&c)).unwrap();
        // Content blobs are named by digest too, and are no container's.
        let blobs = run.path().join("node/containerd/root/io.containerd.content.v1.content/blobs/sha256");
        std::fs::create_dir_all(blobs.join("d".repeat(64))).unwrap();
        std::fs::create_dir_all(cri.join("containers/not-an-id")).unwrap();
        assert_eq!(container_ids_under(run.path()), BTreeSet::from([a, b, c]));
    }
}
