//! The FUSE protocol as the kernel speaks it on `/dev/fuse` (`linux/fuse.h`): the requests a
//! read-only filesystem is sent, and the replies and notifications it writes. Pure: bytes in,
//! bytes out, little-endian as the kernel's own structs on the architectures we ship.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The protocol's major version; the kernel and we must agree on it.
pub const MAJOR: u32 = 7;
/// The newest minor version we speak: 7.31 (Linux 5.4) has every field we use; the kernel
/// speaks the lower of its own and this one.
pub const MINOR: u32 = 31;
/// The oldest minor version we accept: 7.28 brought `max_pages`, which sizes our reads.
pub const OLDEST_MINOR: u32 = 28;

/// The biggest request we read: the kernel refuses a read into a buffer smaller than 8 KiB or
/// than a write request's (we accept none: the mount is read-only); names are at most 4 KiB.
pub const REQUEST_BUFFER: usize = 64 * 1024;
/// What we tell the kernel a write may carry: the least it takes; nothing is ever written.
const MAX_WRITE: u32 = 4096;
/// The most pages one read may ask for (256 × 4 KiB = 1 MiB, the kernel's default limit).
const MAX_PAGES: u16 = 256;
/// Requests the kernel may keep outstanding in the background (readahead).
const MAX_BACKGROUND: u16 = 16;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// Opcodes (`enum fuse_opcode`).
mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
}

/// `FUSE_ASYNC_READ`: reads of one file may arrive side by side.
const ASYNC_READ: u32 = 1 << 0;
/// `FUSE_BIG_WRITES`: asked as the FUSE library the driver used before did, so the kernel
/// behaves as it did then.
const BIG_WRITES: u32 = 1 << 5;
/// `FUSE_MAX_PAGES`: `max_pages` in our answer counts.
const MAX_PAGES_FLAG: u32 = 1 << 22;

/// `FOPEN_DIRECT_IO`: reads of this handle bypass the page cache.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// `FOPEN_KEEP_CACHE`: the file's pages cached before this open stay.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// `FOPEN_NOFLUSH`: no flush on close (nothing is ever written).
pub const FOPEN_NOFLUSH: u32 = 1 << 5;

/// `FUSE_NOTIFY_INVAL_INODE`.
const NOTIFY_INVAL_INODE: i32 = 2;

/// `FUSE_NOTIFY_STORE`.
const NOTIFY_STORE: i32 = 4;

/// What the kernel and we agreed on at `INIT`: kept, and handed to a successor, because the
/// kernel sends `INIT` once per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Negotiated {
    /// The minor version both speak.
    pub minor: u32,
}

/// The kernel's side of the handshake (`struct fuse_init_in`, its first four fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Init {
    /// The kernel's major version.
    pub major: u32,
    /// The kernel's minor version.
    pub minor: u32,
    /// The most the kernel reads ahead.
    pub max_readahead: u32,
    /// What the kernel can do (`FUSE_*` init flags).
    pub flags: u32,
}

/// Why a request could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its header or than its own length says.
    #[error("a FUSE request of {0} bytes is cut short")]
    Short(usize),
    /// The kernel's version is one we do not speak.
    #[error("the kernel speaks FUSE {0}.{1}; the driver needs 7.{OLDEST_MINOR} or newer")]
    Version(u32, u32),
}

/// Who asks, and about what (`struct fuse_in_header`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The request's id, which its reply carries.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
}

/// The operations a read-only filesystem is sent and answers; every other is [`Operation::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation<'a> {
    /// The handshake.
    Init(Init),
    /// A name in the directory `nodeid`.
    Lookup {
        /// The name, without its NUL.
        name: &'a [u8],
    },
    /// The kernel forgets names (`FORGET`, `BATCH_FORGET`): never answered.
    Forget,
    /// The attributes of `nodeid`.
    Getattr,
    /// Opens `nodeid`.
    Open {
        /// The `open(2)` flags.
        flags: u32,
    },
    /// Reads an open file.
    Read {
        /// The handle.
        fh: u64,
        /// Where to start.
        offset: u64,
        /// How many bytes at most.
        size: u32,
    },
    /// Closes a file's handle.
    Release {
        /// The handle.
        fh: u64,
    },
    /// Opens the directory `nodeid`.
    Opendir,
    /// Lists the directory `nodeid`.
    Readdir {
        /// The entry to start from (the offset the previous answer's last entry gave).
        offset: u64,
        /// How many bytes of entries at most.
        size: u32,
    },
    /// Closes a directory handle.
    Releasedir,
    /// The filesystem's totals.
    Statfs,
    /// The kernel asks to interrupt a request: never answered (the request still is).
    Interrupt,
    /// The connection ends.
    Destroy,
    /// Anything else, by its opcode.
    Other(u32),
}

/// One request read from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// Its header.
    pub header: Header,
    /// What it asks.
    pub operation: Operation<'a>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Reads one request as the device returned it.
