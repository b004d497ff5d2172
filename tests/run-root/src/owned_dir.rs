//! A directory this process owns for as long as a value lives, for tests that cannot claim their
//! whole process: libtest runs the driver's tests side by side in one process and gives them no
//! start of their own to claim from. Each directory is a run directory of its own (`igr-…` with
//! an owner file), so the sweep that removes a killed run's directory removes a killed test's too:
//! its mounts (tmpfs, bind, FUSE), the processes that name it, the files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{make_owned, mounts_under, processes_mentioning, sweep, sweep_dead_runs};

/// The directories under which this process has swept the dead runs already: once per process
/// is enough (a run killed meanwhile is the next process's to sweep).
static SWEPT: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// A directory owned by this process, swept (its processes killed, its mounts unmounted, its
/// files removed) when dropped.
#[derive(Debug)]
pub struct OwnedDir {
    path: PathBuf,
}

impl OwnedDir {
    /// A fresh directory under the process's temporary directory (`$TMPDIR`, not a run
    /// directory `tempfile` was pointed at), after sweeping what dead runs left there.
    pub fn new() -> Result<OwnedDir, String> {
        OwnedDir::new_in(&std::env::temp_dir())
    }

    /// A fresh directory under `base`, after sweeping what dead runs left there (once per
    /// process and `base`).
    pub fn new_in(base: &Path) -> Result<OwnedDir, String> {
        let first = SWEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(base.to_path_buf());
        if first {
            for (dir, swept) in sweep_dead_runs(base).swept {
                eprintln!("run_root: swept what a killed run left in {}: {}", dir.display(), swept.describe());
            }
        }
        make_owned(base).map(|path| OwnedDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves `inside` (a path below this directory) to `to`, replacing what was there, and
    /// sweeps the rest: what a finished build keeps.
    pub fn keep(self, inside: &Path, to: &Path) -> Result<(), String> {
        if !inside.starts_with(&self.path) {
            return Err(format!("{} is not inside {}", inside.display(), self.path.display()));
        }
        let _ = std::fs::remove_dir_all(to);
        std::fs::rename(inside, to).map_err(|e| format!("moving {} to {}: {e}", inside.display(), to.display()))
    }
}

impl Drop for OwnedDir {
    fn drop(&mut self) {
        // A test's own cleanup has usually left nothing: one look, and the full sweep (which
        // waits to be sure nothing is still starting) only when something is there.
        let needle = self.path.to_string_lossy().into_owned();
        if processes_mentioning(&needle).is_empty() && mounts_under(&self.path).is_empty() {
            let _ = std::fs::remove_dir_all(&self.path);
        } else {
            let swept = sweep(&self.path);
            eprintln!("run_root: {} was left holding {}", self.path.display(), swept.describe());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_owned_by_this_process_and_gone_with_its_value() {
        let base = tempfile::tempdir().unwrap();
        let owned = OwnedDir::new_in(base.path()).unwrap();
        let path = owned.path().to_path_buf();
        assert!(path.file_name().unwrap().to_string_lossy().starts_with(crate::PREFIX), "{}", path.display());
        std::fs::write(path.join("file"), "x").unwrap();
        // Live while its value is: a sweep of dead runs leaves it.
        let dead = sweep_dead_runs(base.path());
        assert!(dead.live && dead.swept.is_empty(), "{dead:?}");
        drop(owned);
        assert!(!path.exists(), "{} is still there", path.display());
    }

    #[test]
    fn what_is_kept_moves_out_and_the_rest_goes() {
        let base = tempfile::tempdir().unwrap();
        let owned = OwnedDir::new_in(base.path()).unwrap();
        let (built, kept) = (owned.path().join("built"), base.path().join("kept"));
        std::fs::create_dir(&built).unwrap();
        std::fs::write(built.join("image.tar"), "x").unwrap();
        let path = owned.path().to_path_buf();
        owned.keep(&built, &kept).unwrap();
        assert_eq!(std::fs::read_to_string(kept.join("image.tar")).unwrap(), "x");
        assert!(!path.exists(), "{} is still there", path.display());
    }
}
