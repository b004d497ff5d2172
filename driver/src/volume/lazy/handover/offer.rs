//! The predecessor's side of a handover. A driver holding the state directory's lock listens on
//! `stateDir/handover.sock` (root only: the directory is the driver's, and the socket is made
//! 0600). A successor's request there stops this driver's publishes, unpublishes and refreshes
//! (kubelet's retries reach the successor), pauses every lazy volume at a request boundary and
//! sends it, then (to a successor speaking version 2) each socket it listens on; once the
//! successor says it has taken them, this driver lets go of the node (its lock released, its
//! CSI sockets no longer accepted on, their files left for the successor, which accepts on the
//! same sockets, or replaces them in version 1) and says so. Short of that word, every volume is resumed and served on, as if
//! nobody had asked.
//!
//! Who may ask: a peer of this process's own user (root), that proves it may write the state
//! directory by creating there the file a fresh challenge names, within [`PROOF_WITHIN`], before
//! anything is paused. A root process in a pod that mounts the state directory read-only (or any
//! other user) is refused without a volume paused, and a handover that pauses the volumes is
//! started at most once every [`PAUSES_EVERY`].

use std::os::fd::AsFd as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::HandsOverLazy;
use super::{
    CHALLENGE_DIGITS, HandedVolume, ListeningSocket, PROOF_PREFIX, SOCKET_FILE, STEP_TIMEOUT, Word, hear, say, send,
    send_challenge, send_end, send_socket,
};
use crate::quote::{Logged, quote_path};
use crate::volume::error::{Error, Result};

