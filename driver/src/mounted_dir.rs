//! For tests that mount: a temporary directory that unmounts whatever is still mounted below it
//! when it is dropped, so a test that fails between a mount and its unmount leaves nothing
//! mounted on the machine.

use std::ops::Deref;

use nix::mount::{MntFlags, umount2};

/// A temporary directory whose mounts go with it.
pub struct MountedDir(pub tempfile::TempDir);

impl MountedDir {
    /// A fresh temporary directory.
    pub fn new() -> MountedDir {
        MountedDir(tempfile::tempdir().expect("a temporary directory"))
    }
}

impl Default for MountedDir {
    fn default() -> MountedDir {
        MountedDir::new()
    }
}

impl Deref for MountedDir {
    type Target = tempfile::TempDir;
    fn deref(&self) -> &tempfile::TempDir {
        &self.0
    }
}

impl Drop for MountedDir {
    fn drop(&mut self) {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", self.0.path().display());
        let mut points: Vec<&str> = table
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&prefix) || *point == prefix.trim_end_matches('/'))
            .collect();
        // Deepest first, so a mount on top of another comes off before the one beneath.
        points.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in points {
            let _ = umount2(point, MntFlags::MNT_DETACH);
        }
    }
}
