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
//!
//! The guard also holds an unfinished request head back from hyper: hyper
//! gets a head only once it is complete, so an unfinished head is held
//! once (here, not in hyper's buffer too), and until the connection has
//! authenticated it may hold only its allowance and what it can draw from
//! the listener's head budget (`guarded_listener::head_budget`); past
//! that the guard answers `431` itself and closes the connection.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::adapters::guarded_listener::head_budget::{Growth, HeadAllowance};
use crate::adapters::guarded_listener::{LINGER, Refusal, Slot};

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
#[derive(Debug)]
pub struct FramingTracker {
    state: State,
    /// An incomplete head, chunk-size line or trailer line.
    pending: Vec<u8>,
    /// Each head's verdict, and its length.
    verdicts: VecDeque<(Verdict, usize)>,
    /// The length of the head whose verdict was taken last.
    taken_head: usize,
    /// When the tracker holds unfinished heads back (for a [`FramingGuard`]):
    /// the bytes fed that may go on to hyper, in order. An unfinished head
    /// stays in `pending` until it completes.
    released: Option<Vec<u8>>,
    /// `pending` grows no larger than this for a head (the guard's allowance).
    head_capacity: usize,
}

impl Default for FramingTracker {
    fn default() -> Self {
        Self {
            state: State::default(),
            pending: Vec::new(),
            verdicts: VecDeque::new(),
            taken_head: 0,
            released: None,
            head_capacity: MAX_HEAD,
        }
    }
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

/// How the guard reads the next bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Passage {
    /// Straight into hyper's buffer, at most this many (a body's rest, or
    /// anything once the tracker has stopped).
    Direct(usize),
    /// Through the tracker, which holds back an unfinished head.
    Held,
}

impl FramingTracker {
    /// A tracker that holds unfinished heads back (see [`Self::take_released`]).
    pub fn holding() -> Self {
        Self {
            released: Some(Vec::new()),
            ..Self::default()
        }
    }

    /// The verdict on the oldest request head not yet taken.
    pub fn next_verdict(&mut self) -> Option<Verdict> {
        let (verdict, head) = self.verdicts.pop_front()?;
        self.taken_head = head;
        Some(verdict)
    }

    /// Bytes of an unfinished head held now.
    pub fn unfinished_head(&self) -> usize {
        if self.state == State::Head {
            self.pending.len()
        } else {
            0
        }
    }

    /// Moves up to `room` released bytes to `into`; how many.
    fn take_released(&mut self, into: &mut ReadBuf<'_>) -> usize {
        let Some(released) = &mut self.released else {
            return 0;
        };
        let n = released.len().min(into.remaining());
        into.put_slice(&released[..n]);
        released.drain(..n);
        if released.is_empty() && released.capacity() > 16 * 1024 {
            // A large head passed: an idle connection keeps no large buffer.
            *released = Vec::new();
        }
        n
    }

    fn passage(&self) -> Passage {
        match self.state {
            State::Body(left) | State::ChunkData(left) => {
                Passage::Direct(usize::try_from(left).unwrap_or(usize::MAX))
            }
            State::Stopped => Passage::Direct(usize::MAX),
            _ => Passage::Held,
        }
    }

    /// Stops following the connection and drops what it holds.
    fn abandon(&mut self) {
        self.state = State::Stopped;
        self.pending = Vec::new();
        if let Some(released) = &mut self.released {
            *released = Vec::new();
        }
    }

    /// Bytes that may go on to hyper.
    fn release(&mut self, bytes: &[u8]) {
        if let Some(released) = &mut self.released {
            released.extend_from_slice(bytes);
        }
    }

    /// Follows bytes read straight into hyper's buffer (never held).
    fn observe(&mut self, bytes: &[u8]) {
        let released = self.released.take();
        self.feed(bytes);
        self.released = released;
    }

