//! Lays out a volume's files so that a reader never sees a mix of old and new content: each
//! version is written to its own hidden timestamped directory, `..data` is a symlink to the
//! current one, swapped by rename (atomic), and each user-visible top-level name is a symlink
//! through `..data`. The layout kubelet uses for Secret and ConfigMap volumes, so tools that know
//! it (reloaders watching `..data`) work unchanged.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub use crate::content::payload::{DEFAULT_MODE, FileContent, Payload, check_key};
use crate::dir_tree::{create_dirs, non_directories_below, remove_tree};
use crate::quote::quote_path;
use crate::volume::content_budget::{ContentBudget, PAGE_BYTES, Payer, charge_of};
use crate::volume::error::{Error, Result};

/// What fsGroup adds to a file's mode: read for the group.
const GROUP_READ: u32 = 0o040;
/// What fsGroup adds to a directory's mode besides: search for the group.
const GROUP_SEARCH: u32 = 0o050;
/// New entries of a set-group-id directory belong to its group.
const SET_GROUP_ID: u32 = 0o2000;

/// The symlink to the current version.
pub const DATA_LINK: &str = "..data";
const DATA_LINK_TMP: &str = "..data_tmp";
/// Writes payloads into one volume directory.
#[derive(Clone)]
pub struct AtomicWriter {
    dir: PathBuf,
    group: Option<u32>,
    charged: Option<(ContentBudget, Payer)>,
}

impl AtomicWriter {
    /// A writer for the volume rooted at `dir` (which must exist).
    pub fn new(dir: impl Into<PathBuf>) -> AtomicWriter {
        AtomicWriter { dir: dir.into(), group: None, charged: None }
    }

    /// The same writer, making the files it writes belong to group `group` (the pod's
    /// `fsGroup`) as kubelet does for a read-only volume: each file group-owned and readable by
    /// the group, each directory group-owned, searchable by the group and set-group-id.
    pub fn with_group(mut self, group: Option<u32>) -> AtomicWriter {
        self.group = group;
        self
    }

    /// The same writer, reserving each new version in `budget` for `payer` before writing it
    /// (refused with [`Error::OverBudget`] when it does not fit) and making it what the volume
    /// holds once swapped in.
    pub fn charging(mut self, budget: &ContentBudget, payer: Payer) -> AtomicWriter {
        self.charged = Some((budget.clone(), payer));
        self
    }

    /// Makes `payload` the volume's content. Every key is checked before anything is written;
    /// an unchanged payload writes nothing. Returns whether a new version was written.
    pub fn write(&self, payload: &Payload) -> Result<bool> {
        for key in payload.keys() {
            check_key(key)?;
        }
        let previous = self.current_version();
        if let Some(previous) = &previous
            && self.holds(previous, payload)
        {
            return Ok(false);
        }
        let room = Room::measure(&self.dir, payload, previous.is_some())?;
        let reservation = match &self.charged {
            Some((budget, payer)) => Some(budget.reserve(payer, charge_of(payload))?),
            None => None,
        };

        let version = self.new_version_dir()?;
        let cleanup = |error: Error| {
            let _ = remove_tree(&self.dir.join(&version));
            room.explain(error)
        };
        self.write_version(&version, payload).map_err(cleanup)?;

        // The swap: a reader following ..data sees the old version or the new, never a mix.
        let tmp_link = self.dir.join(DATA_LINK_TMP);
        let _ = fs::remove_file(&tmp_link);
        symlink(&version, &tmp_link).map_err(|e| cleanup(io_error("creating the data link", &tmp_link, e)))?;
        fs::rename(&tmp_link, self.dir.join(DATA_LINK))
            .map_err(|e| cleanup(io_error("swapping the data link", &tmp_link, e)))?;
        // Swapped: the new version is what the volume holds, and the old one is on its way out.
        if let Some(reservation) = reservation {
            reservation.commit();
        }

        self.update_visible_links(payload)?;
        if let Some(previous) = previous {
            remove_tree(&self.dir.join(&previous))
                .map_err(|e| io_error("removing the previous version", &self.dir.join(&previous), e))?;
        }
        Ok(true)
    }

