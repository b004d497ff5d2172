//! The successor's side of a handover: a driver that finds the state directory's lock held asks
//! the holder, on its offer socket, for its lazy volumes and its listening sockets (in version
//! 2, then in version 1 if the holder does not know it); lays each volume's files out again from
//! what travelled (no helper runs); says it has taken them only once every one could be laid
//! out (otherwise it refuses, and the predecessor resumes them all); and waits for the
//! predecessor to let go of the node before it takes the lock.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use tracing::{info, warn};

use super::{
    Frame, HandedVolume, ListeningSocket, PROOF_PREFIX, SOCKET_FILE, STEP_TIMEOUT, Word, hear, receive_frame, say,
};
use crate::content::ContentSource;
use crate::content::lazy::LazyFiles;
use crate::quote::{Logged, quote, quote_path};
use crate::volume::error::{Error, Result};
use crate::volume::lazy::filesystem::HandedLazyVolume;

/// A lazy volume taken over: what its mount's kernel side holds, its files laid out again and
/// this process's descriptor of its connection.
pub struct TakenVolume {
    /// The volume's id.
    pub volume_id: String,
    /// What the kernel holds of its mount.
    pub mount: HandedLazyVolume,
    /// Its files, laid out from what travelled.
    pub files: Arc<dyn LazyFiles>,
    /// This process's descriptor of its FUSE connection.
    pub device: OwnedFd,
}

/// The most sockets a predecessor hands over: the CSI socket and the registration socket.
const MOST_SOCKETS: usize = 2;

/// What a successor took from its predecessor.
pub struct TakenNode {
    /// The lazy volumes.
    pub volumes: Vec<TakenVolume>,
    /// The sockets the predecessor listened on (none from a version-1 predecessor).
    pub sockets: Vec<ListeningSocket>,
}

/// How one request for the node ended, short of an error.
enum Asked {
    /// Nobody offers a handover.
    NoOffer,
    /// The holder closed the connection at the request's first word, before anything else: it
    /// does not speak that version.
    NotUnderstood,
    /// The node was taken.
    Taken(TakenNode),
}

/// Writes the proof `challenge` names into `state_dir` (new, 0600): only a process that may write
/// the driver's state directory can.
fn prove(state_dir: &Path, challenge: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = state_dir.join(format!("{PROOF_PREFIX}{challenge}"));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map(drop)
        .map_err(|error| Error::Handover(format!("writing the handover's proof {}: {error}", quote_path(&path))))
}