/// How long a lazy volume being handed over may take to answer what it owes (opens waiting on
/// its helper) once paused: a helper's own timeout may be longer, and then the handover fails
/// and everything is resumed rather than the answer lost.
pub const ANSWERS_OWED_WITHIN: Duration = Duration::from_secs(30);
/// How long an asking process may take to prove it may write the state directory: a driver
/// writes one small file at once; a silent peer holds the offer no longer than this.
pub const PROOF_WITHIN: Duration = Duration::from_secs(5);
/// The least time between two handovers that pause the volumes (a failed one resumes them):
/// however often a writer of the state directory asks, the volumes keep being served.
pub const PAUSES_EVERY: Duration = Duration::from_secs(10);

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

    /// Waits for a successor and hands `node`'s lazy volumes (and, in version 2, the listening
    /// `sockets`: copies of the descriptors this driver accepts on) to the first whose handover
    /// completes; a failed one is logged, and the next successor may ask. `let_go` runs once a
    /// successor has taken the volumes, before it is told the node is its: it releases what the
    /// successor takes next (the lock, the sockets). Returns after that.
    pub async fn serve(
        self,
        node: Arc<dyn HandsOverLazy>,
        sockets: Vec<ListeningSocket>,
        let_go: impl FnOnce(),
    ) -> Result<()> {
        let sockets = Arc::new(sockets);
        let Offer { listener, mut file, frame_bound } = self;
        let path = file.path.clone();
        listener
            .set_nonblocking(true)
            .map_err(|error| Error::Handover(format!("offering a handover: {}: {error}", quote_path(&path))))?;
        let listener = tokio::net::UnixListener::from_std(listener)
            .map_err(|error| Error::Handover(format!("offering a handover: {}: {error}", quote_path(&path))))?;
        let state_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut last_paused: Option<std::time::Instant> = None;
        loop {
            let socket = match listener.accept().await {
                Ok((socket, _)) => socket,
                Err(error) => {
                    warn!(problem = %Logged(&error), "accepting a successor's handover request failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Err(error) = same_user(&socket) {
                warn!(problem = %Logged(&error), "a handover request was refused");
                continue;
            }
            let node = node.clone();
            let state_dir = state_dir.clone();
            let handed = tokio::task::spawn_blocking(move || {
                let socket = blocking(socket)?;
                let request = proved(&socket, &state_dir)?;
                if let Some(since) = last_paused.map(|at| at.elapsed()).filter(|since| *since < PAUSES_EVERY) {
                    let _ = say(&socket, Word::Refused);
                    return Err(Error::Handover(format!(
                        "a handover was asked {} ms after the last one paused the volumes; at most one every {} s",
                        since.as_millis(),
                        PAUSES_EVERY.as_secs()
                    )));
                }
                Ok((socket, request, std::time::Instant::now()))
            })
            .await
            .map_err(|error| Error::Handover(format!("the handover's task: {error}")))
            .and_then(|proved| proved);
            let (socket, request, paused_at) = match handed {
                Ok(proved) => proved,
                Err(error) => {
                    warn!(problem = %Logged(&error), "a handover request was refused; no volume was paused");
                    continue;
                }
            };
            last_paused = Some(paused_at);
            let node = node.clone();
            // Only a successor that asked for them (version 2) knows what a socket's frame is.
            let handed_sockets = if request == Word::AskWithSockets { sockets.clone() } else { Arc::default() };
            let handed = tokio::task::spawn_blocking(move || {
                hand_off(&socket, &*node, &handed_sockets, frame_bound).map(|count| (socket, count))
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

/// Refuses a peer that does not run as this process's user (root): only a driver may ask.
fn same_user(socket: &tokio::net::UnixStream) -> Result<()> {
    let peer = socket
        .peer_cred()
        .map_err(|error| Error::Handover(format!("reading the asking process's credentials: {error}")))?;
    let own = nix::unistd::geteuid().as_raw();
    if peer.uid() != own {
        return Err(Error::Handover(format!("the asking process runs as uid {}, not {own}", peer.uid())));
    }
    Ok(())
}

/// Hears the successor's request (returned: an ask of either version) and has it prove that it
/// may write `state_dir`: it creates there, owned by this process's user, the file a fresh
/// challenge names, which is then removed. Nothing is paused before; the proof must come within
/// [`PROOF_WITHIN`].
fn proved(socket: &std::os::unix::net::UnixStream, state_dir: &Path) -> Result<Word> {
    let timeouts = |within: Duration| {
        socket
            .set_read_timeout(Some(within))
            .map_err(|error| Error::Handover(format!("setting the handover's timeout: {error}")))
    };
    timeouts(PROOF_WITHIN)?;
    let request = match hear(socket, "a successor's request")? {
        request @ (Word::Ask | Word::AskWithSockets) => request,
        other => return Err(Error::Handover(format!("a successor said {other:?} instead of asking"))),
    };
    let challenge = challenge()?;
    send_challenge(socket, &challenge)?;
    let word = hear(socket, "the successor's proof");
    let proof = state_dir.join(format!("{PROOF_PREFIX}{challenge}"));
    let found = std::fs::symlink_metadata(&proof);
    // Removed whatever was found, so that no proof outlives its challenge.
    let _ = std::fs::remove_file(&proof);
    if word? != Word::Proved {
        return Err(Error::Handover("the asking process did not say it wrote the proof".into()));
    }
    let own = nix::unistd::geteuid().as_raw();
    match found {
        Ok(metadata) if metadata.file_type().is_file() && metadata.uid() == own => {}
        _ => {
            return Err(Error::Handover(
                "the asking process did not write the proof into the state directory: it is not a driver of this node"
                    .into(),
            ));
        }
    }
    timeouts(STEP_TIMEOUT)?;
    Ok(request)
}

/// A fresh challenge: 128 bits from the kernel's random source, as lowercase hex.
fn challenge() -> Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; CHALLENGE_DIGITS / 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|error| Error::Handover(format!("making a challenge: /dev/urandom: {error}")))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// One successor's handover, once it has asked and proved itself: every lazy volume paused and
/// sent, then `sockets`, until its word that it has taken them; how many volumes were handed.
fn hand_off(
    socket: &std::os::unix::net::UnixStream,
    node: &dyn HandsOverLazy,
    sockets: &[ListeningSocket],
    frame_bound: u64,
) -> Result<usize> {
    let mut count = 0;
    node.hand_over_lazy(Box::new(|mounts| {
        let sent = (|| {
            for (volume_id, mount) in mounts.iter_mut() {
                let (state, device) = mount.hand_over(ANSWERS_OWED_WITHIN)?;
                let volume = HandedVolume { volume_id: volume_id.clone(), mount: state, files: mount.files().handed() };
                send(socket, &volume, device.as_fd(), frame_bound)?;
                count += 1;
            }
            for listening in sockets {
                send_socket(socket, listening)?;
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
    }))?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::lazy::handover::{Frame, receive_frame};
    use std::os::unix::net::UnixStream;

    /// Runs `asker` as the asking side of `proved` over a socket pair, in a state directory.
    fn ask_with(asker: impl FnOnce(&UnixStream, &Path, String) + Send + 'static) -> (Result<()>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let (offer, asking) = UnixStream::pair().unwrap();
        let state_dir = dir.path().to_path_buf();
        let successor = std::thread::spawn(move || {
            say(&asking, Word::Ask).unwrap();
            let Frame::Prove(challenge) = receive_frame(&asking, 1 << 20).unwrap() else { panic!("no challenge") };
            assert_eq!(challenge.len(), CHALLENGE_DIGITS);
            asker(&asking, &state_dir, challenge);
        });
        let result = proved(&offer, dir.path()).map(drop);
        successor.join().unwrap();
        (result, dir)
    }

    fn proofs_left(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(PROOF_PREFIX))
            .count()
    }

    #[test]
    fn a_process_that_cannot_write_the_state_directory_is_refused_before_anything_is_paused() {
        let (result, dir) = ask_with(|socket, _, _| say(socket, Word::Proved).unwrap());
        let error = result.unwrap_err().to_string();
        assert!(
            error.contains("did not write the proof into the state directory: it is not a driver of this node"),
            "{error}"
        );
        // A proof made for another challenge (or left from an earlier one) proves nothing.
        let (result, _) = ask_with(|socket, dir, _| {
            std::fs::write(dir.join(format!("{PROOF_PREFIX}{}", "0".repeat(CHALLENGE_DIGITS))), b"").unwrap();
            say(socket, Word::Proved).unwrap();
        });
        assert!(result.is_err());
        // A directory where the file should be is no proof either, and is left alone.
        let (result, dir2) = ask_with(|socket, dir, challenge| {
            std::fs::create_dir(dir.join(format!("{PROOF_PREFIX}{challenge}"))).unwrap();
            say(socket, Word::Proved).unwrap();
        });
        assert!(result.is_err());
        assert_eq!(proofs_left(dir.path()), 0);
        drop(dir2);
    }

    #[test]
    fn a_driver_that_writes_the_proof_is_heard_and_the_proof_is_removed() {
        let (result, dir) = ask_with(|socket, dir, challenge| {
            std::fs::write(dir.join(format!("{PROOF_PREFIX}{challenge}")), b"").unwrap();
            say(socket, Word::Proved).unwrap();
        });
        result.unwrap();
        assert_eq!(proofs_left(dir.path()), 0, "the proof outlives no challenge");
    }

    #[test]
    fn challenges_are_fresh_lowercase_hex() {
        let (one, two) = (challenge().unwrap(), challenge().unwrap());
        assert_ne!(one, two);
        assert!(one.len() == CHALLENGE_DIGITS && one.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}
