//! The body of a response the proxy sends a client: the upstream's, or
//! none (the proxy's own answers). It carries the request's [`InFlight`]
//! mark, so the connection counts as idle only once the body is sent.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::guarded_listener::InFlight;

pub struct ProxyBody {
    upstream: Option<Incoming>,
    _request: Option<InFlight>,
    /// Dropped with the body: the gateway's lease, released once the
    /// response is sent (or the client went away).
    _held: Option<Box<dyn Send + Sync>>,
}

impl ProxyBody {
    /// The upstream's body, relayed.
    pub fn relayed(upstream: Incoming, request: InFlight) -> Self {
        request.relaying();
        Self {
            upstream: Some(upstream),
            _request: Some(request),
            _held: None,
        }
    }

    /// The body, keeping `held` alive until it is dropped.
    pub fn holding(mut self, held: Box<dyn Send + Sync>) -> Self {
        self._held = Some(held);
        self
    }

    /// No body.
    pub fn empty(request: Option<InFlight>) -> Self {
        Self {
            upstream: None,
            _request: request,
            _held: None,
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
        match self.upstream.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.upstream.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.upstream
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
