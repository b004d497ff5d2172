//! What can go wrong building an image, each told with what it concerns.

/// An image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input (the program, a library, a flag) is missing or unusable.
    #[error("{0}")]
    Input(String),
    /// Writing the archive failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file being written.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The result of building.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// At most 300 bytes of `text`, for an error that quotes a tool's output.
pub fn bounded(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}
