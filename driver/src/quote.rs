//! Quoting request input into messages: escaped, so a control character cannot forge a log line,
//! and bounded, so a megabyte of input never makes a megabyte of error.

/// How much of one input a message quotes.
pub const MAX_QUOTED_BYTES: usize = 256;

/// `input` in double quotes with Rust's escapes, cut to its first [`MAX_QUOTED_BYTES`] bytes (at
/// a character boundary) with the full length said when it was cut.
pub fn quote(input: &str) -> String {
    if input.len() <= MAX_QUOTED_BYTES {
        return format!("{input:?}");
    }
    let mut end = MAX_QUOTED_BYTES;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &input[..end], input.len())
}

/// [`quote`] for a path, which may not be UTF-8.
pub fn quote_path(path: &std::path::Path) -> String {
    quote(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole_and_escaped() {
        assert_eq!(quote("cluster-ca"), "\"cluster-ca\"");
        assert_eq!(quote("a\nforged: line\u{1b}[31m"), "\"a\\nforged: line\\u{1b}[31m\"");
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
