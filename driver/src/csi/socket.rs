//! Serving gRPC on unix sockets. A socket left by a dead process is replaced, but one a live
//! process still answers on is not (a second instance refuses to start instead of stealing it),
//! and another kind of file is never touched. The socket is made 0660, and removed on exit only
//! while it is still the one this process bound. A successor in a handover accepts on the very
//! socket its predecessor listened on ([`inherit`]), or (from a predecessor that cannot hand it)
//! binds one beside it, under a name kubelet's plugin watcher ignores, and renames it in place.

use std::fs;
use std::future::Future;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::UnixListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::server::Connected;

use crate::csi::authority_rewrite::AuthorityRewrite;
use crate::quote::{quote, quote_path};
use crate::volume::error::Cause;

/// Why a socket of the driver could not be bound, taken over or served. These reach the log and
/// the exit status (as the process's `RunError::Socket`), never a gRPC client.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The CSI endpoint is not a `unix://` path.
    #[error("{0}")]
    Endpoint(String),
    /// What must be this process's alone is another's: a socket a live process answers on, a
    /// path that is not a socket.
    #[error("{0}")]
    Taken(String),
    /// A socket a predecessor handed over is not one this driver can serve on.
    #[error("{0}")]
    Handover(String),
    /// A step the code should never take (a socket served twice).
    #[error("{0}")]
    Fault(String),
    /// A step failed. The message says both what the driver was doing and how it failed;
    /// `source` keeps the cause.
    #[error("{context}: {source}")]
    Step {
        /// What the driver was doing, naming the path.
        context: String,
        /// The underlying failure.
        #[source]
        source: Cause,
    },
}

/// Result with a socket error.
pub type Result<T, E = SocketError> = std::result::Result<T, E>;

impl SocketError {
    /// A step that failed: `context` says what the driver was doing, `source` how it failed.
    pub fn step(context: impl Into<String>, source: impl Into<Cause>) -> SocketError {
        SocketError::Step { context: context.into(), source: source.into() }
    }
}

/// Parses `unix:///path` (or a bare path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(SocketError::Endpoint(format!("endpoint {} is not unix:///absolute/path", quote(endpoint))));
    }
    Ok(PathBuf::from(path))
}

/// A bound socket; dropping it removes the socket file if it is still this one.
#[derive(Debug)]
pub struct BoundSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
    // The socket file's identity when bound: whatever is at the path later is removed only if
    // it is still this file (a successor may have replaced it).
    identity: (u64, u64),
    // Set when the file is left for a successor to replace (a handover): never removed then.
    kept: Arc<AtomicBool>,
}

impl BoundSocket {
    /// What, once set, leaves the socket file in place when this socket stops being served
    /// (a successor that took a handover accepts on it, or replaces it: kubelet never sees it go).
    pub fn keeper(&self) -> Arc<AtomicBool> {
        self.kept.clone()
    }

    /// The socket file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A second descriptor of the listening socket, for a successor to accept on (a handover).
    /// Taken before the socket is served.
    pub fn listener_copy(&self) -> Result<OwnedFd> {
        let listener = self
            .listener
            .as_ref()
            .ok_or_else(|| SocketError::Fault(format!("{} is served already", quote_path(&self.path))))?;
        listener
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| SocketError::step(format!("copying the descriptor of {}", quote_path(&self.path)), e))
    }
}

