//! The body of a message a proxy listener sends on: the upstream's (or the
//! client's) streamed, bytes it read ahead (a request body kept whole for a
//! retry, a response's beginning looked at for block markers) followed by
//! the rest, or none (the proxy's own answers). A response body carries the
//! request's [`InFlight`] mark, so the connection counts as idle only once
//! the body is sent.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::adapters::guarded_listener::InFlight;

pub struct ProxyBody {
    /// Sent first, when there.
    read_ahead: Option<Bytes>,
    /// Streamed after `read_ahead`.
    rest: Option<Incoming>,
    _request: Option<InFlight>,
    /// Dropped with the body: the gateway's lease and access record, ended
    /// once the response is sent (or the client went away).
    _held: Option<Box<dyn Send + Sync>>,
    /// What became of `rest`, for whoever sends this body on.
    watch: Option<Arc<BodyWatch>>,
}

/// How a streamed body went: whether it ended, or failed (a client's
/// malformed chunk or abort shows here, not as the upstream's error).
#[derive(Debug, Default)]
pub struct BodyWatch {
    ended: AtomicBool,
    failed: AtomicBool,
}

impl BodyWatch {
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

impl ProxyBody {
    /// The upstream's body, relayed.
    pub fn relayed(upstream: Incoming, request: InFlight) -> Self {
        request.relaying();
        Self::read_ahead(Bytes::new(), Some(upstream), Some(request))
    }

    /// `bytes` already read, then `rest` (none: `bytes` is the whole body).
    pub fn read_ahead(bytes: Bytes, rest: Option<Incoming>, request: Option<InFlight>) -> Self {
        if let Some(request) = &request {
            request.relaying();
        }
        Self {
            read_ahead: (!bytes.is_empty()).then_some(bytes),
            rest,
            _request: request,
            _held: None,
            watch: None,
        }
    }

    /// The body, noting in `watch` how its streamed part goes.
    pub fn watched(mut self, watch: Arc<BodyWatch>) -> Self {
        if self.rest.is_none() {
            watch.ended.store(true, Ordering::Relaxed);
        }
        self.watch = Some(watch);
        self
    }

    /// The body, keeping `held` alive until it is dropped.
    pub fn holding(mut self, held: Box<dyn Send + Sync>) -> Self {
        self._held = Some(held);
        self
    }

    /// No body.
    pub fn empty(request: Option<InFlight>) -> Self {
        Self {
            read_ahead: None,
            rest: None,
            _request: request,
            _held: None,
            watch: None,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(bytes) = self.read_ahead.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        let polled = match self.rest.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        };
        if let Some(watch) = &self.watch {
            match &polled {
                Poll::Ready(None) => watch.ended.store(true, Ordering::Relaxed),
                Poll::Ready(Some(Err(_))) => watch.failed.store(true, Ordering::Relaxed),
                // Whoever sends it may stop polling once it says it ended.
                Poll::Ready(Some(Ok(_))) if self.rest.as_ref().is_none_or(Body::is_end_stream) => {
                    watch.ended.store(true, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.read_ahead.is_none() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let ahead = self.read_ahead.as_ref().map_or(0, |b| b.len() as u64);
        let mut hint = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        // Upper first: a lower bound above the upper one panics.
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + ahead);
        }
        hint.set_lower(hint.lower() + ahead);
        hint
    }
}

/// Reads `body` until it ends or `limit` bytes are read: the bytes, and
/// whether the body ended within them (else the rest is still in `body`).
pub async fn read_up_to(body: &mut Incoming, limit: usize) -> Result<(Bytes, bool), hyper::Error> {
    let mut read = BytesMut::new();
    while read.len() < limit {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await;
        match frame {
            None => return Ok((read.freeze(), true)),
            Some(frame) => {
                // Trailers are not kept: proxies in front of crawlers do not relay them.
                if let Ok(data) = frame?.into_data() {
                    read.extend_from_slice(&data);
                }
            }
        }
    }
    Ok((read.freeze(), body.is_end_stream()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_bytes_are_counted_in_the_size() {
        let body = ProxyBody::read_ahead(Bytes::from_static(b"hello"), None, None);
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert_eq!(ProxyBody::empty(None).size_hint().exact(), Some(0));
    }
}
