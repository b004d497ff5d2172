//! kubelet's plugin watcher dials the registration socket with grpc-go and a bare socket path as
//! the target, so its requests carry that path (`/var/lib/kubelet/plugins_registry/...sock`) as
//! the HTTP/2 `:authority`. The h2 library under tonic refuses such an authority as malformed
//! (PROTOCOL_ERROR), so kubelet could never register the driver. This stream adapter sits between
//! the registration socket and h2 and rewrites that one header's value to `localhost` before h2
//! reads it; every other byte passes unchanged, and the CSI socket does not use it.
//!
//! Only what is needed is parsed: HTTP/2 frame headers (RFC 9113 §4.1), and in HEADERS frames the
//! HPACK representations (RFC 7541 §6), walked by their integer and string lengths without
//! decoding any string. The `:authority` name is recognised by its static-table index (1), which
//! is how grpc-go sends it. Replacing a value with a shorter one keeps HPACK's dynamic tables in
//! step: the server's entry is smaller, so the server evicts no earlier than the client, and an
//! index the client uses always names the same entry on both sides.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4), passed through untouched.
const PREFACE_LENGTH: usize = 24;
const FRAME_HEADER_LENGTH: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Larger frames are passed through unread (h2 refuses them anyway beyond its 16 KiB default).
const MAX_REWRITTEN_FRAME: usize = 1 << 20;
/// `:authority`'s index in HPACK's static table.
const AUTHORITY_INDEX: u64 = 1;
/// What replaces an authority h2 would refuse.
const REPLACEMENT: &[u8] = b"localhost";

/// A stream whose incoming HTTP/2 `:authority` headers are made acceptable to h2.
#[derive(Debug)]
pub struct AuthorityRewrite<S> {
    inner: S,
    /// Bytes read from `inner` and not yet framed.
    pending: Vec<u8>,
    /// Bytes ready for the reader.
    ready: Vec<u8>,
    preface_left: usize,
    /// Once a frame cannot be handled (too large), everything after passes through as read.
    passthrough: bool,
    eof: bool,
}

impl<S> AuthorityRewrite<S> {
    /// Wraps `inner`, a server-side connection.
    pub fn new(inner: S) -> AuthorityRewrite<S> {
        AuthorityRewrite {
            inner,
            pending: Vec::new(),
            ready: Vec::new(),
            preface_left: PREFACE_LENGTH,
            passthrough: false,
            eof: false,
        }
    }

    /// The wrapped stream.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Moves every complete frame from `pending` to `ready`, rewritten where needed.
    fn process(&mut self) {
        if self.preface_left > 0 {
            let take = self.preface_left.min(self.pending.len());
            self.ready.extend(self.pending.drain(..take));
            self.preface_left -= take;
        }
        while self.preface_left == 0 && !self.passthrough && self.pending.len() >= FRAME_HEADER_LENGTH {
            let length = u32::from_be_bytes([0, self.pending[0], self.pending[1], self.pending[2]]) as usize;
            if length > MAX_REWRITTEN_FRAME {
                self.passthrough = true;
                break;
            }
            if self.pending.len() < FRAME_HEADER_LENGTH + length {
                return;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER_LENGTH + length).collect();
            match rewrite_headers_frame(&frame) {
                Some(rewritten) => self.ready.extend(rewritten),
                None => self.ready.extend(frame),
            }
        }
        if self.passthrough || self.eof {
            self.ready.append(&mut self.pending);
        }
    }
}

/// A HEADERS frame carrying a whole header block (END_HEADERS) with its `:authority` values
/// replaced; `None` when the frame is anything else or needs no change.
fn rewrite_headers_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let (header, payload) = frame.split_at(FRAME_HEADER_LENGTH);
    let (kind, flags) = (header[3], header[4]);
    // A block continued in CONTINUATION frames is left alone: grpc-go's request headers fit in
    // one frame, and splitting a rewrite across frames is not worth its risk.
    if kind != HEADERS || flags & END_HEADERS == 0 {
        return None;
    }
    let padding = if flags & PADDED != 0 { usize::from(*payload.first()?) } else { 0 };
    let start = usize::from(flags & PADDED != 0) + if flags & PRIORITY != 0 { 5 } else { 0 };
    let end = payload.len().checked_sub(padding)?;
    let block = payload.get(start..end)?;
    let rewritten = rewrite_authority(block)?;
    let mut out = Vec::with_capacity(frame.len());
    let length = u32::try_from(start + rewritten.len() + padding).ok()?.to_be_bytes();
    out.extend_from_slice(&length[1..]);
    out.extend_from_slice(&header[3..]);
    out.extend_from_slice(&payload[..start]);
    out.extend_from_slice(&rewritten);
    out.extend_from_slice(&payload[end..]);
    Some(out)
}

