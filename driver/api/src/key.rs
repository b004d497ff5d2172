//! The rule a file's path in a volume follows (a share's key, an item's path, a provider's
//! file): it must stay inside the volume and clear of the atomic writer's own entries.

use std::path::{Component, Path};

use crate::invalid::{Invalid, Result};
use crate::quote::quote;

const MAX_KEY_BYTES: usize = 4096;
const MAX_COMPONENT_BYTES: usize = 255;

/// Checks that `key` names a file inside the volume: relative, no `.` or `..` components, no
/// empty components, not starting with `..` (reserved for the writer's own entries), no NUL.
pub fn check_key(key: &str) -> Result<()> {
    let refuse = |why: &str| Err(Invalid(format!("key {} is refused: {why}", quote(key))));
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