    /// The version `..data` points at, if it names one of the writer's own version directories:
    /// the previous version is removed after a swap, so a link pointing anywhere else must never
    /// be taken for one.
    fn current_version(&self) -> Option<PathBuf> {
        let version = fs::read_link(self.dir.join(DATA_LINK)).ok()?;
        let name = version.to_str()?;
        let own =
            name.starts_with("..") && name.len() > 2 && name[2..].bytes().all(|b| b.is_ascii_digit() || b == b'.');
        own.then_some(version)
    }

    fn holds(&self, version: &Path, payload: &Payload) -> bool {
        let root = self.dir.join(version);
        let mut present = BTreeSet::new();
        if collect_files(&root, &root, &mut present).is_err() {
            return false;
        }
        present.len() == payload.len()
            && payload.iter().all(|(key, content)| {
                present.contains(key)
                    && fs::read(root.join(key)).is_ok_and(|data| data == content.data)
                    && fs::metadata(root.join(key)).is_ok_and(|m| {
                        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777 == content.mode
                    })
            })
    }

    fn new_version_dir(&self) -> Result<PathBuf> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let name = PathBuf::from(format!("..{}.{:09}", now.as_secs(), now.subsec_nanos()));
        let path = self.dir.join(&name);
        fs::create_dir(&path).map_err(|e| io_error("creating a version directory", &path, e))?;
        Ok(name)
    }

    fn write_version(&self, version: &Path, payload: &Payload) -> Result<()> {
        let root = self.dir.join(version);
        let mut created = BTreeSet::new();
        for (key, content) in payload {
            let path = root.join(key);
            if let Some(parent) = path.parent()
                && parent != root
                && created.insert(parent.to_path_buf())
            {
                create_dirs(&root, parent).map_err(|e| io_error("creating a directory", parent, e))?;
            }
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(content.mode)
                .open(&path)
                .map_err(|e| io_error("creating a file", &path, e))?;
            // No fsync: volumes live on tmpfs, whose content never outlives the boot, and the
            // reader's consistency comes from the rename of ..data, not from durability.
            file.write_all(&content.data).map_err(|e| io_error("writing a file", &path, e))?;
            // The mode given to open() is filtered by the umask; set it exactly.
            let mode = content.mode | self.group.map_or(0, |_| GROUP_READ);
            if let Some(group) = self.group {
                std::os::unix::fs::fchown(&file, None, Some(group))
                    .map_err(|e| io_error("giving a file to the pod's fsGroup", &path, e))?;
            }
            file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|e| io_error("setting a file's mode", &path, e))?;
        }
        if let Some(group) = self.group {
            self.give_dirs(&root, payload, group)?;
        }
        Ok(())
    }

    /// Gives the directories of version `root` (itself included) to `group`: group-owned,
    /// searchable by it, set-group-id (kubelet's rule for fsGroup).
    fn give_dirs(&self, root: &Path, payload: &Payload, group: u32) -> Result<()> {
        let mut dirs = BTreeSet::from([root.to_path_buf()]);
        for key in payload.keys() {
            // The key's own directories, walked on the relative key and only then joined to
            // the version: no walk of this loop, however changed, can climb above `root` (a
            // walk up an absolute path once gave `/` itself to the group in a mutation run).
            for dir in Path::new(key).ancestors().skip(1).filter(|dir| !dir.as_os_str().is_empty()) {
                dirs.insert(root.join(dir));
            }
        }
        for dir in dirs {
            std::os::unix::fs::chown(&dir, None, Some(group))
                .map_err(|e| io_error("giving a directory to the pod's fsGroup", &dir, e))?;
            let mode = fs::metadata(&dir).map_err(|e| io_error("reading a directory's mode", &dir, e))?.permissions();
            let mode = std::os::unix::fs::PermissionsExt::mode(&mode) | GROUP_SEARCH | SET_GROUP_ID;
            fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|e| io_error("setting a directory's mode", &dir, e))?;
        }
        Ok(())
    }

    /// Each top-level name of the payload is a symlink through `..data`; names no longer in the
    /// payload are removed. Only symlinks are ever removed here.
    fn update_visible_links(&self, payload: &Payload) -> Result<()> {
        let wanted: BTreeSet<&str> = payload.keys().filter_map(|key| key.split('/').next()).collect();
        for name in &wanted {
            let link = self.dir.join(name);
            if fs::symlink_metadata(&link).is_err() {
                symlink(Path::new(DATA_LINK).join(name), &link).map_err(|e| io_error("creating a link", &link, e))?;
            }
        }
        let entries = fs::read_dir(&self.dir).map_err(|e| io_error("listing the volume", &self.dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("..") || wanted.contains(name.as_ref()) {
                continue;
            }
            if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                fs::remove_file(entry.path()).map_err(|e| io_error("removing a stale link", &entry.path(), e))?;
            }
        }
        Ok(())
    }
}

