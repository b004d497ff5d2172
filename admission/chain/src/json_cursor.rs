//! A strict, single-pass JSON reader for decoders that read a few fields and skip everything
//! else. It accepts nothing serde_json would refuse, and declines ([`Declined`]) whatever it does not
//! handle itself, so its caller can always fall back to serde_json for the answer and the error.
//!
//! What it leaves to serde_json, on purpose: keys with escapes (serde would unescape them before
//! matching a field), surrogate escapes in strings it reads, structs written as arrays, and
//! nesting deeper than [`MAX_DEPTH`]. Skipped values are checked exactly as serde_json's
//! `ignore_value` checks them: the same number grammar, the same string escapes, no control
//! characters in strings.

use std::borrow::Cow;

/// The reader declined the input: it is not JSON, or not in the shape the decoder reads, or in a
/// form left to serde_json. Never an answer by itself; the caller asks serde_json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Declined;

/// A reading step.
pub(crate) type Step<T> = Result<T, Declined>;

/// Arrays and objects nested deeper than this are left to serde_json, whose skipping does not
/// recurse; this reader does, and must not exhaust the stack on hostile input.
pub(crate) const MAX_DEPTH: u32 = 128;

/// A position in one JSON text.
pub(crate) struct JsonCursor<'a> {
    text: &'a str,
    at: usize,
    depth: u32,
}

impl<'a> JsonCursor<'a> {
    /// A cursor at the start of `text`.
    pub(crate) fn new(text: &'a str) -> JsonCursor<'a> {
        JsonCursor { text, at: 0, depth: 0 }
    }

    /// The bytes not yet read.
    #[cfg(test)]
    pub(crate) fn remaining(&self) -> usize {
        self.text.len() - self.at
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not JSON whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.bytes();
        while let Some(&byte) = bytes.get(self.at) {
            if !matches!(byte, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(byte);
            }
            self.at += 1;
        }
        None
    }

    fn expect(&mut self, wanted: u8) -> Step<()> {
        if self.peek() != Some(wanted) {
            return Err(Declined);
        }
        self.at += 1;
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Step<()> {
        if !self.bytes()[self.at..].starts_with(word) {
            return Err(Declined);
        }
        self.at += word.len();
        Ok(())
    }

    /// Only whitespace remains: the document has ended.
    pub(crate) fn finish(mut self) -> Step<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Declined),
        }
    }

    /// `null` (consumed, `None`), or the value `read` reads.
    pub(crate) fn optional<T>(&mut self, read: impl FnOnce(&mut Self) -> Step<T>) -> Step<Option<T>> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            return Ok(None);
        }
        read(self).map(Some)
    }

    /// `true` or `false`.
    pub(crate) fn bool(&mut self) -> Step<bool> {
        match self.peek() {
            Some(b't') => self.literal(b"true").map(|()| true),
            Some(b'f') => self.literal(b"false").map(|()| false),
            _ => Err(Declined),
        }
    }

    /// A string, unescaped: borrowed from the text when it holds no escapes (nearly always), so
    /// reading it neither allocates nor copies.
    pub(crate) fn string(&mut self) -> Step<Cow<'a, str>> {
        self.expect(b'"')?;
        let start = self.at;
        let escaped = self.skip_string_body()?;
        let raw = &self.text[start..self.at - 1];
        if escaped { unescape(raw).map(Cow::Owned) } else { Ok(Cow::Borrowed(raw)) }
    }

    /// A string without escapes, borrowed from the text; one with escapes is declined.
    pub(crate) fn plain_str(&mut self) -> Step<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        if self.skip_string_body()? {
            return Err(Declined);
        }
        Ok(&self.text[start..self.at - 1])
    }

    /// An object, handing each member's key to `member`, which must read or skip its value.
    pub(crate) fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Step<()>) -> Step<()> {
        self.enclosed(b'{', b'}', |cursor| {
            let key = cursor.plain_str()?;
            cursor.expect(b':')?;
            member(cursor, key)
        })
    }

    /// An array, calling `item` for each element, which must read or skip it.
    pub(crate) fn array(&mut self, item: impl FnMut(&mut Self) -> Step<()>) -> Step<()> {
        self.enclosed(b'[', b']', item)
    }

    /// `open`, entries separated by commas (none trailing), `close`.
    fn enclosed(&mut self, open: u8, close: u8, mut entry: impl FnMut(&mut Self) -> Step<()>) -> Step<()> {
        self.expect(open)?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Declined);
        }
        if self.peek() != Some(close) {
            loop {
                entry(self)?;
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(byte) if byte == close => break,
                    _ => return Err(Declined),
                }
            }
        }
        self.at += 1;
        self.depth -= 1;
        Ok(())
    }

    /// An array whose every element `read` reads.
    pub(crate) fn list<T>(&mut self, mut read: impl FnMut(&mut Self) -> Step<T>) -> Step<Vec<T>> {
        let mut items = Vec::new();
        self.array(|cursor| read(cursor).map(|item| items.push(item)))?;
        Ok(items)
    }

    /// Any value, checked and dropped.
    pub(crate) fn skip(&mut self) -> Step<()> {
        match self.peek() {
            Some(b'{') => self.object(|cursor, _| cursor.skip()),
            Some(b'[') => self.array(Self::skip),
            Some(b'"') => {
                self.at += 1;
                self.skip_string_body().map(|_| ())
            }
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.skip_number(),
            _ => Err(Declined),
        }
    }

    /// From after an opening quote to after the closing one; true when the string holds escapes.
    /// The escapes accepted are serde_json's: `\" \\ \/ \b \f \n \r \t` and `\u` with four hex
    /// digits; a raw control character is refused, as JSON requires.
    fn skip_string_body(&mut self) -> Step<bool> {
        let bytes = self.bytes();
        let mut escaped = false;
        loop {
            self.at = next_quote_backslash_or_control(bytes, self.at);
            match bytes.get(self.at) {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    match bytes.get(self.at + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 2,
                        Some(b'u') => {
                            let digits = bytes.get(self.at + 2..self.at + 6).ok_or(Declined)?;
                            if !digits.iter().all(u8::is_ascii_hexdigit) {
                                return Err(Declined);
                            }
                            self.at += 6;
                        }
                        _ => return Err(Declined),
                    }
                }
                _ => return Err(Declined),
            }
        }
    }

    /// serde_json's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn skip_number(&mut self) -> Step<()> {
        let bytes = self.bytes();
        let digits = |at: usize| bytes[at..].iter().take_while(|b| b.is_ascii_digit()).count();
        if bytes.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match bytes.get(self.at) {
            Some(b'0') => {
                self.at += 1;
                if bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
                    return Err(Declined);
                }
            }
            Some(b'1'..=b'9') => self.at += digits(self.at),
            _ => return Err(Declined),
        }
        if bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            let fraction = digits(self.at);
            if fraction == 0 {
                return Err(Declined);
            }
            self.at += fraction;
        }
        if matches!(bytes.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(bytes.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            let exponent = digits(self.at);
            if exponent == 0 {
                return Err(Declined);
            }
            self.at += exponent;
        }
        Ok(())
    }
}