/// The socket a predecessor listened on at `path`, handed over as `listener`: accepted on as it
/// is, its file untouched (kubelet's plugin watcher sees nothing change). Refused, naming why,
/// unless it is a listening unix stream socket bound at `path` (or at a name [`bind_beside`]
/// gives, before its rename there) and the file there is a socket.
pub fn inherit(listener: OwnedFd, path: &Path) -> Result<BoundSocket> {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let refused =
        |why: String| SocketError::Handover(format!("the socket handed over for {}: {why}", quote_path(path)));
    let family = sockopt::socket_domain(&listener).map_err(|e| refused(format!("reading its family: {e}")))?;
    let kind = sockopt::socket_type(&listener).map_err(|e| refused(format!("reading its type: {e}")))?;
    let listening = sockopt::socket_acceptconn(&listener).map_err(|e| refused(format!("reading its state: {e}")))?;
    if family != AddressFamily::UNIX || kind != SocketType::STREAM || !listening {
        return Err(refused("it is not a listening unix stream socket".into()));
    }
    let listener = std::os::unix::net::UnixListener::from(listener);
    let address = listener.local_addr().map_err(|e| refused(format!("reading its address: {e}")))?;
    // A socket keeps the name it was bound under: one bound beside its path and renamed there
    // (a successor of a version-1 predecessor, or of this version's, or of v0.1.0's `~` name)
    // is the path's socket all the same.
    let names = [path.to_path_buf(), beside(path, '.'), beside(path, '~')];
    if !address.as_pathname().is_some_and(|bound| names.iter().any(|name| name == bound)) {
        return Err(refused("it is bound at another path".into()));
    }
    let metadata = fs::symlink_metadata(path).map_err(|e| refused(format!("inspecting its file: {e}")))?;
    if !metadata.file_type().is_socket() {
        return Err(refused("its file is not a socket".into()));
    }
    listener.set_nonblocking(true).map_err(|e| refused(format!("making it non-blocking: {e}")))?;
    let listener = UnixListener::from_std(listener).map_err(|e| refused(format!("accepting on it: {e}")))?;
    Ok(BoundSocket {
        listener: Some(listener),
        path: path.to_path_buf(),
        identity: (metadata.dev(), metadata.ino()),
        kept: Arc::default(),
    })
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if self.kept.load(Ordering::SeqCst) {
            return;
        }
        let still_ours = fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity);
        if still_ours {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds `path`. A socket nobody answers on is stale and replaced; one a live process answers
/// on, or any other kind of file, is an error naming it.
pub fn bind(path: &Path) -> Result<BoundSocket> {
    if let Ok(metadata) = fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(SocketError::Taken(format!(
                "{} exists and is not a socket; refusing to replace it",
                quote_path(path)
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::Taken(format!(
                "{} is served by a live process (another instance of the driver?); refusing to take it over",
                quote_path(path)
            )));
        }
        fs::remove_file(path)
            .map_err(|e| SocketError::step(format!("removing the stale socket {}", quote_path(path)), e))?;
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| SocketError::step(format!("creating {}", quote_path(parent)), e))?;
    }
    let listener =
        UnixListener::bind(path).map_err(|e| SocketError::step(format!("binding {}", quote_path(path)), e))?;
    bound_at(listener, path)
}

/// Binds `path` in place of the socket a predecessor that handed its volumes over left there
/// (a live one, or one it stopped serving): [`bind_beside`], then [`Beside::put_in_place`].
pub fn bind_in_place_of(path: &Path) -> Result<BoundSocket> {
    bind_beside(path)?.put_in_place()
}

/// A socket bound beside the path it is to take, before the taking: what could fail in binding
/// it fails while nothing at the path has changed (a successor asks its predecessor for the
/// node only once its sockets are bound). Dropped without being put in place, its file goes.
#[derive(Debug)]
pub struct Beside {
    listener: Option<UnixListener>,
    beside: PathBuf,
    path: PathBuf,
}

