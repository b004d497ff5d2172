//! Mounting, behind a trait so the Node service can be tested with a fake that records what it
//! was asked to do; the Linux implementation uses the kernel's mount(2) through nix, always on a
//! directory already opened without following symlinks (through its `/proc/self/fd` path).
//!
//! Every tmpfs (and FUSE filesystem, for lazy volumes) the driver makes carries a source name derived from its volume id (its tag), so
//! the driver can tell its own mount from anything else mounted on a target and never unmounts
//! what it did not make.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::Mode;

use crate::quote::quote_path;
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::error::{Error, Result};
use crate::volume::target_dir::OpenDir;

/// What is mounted on a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSource {
    /// The filesystem type (`tmpfs`).
    pub fs_type: String,
    /// The mount's source name (for the driver's own mounts, their tag).
    pub source: String,
}

impl MountSource {
    /// True for the driver's own tmpfs or FUSE filesystem tagged `tag`.
    pub fn is(&self, tag: &str) -> bool {
        (self.fs_type == "tmpfs" || self.fs_type == "fuse") && self.source == tag
    }
}

/// What the Node service needs from mounts.
pub trait Mounter: Send + Sync {
    /// Mounts a fresh tmpfs of at most `size_bytes`, with source name `tag`, on the directory
    /// `at`.
    fn mount_tmpfs(&self, at: &OpenDir, size_bytes: u64, tag: &str) -> Result<()>;
    /// Mounts a FUSE filesystem with source name `tag` on the directory `at`, read-only, for
    /// any user (`allow_other`) with the kernel checking permissions (`default_permissions`);
    /// returns the `/dev/fuse` descriptor its requests are read from.
    fn mount_fuse(&self, at: &OpenDir, tag: &str) -> Result<OwnedFd>;
    /// Switches the tmpfs whose root is `root` between read-only and read-write (content refresh
    /// on a read-only host mount).
    fn remount(&self, root: &OpenDir, read_only: bool) -> Result<()>;
    /// Unmounts the mount whose root is `root`: that very mount, whatever has happened to the
    /// path since it was opened.
    fn unmount(&self, root: &OpenDir) -> Result<()>;
    /// What is mounted with its root at `dir` (a child of `parent`), or `None` when `dir` is a
    /// plain directory. Reads the mount table when `dir` is a mount.
    fn mount_source(&self, parent: &OpenDir, dir: &OpenDir) -> Result<Option<MountSource>>;
    /// The device number of the filesystem mounted with its root at `dir`, or `None` when `dir`
    /// is a plain directory; never reads the mount table. A tmpfs's device number is its own
    /// among all mounted filesystems, so a recorded one identifies the driver's mount cheaply.
    fn mount_device(&self, parent: &OpenDir, dir: &OpenDir) -> Result<Option<u64>>;
}

/// Real mounts (needs CAP_SYS_ADMIN).
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxMounter;

fn mount_error(action: &str, target: &Path, error: nix::Error) -> Error {
    Error::local(format!("{action} {}", quote_path(target)), error)
}

// No device files, no set-uid, no execution: volumes hold data only.
const DATA_ONLY: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV).union(MsFlags::MS_NOEXEC);

impl Mounter for LinuxMounter {
    fn mount_tmpfs(&self, at: &OpenDir, size_bytes: u64, tag: &str) -> Result<()> {
        let options = format!("size={size_bytes},mode=0755");
        mount(Some(tag), &at.proc_path(), Some("tmpfs"), DATA_ONLY, Some(options.as_str()))
            .map_err(|error| mount_error("mounting a tmpfs at", at.path(), error))
    }

    fn mount_fuse(&self, at: &OpenDir, tag: &str) -> Result<OwnedFd> {
        use std::os::fd::AsRawFd as _;
        let device = nix::fcntl::open("/dev/fuse", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|error| Error::local("opening /dev/fuse", error))?;
        // rootmode: the root is a directory; user_id/group_id: the mount's owner, root, whom
        // the kernel lets past allow_other's restriction anyway.
        let options =
            format!("fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions", device.as_raw_fd());
        mount(Some(tag), &at.proc_path(), Some("fuse"), DATA_ONLY | MsFlags::MS_RDONLY, Some(options.as_str()))
            .map_err(|error| mount_error("mounting FUSE at", at.path(), error))?;
        Ok(device)
    }

