//! Reaching a target below kubelet's root one directory at a time, each element opened with
//! `O_NOFOLLOW` relative to its parent's descriptor: a symlink anywhere below the root is refused,
//! and since every later step (mount, write, unmount) goes through the descriptors opened here,
//! nothing can be swapped between the check and the use. Only missing directories are created,
//! and the caller is told which, so that it removes exactly those (and only while empty).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::quote::quote_path;
use crate::volume::error::{Error, Result};
use crate::volume::target_path::TargetPath;

/// The mode of directories the driver creates (kubelet's for its volume directories).
const DIR_MODE: u32 = 0o750;

/// An open directory and the path it was reached by (for messages and the fake mounter).
#[derive(Debug)]
pub struct OpenDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl OpenDir {
    /// The path this directory was reached by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `/proc/self/fd/N`: a path the kernel resolves to this very directory, for the calls that
    /// take a path (mount(2), the writer's file operations), so they act on what was checked.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// A target and its parent, both open.
#[derive(Debug)]
pub struct OpenTarget {
    /// The directory holding the target.
    pub parent: OpenDir,
    /// The target: the root of whatever is mounted on it, or the directory itself.
    pub target: OpenDir,
}

impl OpenTarget {
    /// Opens the target again from its parent: after a mount, this reaches the new mount's root.
    pub fn reopen(&self) -> Result<OpenDir> {
        let name = self.target.path.file_name().map(Path::new).unwrap_or(Path::new("."));
        child(&self.parent, name).map_err(|errno| refused(&self.target.path, errno))
    }
}

fn open_root(root: &Path) -> Result<OpenDir> {
    // The configured root is trusted as written (it may be a symlink to where kubelet keeps its
    // data); only what lies below it is not.
    let fd = nix::fcntl::open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|errno| Error::local(format!("opening the kubelet root {}", quote_path(root)), errno))?;
    Ok(OpenDir { fd, path: root.to_path_buf() })
}

fn child(parent: &OpenDir, name: &Path) -> std::result::Result<OpenDir, Errno> {
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match openat(parent.fd(), name, flags | OFlag::O_RDONLY, Mode::empty()) {
        // A FUSE mount whose server is gone (a lazy volume of the driver's previous run)
        // answers nothing, not even an open; a path descriptor still reaches its root without
        // asking it, so that it can be recognised as the driver's and unmounted.
        Err(Errno::ENOTCONN) => openat(parent.fd(), name, flags | OFlag::O_PATH, Mode::empty())?,
        opened => opened?,
    };
    Ok(OpenDir { fd, path: parent.path.join(name) })
}

/// Why an element could not be opened, as the caller's error.
fn refused(path: &Path, errno: Errno) -> Error {
    match errno {
        // O_NOFOLLOW with O_DIRECTORY on a symlink fails with ENOTDIR (ELOOP without
        // O_DIRECTORY); the second look only chooses the message, the refusal is already made.
        Errno::ELOOP | Errno::ENOTDIR => {
            let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            let what = if link { "is a symbolic link" } else { "is not a directory" };
            Error::Refused(format!("{} {what}; refused", quote_path(path)))
        }
        other => Error::local(format!("opening {}", quote_path(path)), other),
    }
}

/// Opens `target` below `root` without creating anything; `None` when an element is missing.
pub fn open(root: &Path, target: &TargetPath) -> Result<Option<OpenTarget>> {
    walk(root, target, None)
}

/// The elements of `target` that do not exist yet (what a publish is about to create).
pub fn missing(root: &Path, target: &TargetPath) -> Result<Vec<PathBuf>> {
    let mut dir = open_root(root)?;
    let mut path = root.to_path_buf();
    let mut absent = Vec::new();
    for name in target.below_root() {
        path.push(name);
        if !absent.is_empty() {
            absent.push(path.clone());
            continue;
        }
        match child(&dir, Path::new(name)) {
            Ok(next) => dir = next,
            Err(Errno::ENOENT) => absent.push(path.clone()),
            Err(errno) => return Err(refused(&path, errno)),
        }
    }
    Ok(absent)
}