/// The header block with every literal `:authority` (name by static index) that h2 would refuse
/// given the value `localhost`; `None` when nothing changes or the block does not parse.
pub fn rewrite_authority(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    let mut changed = false;
    while at < block.len() {
        let first = block[at];
        let (prefix_bits, literal) = match first {
            b if b & 0x80 != 0 => (7, false),    // indexed field
            b if b & 0xC0 == 0x40 => (6, true),  // literal, incremental indexing
            b if b & 0xE0 == 0x20 => (5, false), // dynamic table size update
            _ => (4, true),                      // literal without / never indexed
        };
        let (name_index, after_index) = integer(block, at, prefix_bits)?;
        if !literal {
            out.extend_from_slice(&block[at..after_index]);
            at = after_index;
            continue;
        }
        let mut cursor = after_index;
        if name_index == 0 {
            cursor = string_end(block, cursor)?;
        }
        let value_start = cursor;
        let value_end = string_end(block, value_start)?;
        out.extend_from_slice(&block[at..value_start]);
        if name_index == AUTHORITY_INDEX && needs_rewrite(&block[value_start..value_end]) {
            // Raw (not Huffman) and shorter than what it replaces: see the module comment.
            out.push(REPLACEMENT.len() as u8);
            out.extend_from_slice(REPLACEMENT);
            changed = true;
        } else {
            out.extend_from_slice(&block[value_start..value_end]);
        }
        at = value_end;
    }
    changed.then_some(out)
}

/// Huffman-coded values at least this long decode to at least [`REPLACEMENT`]'s length (no
/// Huffman code is longer than 30 bits).
const MIN_HUFFMAN_REWRITTEN: usize = (REPLACEMENT.len() * 30).div_ceil(8);

/// Whether an encoded `:authority` string should be replaced: a raw value that is not made of
/// host characters (h2 would refuse it), or a Huffman-coded one long enough that the replacement
/// is surely shorter. Huffman strings are not decoded: this socket is dialled only by kubelet,
/// whose authority is its socket path, and the server does not read the authority anyway.
fn needs_rewrite(encoded: &[u8]) -> bool {
    let Some((_, data_start)) = integer(encoded, 0, 7) else { return false };
    let data = &encoded[data_start..];
    if encoded[0] & 0x80 != 0 {
        return data.len() >= MIN_HUFFMAN_REWRITTEN;
    }
    data.len() >= REPLACEMENT.len() && !data.iter().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(b))
}

