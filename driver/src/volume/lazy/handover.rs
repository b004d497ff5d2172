//! The node passed from one driver process to its successor over a unix socket: its lazy
//! volumes and (from protocol version 2) its listening sockets. One frame per volume: an 8-byte
//! little-endian length sent together with the volume's FUSE descriptor (SCM_RIGHTS: the kernel
//! gives the receiver its own descriptor of the same connection), then that many bytes of JSON
//! naming the volume and its state; a frame of length 0 with no descriptor ends the handover.
//! One descriptor per frame keeps every message far below the kernel's limit on descriptors per
//! message, however many volumes a node serves.
//!
//! **Versions.** The successor's first word says which version it speaks; every word of version
//! 1 is answered as version 1 answered it, so a driver of either version hands over to one of
//! the other (an upgrade, and a rollback).
//! - Version 1 (`IGH1ASK_`): the volumes only. The successor binds its own sockets and renames
//!   them over the predecessor's, which kubelet's plugin watcher sees as a new plugin: it
//!   deregisters the driver and registers it again (about a second without it in CSINode).
//! - Version 2 (`IGH2ASK_`): after the volumes, each socket the predecessor listens on (the CSI
//!   socket, kubelet's registration socket) travels as a frame `IGH2SOCK` carrying the
//!   listening descriptor, then an 8-byte little-endian length and the socket's path. The
//!   successor accepts on the very socket kubelet registered: no file changes, kubelet never
//!   deregisters, and connections made while neither process accepts wait in its backlog.
//!   A version-1 predecessor closes the connection at a word it does not know, before pausing
//!   anything; the successor then asks again in version 1.

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Read as _, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use crate::content::lazy::HandedFiles;
use crate::quote::quote;
use crate::volume::error::{Error, Result};
use crate::volume::lazy::filesystem::{HandedLazyVolume, LazyMount};

/// The most bytes of JSON one volume's frame may hold on a node whose volumes are at most
/// `tmpfs_size` bytes: its files' contents travel in it, and a lazy volume holds at most
/// tmpfsSize of them, base64 in the JSON (4 bytes for 3) beside their names and numbers; so
/// twice tmpfsSize, and never under 256 MiB. Anything beyond is refused rather than read into
/// memory (a successor configured with a smaller tmpfsSize than its predecessor may refuse the
/// handover: the predecessor then serves on).
pub fn frame_bound(tmpfs_size: u64) -> u64 {
    const FLOOR: u64 = 256 << 20;
    FLOOR.max(tmpfs_size.saturating_mul(2))
}

/// One lazy volume as it travels, its descriptor apart: what its mount's kernel side holds and
/// what its files are made of.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HandedVolume {
    /// The volume's id.
    pub volume_id: String,
    /// What the kernel holds of its mount.
    pub mount: HandedLazyVolume,
    /// What its files are made of.
    pub files: HandedFiles,
}

/// A listening socket as it travels: where its file is, and the listening descriptor.
#[derive(Debug)]
pub struct ListeningSocket {
    /// The socket file's path (what kubelet dials).
    pub path: PathBuf,
    /// The listening socket itself.
    pub listener: OwnedFd,
}

/// The longest path a unix socket may have (`sun_path`, its NUL excluded).
pub const SOCKET_PATH_MAX: u64 = 107;

/// What the two processes say besides the volumes, one 8-byte word each: the successor asks,
/// the predecessor sends every volume and the end, the successor says it has taken them (or
/// refuses them), and the predecessor, once it has let go of the node (its lock released, its
/// sockets no longer served), says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// "Hand me your lazy volumes." (version 1)
    Ask,
    /// "Hand me your lazy volumes and your listening sockets." (version 2)
    AskWithSockets,
    /// "I serve them from now on."
    Taken,
    /// "I cannot serve them: keep them."
    Refused,
    /// "The node is yours."
    LetGo,
    /// "I wrote the file you named into the state directory" (the successor's proof).
    Proved,
}

const WORDS: [(Word, &[u8; 8]); 6] = [
    (Word::Ask, b"IGH1ASK_"),
    (Word::AskWithSockets, b"IGH2ASK_"),
    (Word::Taken, b"IGH1TAKE"),
    (Word::Refused, b"IGH1NOPE"),
    (Word::LetGo, b"IGH1GONE"),
    (Word::Proved, b"IGH1PRVD"),
];

/// What the predecessor says, in place of a frame, before it hands anything: "write the file
/// named by the 32 hex digits that follow into the state directory". Only a process that may
/// write the driver's state directory can answer it (a pod with that directory mounted
/// read-only cannot), and the file's owner is checked too.
pub const PROVE: &[u8; 8] = b"IGH1PROV";
/// What starts a listening socket's frame (version 2), sent with its descriptor.
pub const SOCKET: &[u8; 8] = b"IGH2SOCK";
/// The proof file's name in the state directory, before the challenge's hex digits.
pub const PROOF_PREFIX: &str = ".handover-proof-";
/// How many hex digits a challenge holds (128 random bits).
pub const CHALLENGE_DIGITS: usize = 32;

