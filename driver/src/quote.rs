//! Request input in messages and log lines: the quoting itself is the vocabulary crate's (the
//! admission plugin quotes with the same rule), re-exported here; the driver adds the bounds of
//! its log lines.

pub use sharedresource_api::quote::{MAX_QUOTED_BYTES, cut, quote, without_percent};

/// A message for a log line or the wire, cut to `limit` bytes at a character boundary (with
/// `...`): the backstop behind [`quote`], so that no path through the code makes an unbounded
/// line.
pub fn bounded(mut message: String, limit: usize) -> String {
    if message.len() > limit {
        let end = cut(&message, limit).len();
        message.truncate(end);
        message.push_str("...");
    }
    message
}

/// The longest error message a log line carries.
pub const MAX_LOGGED_BYTES: usize = 1024;

/// An error for a log line: displayed through [`bounded`] at [`MAX_LOGGED_BYTES`].
pub struct Logged<'a, E: std::fmt::Display + ?Sized>(pub &'a E);

impl<E: std::fmt::Display + ?Sized> std::fmt::Display for Logged<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&bounded(without_percent(self.0.to_string()), MAX_LOGGED_BYTES))
    }
}

/// [`quote`] for a path, which may not be UTF-8.
pub fn quote_path(path: &std::path::Path) -> String {
    quote(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percent_sign_never_reaches_a_log_line_as_itself() {
        assert_eq!(Logged(&"100%").to_string(), "100\\u{25}");
    }

    #[test]
    fn a_logged_error_is_bounded() {
        let logged = Logged(&"x".repeat(91_364)).to_string();
        assert_eq!(logged.len(), MAX_LOGGED_BYTES + 3);
    }
}