/// Binds a socket beside `path`, under a name no longer than its own (a socket's path is
/// bounded, 108 bytes, and one that fits must not be refused for a longer temporary name) that
/// starts with `.` (kubelet's plugin watcher skips such names: it never dials the temporary
/// socket as a second driver), made 0660 before it takes the path (kubelet may connect at once).
/// Any other kind of file at `path` is an error naming it.
pub fn bind_beside(path: &Path) -> Result<Beside> {
    if fs::symlink_metadata(path).is_ok_and(|metadata| !metadata.file_type().is_socket()) {
        return Err(SocketError::Taken(format!(
            "{} exists and is not a socket; refusing to replace it",
            quote_path(path)
        )));
    }
    let beside = beside(path, '.');
    // Only a socket there is one a successor left (killed before it put it in place).
    if let Ok(metadata) = fs::symlink_metadata(&beside) {
        if !metadata.file_type().is_socket() {
            return Err(SocketError::Taken(format!(
                "{} exists and is not a socket; refusing to replace it",
                quote_path(&beside)
            )));
        }
        fs::remove_file(&beside)
            .map_err(|e| SocketError::step(format!("removing the stale socket {}", quote_path(&beside)), e))?;
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| SocketError::step(format!("creating {}", quote_path(parent)), e))?;
    }
    let listener =
        UnixListener::bind(&beside).map_err(|e| SocketError::step(format!("binding {}", quote_path(&beside)), e))?;
    let bound = Beside { listener: Some(listener), beside, path: path.to_path_buf() };
    fs::set_permissions(&bound.beside, fs::Permissions::from_mode(0o660))
        .map_err(|e| SocketError::step(format!("setting the mode of {}", quote_path(&bound.beside)), e))?;
    Ok(bound)
}

/// The name beside `path` a successor binds under before it renames the socket there: `mark`
/// (`.` here; v0.1.0 used `~`) and the file name without its last character.
fn beside(path: &Path, mark: char) -> PathBuf {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let shortened: String = name.chars().take(name.chars().count().saturating_sub(1)).collect();
    path.with_file_name(format!("{mark}{shortened}"))
}

impl Beside {
    /// Renames the socket over its path, so the path never lacks a socket (kubelet's plugin
    /// watcher sees no removal of the registration socket, but a new one: it deregisters the
    /// driver and registers it again, which a handed socket avoids).
    pub fn put_in_place(mut self) -> Result<BoundSocket> {
        let Some(listener) = self.listener.take() else {
            return Err(SocketError::Fault(format!("{} was put in place already", quote_path(&self.path))));
        };
        fs::rename(&self.beside, &self.path).map_err(|e| {
            SocketError::step(format!("renaming {} over {}", quote_path(&self.beside), quote_path(&self.path)), e)
        })?;
        bound_at(listener, &self.path)
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        if self.listener.is_some() {
            let _ = fs::remove_file(&self.beside);
        }
    }
}

/// `listener`, whose socket file is at `path`, made 0660.
fn bound_at(listener: UnixListener, path: &Path) -> Result<BoundSocket> {
    let metadata =
        fs::symlink_metadata(path).map_err(|e| SocketError::step(format!("inspecting {}", quote_path(path)), e))?;
    let socket = BoundSocket {
        listener: Some(listener),
        path: path.to_path_buf(),
        identity: (metadata.dev(), metadata.ino()),
        kept: Arc::default(),
    };
    fs::set_permissions(path, fs::Permissions::from_mode(0o660))
        .map_err(|e| SocketError::step(format!("setting the mode of {}", quote_path(path)), e))?;
    Ok(socket)
}

/// How the bytes of a connection reach the gRPC server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clients {
    /// As sent (the CSI socket: kubelet's CSI calls send a valid authority).
    AsSent,
    /// Through [`AuthorityRewrite`] (the registration socket: kubelet's plugin watcher sends its
    /// socket path as the `:authority`, which h2 refuses).
    KubeletRegistration,
}

/// Serves `routes` on `socket` until `shutdown` completes; the socket is removed when this
/// future finishes or is dropped.
pub async fn serve(
    mut socket: BoundSocket,
    routes: Routes,
    clients: Clients,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let Some(listener) = socket.listener.take() else {
        return Err(SocketError::Fault(format!("{} was served already", quote_path(&socket.path))));
    };
    let server = tonic::transport::Server::builder().add_routes(routes);
    let connections = UnixListenerStream::new(listener);
    let served = match clients {
        Clients::AsSent => server.serve_with_incoming_shutdown(connections, shutdown).await,
        Clients::KubeletRegistration => {
            let rewritten = connections.map(|connection| connection.map(AuthorityRewrite::new));
            server.serve_with_incoming_shutdown(rewritten, shutdown).await
        }
    };
    served.map_err(|e| SocketError::step(format!("serving on {}", quote_path(&socket.path)), e))
}

