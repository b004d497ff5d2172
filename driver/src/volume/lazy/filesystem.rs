//! A lazy volume served through FUSE: the kernel's requests for the files of a lazy provider's
//! volume, answered from its [`LazyFiles`]. Read-only, every file `0444` and directory `0555`
//! owned by root, which the kernel enforces (`default_permissions`) for any user of the
//! container (`allow_other`). A file's content is had when it is opened (the helper's `get`, or
//! the cache within its TTL) and that open file reads that content to its end, whatever comes
//! after. Content a file is opened with is stored in the kernel's page cache as it is opened
//! (with the size the kernel holds of the file, which `sendfile(2)` readers go by), and a file
//! opened again with the same content is read from there: one trip to the driver per open, the
//! open itself.
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

use nix::errno::Errno;
use tracing::warn;

use crate::content::error::Error as ContentError;
use crate::content::lazy::{EntryKind, Fetched, LazyFiles};
use crate::quote::{Logged, quote};
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::error::{Error, Result};
use crate::volume::lazy::fuse::session::{self, Device, Filesystem, Paused, Reply, Serving};
use crate::volume::lazy::fuse::wire::{
    Attr, Entries, FOPEN_DIRECT_IO, FOPEN_KEEP_CACHE, FOPEN_NOFLUSH, Kind, Negotiated,
};
use crate::volume::lazy::open_files::{OpenFiles, OpenFilesState, OpenMode};

/// The root directory's inode number, as the kernel knows it.
const ROOT: u64 = 1;

/// The most inodes one lazy volume hands out: its layout's, and a name looked up in an open
/// directory each; past it, new names are refused (ENFILE) rather than grow the driver.
const MAX_INODES: usize = 8192;

/// A lazy volume being served; dropping it lets the session end once the kernel lets go of the
/// mount (its unmount).
pub struct LazyMount {
    filesystem: Arc<LazyFilesystem>,
    session: Session,
}

/// Whether the volume's connection is read by this process.
enum Session {
    Serving(Serving),
    Paused(Paused),
    /// Between the two, for the moment one is turned into the other (or for good, when the
    /// serving thread could not be started again).
    Switching,
}

/// The name of the thread reading a lazy volume's connection.
const SESSION_THREAD: &str = "lazy-volume";

fn serving(error: session::SessionError) -> Error {
    Error::local("serving the volume through FUSE", error)
}

impl LazyMount {
    /// Serves `files` for volume `volume_id` on `device`, the descriptor of a FUSE mount just
    /// made, its entries belonging to `group` (the pod's fsGroup) when given: answers the
    /// kernel's first request (the protocol's handshake) before returning.
    pub fn serve(volume_id: &str, device: OwnedFd, files: Arc<dyn LazyFiles>, group: Option<u32>) -> Result<LazyMount> {
        let filesystem = LazyFilesystem {
            volume: quote(volume_id),
            files,
            inodes: Mutex::new(Inodes::default()),
            open_files: Arc::default(),
            notifier: Arc::default(),
            reads_served: AtomicU64::new(0),
            mounted: SystemTime::now(),
            group: group.unwrap_or(0),
        };
        LazyMount::start(filesystem, session::handshake(device).map_err(serving)?)
    }

    /// Serves `filesystem` on `connection`, whose handshake is made.
    fn start(filesystem: LazyFilesystem, connection: Paused) -> Result<LazyMount> {
        let filesystem = Arc::new(filesystem);
        // Set before the session serves anything: no open can need it earlier.
        let _ = filesystem.notifier.set(connection.device.clone());
        let session = Serving::resume(connection, filesystem.clone(), SESSION_THREAD).map_err(serving)?;
        Ok(LazyMount { filesystem, session: Session::Serving(session) })
    }

