//! The gateway's listener: the built-in forward proxy's server side (the
//! framing guard, hop-by-hop rewriting, answers, the tunnel splice) with a
//! leased upstream proxy as the next hop instead of the destination.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use super::{GatewayError, Leases, REASON_HEADER, Upstream, admits, lease_target};
use crate::destinations::{CheckedConnectError, DestinationPolicy, check_destination};
use crate::forward_proxy::answers::{answer, authentication_required};
use crate::forward_proxy::body::ProxyBody;
use crate::forward_proxy::client_connection;
use crate::forward_proxy::framing::{Verdict, Verdicts};
use crate::forward_proxy::request::{Target, drop_hop_by_hop, forwarded_headers, target_of};
use crate::forward_proxy::tunnel::{established, splice};
use crate::guarded_listener::{InFlight, ListenerSettings, Slot, serve_connections};

/// Descriptors one client connection may need: its own and its upstream's.
pub const FDS_PER_CONNECTION: u64 = 2;
/// Time allowed to resolve a destination, and to connect to an upstream proxy.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the gateway enforces and where it leases.
pub struct Options {
    pub destinations: Arc<DestinationPolicy>,
    /// The crawler token, presented as the proxy password; none: no auth
    /// (the caller binds loopback only, see [`super::check_exposure`]).
    pub token: Option<Arc<String>>,
    pub leases: Arc<dyn Leases>,
}

/// Serves until the process ends; accept errors are waited out.
pub async fn serve(listener: TcpListener, options: Options, settings: ListenerSettings) -> io::Result<()> {
    let gateway = Arc::new(Gateway::new(options, &settings));
    match serve_connections(
        listener,
        settings.max_connections,
        "gateway",
        move |stream, peer, slot| gateway.clone().serve_client(stream, peer, slot),
    )
    .await {}
}

/// A lease held for one request or tunnel, given back when dropped.
struct Held {
    lease_id: String,
    leases: Arc<dyn Leases>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.leases.release(std::mem::take(&mut self.lease_id));
    }
}

struct Gateway {
    options: Options,
    server: http1::Builder,
    idle_timeout: Duration,
}

impl Gateway {
    fn new(options: Options, settings: &ListenerSettings) -> Self {
        Self {
            options,
            server: client_connection::server(settings),
            idle_timeout: settings.idle_timeout,
        }
    }

    /// Serves one client connection, as the built-in forward proxy does.
    async fn serve_client(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, slot: Arc<Slot>) {
        let gateway = self.clone();
        let handle = move |request, slot, verdicts: Verdicts| {
            let gateway = gateway.clone();
            async move { gateway.handle(request, peer, slot, &verdicts).await }
        };
        client_connection::serve(&self.server, stream, peer, slot, self.idle_timeout, handle).await;
    }

    async fn handle(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
        slot: Arc<Slot>,
        verdicts: &Verdicts,
    ) -> Response<ProxyBody> {
        let in_flight = slot.in_flight();
        let tunnel = request.method() == Method::CONNECT;
        let refused = match verdicts.next() {
            Some(Verdict::Clear) => None,
            Some(Verdict::Ambiguous(why)) => Some(GatewayError::Framing(why)),
            None => Some(GatewayError::Framing("the connection's framing was lost")),
        };
        if let Some(e) = refused {
            return refusal(&e, peer, true, in_flight);
        }
        let token = self.options.token.as_deref().map(String::as_str);
        let presented = request.headers().get(header::PROXY_AUTHORIZATION);
        if !admits(token, presented.map(HeaderValue::as_bytes)) {
            tracing::info!(%peer, "gateway request without valid proxy credentials refused (407)");
            return authentication_required(tunnel, in_flight);
        }
        let target = match target_of(request.method(), request.uri()) {
            Ok(target) => target,
            Err(e) => return refusal(&e.into(), peer, tunnel, in_flight),
        };
        let (host, port) = match &target {
            Target::Tunnel { host, port } => (host.clone(), *port),
            Target::Forward { uri, .. } => (
                uri.host().unwrap_or_default().to_owned(),
                uri.port_u16().unwrap_or(80),
            ),
        };
        // Checked before a lease is taken: a refused destination costs no proxy.
        let upstream = match self.lease_for(&host, port, tunnel).await {
            Ok(upstream) => upstream,
            Err(e) => return refusal(&e, peer, tunnel, in_flight),
        };
        let held = Held {
            lease_id: upstream.lease_id.clone(),
            leases: self.options.leases.clone(),
        };
        tracing::debug!(%peer, %host, port, proxy = %upstream.proxy, tunnel, "gateway request leased a proxy");
        match target {
            Target::Forward { uri, host } => match self.forward(request, uri, host, &upstream, &slot).await {
                Ok(response) => {
                    let (mut parts, body) = response.into_parts();
                    drop_hop_by_hop(&mut parts.headers);
                    let body = ProxyBody::relayed(body, in_flight).holding(Box::new(held));
                    Response::from_parts(parts, body)
                }
                Err(e) => refusal(&e, peer, tunnel, in_flight),
            },
            Target::Tunnel { host, port } => {
                let upgrade = hyper::upgrade::on(request);
                match self.tunnel(&host, port, &upstream, &slot).await {
                    Ok(upstream_io) => {
                        splice(
                            upgrade,
                            upstream_io,
                            in_flight,
                            self.idle_timeout,
                            Some(Box::new(held)),
                        );
                        established()
                    }
                    Err(e) => refusal(&e, peer, tunnel, in_flight),
                }
            }
        }
    }