/// Opens `target` below `root`, creating missing directories; pushes each one it created onto
/// `created` as it goes, so a failure part-way still says what to take back.
pub fn create(root: &Path, target: &TargetPath, created: &mut Vec<PathBuf>) -> Result<OpenTarget> {
    match walk(root, target, Some(created))? {
        Some(opened) => Ok(opened),
        None => Err(Error::Fault(format!("{} vanished while it was created", quote_path(target.as_path())))),
    }
}

fn walk(root: &Path, target: &TargetPath, mut created: Option<&mut Vec<PathBuf>>) -> Result<Option<OpenTarget>> {
    let mut parent = None;
    let mut dir = open_root(root)?;
    for name in target.below_root() {
        let name = Path::new(name);
        let path = dir.path.join(name);
        let next = match child(&dir, name) {
            Ok(next) => next,
            Err(Errno::ENOENT) => {
                let Some(created) = created.as_deref_mut() else {
                    return Ok(None);
                };
                match mkdirat(dir.fd(), name, Mode::from_bits_truncate(DIR_MODE)) {
                    Ok(()) => created.push(path.clone()),
                    // Made by someone else a moment ago: theirs, not ours to remove later.
                    Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(Error::local(format!("creating {}", quote_path(&path)), errno)),
                }
                child(&dir, name).map_err(|errno| refused(&path, errno))?
            }
            Err(errno) => return Err(refused(&path, errno)),
        };
        parent = Some(std::mem::replace(&mut dir, next));
    }
    Ok(parent.map(|parent| OpenTarget { parent, target: dir }))
}

/// Removes the directories in `created` that lie on the way from `root` to `target`, deepest
/// first, each only while empty and only when reached without a symlink. Anything else in the
/// list is ignored: a record can only make the driver remove its own empty directories. Returns
/// a line for each directory left in place and why.
pub fn remove_created(root: &Path, target: &Path, created: &[PathBuf]) -> Vec<String> {
    let mut ours: Vec<&PathBuf> = created
        .iter()
        .filter(|path| path.starts_with(root) && path.as_path() != root && target.starts_with(path))
        .filter(|path| path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))))
        .collect();
    ours.sort_by_key(|path| std::cmp::Reverse(path.components().count()));
    ours.dedup();
    let mut kept = Vec::new();
    for path in ours {
        if let Err(why) = remove_empty_dir(root, path) {
            kept.push(format!("{} left in place: {why}", quote_path(path)));
        }
    }
    kept
}

