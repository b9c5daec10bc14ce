//! One try of a `CONNECT` on a leased proxy: the proxy's own `CONNECT` to
//! an address the gateway checked, not the crawler's name (it cannot
//! resolve the name again to an address the gateway never saw: DNS
//! rebinding). SNI and `Host` travel inside the tunnel, so the site sees
//! the crawler's name. As a proxy given the name would, each checked
//! address is asked for in turn until one opens (an IPv6 address the proxy
//! cannot reach does not fail the try). Once the judge relays it, the
//! crawler gets `200` and its bytes are spliced to the proxy's; the lease
//! goes back within [`LINGER`] of either side closing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::{Attempt, Forwarder, Tried};
use crate::adapters::forward_proxy::body::ProxyBody;
use crate::adapters::forward_proxy::tunnel::{Splice, Tally, established, splice};
use crate::adapters::forward_proxy::zero_copy::Way;
use crate::adapters::gateway::challenge::challenge_realm;
use crate::adapters::gateway::phases::RequestContext;
use crate::adapters::gateway::phases::answers::describe;
use crate::adapters::gateway::phases::choose::Held;
use crate::adapters::gateway::phases::judge::Seen;
use crate::adapters::gateway::phases::log::{ExchangeOutcome, Transferred, meter};
use crate::adapters::gateway::upstream::{Connection, open};
use crate::adapters::gateway::{GatewayError, Upstream};

/// How long a tunnel stays once one side has closed: a side that closed is
/// done with it, and the lease must not wait on the other.
pub const LINGER: Duration = Duration::from_secs(1);

/// A tunnel on its way: the request (its connection is handed over once
/// the tunnel opens) and the checked addresses.
pub(in crate::adapters::gateway) struct Tunnel {
    pub request: Request<Incoming>,
    pub addresses: Vec<SocketAddr>,
}

/// A tunnel the proxy opened.
pub(in crate::adapters::gateway) type Answer = TokioIo<hyper::upgrade::Upgraded>;

impl Attempt for Tunnel {
    type Answer = Answer;
    const TUNNEL: bool = true;

    async fn prepare(&mut self, _: &Forwarder, _: &mut RequestContext) -> Result<(), GatewayError> {
        Ok(())
    }

    /// Nothing is sent before the tunnel opens.
    fn can_retry(&self) -> bool {
        true
    }

    /// The proxy's `CONNECT` to each checked address in turn until one opens.
    async fn try_on(
        &mut self,
        forwarder: &Forwarder,
        upstream: &Upstream,
        context: &RequestContext,
    ) -> Tried<Answer> {
        let deadline = tokio::time::Instant::from_std(context.deadline);
        let mut last = Tried::failed(Seen::SiteUnreachable { status: 502 }, "no address to ask it for");
        for &address in &self.addresses {
            let tried = connect_to(address, forwarder, upstream, context);
            last = match tokio::time::timeout_at(deadline, tried).await {
                Ok(tried) => tried,
                Err(_) => return Tried::failed(Seen::NoAnswer, "no answer to CONNECT before the deadline"),
            };
            // Only the site's address failing is worth the next address.
            if !matches!(last.seen, Seen::SiteUnreachable { .. }) {
                return last;
            }
        }
        last
    }

    /// Answers `200` and splices the crawler's connection to the proxy's.
    fn relay(
        self,
        opened: Answer,
        forwarder: &Forwarder,
        upstream: Upstream,
        held: Held,
        context: RequestContext,
        _blocked: bool,
    ) -> Response<ProxyBody> {
        let RequestContext {
            mut exchange,
            in_flight,
            ..
        } = context;
        let mut response = established();
        describe(response.headers_mut(), &upstream, &exchange, false);
        exchange.status = 200;
        exchange.outcome = ExchangeOutcome::Served;
        let held = held.renewed(upstream.ttl);
        let transferred: Arc<Transferred> = exchange.transferred.clone();
        let tally: Tally = Arc::new(move |way, n| {
            let counter = match way {
                Way::Forward => &transferred.up,
                Way::Back => &transferred.down,
            };
            counter.fetch_add(n as u64, Ordering::Relaxed);
        });
        let how = Splice {
            idle_timeout: forwarder.idle_timeout,
            linger: Some(LINGER),
            held: Some(Box::new((held, exchange))),
            tally: Some(tally),
            revoked: Some(Box::pin(upstream.revoked.clone().revoked())),
        };
        splice(hyper::upgrade::on(self.request), opened, in_flight, how);
        response
    }
}

/// The leased proxy's own `CONNECT` to one checked address.
async fn connect_to(
    address: SocketAddr,
    forwarder: &Forwarder,
    upstream: &Upstream,
    context: &RequestContext,
) -> Tried<Answer> {
    // `[v6]:port` for an IPv6 address.
    let authority = address.to_string();
    let mut connect = match Request::builder()
        .method(Method::CONNECT)
        .uri(authority.as_str())
        .body(ProxyBody::empty(None))
    {
        Ok(connect) => connect,
        Err(e) => return Tried::failed(Seen::SiteUnreachable { status: 400 }, e),
    };
    if let Ok(value) = HeaderValue::from_str(&authority) {
        connect.headers_mut().insert(header::HOST, value);
    }
    crate::adapters::gateway::upstream::authorize(connect.headers_mut(), upstream);
    let Connection { mut sender, .. } = match open(upstream, meter(&context.exchange.transferred)).await {
        Ok(connection) => connection,
        Err(e) => return Tried::failed(Seen::ProxyUnreachable, e),
    };
    let response = tokio::select! {
        received = sender.send_request(connect) => match received {
            Ok(response) => response,
            Err(e) if e.is_parse() => return Tried::failed(Seen::ProxyBroken, e),
            Err(e) => return Tried::failed(Seen::ProxyUnreachable, e),
        },
        () = context.slot.stalled(forwarder.idle_timeout, None) => {
            return Tried::failed(Seen::NoAnswer, "no answer to CONNECT within the idle timeout");
        }
    };
    match response.status() {
        StatusCode::OK => {}
        StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
            let realm = challenge_realm(response.headers());
            let detail = format!("it refused its credentials (407 to CONNECT {authority})");
            return Tried::failed(Seen::AuthenticationRequired { realm }, detail);
        }
        status => {
            let detail = format!("it answered {status} to CONNECT {authority}");
            return Tried::failed(
                Seen::SiteUnreachable {
                    status: status.as_u16(),
                },
                detail,
            );
        }
    }
    match hyper::upgrade::on(response).await {
        Ok(upgraded) => Tried {
            seen: Seen::Opened,
            detail: format!("CONNECT {authority} opened"),
            answer: Some(TokioIo::new(upgraded)),
        },
        Err(e) => Tried::failed(Seen::ProxyBroken, e),
    }
}