    /// The destination checked against the rules, then a lease for its host.
    async fn lease_for(&self, host: &str, port: u16, tunnel: bool) -> Result<Upstream, GatewayError> {
        let target = lease_target(host)?;
        check_destination(&self.options.destinations, host, port, tunnel, CONNECT_TIMEOUT)
            .await
            .map_err(|e| match e {
                CheckedConnectError::Refused { .. } => GatewayError::DestinationRefused(e.to_string()),
                other => GatewayError::DestinationUnresolved(other.to_string()),
            })?;
        self.options.leases.acquire(target).await
    }

    /// Sends an absolute-form request on through the leased proxy.
    async fn forward(
        &self,
        request: Request<Incoming>,
        uri: Uri,
        host: HeaderValue,
        upstream: &Upstream,
        slot: &Slot,
    ) -> Result<Response<Incoming>, GatewayError> {
        let (mut parts, body) = request.into_parts();
        // hyper let through only `chunked` (the guard refused any other coding).
        let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
        // Drops the crawler's Proxy-Authorization (its token) among the hop-by-hop headers.
        forwarded_headers(&mut parts.headers, host, chunked);
        authorize(&mut parts.headers, upstream);
        parts.uri = uri;
        parts.version = Version::HTTP_11;
        parts.extensions = http::Extensions::new();
        let mut sender = open(upstream).await?;
        let sent = sender.send_request(Request::from_parts(parts, body));
        let response = tokio::select! {
            received = sent => received.map_err(|e| upstream_failed(upstream, &e))?,
            () = slot.stalled(self.idle_timeout, None) => {
                return Err(GatewayError::TimedOut { proxy: upstream.proxy.clone() });
            }
        };
        match response.status() {
            StatusCode::SWITCHING_PROTOCOLS => {
                Err(upstream_failed(upstream, &"it switched protocols unasked"))
            }
            // The upstream refused its own credentials: the crawler can do nothing about it.
            StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
                Err(upstream_failed(upstream, &"it refused its credentials (407)"))
            }
            _ => Ok(response),
        }
    }

    /// Opens a tunnel through the leased proxy (its own `CONNECT`); the
    /// caller answers `200` and splices the client's bytes to it.
    async fn tunnel(
        &self,
        host: &str,
        port: u16,
        upstream: &Upstream,
        slot: &Slot,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, GatewayError> {
        let authority = format!("{host}:{port}");
        let mut connect = Request::builder()
            .method(Method::CONNECT)
            .uri(authority.as_str())
            .body(ProxyBody::empty(None))
            .map_err(|e| upstream_failed(upstream, &e))?;
        if let Ok(value) = HeaderValue::from_str(&authority) {
            connect.headers_mut().insert(header::HOST, value);
        }
        authorize(connect.headers_mut(), upstream);
        let mut sender = open(upstream).await?;
        let response = tokio::select! {
            received = sender.send_request(connect) => received.map_err(|e| upstream_failed(upstream, &e))?,
            () = slot.stalled(self.idle_timeout, None) => {
                return Err(GatewayError::TimedOut { proxy: upstream.proxy.clone() });
            }
        };
        if response.status() != StatusCode::OK {
            let why = format!("it answered {} to CONNECT {authority}", response.status());
            return Err(upstream_failed(upstream, &why));
        }
        let upstream_io = hyper::upgrade::on(response)
            .await
            .map_err(|e| upstream_failed(upstream, &e))?;
        Ok(TokioIo::new(upstream_io))
    }
}

/// Adds the leased proxy's credentials (never the crawler's).
fn authorize(headers: &mut http::HeaderMap, upstream: &Upstream) {
    if let Some(credentials) = &upstream.credentials
        && let Ok(value) = HeaderValue::from_str(&credentials.basic_authorization())
    {
        headers.insert(header::PROXY_AUTHORIZATION, value);
    }
}

/// A fresh HTTP/1 connection to the leased proxy (one per request or
/// tunnel: the lease is per request, so there is nothing to pool yet).
async fn open<B>(upstream: &Upstream) -> Result<client::SendRequest<B>, GatewayError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let uri: Uri = upstream
        .url
        .parse()
        .map_err(|e| upstream_failed(upstream, &format!("its URL does not parse: {e}")))?;
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port)))
        .await
        .map_err(|_| upstream_failed(upstream, &"connecting timed out"))?
        .map_err(|e| upstream_failed(upstream, &e))?;
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set on an upstream proxy connection");
    }
    let (sender, connection) = client::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| upstream_failed(upstream, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "upstream proxy connection ended with an error");
        }
    });
    Ok(sender)
}

fn upstream_failed(upstream: &Upstream, why: &dyn std::fmt::Display) -> GatewayError {
    GatewayError::Upstream {
        proxy: upstream.proxy.clone(),
        why: why.to_string(),
    }
}

/// The gateway's own answer to a failure: its status, the reason header,
/// `Retry-After` when waiting helps, logged without any credential.
fn refusal(e: &GatewayError, peer: SocketAddr, tunnel: bool, in_flight: InFlight) -> Response<ProxyBody> {
    // No capacity is routine for a busy fleet (as for the API's no_capacity): not worth INFO.
    if matches!(e, GatewayError::NoProxy { .. }) {
        tracing::debug!(%peer, status = 503, reason = e.reason(), error = %e, "gateway request not served");
    } else {
        tracing::info!(%peer, status = e.status().as_u16(), reason = e.reason(), error = %e, "gateway request not served");
    }
    if matches!(e, GatewayError::AuthenticationRequired) {
        return authentication_required(tunnel, in_flight);
    }
    // After a failed CONNECT or lost framing the client's next bytes are not a request.
    let close = tunnel || matches!(e, GatewayError::Framing(_));
    let mut response = answer(e.status(), close, in_flight);
    let headers = response.headers_mut();
    headers.insert(REASON_HEADER, HeaderValue::from_static(e.reason()));
    if let Some(seconds) = e.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}
