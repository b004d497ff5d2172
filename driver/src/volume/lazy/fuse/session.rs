//! One FUSE connection served by the driver: a thread of its own reads the kernel's requests one
//! at a time and hands each to the [`Filesystem`] with a [`Reply`] that answers it exactly once
//! (from that thread or, later, from any other). Reading stops only between two requests: a
//! request read is always answered, and [`Serving::pause`] stops the reading, then waits for the
//! answers still owed, so whoever reads the connection next finds every request it has not been
//! answered still queued in the kernel.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tracing::warn;

use super::wire::{self, Attr, Entries, Negotiated, Operation};
use crate::unpoisoned::UnpoisonedMutex;

/// The connection's `/dev/fuse` descriptor: every reply and notification is one write to it.
#[derive(Clone)]
pub struct Device(Arc<OwnedFd>);

impl Device {
    fn send(&self, bytes: &[u8]) -> nix::Result<()> {
        // One write per message: the kernel takes a reply whole or not at all.
        nix::unistd::write(self.0.as_fd(), bytes).map(drop)
    }

    /// Tells the kernel to drop its cached attributes and pages of inode `ino`; an error when
    /// it cannot (ENOENT: it holds nothing of it).
    pub fn invalidate_inode(&self, ino: u64) -> std::io::Result<()> {
        self.send(&wire::inval_inode(ino, 0, 0)).map_err(std::io::Error::from)
    }

    /// Puts `data` in the kernel's page cache of inode `ino`, the size it holds of the file
    /// set to cover it: readers it serves from there without asking (`sendfile(2)` and
    /// `splice(2)` never ask for a newer size) see the whole content.
    pub fn store(&self, ino: u64, data: &[u8]) -> std::io::Result<()> {
        let message = wire::store(ino, data).ok_or_else(|| std::io::Error::other("content past 4 GiB"))?;
        self.send(&message).map_err(std::io::Error::from)
    }
}

/// The requests a read-only filesystem answers itself; the session answers the rest.
pub trait Filesystem: Send + Sync + 'static {
    /// `name` in the directory `parent`.
    fn lookup(&self, parent: u64, name: &OsStr, reply: Reply);
    /// The attributes of `ino`.
    fn getattr(&self, ino: u64, reply: Reply);
    /// Opens `ino` with these `open(2)` flags.
    fn open(&self, ino: u64, flags: u32, reply: Reply);
    /// Reads `size` bytes at `offset` of the handle `fh`.
    fn read(&self, fh: u64, offset: u64, size: u32, reply: Reply);
    /// Closes the handle `fh`.
    fn release(&self, fh: u64, reply: Reply);
    /// Lists the directory `ino` from entry `offset` into `entries`.
    fn readdir(&self, ino: u64, offset: u64, entries: Entries, reply: Reply);
}

/// How many answers are owed: a reply counts from the moment its request is read until it is
/// sent (or dropped, which answers EIO).
#[derive(Default)]
struct Owed {
    count: Mutex<usize>,
    settled: Condvar,
}

impl Owed {
    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.count.locked()
    }

    /// Waits until nothing is owed, at most `within`; whether nothing is.
    fn wait_settled(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut count = self.lock();
        while *count > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = self.settled.wait_timeout(count, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }
}

/// The answer owed to one request. Answering consumes it; dropping it unanswered answers EIO,
/// so no caller in the container waits for ever on a request the driver lost track of.
pub struct Reply {
    unique: u64,
    device: Device,
    owed: Arc<Owed>,
    answered: bool,
}

impl Reply {
    fn new(unique: u64, device: Device, owed: Arc<Owed>) -> Reply {
        *owed.lock() += 1;
        Reply { unique, device, owed, answered: false }
    }

    fn send(mut self, bytes: &[u8]) {
        self.answered = true;
        // ENOENT: the request was interrupted and the kernel no longer waits for it.
        if let Err(error) = self.device.send(bytes)
            && error != Errno::ENOENT
        {
            warn!(problem = %error, "a FUSE reply could not be written");
        }
    }

    /// Fails the request with `errno`.
    pub fn error(self, errno: Errno) {
        let unique = self.unique;
        self.send(&wire::error(unique, errno as i32));
    }

    /// Answers a lookup: `attr`, kept for `attr_ttl`, the name for `entry_ttl`.
    pub fn entry(self, attr: &Attr, attr_ttl: Duration, entry_ttl: Duration) {
        let unique = self.unique;
        self.send(&wire::entry(unique, attr, attr_ttl, entry_ttl));
    }

    /// Answers a getattr: `attr`, kept for `ttl`.
    pub fn attr(self, attr: &Attr, ttl: Duration) {
        let unique = self.unique;
        self.send(&wire::attr(unique, attr, ttl));
    }

    /// Answers an open: the handle `fh` and its `FOPEN_*` flags.
    pub fn opened(self, fh: u64, flags: u32) {
        let unique = self.unique;
        self.send(&wire::opened(unique, fh, flags));
    }

