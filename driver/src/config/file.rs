//! Reading the driver's configuration file: bounded in size, YAML (JSON included), and a failure
//! that names the file and the field at fault. The driver's own reader, so that the node plugin
//! depends on nothing of the admission side.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// Far above any configuration, far below what would exhaust a node (an endless device stops
/// here).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why a configuration file could not be used. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("{path}: larger than {limit} bytes; refusing to read it")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// The file is not valid YAML or JSON, or a field does not match the schema.
    #[error("{path}: {field}: {message}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The dotted path of the field at fault (`.` for the document itself).
        field: String,
        /// What is wrong, with the line and column where the parser reports them.
        message: String,
    },
}

/// Reads `path` (at most [`MAX_CONFIG_BYTES`]) and decodes it into `T`.
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigFileError> {
    let read_error = |source| ConfigFileError::Read { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigFileError::TooLarge { path: path.to_path_buf(), limit: MAX_CONFIG_BYTES });
    }
    let text = String::from_utf8(bytes)
        .map_err(|error| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, error.utf8_error())))?;
    decode(path, &text)
}

/// Decodes `text` (one YAML document; JSON is YAML's flow syntax, so a JSON file reads too) into
/// `T`, naming the failing field.
pub fn decode<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigFileError> {
    let mut field = String::from(".");
    serde_saphyr::with_deserializer_from_str(text, |deserializer| {
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            field = error.path().to_string();
            error.into_inner()
        })
    })
    .map_err(|error| ConfigFileError::Decode {
        path: path.to_path_buf(),
        field,
        message: error.without_snippet().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Small {
        #[allow(dead_code)] // Only its decoding is tested.
        size: u64,
    }

    #[test]
    fn a_bad_field_is_named_with_the_file() {
        let error = decode::<Small>(Path::new("driver.yaml"), "size: many\n").unwrap_err().to_string();
        assert!(error.starts_with("driver.yaml: size: "), "{error}");
        let error = decode::<Small>(Path::new("d.json"), "{\"size\": 1, \"extra\": 2}").unwrap_err().to_string();
        assert!(error.starts_with("d.json: "), "{error}");
        assert!(error.contains("extra"), "{error}");
    }

    #[test]
    fn an_endless_file_is_refused_at_the_bound() {
        let error = load::<Small>(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(error, ConfigFileError::TooLarge { limit: MAX_CONFIG_BYTES, .. }), "{error}");
    }
}