    /// Stops reading the kernel's requests at a request boundary and waits at most `within`
    /// for the answers still owed (opens waiting on the helper). Requests sent meanwhile wait
    /// in the kernel's queue, their callers blocked, none failed, until [`LazyMount::resume`]
    /// (or whoever the connection is handed to) reads them. An error, still paused, when
    /// answers are owed after `within`.
    pub fn pause(&mut self, within: Duration) -> Result<()> {
        self.session = match std::mem::replace(&mut self.session, Session::Switching) {
            Session::Serving(serving) => Session::Paused(serving.pause()),
            other => other,
        };
        match &self.session {
            Session::Paused(paused) => paused.settle(within).map_err(serving),
            _ => Ok(()),
        }
    }

    /// Reads the kernel's requests again after [`LazyMount::pause`]. Serving already: nothing.
    pub fn resume(&mut self) -> Result<()> {
        self.session = match std::mem::replace(&mut self.session, Session::Switching) {
            Session::Paused(paused) => {
                Session::Serving(Serving::resume(paused, self.filesystem.clone(), SESSION_THREAD).map_err(serving)?)
            }
            other => other,
        };
        Ok(())
    }

    /// Pauses the volume (see [`LazyMount::pause`]) and says what a successor needs to serve
    /// it on: its state, and a descriptor of its connection. The volume stays paused here: a
    /// successor that refuses it leaves it to [`LazyMount::resume`].
    pub fn hand_over(&mut self, within: Duration) -> Result<(HandedLazyVolume, OwnedFd)> {
        self.pause(within)?;
        let Session::Paused(paused) = &self.session else {
            return Err(Error::Handover("a lazy volume paused for its handover is not paused".into()));
        };
        let device = paused.duplicate().map_err(|error| Error::local("handing a lazy volume over", error))?;
        let filesystem = &self.filesystem;
        let (open_files, contents) = filesystem.open_files.locked().export();
        let handed = HandedLazyVolume {
            negotiated: paused.negotiated,
            mounted: as_handed(filesystem.mounted),
            group: filesystem.group,
            inodes: filesystem.inodes.locked().paths.clone(),
            open_files,
            contents: contents.into_iter().map(|(id, content)| HandedContent::of(id, &content)).collect(),
        };
        Ok((handed, device))
    }

    /// Serves on the lazy volume `volume_id` a predecessor handed over as `handed`, on its
    /// connection `device`, its files `files` (laid out as the predecessor's were): what the
    /// kernel holds of it (inode numbers, open handles, the page cache of each file) stays
    /// true. An error, nothing served, when `handed` does not hold together.
    pub fn take_over(
        volume_id: &str,
        handed: HandedLazyVolume,
        device: OwnedFd,
        files: Arc<dyn LazyFiles>,
    ) -> Result<LazyMount> {
        let invalid = |why: String| Error::Handover(format!("the handed-over lazy volume {}: {why}", quote(volume_id)));
        let inodes = Inodes::handed(&handed.inodes).map_err(invalid)?;
        let mut contents = std::collections::BTreeMap::new();
        for content in handed.contents {
            let (id, bytes) = content.bytes().map_err(invalid)?;
            contents.insert(id, files.adopt(id, bytes));
        }
        let open_files = OpenFiles::import(handed.open_files, &contents).map_err(invalid)?;
        let mounted = mounted_at(handed.mounted).ok_or_else(|| invalid("its mount time is out of range".into()))?;
        let filesystem = LazyFilesystem {
            volume: quote(volume_id),
            files,
            inodes: Mutex::new(inodes),
            open_files: Arc::new(Mutex::new(open_files)),
            notifier: Arc::default(),
            reads_served: AtomicU64::new(0),
            mounted,
            group: handed.group,
        };
        LazyMount::start(filesystem, Paused::handed(device, handed.negotiated))
    }

    /// What the volume serves.
    pub fn files(&self) -> &Arc<dyn LazyFiles> {
        &self.filesystem.files
    }

    /// How many reads the kernel asked of the driver: none for what its page cache holds.
    pub fn reads_served(&self) -> u64 {
        self.filesystem.reads_served.load(Ordering::Relaxed)
    }
}

