//! Quoting user input into messages: escaped, so a control character cannot forge a log line,
//! bounded, so a megabyte of input never makes a megabyte of error, and free of `%`, since
//! kubelet hands a driver's message to a printf-style formatter when it records the pod's event
//! (a quoted `%2f` would come out as `%!f(MISSING)`).

/// How much of one input a message quotes.
pub const MAX_QUOTED_BYTES: usize = 256;

/// `input` in double quotes with Rust's escapes (and `%` as `\u{25}`), cut to its first
/// [`MAX_QUOTED_BYTES`] bytes (at a character boundary) with the full length said when it was
/// cut.
pub fn quote(input: &str) -> String {
    if input.len() <= MAX_QUOTED_BYTES {
        return without_percent(format!("{input:?}"));
    }
    without_percent(format!("{:?}... ({} bytes)", cut(input, MAX_QUOTED_BYTES), input.len()))
}

/// The longest prefix of `text` of at most `limit` bytes that ends at a character boundary: the
/// one place text is cut.
pub fn cut(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` with each `%` written as the escape `\u{25}`, which no printf-style formatter reads.
pub fn without_percent(text: String) -> String {
    if text.contains('%') { text.replace('%', "\\u{25}") } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_never_splits_a_character() {
        assert_eq!(cut("h\u{e9}llo", 2), "h", "\u{e9} is two bytes: it is left out whole");
        assert_eq!(cut("h\u{e9}llo", 3), "h\u{e9}");
        assert_eq!(cut("abc", 10), "abc");
    }

    #[test]
    fn short_input_is_quoted_whole_and_escaped() {
        assert_eq!(quote("cluster-ca"), "\"cluster-ca\"");
        assert_eq!(quote("a\nforged: line\u{1b}[31m"), "\"a\\nforged: line\\u{1b}[31m\"");
    }

    #[test]
    fn a_percent_sign_never_reaches_a_message_as_itself() {
        assert_eq!(quote("a%2fb"), "\"a\\u{25}2fb\"");
    }

    #[test]
    fn long_input_is_cut_at_a_character_boundary_and_says_its_length() {
        let long = "é".repeat(1 << 19);
        let quoted = quote(&long);
        assert!(quoted.len() < MAX_QUOTED_BYTES + 32, "{}", quoted.len());
        assert!(quoted.ends_with("\"... (1048576 bytes)"), "{quoted}");
        assert!(quoted.starts_with("\"éé"));
    }
}