/// What the successor receives after it asked.
#[derive(Debug)]
pub enum Frame {
    /// A volume and its connection.
    Volume(Box<HandedVolume>, OwnedFd),
    /// Every volume was sent.
    End,
    /// The predecessor asks for the proof named by this challenge (hex digits) first.
    Prove(String),
    /// A socket the predecessor listens on (version 2).
    Socket(ListeningSocket),
}

/// Says `word`.
pub fn say(mut socket: &UnixStream, word: Word) -> Result<()> {
    let bytes = WORDS.iter().find(|(known, _)| *known == word).map(|(_, bytes)| *bytes).unwrap_or(b"IGH1NOPE");
    socket.write_all(bytes).map_err(|error| failed(&format!("saying {word:?}"), error))
}

/// The next word said; an error naming what was expected when it is none of them (or the
/// socket closed, or its read timeout passed).
pub fn hear(mut socket: &UnixStream, expected: &str) -> Result<Word> {
    let mut bytes = [0u8; 8];
    socket.read_exact(&mut bytes).map_err(|error| failed(&format!("waiting for {expected}"), error))?;
    WORDS
        .iter()
        .find(|(_, known)| **known == bytes)
        .map(|(word, _)| *word)
        .ok_or_else(|| failed(&format!("waiting for {expected}"), "the other side said something else"))
}

fn failed(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Handover(format!("the handover of lazy volumes: {what}: {error}"))
}

/// Sends `volume` and its connection `device`, in a frame of at most `bound` bytes.
pub fn send(socket: &UnixStream, volume: &HandedVolume, device: BorrowedFd, bound: u64) -> Result<()> {
    let json = serde_json::to_vec(volume).map_err(|error| failed("encoding a volume", error))?;
    if json.len() as u64 > bound {
        return Err(Error::Handover(format!(
            "the handover of lazy volumes: volume {} holds {} bytes of state, more than {bound}",
            quote(&volume.volume_id),
            json.len()
        )));
    }
    send_header(socket, (json.len() as u64).to_le_bytes(), Some(device))?;
    let mut writer = socket;
    writer.write_all(&json).map_err(|error| failed("sending a volume", error))
}

/// Sends the listening socket `listening` (version 2).
pub fn send_socket(socket: &UnixStream, listening: &ListeningSocket) -> Result<()> {
    let path = listening.path.as_os_str().as_bytes();
    if path.len() as u64 > SOCKET_PATH_MAX {
        return Err(failed("sending a socket", format!("its path is {} bytes, more than a socket's", path.len())));
    }
    send_header(socket, *SOCKET, Some(listening.listener.as_fd()))?;
    let mut frame = (path.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(path);
    let mut writer = socket;
    writer.write_all(&frame).map_err(|error| failed("sending a socket", error))
}

/// Asks the successor to prove it may write the state directory: the file named by `challenge`.
pub fn send_challenge(mut socket: &UnixStream, challenge: &str) -> Result<()> {
    let mut bytes = PROVE.to_vec();
    bytes.extend_from_slice(challenge.as_bytes());
    socket.write_all(&bytes).map_err(|error| failed("asking for a proof", error))
}

/// Says that every volume was sent.
pub fn send_end(socket: &UnixStream) -> Result<()> {
    send_header(socket, 0u64.to_le_bytes(), None)
}

/// Sends a frame's first 8 bytes, with `device` alongside when given.
fn send_header(socket: &UnixStream, header: [u8; 8], device: Option<BorrowedFd>) -> Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let devices = device.as_slice();
    if !devices.is_empty() && !control.push(SendAncillaryMessage::ScmRights(devices)) {
        return Err(failed("sending a descriptor", "no room for it in the message"));
    }
    let sent = rustix::net::sendmsg(socket.as_fd(), &[IoSlice::new(&header)], &mut control, SendFlags::empty())
        .map_err(|error| failed("sending a frame's length", error))?;
    // The descriptor went with the first byte; the rest of the length follows as plain bytes.
    let mut writer = socket;
    writer.write_all(&header[sent..]).map_err(|error| failed("sending a frame's length", error))
}

/// The next volume sent and its connection; `None` once the sender said every volume was sent.
/// Anything else (the socket closed early, a frame without its descriptor or with more, a frame
/// of more than `bound` bytes, JSON that is not a volume) is an error naming what is wrong,
/// quoting none of the frame (it holds file contents).
pub fn receive(socket: &UnixStream, bound: u64) -> Result<Option<(HandedVolume, OwnedFd)>> {
    match receive_frame(socket, bound)? {
        Frame::Volume(volume, device) => Ok(Some((*volume, device))),
        Frame::End => Ok(None),
        Frame::Prove(_) => Err(failed("receiving a frame", "a proof was asked for where a volume was expected")),
        Frame::Socket(_) => Err(failed("receiving a frame", "a socket came where a volume was expected")),
    }
}