    fn remount(&self, root: &OpenDir, read_only: bool) -> Result<()> {
        let mut flags = DATA_ONLY | MsFlags::MS_REMOUNT;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        mount(None::<&str>, &root.proc_path(), None::<&str>, flags, None::<&str>)
            .map_err(|error| mount_error("remounting", root.path(), error))
    }

    /// Detached through the descriptor its identity was checked on: the descriptor keeps the
    /// mount busy, so a plain unmount would fail, and unmounting by path would let a mount
    /// slipped in since the check be the one removed. The kernel refuses unless the descriptor
    /// is a mount's root.
    fn unmount(&self, root: &OpenDir) -> Result<()> {
        umount2(&root.proc_path(), MntFlags::MNT_DETACH).map_err(|error| mount_error("unmounting", root.path(), error))
    }

    /// A mount's root has a mount id of its own, different from its parent directory's; only
    /// then is the mount table read, so a publish to a fresh directory never pays for it.
    fn mount_source(&self, parent: &OpenDir, dir: &OpenDir) -> Result<Option<MountSource>> {
        let Some(id) = mount_root_id(parent, dir)? else {
            return Ok(None);
        };
        // Read in large chunks and stopped at the match: the kernel renders the table as it is
        // read, so the mounts after it are never rendered (an unpublish of an early volume
        // reads little of a table of thousands).
        use std::io::BufRead as _;
        let read_error = |error: std::io::Error| Error::local("reading /proc/self/mountinfo", error);
        let mountinfo = std::fs::File::open("/proc/self/mountinfo").map_err(read_error)?;
        let mut reader = std::io::BufReader::with_capacity(1 << 16, mountinfo);
        let prefix = format!("{id} ");
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line).map_err(read_error)? == 0 {
                return Ok(None);
            }
            if line.starts_with(prefix.as_bytes()) {
                return Ok(source_of(String::from_utf8_lossy(&line).trim_end(), &id));
            }
        }
    }

    fn mount_device(&self, parent: &OpenDir, dir: &OpenDir) -> Result<Option<u64>> {
        if mount_root_id(parent, dir)?.is_none() {
            return Ok(None);
        }
        let stat = nix::sys::stat::fstat(dir.fd())
            .map_err(|error| Error::local(format!("inspecting {}", quote_path(dir.path())), error))?;
        Ok(Some(stat.st_dev))
    }
}

/// The id of the mount whose root `dir` is, `None` when `dir` lies on its parent's mount.
fn mount_root_id(parent: &OpenDir, dir: &OpenDir) -> Result<Option<String>> {
    let id = mount_id(dir)?;
    Ok((id != mount_id(parent)?).then_some(id))
}

/// The id of the mount `dir` lies on, from `/proc/self/fdinfo`.
fn mount_id(dir: &OpenDir) -> Result<String> {
    use std::os::fd::AsRawFd as _;
    let path = format!("/proc/self/fdinfo/{}", dir.fd().as_raw_fd());
    let info = std::fs::read_to_string(&path).map_err(|error| Error::local(format!("reading {path}"), error))?;
    info.lines()
        .find_map(|line| line.strip_prefix("mnt_id:"))
        .map(|id| id.trim().to_string())
        .ok_or_else(|| Error::Fault(format!("{path} has no mnt_id")))
}

/// The fs type and source of a mountinfo line when its mount id is `id`:
/// `36 35 98:0 /root /mount/point options [optional fields...] - fstype source superoptions`.
fn source_of(line: &str, id: &str) -> Option<MountSource> {
    if line.split(' ').next() != Some(id) {
        return None;
    }
    let (_, after) = line.split_once(" - ")?;
    let mut fields = after.split(' ');
    let fs_type = unescape_mountinfo(fields.next()?);
    let source = unescape_mountinfo(fields.next()?);
    Some(MountSource { fs_type, source })
}