/// What a successor needs to serve a lazy volume on, besides its files and its connection's
/// descriptor: the inode numbers the kernel holds (in order: inode `n + 2` is `inodes[n]`), the
/// open handles and page caches, and what the attributes were made of. Travels as JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandedLazyVolume {
    /// What the kernel and the driver agreed at the connection's handshake.
    pub negotiated: Negotiated,
    /// When the volume was mounted (seconds and nanoseconds since the epoch): every entry's time.
    pub mounted: (u64, u32),
    /// The group its entries belong to.
    pub group: u32,
    /// The paths of inodes 2, 3, ...
    pub inodes: Vec<String>,
    /// Its open files.
    pub open_files: OpenFilesState,
    /// The contents its open files read, once each.
    pub contents: Vec<HandedContent>,
}

/// One content an open file reads: its id and its bytes (base64 in the JSON). Secret: never
/// logged, and its `Debug` says only its size.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandedContent {
    id: u64,
    base64: String,
}

impl std::fmt::Debug for HandedContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "content {} ({} base64 characters)", self.id, self.base64.len())
    }
}

impl HandedContent {
    fn of(id: u64, content: &[u8]) -> HandedContent {
        use base64::Engine as _;
        HandedContent { id, base64: base64::engine::general_purpose::STANDARD.encode(content) }
    }

    fn bytes(self) -> std::result::Result<(u64, Vec<u8>), String> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.base64)
            .map_err(|_| format!("content {} is not base64", self.id))?;
        Ok((self.id, bytes))
    }
}

/// A mount time as it travels in a handover: seconds and nanoseconds since the epoch (a time
/// before it, which no mount has, as the epoch).
fn as_handed(mounted: SystemTime) -> (u64, u32) {
    let since = mounted.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (since.as_secs(), since.subsec_nanos())
}

/// The mount time a handover carries, or `None` when it is past what a time can be (a broken
/// or hostile predecessor: refused, not a panic).
fn mounted_at((seconds, nanos): (u64, u32)) -> Option<SystemTime> {
    let since = Duration::from_secs(seconds).checked_add(Duration::from_nanos(u64::from(nanos)))?;
    std::time::UNIX_EPOCH.checked_add(since)
}

/// Inode numbers by path and back (the root is inode 1, path `""`).
#[derive(Default)]
struct Inodes {
    paths: Vec<String>,
    numbers: HashMap<String, u64>,
}

impl Inodes {
    /// The inodes a predecessor handed over: `paths` are those of inodes 2, 3, ..., each once,
    /// never the root's (`""`: it has no number to take, and every later path would be
    /// numbered one less than the kernel holds it), at most [`MAX_INODES`].
    fn handed(paths: &[String]) -> std::result::Result<Inodes, String> {
        if paths.len() > MAX_INODES {
            return Err(format!("{} inodes, more than {MAX_INODES}", paths.len()));
        }
        let mut inodes = Inodes::default();
        for path in paths {
            if path.is_empty() {
                return Err("the root's path is among its inodes".into());
            }
            if inodes.numbers.contains_key(path) {
                return Err(format!("the path {} has two inodes", quote(path)));
            }
            inodes.number(path);
        }
        Ok(inodes)
    }

    fn path(&self, ino: u64) -> Option<&str> {
        if ino == ROOT {
            return Some("");
        }
        let index = usize::try_from(ino.checked_sub(2)?).ok()?;
        self.paths.get(index).map(String::as_str)
    }

    fn number(&mut self, path: &str) -> Option<u64> {
        if path.is_empty() {
            return Some(ROOT);
        }
        if let Some(number) = self.numbers.get(path) {
            return Some(*number);
        }
        if self.paths.len() >= MAX_INODES {
            return None;
        }
        self.paths.push(path.to_string());
        let number = self.paths.len() as u64 + 1;
        self.numbers.insert(path.to_string(), number);
        Some(number)
    }
}

