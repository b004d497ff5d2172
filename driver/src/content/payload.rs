//! A volume's content as the sources produce it and the atomic writer lays it out: files by
//! relative path (key), each with its bytes and mode, and the rule a key must follow to stay
//! inside the volume.

use std::collections::BTreeMap;

use crate::content::error::{Error, Result};

/// The default mode of content files.
pub const DEFAULT_MODE: u32 = 0o644;

/// One file of a volume.
#[derive(Clone, PartialEq, Eq)]
pub struct FileContent {
    /// The bytes.
    pub data: Vec<u8>,
    /// Unix permission bits.
    pub mode: u32,
}

impl FileContent {
    /// Content with the default mode.
    pub fn new(data: impl Into<Vec<u8>>) -> FileContent {
        FileContent { data: data.into(), mode: DEFAULT_MODE }
    }
}

// Content may be Secret data: never print it.
impl std::fmt::Debug for FileContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileContent({} bytes, mode {:o})", self.data.len(), self.mode)
    }
}

/// A volume's content: relative paths (keys) to files.
pub type Payload = BTreeMap<String, FileContent>;

/// Checks that `key` names a file inside the volume, by the vocabulary crate's rule (the admission
/// plugin checks a projection's paths with the same), as a content error.
pub fn check_key(key: &str) -> Result<()> {
    sharedresource_api::key::check_key(key).map_err(Error::from)
}