    /// Follows the next bytes the client sent.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let consumed = match self.state {
                State::Stopped => {
                    self.release(bytes);
                    return;
                }
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
                // Releases what it does not hold itself.
                State::Head => {
                    let used = self.head(bytes);
                    bytes = &bytes[used..];
                    continue;
                }
                State::ChunkSize | State::Trailer => self.line(bytes),
            };
            self.release(&bytes[..consumed]);
            bytes = &bytes[consumed..];
        }
    }

    /// Takes in bytes of a request head; returns how many were used. What
    /// is not (or no longer) an unfinished head is released.
    fn head(&mut self, bytes: &[u8]) -> usize {
        if self.pending.is_empty() {
            // The usual case: the whole head came in one read.
            return match parse_head(bytes) {
                Parsed::Complete(n, verdict, next) => {
                    self.release(&bytes[..n]);
                    self.judged(n, n, verdict, next)
                }
                Parsed::Partial if bytes.len() > MAX_HEAD => self.given_up(bytes),
                Parsed::Partial => {
                    self.grow_pending(bytes.len());
                    self.pending.extend_from_slice(bytes);
                    bytes.len()
                }
                Parsed::Invalid => self.given_up(bytes),
            };
        }
        // Parse again only when the new bytes may end the head.
        let window = self.pending.len().saturating_sub(3);
        self.grow_pending(bytes.len());
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > MAX_HEAD {
            return self.given_up(&[]) + bytes.len();
        }
        let tail = &self.pending[window..];
        if !tail.windows(2).any(|w| w == b"\n\n") && !tail.windows(3).any(|w| w == b"\n\r\n") {
            return bytes.len();
        }
        let pending = std::mem::take(&mut self.pending);
        match parse_head(&pending) {
            Parsed::Complete(n, verdict, next) => {
                let earlier = pending.len() - bytes.len();
                self.release(&pending[..n]);
                self.judged(n - earlier, n, verdict, next)
            }
            Parsed::Partial => {
                self.pending = pending;
                bytes.len()
            }
            Parsed::Invalid => {
                self.pending = pending;
                self.given_up(&[]) + bytes.len()
            }
        }
    }

    /// Makes room in `pending` for `more` bytes of a head: doubling, but
    /// never past the head's capacity unless it must.
    fn grow_pending(&mut self, more: usize) {
        let want = self.pending.len() + more;
        if want > self.pending.capacity() {
            let target = (self.pending.capacity() * 2).min(self.head_capacity).max(want);
            self.pending.reserve_exact(target - self.pending.len());
        }
    }

    /// A head the tracker does not follow (invalid, or too large): it
    /// stops, and the held bytes and `bytes` go on to hyper, which refuses
    /// them itself.
    fn given_up(&mut self, bytes: &[u8]) -> usize {
        let pending = std::mem::take(&mut self.pending);
        self.release(&pending);
        self.release(bytes);
        self.stop(bytes.len())
    }

    fn judged(&mut self, used: usize, head: usize, verdict: Verdict, next: State) -> usize {
        self.verdicts.push_back((verdict, head));
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
#[derive(Clone, Debug)]
pub struct Verdicts(Arc<Mutex<FramingTracker>>);

impl Default for Verdicts {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(FramingTracker::holding())))
    }
}

impl Verdicts {
    /// The verdict on the next request; `None` when the guard could not
    /// follow the connection that far.
    pub fn next(&self) -> Option<Verdict> {
        self.tracker().next_verdict()
    }

    /// The length of the request head whose verdict [`Self::next`] gave last.
    pub fn head_length(&self) -> usize {
        self.tracker().taken_head
    }

    fn tracker(&self) -> MutexGuard<'_, FramingTracker> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A client's stream, its bytes followed by a [`FramingTracker`] that holds
/// unfinished heads back, within the allowance of a connection that has
/// not authenticated (see the module).
pub struct FramingGuard<IO> {
    inner: IO,
    verdicts: Verdicts,
    slot: Arc<Slot>,
    peer: SocketAddr,
    allowance: HeadAllowance,
    /// Set once the guard refused the connection: it answers, then closes.
    refusing: Option<Refusing>,
}

/// A refused connection's answer and lingering close.
struct Refusing {
    answer: Vec<u8>,
    written: usize,
    shut: bool,
    deadline: Pin<Box<Sleep>>,
}

impl<IO> FramingGuard<IO> {
    /// `inner`, the connection from `peer` that `slot` holds.
    pub fn new(inner: IO, verdicts: Verdicts, slot: Arc<Slot>, peer: SocketAddr) -> Self {
        let allowance = slot.unauthenticated().allowance();
        Self {
            inner,
            verdicts,
            slot,
            peer,
            allowance,
            refusing: None,
        }
    }

    /// The stream inside, for a tunnel relayed on the socket itself, and
    /// the bytes read after the `CONNECT` that hyper has not taken yet.
    pub fn into_parts(self) -> (IO, Vec<u8>) {
        let mut left = Vec::new();
        if let Some(released) = self.verdicts.tracker().released.as_mut() {
            left = std::mem::take(released);
        }
        (self.inner, left)
    }

