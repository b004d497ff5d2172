//! The predecessor's side of a handover. A driver holding the state directory's lock listens on
//! `stateDir/handover.sock` (root only: the directory is the driver's, and the socket is made
//! 0600). A successor's request there stops this driver's publishes, unpublishes and refreshes
//! (kubelet's retries reach the successor), pauses every lazy volume at a request boundary and
//! sends it; once the successor says it has taken them, this driver lets go of the node (its
//! lock released, its CSI sockets no longer served, their files left for the successor to
//! replace) and says so. Short of that word, every volume is resumed and served on, as if
//! nobody had asked.

use std::os::fd::AsFd as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::take::STEP_TIMEOUT;
use super::{HandedVolume, Word, hear, say, send, send_end};
use crate::quote::{Logged, quote_path};
use crate::volume::error::{Error, Result};
use crate::volume::service::NodeService;

/// The offer socket's name in the state directory.
pub const SOCKET_FILE: &str = "handover.sock";

/// How long a lazy volume being handed over may take to answer what it owes (opens waiting on
/// its helper) once paused: a helper's own timeout may be longer, and then the handover fails
/// and everything is resumed rather than the answer lost.
pub const ANSWERS_OWED_WITHIN: Duration = Duration::from_secs(30);

/// The offer, listening.
pub struct Offer {
    listener: std::os::unix::net::UnixListener,
    file: OfferFile,
    /// The largest frame sent ([`super::frame_bound`]).
    frame_bound: u64,
}

/// The offer socket's file, removed when the offer ends (a stop without a handover) while it is
/// still this offer's: after a handover the path is the successor's offer.
struct OfferFile {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

impl OfferFile {
    /// Removes the file now, and never again.
    fn remove(&mut self) {
        if let Some(identity) = self.identity.take() {
            let still_ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == identity);
            if still_ours {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Drop for OfferFile {
    fn drop(&mut self) {
        self.remove();
    }
}

impl Offer {
    /// Listens on `state_dir`'s offer socket, for a node whose volumes are at most `tmpfs_size`
    /// bytes. Called with the state lock held, so whatever is at the path is a dead
    /// predecessor's and is replaced.
    pub fn open(state_dir: &Path, tmpfs_size: u64) -> Result<Offer> {
        let path = state_dir.join(SOCKET_FILE);
        let failed = |what: &str, error: std::io::Error| {
            Error::Handover(format!("offering a handover: {what} {}: {error}", quote_path(&path)))
        };
        // A dead predecessor's offer socket is replaced; anything else there is left alone.
        if let Ok(metadata) = std::fs::symlink_metadata(&path) {
            if !std::os::unix::fs::FileTypeExt::is_socket(&metadata.file_type()) {
                return Err(failed("refusing to replace", std::io::Error::other("it is not a socket")));
            }
            std::fs::remove_file(&path).map_err(|error| failed("removing", error))?;
        }
        let listener = std::os::unix::net::UnixListener::bind(&path).map_err(|error| failed("binding", error))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|error| failed("setting the mode of", error))?;
        let metadata = std::fs::symlink_metadata(&path).map_err(|error| failed("inspecting", error))?;
        let file = OfferFile { identity: Some((metadata.dev(), metadata.ino())), path };
        Ok(Offer { listener, file, frame_bound: super::frame_bound(tmpfs_size) })
    }

    /// Waits for a successor and hands `node`'s lazy volumes to the first whose handover
    /// completes; a failed one is logged, and the next successor may ask. `let_go` runs once a
    /// successor has taken the volumes, before it is told the node is its: it releases what the
    /// successor takes next (the lock, the sockets). Returns after that.
    pub async fn serve(self, node: Arc<NodeService>, let_go: impl FnOnce()) -> Result<()> {
        let Offer { listener, mut file, frame_bound } = self;
        let path = file.path.clone();
        listener
            .set_nonblocking(true)
            .map_err(|error| Error::Handover(format!("offering a handover: {}: {error}", quote_path(&path))))?;
        let listener = tokio::net::UnixListener::from_std(listener)
            .map_err(|error| Error::Handover(format!("offering a handover: {}: {error}", quote_path(&path))))?;
        loop {
            let socket = match listener.accept().await {
                Ok((socket, _)) => socket,
                Err(error) => {
                    warn!(problem = %Logged(&error), "accepting a successor's handover request failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let node = node.clone();
            let handed = tokio::task::spawn_blocking(move || {
                let socket = blocking(socket)?;
                hand_off(&socket, &node, frame_bound).map(|count| (socket, count))
            })
            .await
            .map_err(|error| Error::Handover(format!("the handover's task: {error}")))
            .and_then(|handed| handed);
            match handed {
                Ok((socket, count)) => {
                    // Before the word: the successor opens its own offer at the same path once
                    // it has it, and that one must stay.
                    file.remove();
                    let_go();
                    if let Err(error) = say(&socket, Word::LetGo) {
                        warn!(problem = %Logged(&error), "telling the successor that the node is its failed; it finds the lock free");
                    }
                    info!(
                        volumes = count,
                        "lazy volumes handed over to the successor; this driver has let go of the node"
                    );
                    return Ok(());
                }
                Err(error) => {
                    warn!(problem = %Logged(&error), "a handover failed; every volume is served on here");
                }
            }
        }
    }
}

/// `socket` as a blocking socket with the handover's timeouts.
fn blocking(socket: tokio::net::UnixStream) -> Result<std::os::unix::net::UnixStream> {
    let failed = |error: std::io::Error| Error::Handover(format!("preparing the handover's socket: {error}"));
    let socket = socket.into_std().map_err(failed)?;
    socket.set_nonblocking(false).map_err(failed)?;
    socket.set_read_timeout(Some(STEP_TIMEOUT)).map_err(failed)?;
    socket.set_write_timeout(Some(STEP_TIMEOUT)).map_err(failed)?;
    Ok(socket)
}

/// One successor's handover, from its request to its word that it has taken every volume; how
/// many were handed.
fn hand_off(socket: &std::os::unix::net::UnixStream, node: &NodeService, frame_bound: u64) -> Result<usize> {
    match hear(socket, "a successor's request")? {
        Word::Ask => {}
        other => return Err(Error::Handover(format!("a successor said {other:?} instead of asking"))),
    }
    let mut count = 0;
    node.hand_over_lazy(|mounts| {
        let sent = (|| {
            for (volume_id, mount) in mounts.iter_mut() {
                let (state, device) = mount.hand_over(ANSWERS_OWED_WITHIN)?;
                let volume = HandedVolume { volume_id: volume_id.clone(), mount: state, files: mount.files().handed() };
                send(socket, &volume, device.as_fd(), frame_bound)?;
                count += 1;
            }
            send_end(socket)?;
            match hear(socket, "the successor to take the volumes")? {
                Word::Taken => Ok(()),
                Word::Refused => Err(Error::Handover("the successor refused the volumes (its log says why)".into())),
                other => Err(Error::Handover(format!("the successor said {other:?} instead of taking the volumes"))),
            }
        })();
        if sent.is_err() {
            for (_, mount) in mounts.iter_mut() {
                if let Err(error) = mount.resume() {
                    warn!(problem = %Logged(&error), "a lazy volume could not be served again after a failed handover");
                }
            }
        }
        sent
    })?;
    Ok(count)
}