impl<S: Connected> Connected for AuthorityRewrite<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner().connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_absolute_unix_paths() {
        assert_eq!(socket_path("unix:///csi/csi.sock").unwrap(), PathBuf::from("/csi/csi.sock"));
        assert_eq!(socket_path("/csi/csi.sock").unwrap(), PathBuf::from("/csi/csi.sock"));
        assert!(socket_path("unix://relative.sock").is_err());
        assert!(socket_path("tcp://127.0.0.1:10000").is_err());
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_but_a_live_one_and_a_regular_file_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        // What a killed process leaves: a socket file nobody listens on.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let bound = bind(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);

        let refused = bind(&path).unwrap_err();
        assert!(
            refused
                .to_string()
                .ends_with("is served by a live process (another instance of the driver?); refusing to take it over")
        );
        assert!(path.exists(), "the live socket is left in place");

        // A successor's socket at the same path is not removed by the predecessor's exit.
        fs::remove_file(&path).unwrap();
        let successor = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(bound);
        assert!(path.exists(), "only the socket this process bound is removed");
        drop(successor);
        fs::remove_file(&path).unwrap();
        drop(bind(&path).unwrap());
        assert!(!path.exists(), "its own socket is removed on drop");

        let file = dir.path().join("file");
        fs::write(&file, "keep me").unwrap();
        assert!(bind(&file).is_err());
        assert_eq!(fs::read_to_string(&file).unwrap(), "keep me");
    }

    #[tokio::test]
    async fn a_successor_binds_in_place_of_a_live_socket_at_the_longest_path_a_socket_may_have() {
        let dir = tempfile::tempdir().unwrap();
        // 107 bytes: the longest path a socket may have (sun_path holds 108 with its NUL).
        let name = "s".repeat(107 - dir.path().as_os_str().len() - 1);
        let path = dir.path().join(name);
        assert_eq!(path.as_os_str().len(), 107);
        let predecessor = bind(&path).unwrap();
        let before = fs::symlink_metadata(&path).unwrap().ino();

        let successor = bind_in_place_of(&path).unwrap();
        assert_ne!(fs::symlink_metadata(&path).unwrap().ino(), before, "the path is the successor's socket now");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "nothing left beside it");
        // The predecessor's keeper set (a handover): its stop leaves the successor's file.
        predecessor.keeper().store(true, Ordering::SeqCst);
        drop(predecessor);
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok(), "the successor answers there");
        drop(successor);
        assert!(!path.exists(), "the successor removes its own socket");

        // Bound beside and dropped (the predecessor offered nothing): nothing changed.
        let kept = bind(&path).unwrap();
        let before = fs::symlink_metadata(&path).unwrap().ino();
        drop(bind_beside(&path).unwrap());
        assert_eq!(fs::symlink_metadata(&path).unwrap().ino(), before, "the path is untouched");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "and nothing is left beside it");
        drop(kept);

        let file = dir.path().join("file");
        fs::write(&file, "keep me").unwrap();
        assert!(bind_in_place_of(&file).is_err());
        assert_eq!(fs::read_to_string(&file).unwrap(), "keep me");
        // A file of someone else's where the socket would be bound beside: left alone.
        let other = dir.path().join(".csi.soc");
        fs::write(&other, "theirs").unwrap();
        assert!(bind_beside(&dir.path().join("csi.sock")).is_err());
        assert_eq!(fs::read_to_string(&other).unwrap(), "theirs");
    }
}
