//! For tests that mount: a directory of the test's own that unmounts whatever is still mounted
//! below it when it is dropped, so a test that fails between a mount and its unmount leaves
//! nothing mounted on the machine. It is an owned run directory ([`OwnedDir`]): a test process
//! killed before the drop (SIGKILL, a CI timeout) leaves it to the next run of any suite, which
//! unmounts, kills the processes that name it (a driver the test started) and removes it.

use std::ops::Deref;

use inline_guard_run_root::OwnedDir;
use nix::mount::{MntFlags, umount2};

/// A test's directory whose mounts go with it.
pub struct MountedDir(OwnedDir);

impl MountedDir {
    /// A fresh directory, after sweeping what killed test runs left.
    pub fn new() -> MountedDir {
        MountedDir(OwnedDir::new().unwrap_or_else(|e| panic!("a test directory: {e}")))
    }
}

impl Default for MountedDir {
    fn default() -> MountedDir {
        MountedDir::new()
    }
}

impl Deref for MountedDir {
    type Target = OwnedDir;
    fn deref(&self) -> &OwnedDir {
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
        // The directory itself goes with the owned directory, dropped next.
    }
}