fn remove_empty_dir(root: &Path, path: &Path) -> std::result::Result<(), String> {
    let Ok(relative) = path.strip_prefix(root) else {
        return Err("not below the kubelet root".into());
    };
    let names: Vec<&Path> = relative.components().map(|c| Path::new(c.as_os_str())).collect();
    let Some((last, parents)) = names.split_last() else {
        return Err("it is the kubelet root".into());
    };
    let mut dir = open_root(root).map_err(|e| e.to_string())?;
    for name in parents {
        dir = match child(&dir, name) {
            Ok(next) => next,
            Err(Errno::ENOENT) => return Ok(()),
            Err(errno) => return Err(refused(&dir.path.join(name), errno).to_string()),
        };
    }
    match unlinkat(dir.fd(), *last, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::ENOTEMPTY) => Err("it is not empty".into()),
        Err(Errno::EBUSY) => Err("something is mounted on it".into()),
        Err(errno) => Err(errno.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    fn target(root: &Path, uid: &str) -> TargetPath {
        let text = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/v/mount"));
        TargetPath::parse(text.to_str().unwrap(), root).unwrap()
    }

    #[test]
    fn missing_directories_are_created_and_named_then_removed_while_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("pods/u/volumes")).unwrap();
        let target = target(root, "u");
        assert_eq!(
            missing(root, &target).unwrap(),
            [
                root.join("pods/u/volumes/kubernetes.io~csi"),
                root.join("pods/u/volumes/kubernetes.io~csi/v"),
                root.join("pods/u/volumes/kubernetes.io~csi/v/mount")
            ]
        );
        assert!(open(root, &target).unwrap().is_none());
        let mut created = Vec::new();
        let opened = create(root, &target, &mut created).unwrap();
        assert_eq!(opened.target.path(), target.as_path());
        assert_eq!(created, missing_before(root));
        assert!(open(root, &target).unwrap().is_some());

        // Something of someone else's in a directory we made keeps that directory.
        fs::write(root.join("pods/u/volumes/kubernetes.io~csi/v/vol_data.json"), "{}").unwrap();
        let kept = remove_created(root, target.as_path(), &created);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept[0].ends_with("/v\" left in place: it is not empty"), "{kept:?}");
        assert!(!target.as_path().exists());
        assert!(root.join("pods/u/volumes/kubernetes.io~csi/v/vol_data.json").exists());
        assert!(root.join("pods/u/volumes").exists(), "what existed before stays");
    }

    #[test]
    fn a_kubelet_root_that_is_not_a_directory_is_named_as_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        // Parsed while the root is a directory (the path's shape is all parse reads), then the
        // root replaced by a file: the root's open fails, naming it, before any element below.
        fs::create_dir_all(&root).unwrap();
        let target = target(&root, "u");
        fs::remove_dir(&root).unwrap();
        fs::write(&root, "not a directory").unwrap();
        for error in [open(&root, &target).map(drop).unwrap_err(), missing(&root, &target).map(drop).unwrap_err()] {
            let message = error.to_string();
            assert!(message.starts_with(&format!("opening the kubelet root {}", quote_path(&root))), "{message}");
        }
    }

    fn missing_before(root: &Path) -> Vec<PathBuf> {
        [
            "pods/u/volumes/kubernetes.io~csi",
            "pods/u/volumes/kubernetes.io~csi/v",
            "pods/u/volumes/kubernetes.io~csi/v/mount",
        ]
        .iter()
        .map(|p| root.join(p))
        .collect()
    }

    #[test]
    fn a_symlink_anywhere_below_the_root_is_refused_and_nothing_is_created_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir_all(root.join("pods")).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        symlink(&elsewhere, root.join("pods/u")).unwrap();
        let target = target(&root, "u");
        let error = create(&root, &target, &mut Vec::new()).unwrap_err();
        assert!(matches!(error, Error::Refused(_)), "{error:?}");
        assert_eq!(error.to_string(), format!("{:?} is a symbolic link; refused", root.join("pods/u")));
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing created through the link");
        assert!(missing(&root, &target).is_err());

        // The last element as a symlink to a directory.
        fs::create_dir_all(root.join("pods/w/volumes/kubernetes.io~csi/v")).unwrap();
        symlink(&elsewhere, root.join("pods/w/volumes/kubernetes.io~csi/v/mount")).unwrap();
        assert!(matches!(open(&root, &target_named(&root, "w")), Err(Error::Refused(_))));
    }

    fn target_named(root: &Path, uid: &str) -> TargetPath {
        target(root, uid)
    }

    #[test]
    fn removal_ignores_paths_off_the_target_and_outside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        fs::create_dir_all(root.join("pods/u")).unwrap();
        let bystander = dir.path().join("bystander");
        fs::create_dir_all(&bystander).unwrap();
        fs::create_dir_all(root.join("pods/other")).unwrap();
        let target = target(&root, "u");
        let hostile = [bystander.clone(), root.clone(), root.join("pods/other"), root.join("pods/u/../other")];
        assert!(remove_created(&root, target.as_path(), &hostile).is_empty());
        assert!(bystander.exists() && root.join("pods/other").exists());
    }
}
