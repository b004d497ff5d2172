//! Decoding one YAML or JSON text into a typed value, with the failing field's path and line.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The syntax of a text, told by its first significant character: JSON texts start with `{` or `[`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON: one value, or several concatenated.
    Json,
    /// YAML: one or more documents separated by `---`.
    Yaml,
}

impl Format {
    /// Tells JSON from YAML.
    pub fn detect(text: &str) -> Format {
        match text.trim_start_matches('\u{feff}').trim_start().as_bytes().first() {
            Some(b'{') | Some(b'[') => Format::Json,
            _ => Format::Yaml,
        }
    }
}

/// Decodes a single-document text into `T`, naming the failing field on error.
pub fn decode<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    let mut field = String::from(".");
    let decoded = match Format::detect(text) {
        Format::Json => {
            let mut deserializer = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut deserializer)
                .map_err(|error| {
                    field = error.path().to_string();
                    error.into_inner().to_string()
                })
                .and_then(|value| deserializer.end().map(|()| value).map_err(|error| error.to_string()))
        }
        Format::Yaml => serde_saphyr::with_deserializer_from_str(text, |deserializer| {
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                field = error.path().to_string();
                error.into_inner()
            })
        })
        .map_err(|error| error.without_snippet().to_string()),
    };
    decoded.map_err(|message| Error::Decode { path: path.to_path_buf(), field, message })
}

/// The largest file any command reads: far above a cluster state of tens of thousands of
/// namespaces, far below what would exhaust a machine (an endless device stops here).
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Reads a file into a string, naming it on failure; refuses one over [`MAX_INPUT_BYTES`].
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = read_bounded(path)?;
    String::from_utf8(bytes).map_err(|error| Error::Read {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, error.utf8_error()),
    })
}

/// Reads a file's bytes, at most [`MAX_INPUT_BYTES`] of them.
pub fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let read_error = |source| Error::Read { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(Error::TooLarge { path: path.to_path_buf(), limit: MAX_INPUT_BYTES });
    }
    Ok(bytes)
}
