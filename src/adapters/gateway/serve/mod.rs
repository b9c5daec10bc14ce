//! The gateway's listener: the built-in forward proxy's server side (the
//! framing guard, hop-by-hop rewriting, answers, the tunnel splice) with a
//! leased upstream proxy as the next hop instead of the destination, tried
//! again on another proxy when one fails or is blocked.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use super::access::{Exchange, ExchangeOutcome, Transferred, exchange_span, meter};
use super::blocks::{BlockRules, HeadVerdict};
use super::sessions::{SessionKey, Sessions};
use super::upstream::{Connection, UpstreamPool, authorize, open, upstream_failed};
use super::upstream_identity::{Author, author, strip_proxy_headers};
use super::{
    Ask, BLOCKED_HEADER, GatewayError, Identified, LEASE_HEADER, Leases, PROXY_HEADER, REASON_HEADER,
    SESSION_MOVED_HEADER, Upstream, identify, lease_target,
};
use crate::config::{BODY_SCAN_LIMIT, GatewaySettings};
use crate::destinations::{CheckedConnectError, DestinationPolicy, check_destination};
use crate::forward_proxy::answers::{answer, authentication_required};
use crate::forward_proxy::body::{ProxyBody, read_up_to};
use crate::forward_proxy::framing::{Verdict, Verdicts};
use crate::forward_proxy::request::{Target, drop_hop_by_hop, forwarded_headers, target_of};
use crate::forward_proxy::tunnel::{Tally, established, splice};
use crate::forward_proxy::zero_copy::Way;
use crate::forward_proxy::{client_connection, holds_a_large_buffer};
use crate::guarded_listener::{InFlight, ListenerSettings, Slot, serve_connections};
use crate::identity::SharedIdentities;
use crate::lease::rendezvous::session_digest;
use crate::lease::{GATEWAY_CLIENT, Outcome};
use crate::rate_limit::{RateLimiter, RateLimits, retry_after_secs};
use crate::telemetry::events::{GatewayBlocked, GatewayLeaseTaken, GatewayTryFailed};
use tracing::Instrument;

mod forward;
mod tunnel;

/// Descriptors one client connection may need: its own and its upstream's.
pub const FDS_PER_CONNECTION: u64 = 2;
/// Time allowed to resolve a destination, and to connect to an upstream proxy.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// First pause between asks for a free proxy, and the longest.
const CAPACITY_POLL: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(200));
/// Rate-limited clients tracked at once.
const MAX_LIMITED_CLIENTS: usize = 10_000;

/// What the gateway enforces and where it leases.
pub struct Options {
    pub settings: GatewaySettings,
    pub destinations: Arc<DestinationPolicy>,
    /// The crawler identities, whose tokens are presented as the proxy
    /// password; open (none): no auth (the caller binds loopback only, see
    /// [`super::check_exposure`]).
    pub identities: SharedIdentities,
    pub leases: Arc<dyn Leases>,
}

/// Serves until the process ends; accept errors are waited out.
pub async fn serve(listener: TcpListener, options: Options, settings: ListenerSettings) -> io::Result<()> {
    let gateway = Arc::new(Gateway::new(options, &settings));
    match serve_connections(
        listener,
        &settings,
        "gateway",
        Some(REASON_HEADER),
        move |stream, peer, slot| gateway.clone().serve_client(stream, peer, slot),
    )
    .await {}
}

/// A lease held for one try, given back when dropped; a tunnel's is
/// renewed meanwhile.
struct Held {
    lease_id: String,
    leases: Arc<dyn Leases>,
    renewal: Option<tokio::task::JoinHandle<()>>,
}

impl Held {
    fn new(upstream: &Upstream, leases: &Arc<dyn Leases>) -> Self {
        Self {
            lease_id: upstream.lease_id.clone(),
            leases: leases.clone(),
            renewal: None,
        }
    }

    /// Renews the lease at half its TTL for as long as it is held: a
    /// tunnel lasts as long as its crawler keeps it open.
    fn renewed(mut self, ttl: Duration) -> Self {
        let (id, leases) = (self.lease_id.clone(), self.leases.clone());
        let every = (ttl / 2).max(Duration::from_secs(1));
        self.renewal = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = leases.renew(id.clone()) {
                    tracing::warn!(error = %e, "a tunnel's lease could not be renewed; its proxy may be leased again");
                }
            }
        }));
        self
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        self.leases.release(std::mem::take(&mut self.lease_id));
    }
}