pub fn parse(bytes: &[u8]) -> Result<Request<'_>, WireError> {
    let short = || WireError::Short(bytes.len());
    let length = u32_at(bytes, 0).ok_or_else(short)? as usize;
    if length < IN_HEADER || length > bytes.len() {
        return Err(short());
    }
    let bytes = &bytes[..length];
    let code = u32_at(bytes, 4).ok_or_else(short)?;
    let header = Header { unique: u64_at(bytes, 8).ok_or_else(short)?, nodeid: u64_at(bytes, 16).ok_or_else(short)? };
    let body = &bytes[IN_HEADER..];
    let word = |at| u32_at(body, at).ok_or_else(short);
    let long = |at| u64_at(body, at).ok_or_else(short);
    let operation = match code {
        opcode::INIT => {
            Operation::Init(Init { major: word(0)?, minor: word(4)?, max_readahead: word(8)?, flags: word(12)? })
        }
        opcode::LOOKUP => {
            // The name, NUL-terminated.
            let name = body.split(|&b| b == 0).next().unwrap_or_default();
            Operation::Lookup { name }
        }
        opcode::FORGET | opcode::BATCH_FORGET => Operation::Forget,
        opcode::GETATTR => Operation::Getattr,
        opcode::OPEN => Operation::Open { flags: word(0)? },
        opcode::READ => Operation::Read { fh: long(0)?, offset: long(8)?, size: word(16)? },
        opcode::RELEASE => Operation::Release { fh: long(0)? },
        opcode::OPENDIR => Operation::Opendir,
        opcode::READDIR => Operation::Readdir { offset: long(8)?, size: word(16)? },
        opcode::RELEASEDIR => Operation::Releasedir,
        opcode::STATFS => Operation::Statfs,
        opcode::INTERRUPT => Operation::Interrupt,
        opcode::DESTROY => Operation::Destroy,
        other => Operation::Other(other),
    };
    Ok(Request { header, operation })
}

/// A reply of `body` to request `unique` (`struct fuse_out_header` before it).
fn reply(unique: u64, error: i32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUT_HEADER + body.len());
    out.extend_from_slice(&((OUT_HEADER + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&error.to_le_bytes());
    out.extend_from_slice(&unique.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The answer to `INIT`, and what was agreed; an error when the kernel's version is not one we
/// speak (the kernel is told so, and ends the connection).
pub fn init_reply(unique: u64, init: &Init) -> (Vec<u8>, Result<Negotiated, WireError>) {
    let Init { major, minor, max_readahead, flags } = *init;
    if major != MAJOR || minor < OLDEST_MINOR {
        return (error(unique, nix::libc::EPROTO), Err(WireError::Version(major, minor)));
    }
    let minor = minor.min(MINOR);
    let wanted = ASYNC_READ | BIG_WRITES | MAX_PAGES_FLAG;
    let mut body = Vec::with_capacity(64);
    body.extend_from_slice(&MAJOR.to_le_bytes());
    body.extend_from_slice(&minor.to_le_bytes());
    body.extend_from_slice(&max_readahead.to_le_bytes());
    body.extend_from_slice(&(flags & wanted).to_le_bytes());
    body.extend_from_slice(&MAX_BACKGROUND.to_le_bytes());
    // Congestion at three quarters of the background requests, the kernel's own default.
    body.extend_from_slice(&(MAX_BACKGROUND * 3 / 4).to_le_bytes());
    body.extend_from_slice(&MAX_WRITE.to_le_bytes());
    // Times to the nanosecond.
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&MAX_PAGES.to_le_bytes());
    body.resize(64, 0);
    (reply(unique, 0, &body), Ok(Negotiated { minor }))
}

/// A failed request: `errno` (positive, as `nix::libc` names them).
pub fn error(unique: u64, errno: i32) -> Vec<u8> {
    reply(unique, -errno, &[])
}

/// A request done, with nothing to say.
pub fn empty(unique: u64) -> Vec<u8> {
    reply(unique, 0, &[])
}

/// The kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Directory,
    /// A regular file.
    File,
}

impl Kind {
    /// Its `S_IFMT` bits.
    fn mode(self) -> u32 {
        match self {
            Kind::Directory => nix::libc::S_IFDIR,
            Kind::File => nix::libc::S_IFREG,
        }
    }
}

/// An inode's attributes (`struct fuse_attr`), as much of them as a read-only filesystem has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Its inode number.
    pub ino: u64,
    /// Its size in bytes.
    pub size: u64,
    /// When it was made, changed and read: one time for all three.
    pub time: SystemTime,
    /// What it is.
    pub kind: Kind,
    /// Its permission bits.
    pub perm: u32,
    /// Its link count.
    pub nlink: u32,
    /// Its owner.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
}

fn seconds_and_nanos(duration: Duration) -> (u64, u32) {
    (duration.as_secs(), duration.subsec_nanos())
}

