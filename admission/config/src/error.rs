//! Errors from reading configuration and manifest files. Each names the file it is about.

use std::path::PathBuf;

/// A file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is larger than any input this tool reads (a device such as /dev/zero included).
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
    /// The file parsed but its content is not acceptable.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field at fault.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Result with this module's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