    /// Answers a read with `bytes`.
    pub fn data(self, bytes: &[u8]) {
        let unique = self.unique;
        self.send(&wire::data(unique, bytes));
    }

    /// Answers a readdir with `entries`.
    pub fn entries(self, entries: &Entries) {
        let unique = self.unique;
        self.send(&entries.reply(unique));
    }

    /// Answers with nothing to say.
    pub fn ok(self) {
        let unique = self.unique;
        self.send(&wire::empty(unique));
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.answered
            && let Err(error) = self.device.send(&wire::error(self.unique, Errno::EIO as i32))
            && error != Errno::ENOENT
        {
            warn!(problem = %error, "a FUSE reply could not be written");
        }
        let mut count = self.owed.lock();
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.owed.settled.notify_all();
        }
    }
}

/// Why a connection could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The device could not be read, written or waited on.
    #[error("{0}")]
    Device(#[from] Errno),
    /// The kernel's handshake was not one we speak.
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    /// The kernel's first request was not the handshake.
    #[error("the kernel's first FUSE request was not INIT")]
    NoInit,
    /// The serving thread could not be started.
    #[error("starting the thread that serves a FUSE connection: {0}")]
    Thread(std::io::Error),
    /// Answers were still owed when the time to wait for them ran out.
    #[error("{0} FUSE answers were still owed after {1:?}")]
    Owed(usize, Duration),
}

/// A connection being served; dropping it stops the reading at the next request boundary.
pub struct Serving {
    device: Device,
    negotiated: Negotiated,
    owed: Arc<Owed>,
    /// Closing it (dropping) wakes the reader, which then stops.
    stop: Option<OwnedFd>,
    reader: Option<JoinHandle<()>>,
}

/// A connection no one reads: its device and what was agreed at its handshake, ready to be
/// served (here, or by a successor it is handed to) once [`Paused::settle`] says no answer to
/// a request read before is still owed.
pub struct Paused {
    /// The `/dev/fuse` descriptor.
    pub device: Device,
    /// What the kernel and the driver agreed at `INIT`.
    pub negotiated: Negotiated,
    owed: Arc<Owed>,
}

impl Paused {
    /// A connection another process served and handed over: its `/dev/fuse` descriptor and
    /// what was agreed at its handshake there, no answer owed here.
    pub fn handed(device: OwnedFd, negotiated: Negotiated) -> Paused {
        Paused { device: Device(Arc::new(device)), negotiated, owed: Arc::default() }
    }

    /// A descriptor of the connection of its own, to hand over.
    pub fn duplicate(&self) -> std::io::Result<OwnedFd> {
        self.device.0.as_fd().try_clone_to_owned()
    }

    /// Waits at most `within` for the answers still owed to requests read before the pause
    /// (an open waiting on its helper): then no request is read and unanswered.
    pub fn settle(&self, within: Duration) -> Result<(), SessionError> {
        match self.owed.wait_settled(within) {
            true => Ok(()),
            false => Err(SessionError::Owed(*self.owed.lock(), within)),
        }
    }
}

/// Answers the kernel's handshake on `device`, a FUSE mount just made: the connection, ready
/// to be served.
pub fn handshake(device: OwnedFd) -> Result<Paused, SessionError> {
    let mut buffer = vec![0u8; wire::REQUEST_BUFFER];
    // The descriptor is still blocking here: the kernel sends INIT as the mount is made.
    let length = loop {
        match read_request(&device, &mut buffer)? {
            Read::Request(length) => break length,
            Read::Nothing => continue,
            Read::Gone => return Err(SessionError::Device(Errno::ENODEV)),
        }
    };
    let request = wire::parse(&buffer[..length])?;
    let Operation::Init(init) = request.operation else {
        let _ = nix::unistd::write(device.as_fd(), &wire::error(request.header.unique, Errno::EIO as i32));
        return Err(SessionError::NoInit);
    };
    let (answer, agreed) = wire::init_reply(request.header.unique, &init);
    nix::unistd::write(device.as_fd(), &answer)?;
    Ok(Paused { device: Device(Arc::new(device)), negotiated: agreed?, owed: Arc::default() })
}