fn push_attr(out: &mut Vec<u8>, attr: &Attr) {
    let (seconds, nanos) = seconds_and_nanos(attr.time.duration_since(UNIX_EPOCH).unwrap_or_default());
    for value in [attr.ino, attr.size, attr.size.div_ceil(512), seconds, seconds, seconds] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    let mode = attr.kind.mode() | (attr.perm & 0o7777);
    // atime, mtime, ctime nanoseconds; mode; nlink; uid; gid; rdev; blksize; flags.
    for value in [nanos, nanos, nanos, mode, attr.nlink, attr.uid, attr.gid, 0, 4096, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// The answer to `LOOKUP` (`struct fuse_entry_out`): the entry, kept by the kernel for
/// `entry_ttl`, its attributes for `attr_ttl`.
pub fn entry(unique: u64, attr: &Attr, attr_ttl: Duration, entry_ttl: Duration) -> Vec<u8> {
    let (entry_seconds, entry_nanos) = seconds_and_nanos(entry_ttl);
    let (attr_seconds, attr_nanos) = seconds_and_nanos(attr_ttl);
    let mut body = Vec::with_capacity(128);
    // nodeid, generation (never reused: 0), entry_valid, attr_valid.
    for value in [attr.ino, 0, entry_seconds, attr_seconds] {
        body.extend_from_slice(&value.to_le_bytes());
    }
    body.extend_from_slice(&entry_nanos.to_le_bytes());
    body.extend_from_slice(&attr_nanos.to_le_bytes());
    push_attr(&mut body, attr);
    reply(unique, 0, &body)
}

/// The answer to `GETATTR` (`struct fuse_attr_out`), kept by the kernel for `ttl`.
pub fn attr(unique: u64, attr: &Attr, ttl: Duration) -> Vec<u8> {
    let (seconds, nanos) = seconds_and_nanos(ttl);
    let mut body = Vec::with_capacity(104);
    body.extend_from_slice(&seconds.to_le_bytes());
    body.extend_from_slice(&nanos.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    push_attr(&mut body, attr);
    reply(unique, 0, &body)
}

/// The answer to `OPEN` or `OPENDIR` (`struct fuse_open_out`): the handle and `FOPEN_*` flags.
pub fn opened(unique: u64, fh: u64, flags: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(16);
    body.extend_from_slice(&fh.to_le_bytes());
    body.extend_from_slice(&flags.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    reply(unique, 0, &body)
}

/// The answer to `READ`: the bytes read.
pub fn data(unique: u64, bytes: &[u8]) -> Vec<u8> {
    reply(unique, 0, bytes)
}

/// The answer to `STATFS` (`struct fuse_kstatfs`): no blocks, no free inodes, names up to 255
/// bytes: a filesystem nothing can be written to.
pub fn statfs(unique: u64) -> Vec<u8> {
    let mut body = vec![0u8; 80];
    body[40..44].copy_from_slice(&512u32.to_le_bytes());
    body[44..48].copy_from_slice(&255u32.to_le_bytes());
    reply(unique, 0, &body)
}

/// The entries of a `READDIR` answer (`struct fuse_dirent` each, 8-byte aligned), at most the
/// size the kernel asked for.
#[derive(Debug)]
pub struct Entries {
    body: Vec<u8>,
    limit: usize,
}

impl Entries {
    /// An empty answer of at most `size` bytes.
    pub fn new(size: u32) -> Entries {
        Entries { body: Vec::new(), limit: size as usize }
    }

    /// Adds an entry whose next one is at `offset`; false, adding nothing, when it does not fit.
    pub fn add(&mut self, ino: u64, offset: u64, kind: Kind, name: &[u8]) -> bool {
        let length = (24 + name.len()).next_multiple_of(8);
        if self.body.len() + length > self.limit {
            return false;
        }
        self.body.extend_from_slice(&ino.to_le_bytes());
        self.body.extend_from_slice(&offset.to_le_bytes());
        self.body.extend_from_slice(&(name.len() as u32).to_le_bytes());
        self.body.extend_from_slice(&(kind.mode() >> 12).to_le_bytes());
        self.body.extend_from_slice(name);
        self.body.resize(self.body.len().next_multiple_of(8), 0);
        true
    }

    /// The answer to request `unique`.
    pub fn reply(&self, unique: u64) -> Vec<u8> {
        reply(unique, 0, &self.body)
    }
}

/// A notification that the kernel drop its cached attributes of inode `ino` and its pages
/// from `offset` for `length` bytes (`-1`: to the end; `0` with offset 0: every page).
pub fn inval_inode(ino: u64, offset: i64, length: i64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(&ino.to_le_bytes());
    body.extend_from_slice(&offset.to_le_bytes());
    body.extend_from_slice(&length.to_le_bytes());
    // A notification is a reply to no request (unique 0), its code where a reply's error is.
    reply(0, NOTIFY_INVAL_INODE, &body)
}

/// A notification that the kernel store `data` in inode `ino`'s page cache from offset 0, the
/// size it holds of the file growing to cover it (`fuse_notify_store_out`: node id, offset,
/// size, padding, then the data). `None` for data past what one notification can say (4 GiB).
pub fn store(ino: u64, data: &[u8]) -> Option<Vec<u8>> {
    let size = u32::try_from(data.len()).ok()?;
    let mut body = Vec::with_capacity(24 + data.len());
    body.extend_from_slice(&ino.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&size.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(data);
    Some(reply(0, NOTIFY_STORE, &body))
}

#[cfg(test)]
mod tests;
