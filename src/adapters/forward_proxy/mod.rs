//! The built-in forward HTTP proxy, on hyper: `CONNECT host:port` tunnels
//! and absolute-form requests (`GET http://host/path`). The local provider
//! runs it as a process of its own (`forward-proxy`) when Squid is not
//! installed; it is also the forwarding core other listeners reuse.
//!
//! Per client connection, one request at a time with HTTP/1.1 framing and
//! keep-alive; a tunnel only after `CONNECT` (after any other request the
//! next bytes are parsed as the next request, never relayed raw). A
//! request goes on with `Host` taken from its URL (RFC 9112 §3.2.2) and
//! without hop-by-hop headers; one with ambiguous framing (see `framing`)
//! is refused with 400 before anything is sent. Upstream connections are
//! pooled and kept alive. Like the Squid config the operator generates, it
//! adds no `Via` or `X-Forwarded-For`, so targets see a plain client.
//! Given credentials, it demands them in `Proxy-Authorization` (Basic) on
//! every request (407 with `Proxy-Authenticate` without); every
//! destination passes the provider's destination rules (`destinations`):
//! 403 refused, 502 unreachable, 504 timed out. Given an outgoing address,
//! it connects to destinations from it. Connections are accepted through
//! `guarded_listener`: capped to the file limit, idle ones evicted at the
//! cap, timeouts on heads, idle keep-alive connections and stalled relays.

// Shared with the gateway (`crate::adapters::gateway`), which relays through leased proxies.
pub(crate) mod answers;
pub(crate) mod body;
pub(crate) mod client_connection;
mod connector;
mod forward;
pub(crate) mod framing;
mod relay;
pub(crate) mod request;
pub(crate) mod tunnel;
// Public for the gateway benchmark's bare relay (actors/benches/gateway.rs).
pub mod zero_copy;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::adapters::guarded_listener::{ListenerSettings, Slot, serve_connections};
use crate::domain::config::UnauthenticatedLimits;
use crate::domain::credentials::{BasicAuthorization, SHARED_REALM};
use crate::domain::destinations::DestinationPolicy;
use answers::{answer, challenge, challenge_naming};
use body::ProxyBody;
use connector::CheckedConnector;
use framing::{Verdict, Verdicts};
use request::{Target, target_of};

/// Descriptors one client connection may need: its own, its upstream's,
/// and one idle in the upstream pool.
pub const FDS_PER_CONNECTION: u64 = 3;
/// What the built-in proxy lets connections hold before they authenticate:
/// the default head allowance and budget, and no cap per source address,
/// for its main client, the gateway, is one source (as is a fleet of
/// crawlers behind one NAT address).
pub fn unauthenticated_limits() -> UnauthenticatedLimits {
    UnauthenticatedLimits {
        connections_per_source: usize::MAX,
        ..UnauthenticatedLimits::default()
    }
}

/// Whether a connection refused its credentials should be closed rather
/// than kept: one that never authenticated and sent a head larger than its
/// free allowance, which hyper's buffer grew to hold and would keep while
/// the connection idles. A usual challenge-response client keeps its
/// connection.
pub(crate) fn holds_a_large_buffer(slot: &Slot, verdicts: &Verdicts) -> bool {
    !slot.is_authenticated() && verdicts.head_length() > slot.unauthenticated().limits().free_head
}

/// Time allowed to connect to a destination.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle pooled upstream connection is closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy enforces.
pub struct Options {
    pub destinations: Arc<DestinationPolicy>,
    /// Every request must present these.
    pub auth: Option<BasicAuthorization>,
    /// The realm its 407 names: the credentials' own
    /// ([`crate::domain::credentials::realm_of`]); the shared one when `None`.
    pub realm: Option<String>,
    /// Destinations are reached from this address (those of its family).
    pub outgoing: Option<IpAddr>,
}

/// Serves until the process ends. With `auth`, every request must present it.
pub async fn serve(
    listener: TcpListener,
    destinations: Arc<DestinationPolicy>,
    auth: Option<BasicAuthorization>,
) -> io::Result<()> {
    serve_from(listener, destinations, auth, None).await
}

