//! A lazy volume served through FUSE: the kernel's requests for the files of a lazy provider's
//! volume, answered from its [`LazyFiles`]. Read-only, every file `0444` and directory `0555`
//! owned by root, which the kernel enforces (`default_permissions`) for any user of the
//! container (`allow_other`). A file's content is had when it is opened (the helper's `get`, or
//! the cache within its TTL) and that open file reads that content to its end, whatever comes
//! after: files are opened for direct I/O, so a size the kernel was told before the content was
//! fetched never cuts a read short. The kernel may keep names and attributes for the cache's TTL,
//! never longer.
//!
//! The session reads requests on a thread of its own; an open that needs the helper runs on the
//! content source's runtime and answers when it is done, so a slow helper delays only the opens
//! waiting on it, never another volume's.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    Request, SessionACL,
};
use tracing::warn;

use crate::content::error::Error as ContentError;
use crate::content::external::lazy_files::{EntryKind, LazyFiles};
use crate::quote::{Logged, quote};
use crate::volume::error::{Error, Result};

/// The most inodes one lazy volume hands out: its layout's, and a name looked up in an open
/// directory each; past it, new names are refused (ENFILE) rather than grow the driver.
const MAX_INODES: usize = 8192;

/// A lazy volume being served; dropping it lets the session end once the kernel lets go of the
/// mount (its unmount).
pub struct LazyMount {
    files: Arc<LazyFiles>,
    _session: BackgroundSession,
}

impl LazyMount {
    /// Serves `files` for volume `volume_id` on `device`, the descriptor of a FUSE mount just
    /// made, its entries belonging to `group` (the pod's fsGroup) when given: answers the
    /// kernel's first request (the protocol's handshake) before returning.
    pub fn serve(volume_id: &str, device: OwnedFd, files: Arc<LazyFiles>, group: Option<u32>) -> Result<LazyMount> {
        let filesystem = LazyFilesystem {
            volume: quote(volume_id),
            files: files.clone(),
            inodes: Mutex::new(Inodes::default()),
            handles: Arc::default(),
            next_handle: Arc::new(AtomicU64::new(1)),
            mounted: SystemTime::now(),
            group: group.unwrap_or(0),
        };
        let mut config = Config::default();
        config.n_threads = Some(1);
        let session = fuser::Session::from_fd(filesystem, device, SessionACL::All, config)
            .and_then(fuser::Session::spawn)
            .map_err(|error| Error::local("serving the volume through FUSE", error))?;
        Ok(LazyMount { files, _session: session })
    }

    /// What the volume serves.
    pub fn files(&self) -> &Arc<LazyFiles> {
        &self.files
    }
}

/// Inode numbers by path and back (the root is inode 1, path `""`).
#[derive(Default)]
struct Inodes {
    paths: Vec<String>,
    numbers: HashMap<String, u64>,
}

impl Inodes {
    fn path(&self, ino: INodeNo) -> Option<&str> {
        if ino == INodeNo::ROOT {
            return Some("");
        }
        let index = usize::try_from(ino.0.checked_sub(2)?).ok()?;
        self.paths.get(index).map(String::as_str)
    }

    fn number(&mut self, path: &str) -> Option<INodeNo> {
        if path.is_empty() {
            return Some(INodeNo::ROOT);
        }
        if let Some(number) = self.numbers.get(path) {
            return Some(INodeNo(*number));
        }
        if self.paths.len() >= MAX_INODES {
            return None;
        }
        self.paths.push(path.to_string());
        let number = self.paths.len() as u64 + 1;
        self.numbers.insert(path.to_string(), number);
        Some(INodeNo(number))
    }
}

struct LazyFilesystem {
    volume: String,
    files: Arc<LazyFiles>,
    inodes: Mutex<Inodes>,
    // Each open file's content, as had at its open.
    handles: Arc<Mutex<HashMap<u64, Arc<[u8]>>>>,
    next_handle: Arc<AtomicU64>,
    mounted: SystemTime,
    group: u32,
}

impl LazyFilesystem {
    fn path(&self, ino: INodeNo) -> Option<String> {
        self.inodes.lock().unwrap_or_else(|p| p.into_inner()).path(ino).map(String::from)
    }

