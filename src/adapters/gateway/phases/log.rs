//! One record per gateway request or tunnel: who asked for what, which
//! proxy served it after how many tries, how it ended, bytes and duration.
//! Written as one access line (target `egress_proxies::gateway::access`)
//! when the exchange ends — when its response body or tunnel is done — and
//! never with a credential in it, by [`GatewayExchangeEnded`], which also
//! records the gateway's metrics. With `traceExchanges` each exchange is a
//! span (`gateway exchange`), its tries child spans.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tracing::field::Empty;

use crate::domain::resource::ObjectKey;
use crate::telemetry::events::{GatewayExchangeEnded, GatewayExchangeStarted};

/// How an exchange ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeOutcome {
    /// Still running (the record is dropped before an outcome only when
    /// the task serving it was cancelled: the client went away).
    Unfinished,
    /// The response (or tunnel) came from a leased proxy.
    Served,
    /// Served, but the response was a block the gateway recognised (no
    /// try left, or retries on block are off).
    Blocked,
    /// The gateway answered itself; the reason header's value.
    Refused(&'static str),
}

impl ExchangeOutcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Unfinished => "client_gone",
            Self::Served => "served",
            Self::Blocked => "blocked",
            Self::Refused(reason) => reason,
        }
    }
}

/// Bytes moved, shared with the body or tunnel that moves them.
#[derive(Debug, Default)]
pub struct Transferred {
    /// From the crawler towards the site.
    pub up: AtomicU64,
    /// From the site towards the crawler.
    pub down: AtomicU64,
}

/// The record of one request or tunnel.
pub struct Exchange {
    pub peer: SocketAddr,
    /// The username's client name, if any.
    pub client: Option<String>,
    pub tunnel: bool,
    pub target: String,
    pub started: Instant,
    /// Leases taken (tries), and the proxies that failed or were blocked.
    pub tries: u32,
    pub failed_over: u32,
    pub blocked: u32,
    /// The proxy that served it (the last one tried).
    pub proxy: Option<ObjectKey>,
    pub session_moved: bool,
    pub status: u16,
    pub outcome: ExchangeOutcome,
    pub transferred: Arc<Transferred>,
    /// The exchange's span ([`exchange_span`]); none unless traced.
    pub span: tracing::Span,
}

/// The span of one exchange, a root (`traceExchanges`; else none, like
/// probe spans: thousands per second otherwise). Its fields are recorded
/// when the exchange ends.
pub fn exchange_span(trace: bool, tunnel: bool) -> tracing::Span {
    if !trace {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        parent: None, "gateway exchange", otel.kind = "server",
        kind = if tunnel { "tunnel" } else { "http" },
        target = Empty, client = Empty, proxy = Empty, tries = Empty, status = Empty, outcome = Empty,
        otel.status_code = Empty, traceID = Empty, spanID = Empty,
    );
    crate::telemetry::otel::record_ids(&span);
    span
}

impl Exchange {
    pub fn new(peer: SocketAddr, tunnel: bool, span: tracing::Span) -> Self {
        GatewayExchangeStarted { tunnel }.emit();
        Self {
            peer,
            client: None,
            tunnel,
            target: String::new(),
            started: Instant::now(),
            tries: 0,
            failed_over: 0,
            blocked: 0,
            proxy: None,
            session_moved: false,
            status: 0,
            outcome: ExchangeOutcome::Unfinished,
            transferred: Arc::default(),
            span,
        }
    }

    /// Ends with the gateway's own answer.
    pub fn refused(&mut self, status: u16, reason: &'static str) {
        self.status = status;
        self.outcome = ExchangeOutcome::Refused(reason);
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let proxy = self.proxy.as_ref().map(ToString::to_string);
        let outcome = self.outcome.label();
        if !self.span.is_disabled() {
            let span = &self.span;
            span.record("target", self.target.as_str());
            span.record("client", self.client.as_deref().unwrap_or("-"));
            span.record("proxy", proxy.as_deref().unwrap_or("-"));
            span.record("tries", self.tries);
            span.record("status", self.status);
            span.record("outcome", outcome);
            if !matches!(self.outcome, ExchangeOutcome::Served) {
                span.record("otel.status_code", "error");
            }
        }
        // The access line inside the span: JSON lines carry its trace ID.
        let _entered = self.span.enter();
        GatewayExchangeEnded {
            peer: self.peer,
            client: self.client.take(),
            tunnel: self.tunnel,
            target: std::mem::take(&mut self.target),
            proxy,
            tries: self.tries,
            failed_over: self.failed_over,
            blocked: self.blocked,
            session_moved: self.session_moved,
            status: self.status,
            outcome,
            bytes_up: self.transferred.up.load(Ordering::Relaxed),
            bytes_down: self.transferred.down.load(Ordering::Relaxed),
            duration: self.started.elapsed(),
        }
        .emit();
    }
}

/// Where a connection's bytes are counted: the exchange using it now (a
/// pooled connection serves one exchange after another).
pub type Meter = Arc<std::sync::Mutex<Arc<Transferred>>>;

/// A meter counting into `transferred`.
pub fn meter(transferred: &Arc<Transferred>) -> Meter {
    Arc::new(std::sync::Mutex::new(transferred.clone()))
}

fn counted(meter: &Meter) -> Arc<Transferred> {
    meter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// An upstream connection counting what it reads (down) and writes (up).
pub struct Counted<IO> {
    inner: IO,
    meter: Meter,
}

impl<IO> Counted<IO> {
    pub fn new(inner: IO, meter: Meter) -> Self {
        Self { inner, meter }
    }

    /// The stream inside, for a tunnel relayed on the socket itself.
    pub fn into_inner(self) -> IO {
        self.inner
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            counted(&this.meter)
                .down
                .fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            counted(&this.meter).up.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }

    // Vectored, so hyper writes a request's head and body in one call
    // instead of first copying them into one buffer.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            counted(&this.meter).up.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