/// The `scope` label of a failure reported on a proxy's lease.
const PROXY_FAILED: &str = "proxy";
const DESTINATION_FAILED: &str = "destination";

/// Why one try failed: the proxy itself (reported `error` at once), or
/// the proxy's own answer about the destination (reported only if another
/// proxy then serves the request: a site down for every proxy must not
/// rest the fleet), or the proxy's own refusal, which ends the request
/// unreported (its rules refused the destination; no proxy is at fault).
enum TryFailure {
    Proxy(GatewayError),
    Destination(GatewayError),
    Final(GatewayError),
}

/// The failed tries of one request or tunnel, and what to report of them.
#[derive(Default)]
struct Failures {
    /// Destination-level failures, blamed only if another proxy serves.
    pending: Vec<(String, GatewayError)>,
    /// The latest failure that ends or was reported at once.
    last: Option<GatewayError>,
}

impl Failures {
    /// A try failed: a proxy-level failure is reported at once.
    fn record(&mut self, gateway: &Gateway, lease_id: &str, failure: TryFailure, exchange: &mut Exchange) {
        match failure {
            TryFailure::Proxy(e) => {
                gateway.report_failure(lease_id, &e, PROXY_FAILED);
                exchange.failed_over += 1;
                self.last = Some(e);
            }
            TryFailure::Destination(e) => self.pending.push((lease_id.to_owned(), e)),
            TryFailure::Final(e) => self.last = Some(e),
        }
    }

    /// Served by a later proxy: the ones that failed where it answered are to blame.
    fn served(&mut self, gateway: &Gateway, exchange: &mut Exchange) {
        for (lease_id, e) in self.pending.drain(..) {
            gateway.report_failure(&lease_id, &e, DESTINATION_FAILED);
            exchange.failed_over += 1;
        }
    }

    /// What the crawler is told when no try served it.
    fn into_error(mut self, target: &str) -> GatewayError {
        self.last
            .or_else(|| self.pending.pop().map(|(_, e)| e))
            .unwrap_or(GatewayError::NoProxy {
                target: target.to_owned(),
            })
    }
}

/// What one request asks for, whatever proxy serves it.
struct Wanted {
    ask: Ask,
    session: Option<(SessionKey, Duration)>,
}

