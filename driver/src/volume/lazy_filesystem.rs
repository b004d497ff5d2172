//! A lazy volume served through FUSE: the kernel's requests for the files of a lazy provider's
//! volume, answered from its [`LazyFiles`]. Read-only, every file `0444` and directory `0555`
//! owned by root, which the kernel enforces (`default_permissions`) for any user of the
//! container (`allow_other`). A file's content is had when it is opened (the helper's `get`, or
//! the cache within its TTL) and that open file reads that content to its end, whatever comes
//! after. A file opened again with the content it was last opened with is read through the
//! kernel's page cache, which keeps its pages: one trip to the driver per open, the open itself.
//! When its content changes, [`OpenFiles`] decides how the kernel's one page cache and one size
//! per file stay true to every open handle (opens of new content are served by direct I/O while
//! handles of the old one read through the page cache; with none left, the kernel's pages and
//! attributes of the file are dropped before the new content is paged). The kernel may keep
//! names and attributes for the cache's TTL, never longer, and keeps no size of a file whose
//! content is not paged.
//!
//! The session reads requests on a thread of its own; an open that needs the helper, or a change
//! of the paged content, runs on the content source's runtime and answers when it is done, so a
//! slow helper delays only the opens waiting on it, never another volume's.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, Request, SessionACL,
};
use tracing::warn;

use crate::content::error::Error as ContentError;
use crate::content::external::lazy_files::{EntryKind, Fetched, LazyFiles};
use crate::quote::{Logged, quote};
use crate::volume::error::{Error, Result};
use crate::volume::lazy_open_files::{OpenFiles, OpenMode};

/// The most inodes one lazy volume hands out: its layout's, and a name looked up in an open
/// directory each; past it, new names are refused (ENFILE) rather than grow the driver.
const MAX_INODES: usize = 8192;

/// A lazy volume being served; dropping it lets the session end once the kernel lets go of the
/// mount (its unmount).
pub struct LazyMount {
    files: Arc<LazyFiles>,
    reads_served: Arc<AtomicU64>,
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
            open_files: Arc::default(),
            notifier: Arc::default(),
            reads_served: Arc::default(),
            mounted: SystemTime::now(),
            group: group.unwrap_or(0),
        };
        let (notifier, reads_served) = (filesystem.notifier.clone(), filesystem.reads_served.clone());
        let mut config = Config::default();
        config.n_threads = Some(1);
        let serving = |error| Error::local("serving the volume through FUSE", error);
        let session = fuser::Session::from_fd(filesystem, device, SessionACL::All, config).map_err(serving)?;
        // Set before the session serves anything: no open can need it earlier.
        let _ = notifier.set(session.notifier());
        let session = session.spawn().map_err(serving)?;
        Ok(LazyMount { files, reads_served, _session: session })
    }

    /// What the volume serves.
    pub fn files(&self) -> &Arc<LazyFiles> {
        &self.files
    }

    /// How many reads the kernel asked of the driver: none for what its page cache holds.
    pub fn reads_served(&self) -> u64 {
        self.reads_served.load(Ordering::Relaxed)
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
    open_files: Arc<Mutex<OpenFiles>>,
    /// Tells the kernel to drop what it keeps of a file whose paged content changes.
    notifier: Arc<OnceLock<Notifier>>,
    reads_served: Arc<AtomicU64>,
    mounted: SystemTime,
    group: u32,
}

impl LazyFilesystem {
    fn path(&self, ino: INodeNo) -> Option<String> {
        self.inodes.lock().unwrap_or_else(|p| p.into_inner()).path(ino).map(String::from)
    }