    /// The attributes of `path`, and how long the kernel may keep them: a directory's and a
    /// fetched file's for what is left of the cache's TTL; a file not fetched yet, whose size is
    /// unknown (0), not at all, so that a stat after its first open shows its size.
    fn attributes(&self, ino: INodeNo, path: &str, kind: EntryKind) -> (FileAttr, Duration) {
        let (kind, perm, nlink, (size, ttl)) = match kind {
            EntryKind::Directory => (FileType::Directory, 0o555, 2, (0, self.ttl())),
            EntryKind::File => (FileType::RegularFile, 0o444, 1, self.files.cached(path).unwrap_or_default()),
        };
        let attributes = FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted,
            mtime: self.mounted,
            ctime: self.mounted,
            crtime: self.mounted,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: self.group,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        (attributes, ttl)
    }

    fn ttl(&self) -> Duration {
        self.files.cache_ttl()
    }
}

/// The errno a failed read of a lazy file answers: withdrawn access is EACCES, a file the
/// helper does not have ENOENT, anything else EIO, for that file only.
fn errno_of(error: &ContentError) -> Errno {
    match error {
        ContentError::Denied(_) => Errno::EACCES,
        ContentError::Missing(_) => Errno::ENOENT,
        _ => Errno::EIO,
    }
}

impl Filesystem for LazyFilesystem {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (Some(parent), Some(name)) = (self.path(parent), name.to_str()) else {
            return reply.error(Errno::ENOENT);
        };
        let path = if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") };
        let Some(kind) = self.files.layout().kind(&path) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(ino) = self.inodes.lock().unwrap_or_else(|p| p.into_inner()).number(&path) else {
            warn!(volume = %self.volume, "a lazy volume ran out of inodes; a new name was refused");
            return reply.error(Errno::ENFILE);
        };
        let (attributes, attributes_ttl) = self.attributes(ino, &path, kind);
        reply.entry_with_ttls(&attributes_ttl, &self.ttl(), &attributes, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match self.files.layout().kind(&path) {
            Some(kind) => {
                let (attributes, ttl) = self.attributes(ino, &path, kind);
                reply.attr(&ttl, &attributes);
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let (handles, next) = (self.handles.clone(), self.next_handle.clone());
        let opened = move |content: Arc<[u8]>, reply: ReplyOpen| {
            let handle = next.fetch_add(1, Ordering::Relaxed);
            handles.lock().unwrap_or_else(|p| p.into_inner()).insert(handle, content);
            reply.opened(FileHandle(handle), FopenFlags::FOPEN_DIRECT_IO);
        };
        // Within the cache's TTL the answer is at hand: no helper, no trip through the runtime.
        if let Some(content) = self.files.cached_content(&path) {
            return opened(content, reply);
        }
        let (files, volume) = (self.files.clone(), self.volume.clone());
        self.files.runtime().spawn(async move {
            match files.read(&path).await {
                Ok(content) => opened(content, reply),
                Err(error) => {
                    warn!(volume = %volume, file = %quote(&path), problem = %Logged(&error), "a lazy file could not be opened");
                    reply.error(errno_of(&error));
                }
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        let Some(content) = handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(content.len());
        let end = start.saturating_add(size as usize).min(content.len());
        reply.data(&content[start..end]);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).remove(&fh.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(listing) = self.files.layout().listing(&path) else {
            return reply.error(Errno::ENOTDIR);
        };
        let mut entries =
            vec![(ino, FileType::Directory, ".".to_string()), (ino, FileType::Directory, "..".to_string())];
        let mut inodes = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
        for (name, kind) in listing {
            let child = if path.is_empty() { name.to_string() } else { format!("{path}/{name}") };
            let Some(number) = inodes.number(&child) else {
                break;
            };
            let kind = if kind == EntryKind::Directory { FileType::Directory } else { FileType::RegularFile };
            entries.push((number, kind, name.to_string()));
        }
        drop(inodes);
        for (index, (number, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(number, index as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

#[cfg(test)]
mod tests;