    fn refuse(&mut self, refusal: Refusal) {
        self.verdicts.tracker().abandon();
        self.allowance.settle();
        let unauthenticated = self.slot.unauthenticated();
        unauthenticated.refused(refusal, self.peer);
        self.refusing = Some(Refusing {
            answer: unauthenticated.answer(refusal),
            written: 0,
            shut: false,
            deadline: Box::pin(tokio::time::sleep(LINGER)),
        });
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> FramingGuard<IO> {
    /// Writes the refusal, closes the sending side and drops what the
    /// client still sends, until it closes or [`LINGER`] has passed; then
    /// hyper reads the end of the stream.
    fn poll_refusing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(refusing) = self.refusing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if refusing.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        while refusing.written < refusing.answer.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &refusing.answer[refusing.written..])) {
                Ok(n) if n > 0 => refusing.written += n,
                _ => return Poll::Ready(Ok(())),
            }
        }
        if !refusing.shut {
            let _ = ready!(Pin::new(&mut self.inner).poll_shutdown(cx));
            refusing.shut = true;
        }
        let mut sink = [0u8; 1024];
        loop {
            let mut dropped = ReadBuf::new(&mut sink);
            match ready!(Pin::new(&mut self.inner).poll_read(cx, &mut dropped)) {
                Ok(()) if !dropped.filled().is_empty() => {}
                _ => return Poll::Ready(Ok(())),
            }
        }
    }

    /// How many bytes of a head may be read now; `None` when the guard
    /// refused the connection instead.
    fn head_room(&mut self, unfinished: usize) -> Option<usize> {
        if self.slot.is_authenticated() {
            return Some(usize::MAX);
        }
        loop {
            match self.allowance.next(unfinished, MAX_HEAD) {
                Growth::Room(n) => return Some(n),
                Growth::Draw(n) if self.allowance.draw(n) => {}
                Growth::Draw(_) => {
                    self.refuse(Refusal::HeadBudgetExhausted);
                    return None;
                }
                Growth::TooLarge => {
                    self.refuse(Refusal::HeadTooLarge);
                    return None;
                }
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for FramingGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.refusing.is_some() {
                return this.poll_refusing(cx);
            }
            let passage = {
                let mut tracker = this.verdicts.tracker();
                // Bytes released earlier go first.
                if tracker.take_released(buf) > 0 {
                    return Poll::Ready(Ok(()));
                }
                tracker.passage()
            };
            if let Passage::Direct(limit) = passage {
                let before = buf.filled().len();
                ready!(read_at_most(&mut this.inner, cx, buf, limit))?;
                this.verdicts.tracker().observe(&buf.filled()[before..]);
                return Poll::Ready(Ok(()));
            }
            // hyper's free space is the read's scratch: what the tracker
            // releases is put back into it at the top of the loop.
            if ready!(this.poll_hold(cx, buf))? == Held::End {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// What one read of a head brought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Bytes, now followed (and held or released).
    Read,
    /// The end of the stream: an unfinished head goes nowhere.
    End,
    /// The guard refused the connection instead of reading.
    Refused,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> FramingGuard<IO> {
    /// Reads bytes of a head (or a chunk line) into the tracker, within
    /// the connection's allowance, `scratch`'s free space serving as the
    /// read's buffer (left as it was).
    fn poll_hold(&mut self, cx: &mut Context<'_>, scratch: &mut ReadBuf<'_>) -> Poll<io::Result<Held>> {
        let unfinished = self.verdicts.tracker().unfinished_head();
        let Some(room) = self.head_room(unfinished) else {
            return Poll::Ready(Ok(Held::Refused));
        };
        let authenticated = self.slot.is_authenticated();
        let mut tracker = self.verdicts.tracker();
        tracker.head_capacity = if authenticated {
            MAX_HEAD
        } else {
            self.allowance.allowed()
        };
        let before = scratch.filled().len();
        if ready!(read_at_most(&mut self.inner, cx, scratch, room))? == 0 {
            return Poll::Ready(Ok(Held::End));
        }
        tracker.feed(&scratch.filled()[before..]);
        scratch.set_filled(before);
        if tracker.unfinished_head() == 0 {
            self.allowance.settle();
        }
        Poll::Ready(Ok(Held::Read))
    }

    /// Reads until the connection's first request head is complete: true
    /// then (hyper reads it next), false when the stream ended first or the
    /// guard refused the connection (and has answered and closed it). Until
    /// then the connection costs no HTTP server state or buffers.
    pub fn poll_first_head(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let mut scratch = [0u8; 2048];
        loop {
            if self.refusing.is_some() {
                return self.poll_refusing(cx).map_ok(|()| false);
            }
            {
                let tracker = self.verdicts.tracker();
                let released = tracker.released.as_ref().is_some_and(|r| !r.is_empty());
                if released || tracker.passage() != Passage::Held {
                    return Poll::Ready(Ok(true));
                }
            }
            let mut buf = ReadBuf::new(&mut scratch);
            if ready!(self.poll_hold(cx, &mut buf))? == Held::End {
                return Poll::Ready(Ok(false));
            }
        }
    }
}

/// Reads at most `limit` bytes from `inner` into `buf`; how many (0 at the
/// end of the stream).
fn read_at_most<IO: AsyncRead + Unpin>(
    inner: &mut IO,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
    limit: usize,
) -> Poll<io::Result<usize>> {
    let before = buf.filled().len();
    if limit >= buf.remaining() {
        ready!(Pin::new(inner).poll_read(cx, buf))?;
        return Poll::Ready(Ok(buf.filled().len() - before));
    }
    let mut part = ReadBuf::new(buf.initialize_unfilled_to(limit));
    ready!(Pin::new(inner).poll_read(cx, &mut part))?;
    let n = part.filled().len();
    buf.advance(n);
    Poll::Ready(Ok(n))
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

    /// Feeds `stream` to a holding tracker `step` bytes at a time: what it
    /// released, and the unfinished head it holds at the end.
    fn released(stream: &[u8], step: usize) -> (Vec<u8>, usize) {
        let mut tracker = FramingTracker::holding();
        let mut out = Vec::new();
        for piece in stream.chunks(step) {
            tracker.feed(piece);
            out.append(tracker.released.as_mut().unwrap());
        }
        (out, tracker.unfinished_head())
    }

    #[test]
    fn a_holding_tracker_releases_every_byte_once_in_order_but_an_unfinished_head() {
        let mut stream = GET.to_vec();
        stream.extend_from_slice(b"POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        stream.extend_from_slice(b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        stream.extend_from_slice(b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n");
        stream.extend_from_slice(GET);
        let slow = b"GET http://a/ HTTP/1.1\r\nX-Slow: abc";
        let mut with_slow = stream.clone();
        with_slow.extend_from_slice(slow);
        for step in [1, 2, 3, 7, 64, with_slow.len()] {
            assert_eq!(
                released(&stream, step),
                (stream.clone(), 0),
                "fed {step} at a time"
            );
            assert_eq!(
                released(&with_slow, step),
                (stream.clone(), slow.len()),
                "fed {step} at a time"
            );
        }
        // After a CONNECT (or bytes it cannot follow) everything goes on.
        let mut tunnel = b"CONNECT a:443 HTTP/1.1\r\n\r\n\x16\x03\x01".to_vec();
        tunnel.extend_from_slice(slow);
        assert_eq!(released(&tunnel, 5), (tunnel.clone(), 0));
        // A head past the largest followed goes on too, for hyper to refuse.
        let mut big = b"GET http://a/ HTTP/1.1\r\nX-Big: ".to_vec();
        big.resize(MAX_HEAD + 10, b'a');
        assert_eq!(released(&big, 1000), (big.clone(), 0));
    }

    #[test]
    fn an_unfinished_head_grows_no_larger_than_its_capacity_in_memory() {
        let mut tracker = FramingTracker::holding();
        tracker.head_capacity = 4096;
        tracker.feed(b"GET http://a/ HTTP/1.1\r\n");
        for _ in 0..100 {
            tracker.feed(&[b'x'; 40]);
        }
        assert_eq!(tracker.unfinished_head(), 24 + 4000);
        assert_eq!(tracker.pending.capacity(), 4096);
    }

    #[test]
    fn an_oversized_head_stops_the_guard() {
        let mut stream = b"GET http://a/ HTTP/1.1\r\nX-Big: ".to_vec();
        stream.resize(MAX_HEAD + 10, b'a');
        stream.extend_from_slice(b"\r\n\r\n");
        assert_eq!(verdicts(&stream, 1000), []);
    }
}