struct Gateway {
    options: Options,
    blocks: BlockRules,
    sessions: Mutex<Sessions>,
    limiter: Option<Mutex<RateLimiter<String>>>,
    pool: Arc<UpstreamPool>,
    server: hyper::server::conn::http1::Builder,
    idle_timeout: Duration,
    /// The listener's timeouts, for each connection.
    listener: ListenerSettings,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded state stays consistent across a panic elsewhere.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Gateway {
    fn new(options: Options, settings: &ListenerSettings) -> Self {
        let s = &options.settings;
        let limiter = (s.rate_per_client > 0.0).then(|| {
            let limits = RateLimits {
                per_client: s.rate_per_client,
                per_client_burst: s.burst_per_client,
                global: f64::INFINITY,
                global_burst: f64::INFINITY,
                max_clients: MAX_LIMITED_CLIENTS,
            };
            Mutex::new(RateLimiter::new(limits, Instant::now()))
        });
        Self {
            blocks: BlockRules::new(s.blocks.clone()),
            sessions: Mutex::new(Sessions::new(s.max_sessions)),
            limiter,
            pool: Arc::default(),
            server: client_connection::server(settings),
            idle_timeout: settings.idle_timeout,
            listener: settings.clone(),
            options,
        }
    }

    /// Serves one client connection, as the built-in forward proxy does.
    async fn serve_client(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, slot: Arc<Slot>) {
        let gateway = self.clone();
        let handle = move |request: Request<Incoming>, slot, verdicts: Verdicts| {
            let gateway = gateway.clone();
            let span = exchange_span(
                gateway.options.settings.trace_exchanges,
                request.method() == Method::CONNECT,
            );
            async move {
                gateway
                    .handle(request, peer, slot, &verdicts, span.clone())
                    .instrument(span)
                    .await
            }
        };
        client_connection::serve(&self.server, stream, peer, slot, &self.listener, handle).await;
    }

    async fn handle(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
        slot: Arc<Slot>,
        verdicts: &Verdicts,
        span: tracing::Span,
    ) -> Response<ProxyBody> {
        let in_flight = slot.in_flight();
        let tunnel = request.method() == Method::CONNECT;
        let mut exchange = Exchange::new(peer, tunnel, span);
        let refused = match verdicts.next() {
            Some(Verdict::Clear) => None,
            Some(Verdict::Ambiguous(why)) => Some(GatewayError::Framing(why)),
            None => Some(GatewayError::Framing("the connection's framing was lost")),
        };
        if let Some(e) = refused {
            return refusal(&e, &mut exchange, true, in_flight);
        }
        let wanted = match self.admit(&request, peer, &slot, &mut exchange) {
            Ok(wanted) => wanted,
            Err(e) => {
                let close = tunnel || holds_a_large_buffer(&slot, verdicts);
                return refusal(&e, &mut exchange, close, in_flight);
            }
        };
        let target = match target_of(request.method(), request.uri()) {
            Ok(target) => target,
            Err(e) => return refusal(&e.into(), &mut exchange, tunnel, in_flight),
        };
        let (host, port) = match &target {
            Target::Tunnel { host, port } => (host.clone(), *port),
            Target::Forward { uri, .. } => (
                uri.host().unwrap_or_default().to_owned(),
                uri.port_u16().unwrap_or(80),
            ),
        };
        // Checked before a lease is taken: a refused destination costs no proxy.
        let (wanted, addresses) = match self.check_destination(&host, port, tunnel, wanted).await {
            Ok(checked) => checked,
            Err(e) => return refusal(&e, &mut exchange, tunnel, in_flight),
        };
        exchange.target = wanted.ask.target.clone();
        match target {
            Target::Forward { uri, host } => {
                self.forward(request, uri, host, wanted, exchange, in_flight, &slot)
                    .await
            }
            Target::Tunnel { .. } => {
                self.tunnel(request, &addresses, wanted, exchange, in_flight, &slot)
                    .await
            }
        }
    }

    /// Credentials (or a client network), the username's parameters and
    /// the client's rate: what the request may ask for. Credentials that
    /// pass mark the connection authenticated (its `slot`).
    fn admit(
        &self,
        request: &Request<Incoming>,
        peer: SocketAddr,
        slot: &Slot,
        exchange: &mut Exchange,
    ) -> Result<Wanted, GatewayError> {
        let settings = &self.options.settings;
        let presented = request.headers().get(header::PROXY_AUTHORIZATION);
        let identified = identify(
            &self.options.identities.current(),
            presented.map(HeaderValue::as_bytes),
            peer.ip(),
            &settings.client_networks,
        );
        // Credentials that passed (bad parameters or not) authenticate the connection.
        if !matches!(identified, Err(GatewayError::AuthenticationRequired)) {
            slot.authenticated();
        }
        let identified = identified?;
        exchange.client = Some(identified.identity.clone());
        if let Some(limiter) = &self.limiter {
            let key = identified.rate_key(peer.ip());
            locked(limiter)
                .check_key(key.clone(), Instant::now())
                .map_err(|limited| GatewayError::RateLimited {
                    client: key,
                    retry_after: u32::try_from(retry_after_secs(limited.retry_after)).unwrap_or(u32::MAX),
                })?;
        }
        let Identified { identity, params } = identified;
        let lifetime = params
            .lifetime
            .unwrap_or(settings.session_lifetime)
            .min(settings.max_session_lifetime);
        Ok(Wanted {
            // Sessions are the identity's: another crawler cannot claim them.
            session: params.session.map(|id| ((identity.clone(), id), lifetime)),
            ask: Ask {
                target: String::new(),
                selector: params.selector,
                client: format!("{GATEWAY_CLIENT}/{identity}"),
                owner: identity,
                prefer: None,
                session: None,
            },
        })
    }

    /// The destination checked against the rules, every address its name
    /// resolves to (one refused refuses the request: a plain request's
    /// name is resolved again by the leased proxy, which could pick it);
    /// the lease target set. The checked addresses, where a tunnel goes.
    async fn check_destination(
        &self,
        host: &str,
        port: u16,
        tunnel: bool,
        mut wanted: Wanted,
    ) -> Result<(Wanted, Vec<SocketAddr>), GatewayError> {
        wanted.ask.target = lease_target(host)?;
        let addresses = check_destination(&self.options.destinations, host, port, tunnel, CONNECT_TIMEOUT)
            .await
            .map_err(|e| match e {
                CheckedConnectError::Refused { .. } => GatewayError::DestinationRefused(e.to_string()),
                other => GatewayError::DestinationUnresolved(other.to_string()),
            })?;
        Ok((wanted, addresses))
    }

    /// A lease for one try: the session's proxy while it stays eligible,
    /// waiting for a free proxy until `until`.
    async fn lease(
        &self,
        wanted: &mut Wanted,
        exchange: &mut Exchange,
        until: Instant,
    ) -> Result<(Upstream, Held), GatewayError> {
        let asked = Instant::now();
        if let Some((key, _)) = &wanted.session {
            wanted.ask.prefer = locked(&self.sessions).proxy_of(key, Instant::now());
            wanted.ask.session = Some(session_digest(&key.0, &key.1));
        }
        let mut pause = CAPACITY_POLL.0;
        let upstream = loop {
            match self.options.leases.acquire(wanted.ask.clone()) {
                Err(GatewayError::NoProxy { .. }) if Instant::now() + pause < until => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CAPACITY_POLL.1);
                }
                other => break other?,
            }
        };
        let mut sessions = None;
        if let Some((key, lifetime)) = &wanted.session {
            let mut held = locked(&self.sessions);
            let moved = held.left_through(key, &upstream.proxy, *lifetime, Instant::now());
            exchange.session_moved |= moved.is_some();
            sessions = Some(held.len());
        }
        exchange.tries += 1;
        GatewayLeaseTaken {
            span: &exchange.span,
            tunnel: exchange.tunnel,
            proxy: &upstream.proxy.to_string(),
            attempt: exchange.tries,
            waited: asked.elapsed(),
            sessions,
        }
        .emit();
        exchange.proxy = Some(upstream.proxy.clone());
        let held = Held::new(&upstream, &self.options.leases);
        Ok((upstream, held))
    }

    /// Reports a try's failure as `error` (now, or later for pending ones).
    fn report_failure(&self, lease_id: &str, why: &GatewayError, scope: &'static str) {
        if let GatewayError::Upstream { proxy, .. } | GatewayError::TimedOut { proxy } = why {
            GatewayTryFailed {
                proxy,
                scope,
                reason: why.reason(),
                error: why,
            }
            .emit();
        }
        self.options
            .leases
            .report(lease_id.to_owned(), Outcome::Error, format!("gateway: {why}"));
    }
}

