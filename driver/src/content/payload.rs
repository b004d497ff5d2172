//! A volume's content as the sources produce it and the atomic writer lays it out: files by
//! relative path (key), each with its bytes and mode, and the rule a key must follow to stay
//! inside the volume.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use crate::content::error::{Error, Result};
use crate::quote::quote;

/// The default mode of content files.
pub const DEFAULT_MODE: u32 = 0o644;
const MAX_KEY_BYTES: usize = 4096;
const MAX_COMPONENT_BYTES: usize = 255;

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

/// Checks that `key` names a file inside the volume: relative, no `.` or `..` components, no
/// empty components, not starting with `..` (reserved for the writer's own entries), no NUL.
pub fn check_key(key: &str) -> Result<()> {
    let refuse = |why: &str| Err(Error::Invalid(format!("key {} is refused: {why}", quote(key))));
    if key.is_empty() {
        return refuse("it is empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return refuse("it is longer than 4096 bytes");
    }
    if key.contains('\0') {
        return refuse("it contains a NUL byte");
    }
    if key.starts_with('/') {
        return refuse("it is an absolute path");
    }
    if key.starts_with("..") {
        return refuse("names starting with \"..\" are reserved");
    }
    for component in key.split('/') {
        match component {
            "" => return refuse("it has an empty path component"),
            "." | ".." => return refuse("it has a \".\" or \"..\" component"),
            c if c.len() > MAX_COMPONENT_BYTES => return refuse("a path component is longer than 255 bytes"),
            _ => {}
        }
    }
    // Belt and braces: what the OS will make of it must stay inside the volume.
    if Path::new(key).components().any(|c| !matches!(c, Component::Normal(_))) {
        return refuse("it does not stay inside the volume");
    }
    Ok(())
}
