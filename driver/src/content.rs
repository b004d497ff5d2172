//! Where a volume's files come from: the trait every source implements, and the static source
//! (files from a directory, one subdirectory per share) for demos and tests. The cluster's
//! shares are `shares::source`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::atomic_writer::{FileContent, Payload, check_key};
use crate::dir_tree::non_directories_below;
use crate::error::{Error, Result};
use crate::publish_request::PublishRequest;
use crate::quote::{quote, quote_path};

/// The volume attribute naming the share a pod asks for. `sharedSecret` and `sharedConfigMap`
/// (the Kubernetes source's names) are accepted as aliases, so a manifest written for the
/// cluster's shares runs unchanged against a static directory.
pub const SHARE_ATTRIBUTE: &str = "share";
/// The aliases of [`SHARE_ATTRIBUTE`].
const SHARE_ALIASES: [&str; 2] = ["sharedSecret", "sharedConfigMap"];

/// One refresh pass: the volumes a batch of changes touched. Answers may be shared between the
/// volumes of one pass, never between passes, so an answer from before a change can never serve
/// the pass that change started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PassId(pub u64);

/// Produces the files of a volume.
pub trait ContentSource: Send + Sync {
    /// True once the source can serve (Probe reports it).
    fn ready(&self) -> bool;
    /// The files for `request` as they are now, or why it may not have them.
    fn content(&self, request: &PublishRequest) -> Result<Payload>;
    /// [`ContentSource::content`] within refresh pass `pass`: answers may be shared with the
    /// other volumes of the pass (one access check per service account and share, not per
    /// volume).
    fn content_in_pass(&self, request: &PublishRequest, pass: PassId) -> Result<Payload> {
        let _ = pass;
        self.content(request)
    }
    /// Where the source notes what changed, so a refresh need not wait for its interval and
    /// covers only the volumes touched; `None` for a source that cannot tell.
    fn changes(&self) -> Option<std::sync::Arc<crate::changes::Changes>> {
        None
    }
    /// Refresh pass `pass` starts.
    fn start_pass(&self, pass: PassId) {
        let _ = pass;
    }
    /// Refresh pass `pass` is over: its shared answers are dropped (and what it saw reported).
    fn end_pass(&self, pass: PassId) {
        let _ = pass;
    }
}

/// Shares as subdirectories of a directory; every regular file in a share (recursively) is a key.
#[derive(Debug, Clone)]
pub struct StaticDirSource {
    root: PathBuf,
}

impl StaticDirSource {
    /// Shares under `root`.
    pub fn new(root: impl Into<PathBuf>) -> StaticDirSource {
        StaticDirSource { root: root.into() }
    }
}

impl ContentSource for StaticDirSource {
    fn ready(&self) -> bool {
        self.root.is_dir()
    }

    fn content(&self, request: &PublishRequest) -> Result<Payload> {
        let named = std::iter::once(SHARE_ATTRIBUTE).chain(SHARE_ALIASES).find_map(|key| request.attributes.get(key));
        let Some(share) = named else {
            return Err(Error::InvalidArgument(format!(
                "volumeAttributes lacks {SHARE_ATTRIBUTE:?}: name the share to mount"
            )));
        };
        let not_plain = || Error::InvalidArgument(format!("share name {} is not a plain name", quote(share)));
        check_key(share).map_err(|_| not_plain())?;
        if share.contains('/') {
            return Err(not_plain());
        }
        let dir = self.root.join(share);
        if !dir.is_dir() {
            return Err(Error::InvalidArgument(format!("no share named {}", quote(share))));
        }
        let mut payload = Payload::new();
        collect(&dir, &dir, &mut payload)?;
        Ok(payload)
    }
}

/// Every regular file below `dir` into `payload`, whatever its depth (see [`crate::dir_tree`]).
/// Symlinks are not followed: a share must not reach outside its directory.
fn collect(root: &Path, dir: &Path, payload: &mut Payload) -> Result<()> {
    let read_error =
        |path: &Path, error: std::io::Error| Error::Unavailable(format!("reading {}: {error}", quote_path(path)));
    for (path, kind) in non_directories_below(dir).map_err(|e| read_error(dir, e))? {
        if kind.is_file() {
            let key = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
            let data = fs::read(&path).map_err(|e| read_error(&path, e))?;
            payload.insert(key, FileContent::new(data));
        }
    }
    Ok(())
}
