//! Serving gRPC on unix sockets: a stale socket is removed before binding, the socket is made
//! 0660, and it is removed again on exit.

use std::fs;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;

use crate::error::{Error, Result};

/// Parses `unix:///path` (or a bare path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(Error::InvalidArgument(format!("endpoint {endpoint:?} is not unix:///absolute/path")));
    }
    Ok(PathBuf::from(path))
}

/// Binds `path`, replacing a stale socket (but never another kind of file).
pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Ok(metadata) = fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(Error::Internal(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        fs::remove_file(path)
            .map_err(|e| Error::Internal(format!("removing the stale socket {}: {e}", path.display())))?;
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::Internal(format!("creating {}: {e}", parent.display())))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| Error::Internal(format!("binding {}: {e}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660))
        .map_err(|e| Error::Internal(format!("setting the mode of {}: {e}", path.display())))?;
    Ok(listener)
}

/// Serves `routes` on `path` until `shutdown` completes, then removes the socket.
pub async fn serve(path: PathBuf, routes: Routes, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
    let listener = bind(&path)?;
    let served = tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("serving on {}: {e}", path.display())));
    let _ = fs::remove_file(&path);
    served
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
    async fn a_stale_socket_is_replaced_but_a_regular_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        drop(bind(&path).unwrap());
        assert!(path.exists(), "a socket left behind by a dead process");
        let listener = bind(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);
        drop(listener);
        let file = dir.path().join("file");
        fs::write(&file, "keep me").unwrap();
        assert!(bind(&file).is_err());
        assert_eq!(fs::read_to_string(&file).unwrap(), "keep me");
    }
}
