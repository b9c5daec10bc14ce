//! Refusing requests whose body framing is ambiguous: both `Content-Length`
//! and `Transfer-Encoding`, conflicting or malformed lengths, a transfer
//! coding other than `chunked` — the requests that smuggle a second request
//! past one parser and not another.
//!
//! hyper parses the requests, and by RFC 9112 §6.3 it lets
//! `Transfer-Encoding` win and drops the `Content-Length` before the
//! service sees the request, so the service cannot tell. The
//! [`FramingGuard`] therefore reads the same bytes hyper reads: each
//! request head is parsed with httparse (as hyper does), its body only
//! skipped, and a [`Verdict`] per head queued in order; the service takes
//! one per request. Whatever the guard cannot follow (a CONNECT's tunnel,
//! a malformed chunk, a head too large) stops it, and every later request
//! on the connection finds no verdict and is refused.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest request head followed (hyper refuses larger ones itself).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a head (hyper's default limit too).
const MAX_HEADERS: usize = 100;
/// Longest chunk-size or trailer line followed.
const MAX_LINE: usize = 4 * 1024;

/// What the guard found about one request head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Clear,
    /// Refused with 400; says why.
    Ambiguous(&'static str),
}

/// Follows requests through a connection's bytes (pure; see the module).
#[derive(Debug, Default)]
pub struct FramingTracker {
    state: State,
    /// An incomplete head, chunk-size line or trailer line.
    pending: Vec<u8>,
    verdicts: VecDeque<Verdict>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data: bytes left.
    ChunkEnd(u8),
    /// A trailer field, or the empty line ending a chunked body.
    Trailer,
    /// Not followed any further.
    Stopped,
}

impl FramingTracker {
    /// The verdict on the oldest request head not yet taken.
    pub fn next_verdict(&mut self) -> Option<Verdict> {
        self.verdicts.pop_front()
    }

    /// Follows the next bytes the client sent.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let consumed = match self.state {
                State::Stopped => return,
                State::Body(left) => {
                    let n = skip(left, bytes.len());
                    self.state = if n as u64 == left {
                        State::Head
                    } else {
                        State::Body(left - n as u64)
                    };
                    n
                }
                State::ChunkData(left) => {
                    let n = skip(left, bytes.len());
                    self.state = if n as u64 == left {
                        State::ChunkEnd(2)
                    } else {
                        State::ChunkData(left - n as u64)
                    };
                    n
                }
                State::ChunkEnd(left) => {
                    let n = skip(u64::from(left), bytes.len());
                    let left = left - n as u8;
                    self.state = if left == 0 {
                        State::ChunkSize
                    } else {
                        State::ChunkEnd(left)
                    };
                    n
                }
                State::Head => self.head(bytes),
                State::ChunkSize | State::Trailer => self.line(bytes),
            };
            bytes = &bytes[consumed..];
        }
    }

    /// Takes in bytes of a request head; returns how many were used.
    fn head(&mut self, bytes: &[u8]) -> usize {
        if self.pending.is_empty() {
            // The usual case: the whole head came in one read.
            return match parse_head(bytes) {
                Parsed::Complete(n, verdict, next) => self.judged(n, verdict, next),
                Parsed::Partial => self.keep(bytes, MAX_HEAD),
                Parsed::Invalid => self.stop(bytes.len()),
            };
        }
        // Parse again only when the new bytes may end the head.
        let window = self.pending.len().saturating_sub(3);
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > MAX_HEAD {
            return self.stop(bytes.len());
        }
        let tail = &self.pending[window..];
        if !tail.windows(2).any(|w| w == b"\n\n") && !tail.windows(3).any(|w| w == b"\n\r\n") {
            return bytes.len();
        }
        let pending = std::mem::take(&mut self.pending);
        match parse_head(&pending) {
            Parsed::Complete(n, verdict, next) => {
                let earlier = pending.len() - bytes.len();
                self.judged(n - earlier, verdict, next)
            }
            Parsed::Partial => {
                self.pending = pending;
                bytes.len()
            }
            Parsed::Invalid => self.stop(bytes.len()),
        }
    }

    fn judged(&mut self, used: usize, verdict: Verdict, next: State) -> usize {
        self.verdicts.push_back(verdict);
        self.state = if verdict == Verdict::Clear {
            next
        } else {
            State::Stopped
        };
        used
    }

    /// Takes in bytes of a chunk-size or trailer line.
    fn line(&mut self, bytes: &[u8]) -> usize {
        let Some(end) = bytes.iter().position(|b| *b == b'\n') else {
            return self.keep(bytes, MAX_LINE);
        };
        let used = end + 1;
        self.pending.extend_from_slice(&bytes[..used]);
        let line = std::mem::take(&mut self.pending);
        if line.len() > MAX_LINE || !line.ends_with(b"\r\n") {
            return self.stop(used);
        }
        self.state = match self.state {
            State::ChunkSize => match httparse::parse_chunk_size(&line) {
                Ok(httparse::Status::Complete((n, 0))) if n == line.len() => State::Trailer,
                Ok(httparse::Status::Complete((n, size))) if n == line.len() => State::ChunkData(size),
                _ => State::Stopped,
            },
            _ if line == b"\r\n" => State::Head,
            _ => State::Trailer,
        };
        used
    }

    fn keep(&mut self, bytes: &[u8], max: usize) -> usize {
        if self.pending.len() + bytes.len() > max {
            return self.stop(bytes.len());
        }
        self.pending.extend_from_slice(bytes);
        bytes.len()
    }

    fn stop(&mut self, used: usize) -> usize {
        self.state = State::Stopped;
        self.pending = Vec::new();
        used
    }
}