/// Whether `target` appears in /proc/self/mountinfo: exact, but linear in the node's mounts, so
/// used only where exactness matters more than speed (tests, diagnostics).
pub fn listed_in_mountinfo(target: &Path) -> Result<bool> {
    let Ok(target) = target.canonicalize() else {
        return Ok(false);
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|error| Error::local("reading /proc/self/mountinfo", error))?;
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
        /// The source name.
        tag: String,
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

/// Records actions and tracks mounts by path in memory; can be told to fail the next mount.
#[derive(Debug, Default)]
pub struct FakeMounter {
    actions: Mutex<Vec<MountAction>>,
    mounted: Mutex<HashMap<PathBuf, (MountSource, u64)>>,
    fail_next_mount: Mutex<Option<String>>,
}

impl FakeMounter {
    /// Everything asked so far, in order.
    pub fn actions(&self) -> Vec<MountAction> {
        self.actions.locked().clone()
    }

    /// Makes the next `mount_tmpfs` fail with `message`.
    pub fn fail_next_mount(&self, message: &str) {
        *self.fail_next_mount.locked() = Some(message.to_string());
    }

    /// Pretends something else is mounted at `path`.
    pub fn mount_foreign(&self, path: &Path, source: MountSource) {
        self.insert(path, source);
    }

    /// Mounts `source` at `path` with a device number of its own.
    fn insert(&self, path: &Path, source: MountSource) {
        let mut mounted = self.mounted.locked();
        let device = 1000 + mounted.len() as u64 + self.actions.locked().len() as u64;
        mounted.insert(path.to_path_buf(), (source, device));
    }

    /// Pretends the mount at `path` went away behind the driver's back (unmounted by hand).
    pub fn lose(&self, path: &Path) {
        self.mounted.locked().remove(path);
    }

    /// True when the fake holds a mount at `path`.
    pub fn is_mounted(&self, path: &Path) -> bool {
        self.mounted.locked().contains_key(path)
    }

    fn record(&self, action: MountAction) {
        self.actions.locked().push(action);
    }
}

impl Mounter for FakeMounter {
    fn mount_tmpfs(&self, at: &OpenDir, size_bytes: u64, tag: &str) -> Result<()> {
        self.record(MountAction::MountTmpfs { target: at.path().to_path_buf(), size_bytes, tag: tag.to_string() });
        if let Some(message) = self.fail_next_mount.locked().take() {
            return Err(Error::Fault(message));
        }
        self.insert(at.path(), MountSource { fs_type: "tmpfs".into(), source: tag.into() });
        Ok(())
    }

    fn mount_fuse(&self, at: &OpenDir, _tag: &str) -> Result<OwnedFd> {
        Err(Error::Fault(format!("the fake mounter serves no FUSE filesystem (asked at {})", quote_path(at.path()))))
    }

    fn remount(&self, root: &OpenDir, read_only: bool) -> Result<()> {
        self.record(MountAction::Remount { target: root.path().to_path_buf(), read_only });
        Ok(())
    }

    fn unmount(&self, root: &OpenDir) -> Result<()> {
        self.record(MountAction::Unmount { target: root.path().to_path_buf() });
        self.mounted.locked().remove(root.path());
        Ok(())
    }

    fn mount_source(&self, _parent: &OpenDir, dir: &OpenDir) -> Result<Option<MountSource>> {
        Ok(self.mounted.locked().get(dir.path()).map(|(source, _)| source.clone()))
    }

    fn mount_device(&self, _parent: &OpenDir, dir: &OpenDir) -> Result<Option<u64>> {
        Ok(self.mounted.locked().get(dir.path()).map(|(_, device)| *device))
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
        // Every digit counts, each by its place: a backslash is \134, a tab \011.
        assert_eq!(unescape_mountinfo("/a\\134b\\011c"), "/a\\b\tc");
    }

    #[test]
    fn the_fake_gives_each_mount_a_device_numbered_after_the_mounts_and_calls_before_it() {
        // The volume layer's tests tell a mount from another at the same path by its device, as
        // the driver does on a node: the fake's devices differ, 1000 + mounts + calls so far.
        let fake = FakeMounter::default();
        let source = MountSource { fs_type: "tmpfs".into(), source: "elsewhere".into() };
        fake.mount_foreign(Path::new("/a"), source.clone());
        fake.record(MountAction::Unmount { target: "/x".into() });
        fake.mount_foreign(Path::new("/b"), source.clone());
        fake.mount_foreign(Path::new("/c"), source);
        let mounted = fake.mounted.lock().unwrap();
        let mut devices: Vec<(&str, u64)> =
            mounted.iter().map(|(path, (_, device))| (path.to_str().unwrap(), *device)).collect();
        devices.sort();
        assert_eq!(devices, [("/a", 1000), ("/b", 1002), ("/c", 1003)]);
    }

    #[test]
    fn a_mountinfo_line_yields_its_source_by_mount_id() {
        let line = "612 30 0:88 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount rw,nosuid shared:300 - tmpfs inline-guard:0f1e rw,size=1024k";
        let expected = MountSource { fs_type: "tmpfs".into(), source: "inline-guard:0f1e".into() };
        assert_eq!(source_of(line, "612"), Some(expected.clone()));
        assert!(expected.is("inline-guard:0f1e"));
        assert!(!MountSource { fs_type: "ext4".into(), ..expected }.is("inline-guard:0f1e"));
        assert_eq!(source_of(line, "61"), None);
    }

    /// A kubelet target created below a fresh root (as root: these tests mount).
    fn created_target() -> (crate::test_util::mounted_dir::MountedDir, PathBuf, crate::volume::target_dir::OpenTarget) {
        assert!(nix::unistd::geteuid().is_root(), "mounting needs root: run the test command as root");
        // Whatever a failed test leaves mounted below it is unmounted with it.
        let dir = crate::test_util::mounted_dir::MountedDir::new();
        let text = dir.path().join("pods/u/volumes/kubernetes.io~csi/v/mount");
        let target = crate::volume::target_path::TargetPath::parse(text.to_str().unwrap(), dir.path()).unwrap();
        let opened = crate::volume::target_dir::create(dir.path(), &target, &mut Vec::new()).unwrap();
        (dir, text, opened)
    }

    #[test]
    fn a_real_tmpfs_is_tagged_remounted_and_unmounted_through_its_descriptor() {
        let (_dir, text, opened) = created_target();
        let mounter = LinuxMounter;
        assert_eq!(mounter.mount_source(&opened.parent, &opened.target).unwrap(), None);
        mounter.mount_tmpfs(&opened.target, 1 << 20, "inline-guard:test").unwrap();
        let mounted = opened.reopen().unwrap();
        let source = mounter.mount_source(&opened.parent, &mounted).unwrap().unwrap();
        assert!(source.is("inline-guard:test"), "{source:?}");
        let device = mounter.mount_device(&opened.parent, &mounted).unwrap().unwrap();
        assert_eq!(mounter.mount_device(&opened.parent, &opened.target).unwrap(), None, "the directory under it");
        assert_ne!(device, nix::sys::stat::fstat(opened.parent.fd()).unwrap().st_dev);
        assert!(listed_in_mountinfo(&text).unwrap(), "mounted on the path that was checked");
        std::fs::write(text.join("f"), "x").unwrap();
        mounter.remount(&mounted, true).unwrap();
        let error = std::fs::write(text.join("g"), "y").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::libc::EROFS), "read-only after remount");
        assert_eq!(std::fs::read_to_string(text.join("f")).unwrap(), "x");
        mounter.unmount(&mounted).unwrap();
        drop(mounted);
        let reopened = opened.reopen().unwrap();
        assert_eq!(mounter.mount_source(&opened.parent, &reopened).unwrap(), None);
        assert!(!listed_in_mountinfo(&text).unwrap());
        assert!(!text.join("f").exists(), "the tmpfs content went with it");
    }

    #[test]
    fn a_bind_mount_of_the_same_filesystem_is_seen_as_a_mount() {
        let (dir, text, opened) = created_target();
        let root = dir.path();
        std::fs::create_dir(root.join("elsewhere")).unwrap();
        mount(Some(&root.join("elsewhere")), &text, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        let source = LinuxMounter.mount_source(&opened.parent, &opened.reopen().unwrap()).unwrap();
        umount2(&text, MntFlags::empty()).unwrap();
        let source = source.expect("a bind mount is a mount");
        assert!(!source.is("inline-guard:test"));
    }
}