struct LazyFilesystem {
    volume: String,
    files: Arc<dyn LazyFiles>,
    inodes: Mutex<Inodes>,
    open_files: Arc<Mutex<OpenFiles>>,
    /// Tells the kernel to drop what it keeps of a file whose paged content changes.
    notifier: Arc<OnceLock<Device>>,
    reads_served: AtomicU64,
    mounted: SystemTime,
    group: u32,
}

impl LazyFilesystem {
    fn path(&self, ino: u64) -> Option<String> {
        self.inodes.locked().path(ino).map(String::from)
    }

    /// The attributes of `path`, and how long the kernel may keep them: a directory's for the
    /// cache's TTL; a file's size is its paged content's, kept for the cache's TTL (a change of
    /// it drops the kernel's copy first); a file with no paged content shows its cached size, or
    /// 0 before it is fetched, and the kernel keeps neither.
    fn attributes(&self, ino: u64, path: &str, kind: EntryKind) -> (Attr, Duration) {
        let file = || {
            let paged = self.open_files.locked().paged_size(ino);
            match paged {
                Some(size) => (size, self.ttl()),
                None => (self.files.cached(path).map_or(0, |(size, _)| size), Duration::ZERO),
            }
        };
        let (kind, perm, nlink, (size, ttl)) = match kind {
            EntryKind::Directory => (Kind::Directory, 0o555, 2, (0, self.ttl())),
            EntryKind::File => (Kind::File, 0o444, 1, file()),
        };
        let attributes = Attr { ino, size, time: self.mounted, kind, perm, nlink, uid: 0, gid: self.group };
        (attributes, ttl)
    }

    fn ttl(&self) -> Duration {
        self.files.cache_ttl()
    }
}

/// How an open file is read: through the page cache, kept from earlier opens of the same
/// content; or by direct I/O, past any size the kernel holds. Never flushed: nothing is written.
fn fopen_flags(paged: bool) -> u32 {
    let mode = if paged { FOPEN_KEEP_CACHE } else { FOPEN_DIRECT_IO };
    mode | FOPEN_NOFLUSH
}

