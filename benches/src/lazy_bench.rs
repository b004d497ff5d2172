//! What the benchmarks of lazy volumes share: the helper serving one 4 KiB file, its provider,
//! the machine's cores and pinning to one of them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sharedresource_api::ObjectName;
use sharedresource_csi_driver::content::external::provider::{ExecProvider, FetchMode};

/// The size of the one file the helper serves.
pub const FILE_BYTES: usize = 4096;

/// A helper serving `s/f`, `FILE_BYTES` bytes of `x`.
const HELPER: &str = r#"#!/bin/sh
case "$1" in
mount) echo '{"enable-dirs": ["s"], "mount-param": [], "files": {"s": ["f"]}}' ;;
get) head -c 4096 /dev/zero | tr '\0' 'x' ;;
*) exit 1 ;;
esac
"#;

/// The helper's `mount` answer, for a benchmark that lays the files out itself.
pub const MOUNT_REPLY: &[u8] = br#"{"enable-dirs": ["s"], "mount-param": [], "files": {"s": ["f"]}}"#;

/// Writes the helper into `dir` and returns the lazy provider `bench` running it, a fetched
/// file served for an hour (so every read but the first is served from the driver's cache).
pub fn lazy_provider(dir: &Path) -> Result<ExecProvider, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let helper: PathBuf = dir.join("helper");
    std::fs::write(&helper, HELPER).map_err(|e| format!("{}: {e}", helper.display()))?;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    Ok(ExecProvider {
        name: ObjectName::parse("bench").map_err(|e| e.to_string())?,
        helper,
        mode: FetchMode::Lazy,
        timeout: Duration::from_secs(30),
        cache_ttl: Duration::from_secs(3600),
        max_file_bytes: 1 << 20,
        run_as: sharedresource_csi_driver::content::external::provider::HelperUser::this_process(),
    })
}

/// The machine's cores online (not this process's: a pinned process sees one).
pub fn online_cores() -> usize {
    let cores = nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN).ok().flatten().unwrap_or(1);
    usize::try_from(cores).unwrap_or(1)
}

/// Pins the calling thread (and the threads it starts afterwards) to CPU `core`.
pub fn pin_to(core: usize) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    set.set(core).map_err(|e| format!("CPU {core}: {e}"))?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("pinning to CPU {core}: {e}"))
}