/// Every file below `dir`, relative to `root`, whatever its depth (see [`crate::dir_tree`]).
fn collect_files(root: &Path, dir: &Path, into: &mut BTreeSet<String>) -> std::io::Result<()> {
    for (path, _) in non_directories_below(dir)? {
        if let Ok(relative) = path.strip_prefix(root) {
            into.insert(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// How much a new version needs against what the volume's filesystem has, measured before it
/// is written, so that running out of room is explained in the user's terms (the volume's
/// `tmpfsSize`, the bytes needed and free) instead of a bare "No space left on device".
struct Room {
    needed: u64,
    free: u64,
    size: u64,
    update: bool,
}

impl Room {
    /// Measures `dir`'s filesystem for `payload` (`update`: an old version is still there
    /// while the new one is written). Refused at once when it cannot fit.
    fn measure(dir: &Path, payload: &Payload, update: bool) -> Result<Room> {
        let needed = payload.values().map(|file| (file.data.len() as u64).div_ceil(PAGE_BYTES) * PAGE_BYTES).sum();
        match nix::sys::statvfs::statvfs(dir) {
            Ok(stat) => {
                let unit = stat.fragment_size();
                Room::check(needed, stat.blocks_available() * unit, stat.blocks() * unit, update)
            }
            // Unknown: let the write itself tell.
            Err(_) => Room::check(needed, u64::MAX, u64::MAX, update),
        }
    }

    /// `needed` bytes against `free` of a filesystem of `size`: refused when they cannot fit.
    fn check(needed: u64, free: u64, size: u64, update: bool) -> Result<Room> {
        let room = Room { needed, free, size, update };
        if room.needed > room.free {
            return Err(room.too_small());
        }
        Ok(room)
    }

    fn too_small(&self) -> Error {
        let why = if self.update {
            format!(
                "an update writes the new version beside the old one, so tmpfsSize must hold the content twice \
                 (at least {} bytes)",
                self.needed.saturating_mul(2)
            )
        } else {
            format!("tmpfsSize must be at least {} bytes", self.needed)
        };
        Error::TooLarge(format!(
            "the volume's content needs {} bytes but its tmpfs (tmpfsSize {} bytes) has {} bytes free: {why}; \
             raise tmpfsSize in the driver's configuration",
            self.needed, self.size, self.free
        ))
    }

    /// `error`, explained in these terms when it is the filesystem running out of room (the
    /// estimate said it would fit, but tmpfs also charges what the estimate leaves out).
    fn explain(&self, error: Error) -> Error {
        match error {
            Error::TooLarge(_) => self.too_small(),
            other => other,
        }
    }
}

fn io_error(action: &str, path: &Path, error: std::io::Error) -> Error {
    let context = format!("{action} {}", quote_path(path));
    if error.raw_os_error() == Some(nix::libc::ENOSPC) {
        Error::TooLarge(format!("{context}: {error}"))
    } else {
        Error::local(context, error)
    }
}

#[cfg(test)]
mod tests;
