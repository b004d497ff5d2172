//! The suites' run directory ([`inline_guard_run_root`]), with what their runs share outside it:
//! the pods' bridge, deleted after a sweep when no live run is left to use it.

use std::path::PathBuf;

pub use inline_guard_run_root::{
    Claimed, OwnedDir, PREFIX, RUNC_ROOT, Swept, dir_of, dirs_of, finish, kill_processes_mentioning, mounts_under,
    processes_mentioning, sweep,
};

use crate::node::runtime::delete_bridge;

/// Claims this process's run directory ([`inline_guard_run_root::claim`]); the bridge goes
/// with the last run.
pub fn claim() -> Result<PathBuf, String> {
    inline_guard_run_root::claim(delete_bridge)
}

/// [`claim`] for a process that only reports a leak (a benchmark): swept when the guard drops.
pub fn claim_until_dropped() -> Result<Claimed, String> {
    inline_guard_run_root::claim_until_dropped(delete_bridge)
}