    /// The attributes of `path`, and how long the kernel may keep them: a directory's for the
    /// cache's TTL; a file's size is its paged content's, kept for the cache's TTL (a change of
    /// it drops the kernel's copy first); a file with no paged content shows its cached size, or
    /// 0 before it is fetched, and the kernel keeps neither.
    fn attributes(&self, ino: INodeNo, path: &str, kind: EntryKind) -> (FileAttr, Duration) {
        let file = || {
            let paged = self.open_files.lock().unwrap_or_else(|p| p.into_inner()).paged_size(ino.0);
            match paged {
                Some(size) => (size, self.ttl()),
                None => (self.files.cached(path).map_or(0, |(size, _)| size), Duration::ZERO),
            }
        };
        let (kind, perm, nlink, (size, ttl)) = match kind {
            EntryKind::Directory => (FileType::Directory, 0o555, 2, (0, self.ttl())),
            EntryKind::File => (FileType::RegularFile, 0o444, 1, file()),
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

/// How an open file is read: through the page cache, kept from earlier opens of the same
/// content; or by direct I/O, past any size the kernel holds. Never flushed: nothing is written.
fn fopen_flags(paged: bool) -> FopenFlags {
    let mode = if paged { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::FOPEN_DIRECT_IO };
    mode | FopenFlags::FOPEN_NOFLUSH
}

/// Opens `ino` with `content` as [`OpenFiles`] says, switching its paged content when asked:
/// the kernel's pages and attributes of the file are dropped between the switch's two steps.
/// A switch that cannot be made (a paged handle open, no notifier, the kernel refusing) opens
/// direct. Whether the handle is paged, and the handle.
async fn open_with(
    open_files: &Arc<Mutex<OpenFiles>>,
    notifier: &Arc<OnceLock<Notifier>>,
    ino: INodeNo,
    content: Fetched,
    volume: &str,
) -> (bool, u64) {
    let lock = || open_files.lock().unwrap_or_else(|p| p.into_inner());
    let switch = {
        let mut open_files = lock();
        match open_files.mode(ino.0, &content) {
            OpenMode::Switch => match open_files.begin_switch(ino.0) {
                Some(switch) => switch,
                None => return open_files.open(ino.0, content, OpenMode::Direct),
            },
            mode => return open_files.open(ino.0, content, mode),
        }
    };
    let notifier = notifier.get().cloned();
    // Dropping pages may wait on reads of them that the session's thread answers: not here.
    let dropped = tokio::task::spawn_blocking(move || match notifier {
        Some(notifier) => notifier.inval_inode(ino, 0, 0),
        None => Err(std::io::Error::other("no notifier yet")),
    })
    .await
    .unwrap_or_else(|joined| Err(std::io::Error::other(joined.to_string())));
    match dropped {
        Ok(()) => lock().finish_switch(ino.0, switch, content),
        Err(error) => {
            warn!(volume = %volume, problem = %error, "the kernel's copy of a lazy file could not be dropped; it is read by direct I/O");
            lock().open(ino.0, content, OpenMode::Direct)
        }
    }
}

/// The errno a failed read of a lazy file answers: withdrawn access is EACCES, a file the
/// helper does not have ENOENT, a volume holding its size in memory already ENOMEM, anything
/// else EIO, for that file only.
fn errno_of(error: &ContentError) -> Errno {
    match error {
        ContentError::Denied(_) => Errno::EACCES,
        ContentError::Missing(_) => Errno::ENOENT,
        ContentError::TooLarge(_) => Errno::ENOMEM,
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
        // Within the cache's TTL the answer is at hand: no helper, no trip through the runtime,
        // unless the paged content changes (dropping the kernel's pages may wait on reads this
        // thread serves).
        if let Some(content) = self.files.cached_content(&path) {
            let mut open_files = self.open_files.lock().unwrap_or_else(|p| p.into_inner());
            let mode = open_files.mode(ino.0, &content);
            if mode != OpenMode::Switch {
                let (paged, handle) = open_files.open(ino.0, content, mode);
                return reply.opened(FileHandle(handle), fopen_flags(paged));
            }
        }
        let (files, volume) = (self.files.clone(), self.volume.clone());
        let (open_files, notifier) = (self.open_files.clone(), self.notifier.clone());
        self.files.runtime().spawn(async move {
            match files.read(&path).await {
                Ok(content) => {
                    let (paged, handle) = open_with(&open_files, &notifier, ino, content, &volume).await;
                    reply.opened(FileHandle(handle), fopen_flags(paged));
                }
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
        self.reads_served.fetch_add(1, Ordering::Relaxed);
        let open_files = self.open_files.lock().unwrap_or_else(|p| p.into_inner());
        let Some(content) = open_files.content(fh.0) else {
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
        self.open_files.lock().unwrap_or_else(|p| p.into_inner()).release(fh.0);
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