impl Serving {
    /// Serves `filesystem` on a connection whose handshake was made before (by this process or
    /// the one that handed it over), on a thread named `name`.
    pub fn resume<F: Filesystem>(paused: Paused, filesystem: Arc<F>, name: &str) -> Result<Serving, SessionError> {
        let Paused { device, negotiated, owed } = paused;
        // Non-blocking, so the reader never sits in a read a stop cannot end (a request the
        // kernel withdraws between the wake-up and the read would leave it there). The flag
        // belongs to the open file, which a successor shares: it reads the same way.
        let flags =
            nix::fcntl::OFlag::from_bits_truncate(nix::fcntl::fcntl(device.0.as_fd(), nix::fcntl::FcntlArg::F_GETFL)?);
        nix::fcntl::fcntl(device.0.as_fd(), nix::fcntl::FcntlArg::F_SETFL(flags | nix::fcntl::OFlag::O_NONBLOCK))?;
        let (stopped, stop) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let reader = {
            let (device, owed) = (device.clone(), owed.clone());
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || serve(&device, &stopped, &*filesystem, &owed))
                .map_err(SessionError::Thread)?
        };
        Ok(Serving { device, negotiated, owed, stop: Some(stop), reader: Some(reader) })
    }

    /// Stops reading at the next request boundary: the connection stays mounted, and requests
    /// the kernel sends from now on wait in its queue for the next reader. Answers to requests
    /// read before may still be owed: see [`Paused::settle`].
    pub fn pause(mut self) -> Paused {
        drop(self.stop.take());
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Paused { device: self.device.clone(), negotiated: self.negotiated, owed: self.owed.clone() }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // Not joined: the reader stops at its next wake-up, and a drop must not block.
        drop(self.stop.take());
    }
}

/// What one read of the device gave.
enum Read {
    /// A request of this many bytes.
    Request(usize),
    /// Nothing to read after all (interrupted, a request the kernel withdrew meanwhile, or read
    /// by no one yet on a non-blocking descriptor): wait again.
    Nothing,
    /// The connection is gone (unmounted, or aborted).
    Gone,
}

/// Reads one request into `buffer`.
fn read_request(device: &impl AsFd, buffer: &mut [u8]) -> nix::Result<Read> {
    match nix::unistd::read(device.as_fd(), buffer) {
        Ok(length) => Ok(Read::Request(length)),
        Err(Errno::EINTR | Errno::ENOENT | Errno::EAGAIN) => Ok(Read::Nothing),
        Err(Errno::ENODEV) => Ok(Read::Gone),
        Err(error) => Err(error),
    }
}

/// The reader: waits for a request or the stop, whichever comes first, so it never holds a
/// request it will not answer.
fn serve<F: Filesystem>(device: &Device, stopped: &OwnedFd, filesystem: &F, owed: &Arc<Owed>) {
    let mut buffer = vec![0u8; wire::REQUEST_BUFFER];
    loop {
        let mut waiting =
            [PollFd::new(device.0.as_fd(), PollFlags::POLLIN), PollFd::new(stopped.as_fd(), PollFlags::POLLIN)];
        match poll(&mut waiting, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(error) => {
                warn!(problem = %error, "waiting on a FUSE connection failed; it is no longer served");
                return;
            }
        }
        if waiting[1].revents().is_some_and(|events| !events.is_empty()) {
            return;
        }
        let events = waiting[0].revents().unwrap_or(PollFlags::empty());
        if events.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL) {
            // The connection was aborted or unmounted.
            return;
        }
        if !events.contains(PollFlags::POLLIN) {
            continue;
        }
        match read_request(&device.0, &mut buffer) {
            Ok(Read::Request(length)) => dispatch(filesystem, device, owed, &buffer[..length]),
            Ok(Read::Nothing) => continue,
            Ok(Read::Gone) => return,
            Err(error) => {
                warn!(problem = %error, "reading a FUSE connection failed; it is no longer served");
                return;
            }
        }
    }
}

fn dispatch<F: Filesystem>(filesystem: &F, device: &Device, owed: &Arc<Owed>, bytes: &[u8]) {
    let request = match wire::parse(bytes) {
        Ok(request) => request,
        Err(error) => {
            warn!(problem = %error, "a FUSE request could not be read");
            if let Some(unique) = bytes.get(8..16).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes) {
                let _ = device.send(&wire::error(unique, Errno::EIO as i32));
            }
            return;
        }
    };
    let (unique, ino) = (request.header.unique, request.header.nodeid);
    let reply = || Reply::new(unique, device.clone(), owed.clone());
    match request.operation {
        // Never answered: the kernel waits for no reply to these.
        Operation::Forget | Operation::Interrupt => {}
        Operation::Lookup { name } => filesystem.lookup(ino, OsStr::from_bytes(name), reply()),
        Operation::Getattr => filesystem.getattr(ino, reply()),
        Operation::Open { flags } => filesystem.open(ino, flags, reply()),
        Operation::Read { fh, offset, size } => filesystem.read(fh, offset, size, reply()),
        Operation::Release { fh } => filesystem.release(fh, reply()),
        // Directories keep no state per open: handle 0.
        Operation::Opendir => reply().opened(0, 0),
        Operation::Readdir { offset, size } => filesystem.readdir(ino, offset, Entries::new(size), reply()),
        Operation::Releasedir | Operation::Destroy => reply().ok(),
        Operation::Statfs => {
            let reply = reply();
            let unique = reply.unique;
            reply.send(&wire::statfs(unique));
        }
        // A second handshake on one connection is the kernel's mistake, or someone else's.
        Operation::Init(_) => reply().error(Errno::EIO),
        // Everything else (writes, links, extended attributes): not implemented, which the
        // kernel remembers for the ones it may skip.
        Operation::Other(_) => reply().error(Errno::ENOSYS),
    }
}