fn skip(left: u64, available: usize) -> usize {
    usize::try_from(left).map_or(available, |left| left.min(available))
}

enum Parsed {
    /// Head length, its verdict, and what follows it.
    Complete(usize, Verdict, State),
    Partial,
    Invalid,
}

fn parse_head(bytes: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => {
            let (verdict, next) = judge(&request);
            Parsed::Complete(n, verdict, next)
        }
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(_) => Parsed::Invalid,
    }
}

/// The verdict on a parsed head, and how its body is framed.
fn judge(request: &httparse::Request<'_, '_>) -> (Verdict, State) {
    let mut length: Option<u64> = None;
    let mut codings = 0;
    let mut chunked = true;
    for h in request.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let Some(this) = parse_length(h.value) else {
                return ambiguous("an invalid Content-Length");
            };
            if length.is_some_and(|earlier| earlier != this) {
                return ambiguous("conflicting Content-Length headers");
            }
            length = Some(this);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            codings += 1;
            chunked &= h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
        }
    }
    if codings > 0 {
        if length.is_some() {
            return ambiguous("both Content-Length and Transfer-Encoding");
        }
        if codings > 1 || !chunked {
            return ambiguous("a transfer coding other than a single chunked");
        }
        if request.version != Some(1) {
            return ambiguous("Transfer-Encoding in an HTTP/1.0 request");
        }
    }
    if request.method.is_some_and(|m| m.eq_ignore_ascii_case("CONNECT")) {
        // A tunnel, or a refusal that closes the connection.
        return (Verdict::Clear, State::Stopped);
    }
    let next = match length {
        _ if codings > 0 => State::ChunkSize,
        Some(n) if n > 0 => State::Body(n),
        _ => State::Head,
    };
    (Verdict::Clear, next)
}

fn ambiguous(why: &'static str) -> (Verdict, State) {
    (Verdict::Ambiguous(why), State::Stopped)
}

/// A Content-Length value: digits only.
fn parse_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The verdicts of one connection, shared by its stream and its service.
#[derive(Clone, Debug, Default)]
pub struct Verdicts(Arc<Mutex<FramingTracker>>);

impl Verdicts {
    /// The verdict on the next request; `None` when the guard could not
    /// follow the connection that far.
    pub fn next(&self) -> Option<Verdict> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_verdict()
    }
}