/// The headers that tell the crawler which proxy and lease served it.
fn describe(headers: &mut HeaderMap, upstream: &Upstream, exchange: &Exchange, blocked: bool) {
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    set(PROXY_HEADER, &upstream.proxy.to_string());
    set(LEASE_HEADER, &upstream.lease_id);
    if exchange.session_moved {
        set(SESSION_MOVED_HEADER, "true");
    }
    if blocked {
        set(BLOCKED_HEADER, "true");
    }
}

/// The gateway's own answer to a failure: its status, the reason header,
/// `Retry-After` when waiting helps; the exchange records it. `close` (a
/// tunnel's refusal, or a connection that never authenticated and sent a
/// large head) ends the connection after it.
fn refusal(
    e: &GatewayError,
    exchange: &mut Exchange,
    close: bool,
    in_flight: InFlight,
) -> Response<ProxyBody> {
    exchange.refused(e.status().as_u16(), e.reason());
    // No capacity and refused credentials are routine: the access line says enough.
    if matches!(
        e,
        GatewayError::NoProxy { .. }
            | GatewayError::AuthenticationRequired
            | GatewayError::RateLimited { .. }
    ) {
        tracing::debug!(peer = %exchange.peer, status = e.status().as_u16(), reason = e.reason(), error = %e, "gateway request not served");
    } else {
        tracing::info!(peer = %exchange.peer, status = e.status().as_u16(), reason = e.reason(), error = %e, "gateway request not served");
    }
    if matches!(e, GatewayError::AuthenticationRequired) {
        return authentication_required(close, in_flight);
    }
    // After a failed CONNECT or lost framing the client's next bytes are not a request.
    let close = close || matches!(e, GatewayError::Framing(_));
    let mut response = answer(e.status(), close, in_flight);
    let headers = response.headers_mut();
    headers.insert(REASON_HEADER, HeaderValue::from_static(e.reason()));
    if let Some(seconds) = e.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}
