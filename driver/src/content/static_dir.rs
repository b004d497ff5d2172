//! The static source: shares as subdirectories of a directory, for demos and tests.

use std::fs;
use std::path::{Path, PathBuf};

use crate::content::error::{Error, Result};
use crate::content::payload::{FileContent, Payload, check_key};
use crate::content::{ContentSource, Opened, Opening, VolumeAsk};
use crate::dir_tree::non_directories_below;
use crate::quote::{quote, quote_path};

/// The volume attribute naming the share a pod asks for. `sharedSecret` and `sharedConfigMap`
/// (the Kubernetes source's names) are accepted as aliases, so a manifest written for the
/// cluster's shares runs unchanged against a static directory.
pub const SHARE_ATTRIBUTE: &str = "share";
/// The aliases of [`SHARE_ATTRIBUTE`].
const SHARE_ALIASES: [&str; 2] = ["sharedSecret", "sharedConfigMap"];

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

    fn open(&self, ask: &VolumeAsk, _: Opening) -> Result<Opened> {
        let named = std::iter::once(SHARE_ATTRIBUTE).chain(SHARE_ALIASES).find_map(|key| ask.attributes.get(key));
        let Some(share) = named else {
            return Err(Error::Invalid(format!("volumeAttributes lacks {SHARE_ATTRIBUTE:?}: name the share to mount")));
        };
        let not_plain = || Error::Invalid(format!("share name {} is not a plain name", quote(share)));
        check_key(share).map_err(|_| not_plain())?;
        if share.contains('/') {
            return Err(not_plain());
        }
        let dir = self.root.join(share);
        if !dir.is_dir() {
            return Err(Error::Invalid(format!("no share named {}", quote(share))));
        }
        let mut payload = Payload::new();
        collect(&dir, &dir, &mut payload)?;
        Ok(Opened::files(payload))
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