/// A client's stream, its bytes followed by a [`FramingTracker`].
pub struct FramingGuard<IO> {
    inner: IO,
    verdicts: Verdicts,
}

impl<IO> FramingGuard<IO> {
    pub fn new(inner: IO, verdicts: Verdicts) -> Self {
        Self { inner, verdicts }
    }

    /// The stream inside, for a tunnel relayed on the socket itself.
    pub fn into_inner(self) -> IO {
        self.inner
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FramingGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        if !new.is_empty() {
            self.verdicts
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .feed(new);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FramingGuard<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` in pieces of `step` bytes; the verdicts in order.
    fn verdicts(stream: &[u8], step: usize) -> Vec<Verdict> {
        let mut tracker = FramingTracker::default();
        for piece in stream.chunks(step) {
            tracker.feed(piece);
        }
        std::iter::from_fn(|| tracker.next_verdict()).collect()
    }

    fn every_split(stream: &[u8]) -> Vec<Verdict> {
        let whole = verdicts(stream, stream.len());
        for step in [1, 2, 3, 7, 64] {
            assert_eq!(verdicts(stream, step), whole, "fed {step} bytes at a time");
        }
        whole
    }

    const GET: &[u8] = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn requests_with_plain_bodies_are_followed_one_by_one() {
        let mut stream = GET.to_vec();
        // A body that looks like a request with ambiguous framing must be skipped.
        let body = b"GET http://a/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream.extend_from_slice(
            format!(
                "POST http://a/ HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        stream.extend_from_slice(body);
        stream.extend_from_slice(GET);
        assert_eq!(every_split(&stream), [Verdict::Clear; 3]);
    }

    #[test]
    fn chunked_bodies_and_trailers_are_skipped() {
        let mut stream = b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        stream.extend_from_slice(b"5;ext=1\r\nhello\r\n1A\r\n");
        stream.extend_from_slice(&[b'x'; 26]);
        stream.extend_from_slice(b"\r\n0\r\nX-Checksum: 1\r\n\r\n");
        stream.extend_from_slice(GET);
        assert_eq!(every_split(&stream), [Verdict::Clear; 2]);
    }

    #[test]
    fn ambiguous_framing_is_refused_and_nothing_after_it_followed() {
        for (head, why) in [
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                "conflicting Content-Length headers",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
                "an invalid Content-Length",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                "a transfer coding other than a single chunked",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                "a transfer coding other than a single chunked",
            ),
            (
                "POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "Transfer-Encoding in an HTTP/1.0 request",
            ),
        ] {
            let mut stream = head.as_bytes().to_vec();
            stream.extend_from_slice(GET);
            assert_eq!(every_split(&stream), [Verdict::Ambiguous(why)], "{head}");
        }
    }

    #[test]
    fn nothing_after_connect_or_unparsable_bytes_gets_a_verdict() {
        let mut stream = b"CONNECT a:443 HTTP/1.1\r\n\r\n".to_vec();
        stream.extend_from_slice(GET);
        assert_eq!(every_split(&stream), [Verdict::Clear]);

        let mut stream = GET.to_vec();
        stream.extend_from_slice(b"EHLO attacker\r\nMAIL FROM:<a@b>\r\n\r\n");
        stream.extend_from_slice(GET);
        assert_eq!(every_split(&stream), [Verdict::Clear]);

        let mut stream = b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec();
        stream.extend_from_slice(GET);
        assert_eq!(every_split(&stream), [Verdict::Clear], "a malformed chunk size");
    }

    #[test]
    fn an_oversized_head_stops_the_guard() {
        let mut stream = b"GET http://a/ HTTP/1.1\r\nX-Big: ".to_vec();
        stream.resize(MAX_HEAD + 10, b'a');
        stream.extend_from_slice(b"\r\n\r\n");
        assert_eq!(verdicts(&stream, 1000), []);
    }
}