/// The index of the first `"`, `\` or control character at or after `from` (`bytes.len()` when
/// there is none), eight bytes at a time: strings make up most of a review's bytes. These are
/// also exactly the bytes a JSON writer must escape.
pub(crate) fn next_quote_backslash_or_control(bytes: &[u8], from: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let has_byte = |word: u64, byte: u8| {
        let matched = word ^ (ONES * u64::from(byte));
        matched.wrapping_sub(ONES) & !matched
    };
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let Ok(word) = <[u8; 8]>::try_from(chunk).map(u64::from_le_bytes) else { break };
        // A byte below 0x20 borrows out of its high bit; one at or above 0x80 is masked by `!word`.
        // The lowest flagged byte is always a real match (borrows only run upwards).
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let found = (control | has_byte(word, b'"') | has_byte(word, b'\\')) & HIGH;
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&byte) = bytes.get(at) {
        if byte == b'"' || byte == b'\\' || byte < 0x20 {
            return at;
        }
        at += 1;
    }
    at
}

/// The text of a string whose escapes were checked while it was skipped. A `\u` escape of a
/// surrogate is declined: serde_json pairs surrogates itself, with errors of its own.
fn unescape(raw: &str) -> Step<String> {
    let mut text = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(slash) = rest.find('\\') {
        text.push_str(&rest[..slash]);
        let escape = &rest[slash + 1..];
        let (decoded, length) = match escape.as_bytes().first() {
            Some(b'"') => ('"', 1),
            Some(b'\\') => ('\\', 1),
            Some(b'/') => ('/', 1),
            Some(b'b') => ('\u{8}', 1),
            Some(b'f') => ('\u{c}', 1),
            Some(b'n') => ('\n', 1),
            Some(b'r') => ('\r', 1),
            Some(b't') => ('\t', 1),
            Some(b'u') => {
                let hex = escape.get(1..5).ok_or(Declined)?;
                let code = u32::from_str_radix(hex, 16).map_err(|_| Declined)?;
                (char::from_u32(code).ok_or(Declined)?, 5)
            }
            _ => return Err(Declined),
        };
        text.push(decoded);
        rest = &escape[length..];
    }
    text.push_str(rest);
    Ok(text)
}

#[cfg(test)]
mod tests;