/// An HPACK integer with an `prefix_bits`-bit prefix starting at `at` (RFC 7541 §5.1): its value
/// and the index just past it.
fn integer(block: &[u8], at: usize, prefix_bits: u32) -> Option<(u64, usize)> {
    let max = (1u64 << prefix_bits) - 1;
    let mut value = u64::from(*block.get(at)?) & max;
    let mut next = at + 1;
    if value < max {
        return Some((value, next));
    }
    let mut shift = 0u32;
    loop {
        let byte = *block.get(next)?;
        next += 1;
        value = value.checked_add(u64::from(byte & 0x7F).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, next));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// The index just past the HPACK string literal starting at `at` (RFC 7541 §5.2).
fn string_end(block: &[u8], at: usize) -> Option<usize> {
    let (length, data) = integer(block, at, 7)?;
    let end = data.checked_add(usize::try_from(length).ok()?)?;
    (end <= block.len()).then_some(end)
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if !self.ready.is_empty() {
                let take = self.ready.len().min(buf.remaining());
                buf.put_slice(&self.ready[..take]);
                self.ready.drain(..take);
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut read))?;
            let filled = read.filled().len();
            if filled == 0 {
                self.eof = true;
            } else {
                self.pending.extend_from_slice(&chunk[..filled]);
            }
            self.process();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `:method: POST` (static 3), then `:authority` as a literal with incremental indexing
    /// whose raw value is `value`, then `:path: /` (static 4).
    fn block(value: &[u8]) -> Vec<u8> {
        let mut block = vec![0x83, 0x41, value.len() as u8];
        block.extend_from_slice(value);
        block.push(0x84);
        block
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_nothing_else_changes() {
        let path = b"/var/lib/kubelet/plugins_registry/sharedresource.csi.inlineguard.dev-reg.sock";
        assert_eq!(rewrite_authority(&block(path)), Some(block(b"localhost")));
        // Never indexed, and without indexing, are rewritten too.
        let mut never = vec![0x11, path.len() as u8];
        never.extend_from_slice(path);
        assert_eq!(rewrite_authority(&never), Some([&[0x11, 9][..], b"localhost"].concat()));
    }

    #[test]
    fn good_authorities_and_other_headers_are_left_alone() {
        assert_eq!(rewrite_authority(&block(b"localhost")), None);
        assert_eq!(rewrite_authority(&block(b"127.0.0.1:8443")), None);
        // A literal name (index 0) that is not `:authority`: `x-path: /a/b/c/d/e/f`.
        let literal_name = [&[0x40, 6][..], b"x-path", &[11], b"/a/b/c/d/e/f"].concat();
        assert_eq!(rewrite_authority(&literal_name), None);
        // Only indexed fields and a table size update.
        assert_eq!(rewrite_authority(&[0x82, 0x86, 0x3f, 0xe1, 0x1f]), None);
    }

    #[test]
    fn a_huffman_coded_path_is_rewritten_and_a_malformed_block_is_left_to_h2() {
        let mut huffman = vec![0x41, 0x80 | 40];
        huffman.extend_from_slice(&[0x61; 40]);
        assert_eq!(rewrite_authority(&huffman), Some([&[0x41, 9][..], b"localhost"].concat()));
        let mut short = vec![0x41, 0x80 | 12];
        short.extend_from_slice(&[0x61; 12]);
        assert_eq!(rewrite_authority(&short), None, "might decode shorter than the replacement");
        assert_eq!(rewrite_authority(&[0x41, 0x7f]), None, "a length past the end");
        assert_eq!(rewrite_authority(&[0x41, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), None);
    }

    #[test]
    fn headers_frames_keep_their_padding_priority_and_flags_and_get_their_new_length() {
        let path = b"/var/lib/kubelet/plugins_registry/x-reg.sock";
        let block = block(path);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0x80, 0, 0, 1, 15]); // priority
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        frame.extend_from_slice(&[HEADERS, END_HEADERS | PADDED | PRIORITY | 0x1, 0, 0, 0, 1]);
        frame.extend_from_slice(&payload);
        let rewritten = rewrite_headers_frame(&frame).unwrap();
        let new_block = super::tests::block(b"localhost");
        let mut expected_payload = vec![3u8, 0x80, 0, 0, 1, 15];
        expected_payload.extend_from_slice(&new_block);
        expected_payload.extend_from_slice(&[0, 0, 0]);
        let mut expected = (expected_payload.len() as u32).to_be_bytes()[1..].to_vec();
        expected.extend_from_slice(&[HEADERS, END_HEADERS | PADDED | PRIORITY | 0x1, 0, 0, 0, 1]);
        expected.extend_from_slice(&expected_payload);
        assert_eq!(rewritten, expected);
        // Without END_HEADERS (continued), or another type: untouched.
        let mut continued = frame.clone();
        continued[4] &= !END_HEADERS;
        assert_eq!(rewrite_headers_frame(&continued), None);
        let mut data = frame;
        data[3] = 0x0;
        assert_eq!(rewrite_headers_frame(&data), None);
    }

    #[tokio::test]
    async fn the_stream_passes_the_preface_and_rewrites_frames_split_across_reads() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let path = b"/run/kubelet/plugins_registry/x-reg.sock";
        let block = block(path);
        let mut frame = (block.len() as u32).to_be_bytes()[1..].to_vec();
        frame.extend_from_slice(&[HEADERS, END_HEADERS, 0, 0, 0, 1]);
        frame.extend_from_slice(&block);
        let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0];
        let input = [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &settings, &frame].concat();
        let (mut client, server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for byte in input {
                client.write_all(&[byte]).await.unwrap();
            }
        });
        let mut read = Vec::new();
        AuthorityRewrite::new(server).read_to_end(&mut read).await.unwrap();
        writer.await.unwrap();
        let expected_block = super::tests::block(b"localhost");
        let mut expected_frame = (expected_block.len() as u32).to_be_bytes()[1..].to_vec();
        expected_frame.extend_from_slice(&[HEADERS, END_HEADERS, 0, 0, 0, 1]);
        expected_frame.extend_from_slice(&expected_block);
        assert_eq!(read, [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &settings, &expected_frame].concat());
    }
}