/// Removes any proof file left in `state_dir`.
fn remove_proofs(state_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(state_dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(PROOF_PREFIX) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Asks the driver holding `state_dir` for its lazy volumes and listening sockets, laying the
/// volumes' files out with `content`: in version 2, and again in version 1 when the holder closed
/// the connection at that word (a driver from before version 2; it paused nothing). `None` when
/// it offers none (no offer socket, or nobody answers on it: a driver from before handovers);
/// what was taken once this process has said it took it (the lock is then to be taken as the
/// predecessor lets go of it); an error when the handover failed before that (the predecessor
/// then keeps serving everything).
pub fn ask(state_dir: &Path, content: &dyn ContentSource, tmpfs_size: u64) -> Result<Option<TakenNode>> {
    for request in [Word::AskWithSockets, Word::Ask] {
        match ask_in(request, state_dir, content, tmpfs_size)? {
            Asked::NoOffer => return Ok(None),
            Asked::Taken(taken) => return Ok(Some(taken)),
            Asked::NotUnderstood => {
                info!(?request, "the running driver does not speak this version of the handover");
            }
        }
    }
    Err(Error::Handover("the running driver closed the handover at its first word, in version 1 too".into()))
}

/// One request for the node, starting with `request` (an ask of either version).
fn ask_in(request: Word, state_dir: &Path, content: &dyn ContentSource, tmpfs_size: u64) -> Result<Asked> {
    let path = state_dir.join(SOCKET_FILE);
    let socket = match UnixStream::connect(&path) {
        Ok(socket) => socket,
        Err(error) if matches!(error.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
            return Ok(Asked::NoOffer);
        }
        Err(error) => {
            return Err(Error::Handover(format!("asking {} for a handover: {error}", quote_path(&path))));
        }
    };
    let timeouts =
        socket.set_read_timeout(Some(STEP_TIMEOUT)).and_then(|()| socket.set_write_timeout(Some(STEP_TIMEOUT)));
    timeouts.map_err(|error| Error::Handover(format!("setting the handover's timeouts: {error}")))?;
    say(&socket, request)?;
    if closed_unanswered(&socket) {
        return Ok(Asked::NotUnderstood);
    }
    let mut volumes = Vec::new();
    let mut sockets = Vec::new();
    loop {
        let (volume, device) = match receive_frame(&socket, super::frame_bound(tmpfs_size))? {
            Frame::Volume(volume, device) => (volume, device),
            Frame::End => break,
            // Asked only before the first volume (a predecessor from before the proof asks
            // nothing): the file goes once the predecessor has looked at it.
            Frame::Prove(challenge) if volumes.is_empty() && sockets.is_empty() => {
                prove(state_dir, &challenge)?;
                say(&socket, Word::Proved)?;
                continue;
            }
            Frame::Prove(_) => return Err(Error::Handover("the running driver asked for a proof twice".into())),
            Frame::Socket(listening) if request == Word::AskWithSockets => {
                // The CSI socket and kubelet's registration socket: no more descriptors are kept.
                if sockets.len() == MOST_SOCKETS {
                    let _ = say(&socket, Word::Refused);
                    return Err(Error::Handover(format!("the running driver sent more than {MOST_SOCKETS} sockets")));
                }
                sockets.push(listening);
                continue;
            }
            Frame::Socket(_) => {
                let _ = say(&socket, Word::Refused);
                return Err(Error::Handover("the running driver sent a socket to a version-1 request".into()));
            }
        };
        let HandedVolume { volume_id, mount, files } = *volume;
        match content.lazy_handed(files) {
            Ok(files) => volumes.push(TakenVolume { volume_id, mount, files, device }),
            Err(error) => {
                // Refused as a whole: the predecessor keeps serving every volume, this process
                // stops, and the rollout waits (the DaemonSet's maxUnavailable: 0).
                let _ = say(&socket, Word::Refused);
                return Err(Error::Handover(format!(
                    "the lazy volume {} cannot be served by this driver: {error}; the running driver keeps serving it",
                    quote(&volume_id)
                )));
            }
        }
    }
    say(&socket, Word::Taken)?;
    // The predecessor removes the proof; one it could not is not left behind.
    remove_proofs(state_dir);
    // From here the volumes are this process's whatever the predecessor says next: it stops
    // serving them once it has the word, and a predecessor that dies instead has closed only
    // its own descriptors. The lock tells when the node is free.
    match hear(&socket, "the running driver to let go of the node") {
        Ok(Word::LetGo) => {}
        Ok(other) => warn!(word = ?other, "the running driver answered something else than letting go of the node"),
        Err(error) => warn!(problem = %Logged(&error), "the running driver did not say it let go of the node"),
    }
    Ok(Asked::Taken(TakenNode { volumes, sockets }))
}

/// Whether the other side closed `socket` without a byte sent: what a driver does at a first
/// word it does not know. Waits (up to the socket's read timeout) for its first answer.
fn closed_unanswered(socket: &UnixStream) -> bool {
    let mut first = [0u8; 1];
    match rustix::net::recv(socket, &mut first, rustix::net::RecvFlags::PEEK) {
        Ok((_, received)) => received == 0,
        Err(error) => error == rustix::io::Errno::CONNRESET || error == rustix::io::Errno::PIPE,
    }
}