/// Adds the entries of `all` from `offset` on (each entry's offset the next one's index) until
/// one does not fit: the kernel asks again from that one, so none is skipped, and a page holds
/// as many as fit.
fn fill(entries: &mut Entries, all: Vec<(u64, Kind, String)>, offset: u64) {
    for (index, (number, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
        if !entries.add(number, index as u64 + 1, kind, name.as_bytes()) {
            break;
        }
    }
}

/// Opens `ino` with `content` as [`OpenFiles`] says, switching its paged content when asked:
/// the kernel's pages and attributes of the file are dropped between the switch's two steps.
/// A switch that cannot be made (a paged handle open, no notifier, the kernel refusing) opens
/// direct. Whether the handle is paged, and the handle.
async fn open_with(
    open_files: &Arc<Mutex<OpenFiles>>,
    notifier: &Arc<OnceLock<Device>>,
    ino: u64,
    content: Fetched,
    volume: &str,
) -> (bool, u64) {
    let lock = || open_files.locked();
    let switch = {
        let mut open_files = lock();
        match open_files.mode(ino, &content) {
            OpenMode::Switch => match open_files.begin_switch(ino) {
                Some(switch) => switch,
                None => return open_files.open(ino, content, OpenMode::Direct),
            },
            mode => return open_files.open(ino, content, mode),
        }
    };
    let notifier = notifier.get().cloned();
    let stored = content.clone();
    // Dropping pages may wait on reads of them that the session's thread answers: not here.
    // The new content is stored in the kernel's page cache, which sets the size it holds: a
    // reader by sendfile(2) reads the pages up to that size without asking for a newer one,
    // so a size left at what the file showed before its first fetch (0) would read nothing.
    let dropped = tokio::task::spawn_blocking(move || match notifier {
        Some(device) => device.invalidate_inode(ino).and_then(|()| device.store(ino, &stored)),
        None => Err(std::io::Error::other("no notifier yet")),
    })
    .await
    .unwrap_or_else(|joined| Err(std::io::Error::other(joined.to_string())));
    match dropped {
        Ok(()) => lock().finish_switch(ino, switch, content),
        Err(error) => {
            warn!(volume = %volume, problem = %error, "the kernel's copy of a lazy file could not be dropped; it is read by direct I/O");
            lock().open(ino, content, OpenMode::Direct)
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
    fn lookup(&self, parent: u64, name: &OsStr, reply: Reply) {
        let (Some(parent), Some(name)) = (self.path(parent), name.to_str()) else {
            return reply.error(Errno::ENOENT);
        };
        let path = if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") };
        let Some(kind) = self.files.kind(&path) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(ino) = self.inodes.locked().number(&path) else {
            warn!(volume = %self.volume, "a lazy volume ran out of inodes; a new name was refused");
            return reply.error(Errno::ENFILE);
        };
        let (attributes, attributes_ttl) = self.attributes(ino, &path, kind);
        reply.entry(&attributes, attributes_ttl, self.ttl());
    }

    fn getattr(&self, ino: u64, reply: Reply) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match self.files.kind(&path) {
            Some(kind) => {
                let (attributes, ttl) = self.attributes(ino, &path, kind);
                reply.attr(&attributes, ttl);
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, ino: u64, flags: u32, reply: Reply) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if flags as i32 & nix::libc::O_ACCMODE != nix::libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        // Within the cache's TTL the answer is at hand: no helper, no trip through the runtime,
        // unless the paged content changes (dropping the kernel's pages may wait on reads this
        // thread serves).
        if let Some(content) = self.files.cached_content(&path) {
            let mut open_files = self.open_files.locked();
            let mode = open_files.mode(ino, &content);
            if mode != OpenMode::Switch {
                let (paged, handle) = open_files.open(ino, content, mode);
                return reply.opened(handle, fopen_flags(paged));
            }
        }
        let (files, volume) = (self.files.clone(), self.volume.clone());
        let (open_files, notifier) = (self.open_files.clone(), self.notifier.clone());
        self.files.runtime().spawn(async move {
            match files.read(&path).await {
                Ok(content) => {
                    let (paged, handle) = open_with(&open_files, &notifier, ino, content, &volume).await;
                    reply.opened(handle, fopen_flags(paged));
                }
                Err(error) => {
                    warn!(volume = %volume, file = %quote(&path), problem = %Logged(&error), "a lazy file could not be opened");
                    reply.error(errno_of(&error));
                }
            }
        });
    }

    fn read(&self, fh: u64, offset: u64, size: u32, reply: Reply) {
        self.reads_served.fetch_add(1, Ordering::Relaxed);
        let open_files = self.open_files.locked();
        let Some(content) = open_files.content(fh) else {
            return reply.error(Errno::EBADF);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(content.len());
        let end = start.saturating_add(size as usize).min(content.len());
        reply.data(&content[start..end]);
    }

    fn release(&self, fh: u64, reply: Reply) {
        self.open_files.locked().release(fh);
        reply.ok();
    }

    fn readdir(&self, ino: u64, offset: u64, mut entries: Entries, reply: Reply) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(listing) = self.files.listing(&path) else {
            return reply.error(Errno::ENOTDIR);
        };
        let mut all = vec![(ino, Kind::Directory, ".".to_string()), (ino, Kind::Directory, "..".to_string())];
        let mut inodes = self.inodes.locked();
        for (name, kind) in listing {
            let child = if path.is_empty() { name.to_string() } else { format!("{path}/{name}") };
            let Some(number) = inodes.number(&child) else {
                break;
            };
            let kind = if kind == EntryKind::Directory { Kind::Directory } else { Kind::File };
            all.push((number, kind, name));
        }
        drop(inodes);
        fill(&mut entries, all, offset);
        reply.entries(&entries);
    }
}

#[cfg(test)]
pub(crate) mod tests;
