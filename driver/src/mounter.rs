//! Mounting, behind a trait so the Node service can be tested with a fake that records what it
//! was asked to do; the Linux implementation uses the kernel's mount(2) through nix.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::{Error, Result};

/// What the Node service needs from mounts.
pub trait Mounter: Send + Sync {
    /// Mounts a fresh tmpfs of at most `size_bytes` at `target`.
    fn mount_tmpfs(&self, target: &Path, size_bytes: u64, read_only: bool) -> Result<()>;
    /// Switches the tmpfs at `target` between read-only and read-write (content refresh on a
    /// read-only host mount).
    fn remount(&self, target: &Path, read_only: bool) -> Result<()>;
    /// Unmounts `target`.
    fn unmount(&self, target: &Path) -> Result<()>;
    /// True when `target` is itself a mount point.
    fn is_mount_point(&self, target: &Path) -> Result<bool>;
}

/// Real mounts (needs CAP_SYS_ADMIN).
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxMounter;

fn mount_error(action: &str, target: &Path, error: nix::Error) -> Error {
    Error::Internal(format!("{action} {}: {error}", target.display()))
}

// No device files, no set-uid, no execution: volumes hold data only.
const DATA_ONLY: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV).union(MsFlags::MS_NOEXEC);

impl Mounter for LinuxMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: u64, read_only: bool) -> Result<()> {
        let mut flags = DATA_ONLY;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        let options = format!("size={size_bytes},mode=0755");
        mount(Some("inline-guard"), target, Some("tmpfs"), flags, Some(options.as_str()))
            .map_err(|error| mount_error("mounting a tmpfs at", target, error))
    }

    fn remount(&self, target: &Path, read_only: bool) -> Result<()> {
        let mut flags = DATA_ONLY | MsFlags::MS_REMOUNT;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
            .map_err(|error| mount_error("remounting", target, error))
    }

    fn unmount(&self, target: &Path) -> Result<()> {
        umount2(target, MntFlags::empty()).map_err(|error| mount_error("unmounting", target, error))
    }

    /// A filesystem mounted at `target` has a device of its own, different from its parent's.
    /// Comparing devices costs two stat calls, where reading /proc/self/mountinfo grows with
    /// every mount on the node (a thousand volumes made it the slowest step of a publish). A bind
    /// mount of the parent's own filesystem is not seen this way; this driver never makes one.
    fn is_mount_point(&self, target: &Path) -> Result<bool> {
        use std::os::unix::fs::MetadataExt as _;
        let Ok(metadata) = std::fs::metadata(target) else {
            return Ok(false);
        };
        let parent = target.parent().unwrap_or(Path::new("/"));
        let parent = std::fs::metadata(parent)
            .map_err(|error| Error::Internal(format!("inspecting {}: {error}", parent.display())))?;
        Ok(metadata.dev() != parent.dev())
    }
}

/// Whether `target` appears in /proc/self/mountinfo: exact, but linear in the node's mounts, so
/// used only where exactness matters more than speed (tests, diagnostics).
pub fn listed_in_mountinfo(target: &Path) -> Result<bool> {
    let Ok(target) = target.canonicalize() else {
        return Ok(false);
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|error| Error::Internal(format!("reading /proc/self/mountinfo: {error}")))?;
    Ok(mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| Path::new(&unescape_mountinfo(mount_point)) == target))
}

/// mountinfo escapes space, tab, newline and backslash as three-digit octal (`\040`).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One call a [`FakeMounter`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountAction {
    /// `mount_tmpfs`.
    MountTmpfs {
        /// Where.
        target: PathBuf,
        /// Size limit.
        size_bytes: u64,
        /// Read-only on the host.
        read_only: bool,
    },
    /// `remount`.
    Remount {
        /// Where.
        target: PathBuf,
        /// Read-only after.
        read_only: bool,
    },
    /// `unmount`.
    Unmount {
        /// Where.
        target: PathBuf,
    },
}

/// Records actions and tracks mount points in memory; can be told to fail the next mount.
#[derive(Debug, Default)]
pub struct FakeMounter {
    actions: Mutex<Vec<MountAction>>,
    mounted: Mutex<HashSet<PathBuf>>,
    fail_next_mount: Mutex<Option<String>>,
}

impl FakeMounter {
    /// Everything asked so far, in order.
    pub fn actions(&self) -> Vec<MountAction> {
        self.actions.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes the next `mount_tmpfs` fail with `message`.
    pub fn fail_next_mount(&self, message: &str) {
        *self.fail_next_mount.lock().unwrap_or_else(|p| p.into_inner()) = Some(message.to_string());
    }

    fn record(&self, action: MountAction) {
        self.actions.lock().unwrap_or_else(|p| p.into_inner()).push(action);
    }
}

impl Mounter for FakeMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: u64, read_only: bool) -> Result<()> {
        self.record(MountAction::MountTmpfs { target: target.to_path_buf(), size_bytes, read_only });
        if let Some(message) = self.fail_next_mount.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(Error::Internal(message));
        }
        self.mounted.lock().unwrap_or_else(|p| p.into_inner()).insert(target.to_path_buf());
        Ok(())
    }

    fn remount(&self, target: &Path, read_only: bool) -> Result<()> {
        self.record(MountAction::Remount { target: target.to_path_buf(), read_only });
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<()> {
        self.record(MountAction::Unmount { target: target.to_path_buf() });
        self.mounted.lock().unwrap_or_else(|p| p.into_inner()).remove(target);
        Ok(())
    }

    fn is_mount_point(&self, target: &Path) -> Result<bool> {
        Ok(self.mounted.lock().unwrap_or_else(|p| p.into_inner()).contains(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/var/lib/a\\040b"), "/var/lib/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/tail\\04"), "/tail\\04");
    }

    #[test]
    fn a_real_tmpfs_is_mounted_read_only_remounted_and_unmounted() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED LOUDLY: mounting needs root; run the test command as root (CI does)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("volume");
        std::fs::create_dir(&target).unwrap();
        let mounter = LinuxMounter;
        assert!(!mounter.is_mount_point(&target).unwrap());
        mounter.mount_tmpfs(&target, 1 << 20, false).unwrap();
        assert!(mounter.is_mount_point(&target).unwrap());
        assert!(listed_in_mountinfo(&target).unwrap(), "the device check agrees with the mount table");
        std::fs::write(target.join("f"), "x").unwrap();
        mounter.remount(&target, true).unwrap();
        let error = std::fs::write(target.join("g"), "y").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::libc::EROFS), "read-only after remount");
        assert_eq!(std::fs::read_to_string(target.join("f")).unwrap(), "x");
        mounter.unmount(&target).unwrap();
        assert!(!mounter.is_mount_point(&target).unwrap());
        assert!(!listed_in_mountinfo(&target).unwrap());
        assert!(!target.join("f").exists(), "the tmpfs content went with it");
    }
}