/// The next frame: a volume and its connection, a listening socket, the end, or (before any
/// volume) a challenge. Errors as [`receive`].
pub fn receive_frame(socket: &UnixStream, bound: u64) -> Result<Frame> {
    let mut header = [0u8; 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket.as_fd(),
        &mut [IoSliceMut::new(&mut header)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|error| failed("receiving a frame's length", error))?;
    let mut devices: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            devices.extend(fds);
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(failed("receiving a frame", "it carried more descriptors than one"));
    }
    if received.bytes == 0 {
        return Err(failed("receiving a frame", "the sender closed the socket before the end"));
    }
    let mut reader = socket;
    reader.read_exact(&mut header[received.bytes..]).map_err(|error| failed("receiving a frame's length", error))?;
    if header == *PROVE && devices.is_empty() {
        let mut challenge = [0u8; CHALLENGE_DIGITS];
        reader.read_exact(&mut challenge).map_err(|error| failed("receiving a challenge", error))?;
        return match std::str::from_utf8(&challenge) {
            Ok(hex) if hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) => {
                Ok(Frame::Prove(hex.to_string()))
            }
            _ => Err(failed("receiving a challenge", "it is not lowercase hex digits")),
        };
    }
    if header == *SOCKET {
        return receive_socket(socket, devices).map(Frame::Socket);
    }
    let length = u64::from_le_bytes(header);
    match (length, devices.len()) {
        (0, 0) => return Ok(Frame::End),
        (0, _) => return Err(failed("receiving the end", "it carried a descriptor")),
        (_, 1) => {}
        (_, count) => return Err(failed("receiving a frame", format!("it carried {count} descriptors, not one"))),
    }
    if length > bound {
        return Err(failed("receiving a frame", format!("it holds {length} bytes, more than {bound}")));
    }
    let mut json = vec![0u8; length as usize];
    reader.read_exact(&mut json).map_err(|error| failed("receiving a frame", error))?;
    let volume: HandedVolume = serde_json::from_slice(&json).map_err(|error| {
        failed("reading a frame", format!("not a volume's state (line {}, column {})", error.line(), error.column()))
    })?;
    devices
        .pop()
        .map(|device| Frame::Volume(Box::new(volume), device))
        .ok_or_else(|| failed("receiving a frame", "its descriptor was lost"))
}

/// The rest of a listening socket's frame, whose start came with `devices`: its path.
fn receive_socket(mut socket: &UnixStream, mut devices: Vec<OwnedFd>) -> Result<ListeningSocket> {
    if devices.len() != 1 {
        return Err(failed("receiving a socket", format!("it carried {} descriptors, not one", devices.len())));
    }
    let mut length = [0u8; 8];
    socket.read_exact(&mut length).map_err(|error| failed("receiving a socket's path", error))?;
    let length = u64::from_le_bytes(length);
    if length == 0 || length > SOCKET_PATH_MAX {
        return Err(failed("receiving a socket", format!("its path is {length} bytes, not 1 to {SOCKET_PATH_MAX}")));
    }
    let mut path = vec![0u8; length as usize];
    socket.read_exact(&mut path).map_err(|error| failed("receiving a socket's path", error))?;
    let path = PathBuf::from(OsString::from_vec(path));
    if !path.is_absolute() {
        return Err(failed("receiving a socket", "its path is not absolute"));
    }
    let listener = devices.pop().ok_or_else(|| failed("receiving a socket", "its descriptor was lost"))?;
    Ok(ListeningSocket { path, listener })
}

/// The handed socket listening at `path`, taken out of `sockets`.
pub fn take_socket(sockets: &mut Vec<ListeningSocket>, path: &Path) -> Option<ListeningSocket> {
    let at = sockets.iter().position(|socket| socket.path == path)?;
    Some(sockets.swap_remove(at))
}

/// The offer socket's name in the state directory.
pub const SOCKET_FILE: &str = "handover.sock";

/// How long one read or write of the handover may wait for the other side: the predecessor
/// pauses each volume (at most its own bound on answers owed) and stops its sockets between
/// two of them.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// What hands lazy volumes over: the node service, which the offer reaches only through this,
/// so that the service can take a predecessor's volumes (`take`) without the two depending on
/// each other.
pub trait HandsOverLazy: Send + Sync {
    /// Runs `hand` over every live lazy volume, with every other operation on the node held off
    /// from then on; when `hand` fails, the volumes stay this driver's and operations resume.
    fn hand_over_lazy(&self, hand: HandOver<'_>) -> Result<()>;
}

/// What hands each of the node's lazy volumes (its id and mount) to a successor.
pub type HandOver<'a> = Box<dyn FnOnce(&mut Vec<(String, LazyMount)>) -> Result<()> + 'a>;

pub mod offer;
pub mod take;

#[cfg(test)]
pub(crate) mod tests;