/// [`serve`], connecting to destinations from `outgoing` (those of its IP
/// family; see [`crate::adapters::checked_connect::connect_checked_from`]).
pub async fn serve_from(
    listener: TcpListener,
    destinations: Arc<DestinationPolicy>,
    auth: Option<BasicAuthorization>,
    outgoing: Option<IpAddr>,
) -> io::Result<()> {
    let options = Options {
        destinations,
        auth,
        realm: None,
        outgoing,
    };
    serve_with(
        listener,
        options,
        ListenerSettings::for_process_limits(FDS_PER_CONNECTION, unauthenticated_limits()),
    )
    .await
}

/// [`serve`] with explicit listener settings. Never ends by itself: accept
/// errors are waited out (the `io::Result` is for callers' `select!`s).
pub async fn serve_with(
    listener: TcpListener,
    options: Options,
    settings: ListenerSettings,
) -> io::Result<()> {
    let proxy = Arc::new(Proxy::new(options, &settings));
    match serve_connections(
        listener,
        &settings,
        "forward-proxy",
        None,
        move |stream, peer, slot| proxy.clone().serve_client(stream, peer, slot),
    )
    .await {}
}

/// The proxy's shared state: its rules, its HTTP server settings and its
/// pooled client.
struct Proxy {
    connector: CheckedConnector,
    client: Client<CheckedConnector, Incoming>,
    server: http1::Builder,
    auth: Option<BasicAuthorization>,
    /// The `Proxy-Authenticate` value of its 407s.
    challenge: HeaderValue,
    idle_timeout: Duration,
    /// The listener's timeouts, for each connection.
    listener: ListenerSettings,
}

impl Proxy {
    fn new(options: Options, settings: &ListenerSettings) -> Self {
        let connector = CheckedConnector {
            destinations: options.destinations,
            outgoing: options.outgoing,
            timeout: CONNECT_TIMEOUT,
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(settings.max_connections)
            .http1_title_case_headers(true)
            // `request` sets Host from the URL itself.
            .set_host(false)
            .build(connector.clone());
        Self {
            connector,
            client,
            server: client_connection::server(settings),
            auth: options.auth,
            challenge: challenge_naming(options.realm.as_deref().unwrap_or(SHARED_REALM)),
            idle_timeout: settings.idle_timeout,
            listener: settings.clone(),
        }
    }

    /// Serves one client connection until it closes, is evicted, or stalls.
    async fn serve_client(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, slot: Arc<Slot>) {
        let proxy = self.clone();
        let handle = move |request, slot, verdicts: Verdicts| {
            let proxy = proxy.clone();
            async move { proxy.handle(request, slot, &verdicts).await }
        };
        client_connection::serve(&self.server, stream, peer, slot, &self.listener, handle).await;
    }

    /// Answers one request.
    async fn handle(
        &self,
        request: Request<Incoming>,
        slot: Arc<Slot>,
        verdicts: &Verdicts,
    ) -> Response<ProxyBody> {
        let in_flight = slot.in_flight();
        match verdicts.next() {
            Some(Verdict::Clear) => {}
            Some(Verdict::Ambiguous(why)) => {
                tracing::debug!(why, "request with ambiguous framing refused");
                return answer(StatusCode::BAD_REQUEST, true, in_flight);
            }
            None => {
                tracing::debug!("request on a connection whose framing was lost refused");
                return answer(StatusCode::BAD_REQUEST, true, in_flight);
            }
        }
        let tunnel = request.method() == http::Method::CONNECT;
        if let Some(auth) = &self.auth {
            let presented = request.headers().get(header::PROXY_AUTHORIZATION);
            if !presented.is_some_and(|value| auth.admits(value.as_bytes())) {
                let close = tunnel || holds_a_large_buffer(&slot, verdicts);
                return challenge(self.challenge.clone(), close, in_flight);
            }
        }
        slot.authenticated();
        match target_of(request.method(), request.uri()) {
            Ok(Target::Forward { uri, host }) => self.forward(request, uri, host, in_flight).await,
            Ok(Target::Tunnel { host, port }) => self.tunnel(request, &host, port, in_flight).await,
            Err(e) => {
                tracing::debug!(error = %e, "request refused");
                answer(StatusCode::BAD_REQUEST, tunnel, in_flight)
            }
        }
    }
}
