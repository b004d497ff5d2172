//! Request text on its way into a log line: control characters escaped (so a crafted value cannot
//! forge a line), at most 256 bytes of it, and per-request warnings rate-limited so that a flood
//! of bad requests costs a counter, not the disk.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much of one text a log line quotes.
pub const MAX_LOGGED_BYTES: usize = 256;

/// `text` with control characters escaped, cut at [`MAX_LOGGED_BYTES`] (at a character
/// boundary) with its full length said.
pub fn escaped(text: &str) -> String {
    let mut end = text.len().min(MAX_LOGGED_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end);
    for c in text[..end].chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if end < text.len() {
        out.push_str(&format!("... ({} bytes)", text.len()));
    }
    out
}

/// At most one line per interval; the lines held back are counted and reported with the next.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimiter {
    /// One line per `interval`.
    pub fn new(interval: Duration) -> LogLimiter {
        LogLimiter { interval, state: Mutex::new((None, 0)) }
    }

    /// `Some(held back since the last line)` when a line may be written now.
    pub fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        if state.0.is_some_and(|last| now.duration_since(last) < self.interval) {
            state.1 += 1;
            return None;
        }
        let held_back = state.1;
        *state = (Some(now), 0);
        Some(held_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_cut() {
        assert_eq!(escaped("unknown variant `X\nlevel=ERROR forged`"), "unknown variant `X\\nlevel=ERROR forged`");
        assert_eq!(escaped("tab\there \u{1b}[31m"), "tab\\there \\u{1b}[31m");
        let long = "é".repeat(600);
        let cut = escaped(&long);
        assert!(cut.ends_with("... (1200 bytes)") && cut.len() <= MAX_LOGGED_BYTES + 20, "{cut}");
    }

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let limiter = LogLimiter::new(Duration::from_secs(3600));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
        assert_eq!(limiter.allow(), None);
        let limiter = LogLimiter::new(Duration::ZERO);
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), Some(0));
    }
}
