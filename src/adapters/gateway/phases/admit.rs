//! Admit: whether the gateway takes a request at all, and what it asks
//! for — the connection's framing, the crawler's credentials (or a client
//! network), its rate, its username's parameters, and the destination
//! checked against the rules before any proxy is leased (a refused
//! destination costs no proxy).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{Request, Uri};
use hyper::body::Incoming;

use super::forward::{Hop, Plain, Tunnel};
use crate::adapters::checked_connect::{CheckedConnectError, check_destination};
use crate::adapters::forward_proxy::framing::{Verdict, Verdicts};
use crate::adapters::forward_proxy::holds_a_large_buffer;
use crate::adapters::forward_proxy::request::{Target, forwarded_headers, target_of};
use crate::adapters::gateway::sessions::SessionKey;
use crate::adapters::gateway::{Ask, GatewayError, Identified, identify, lease_target};
use crate::adapters::guarded_listener::Slot;
use crate::domain::config::GatewaySettings;
use crate::domain::destinations::{DestinationPolicy, IpNet};
use crate::domain::identity::SharedIdentities;
use crate::domain::lease::GATEWAY_CLIENT;
use crate::rate_limit::{RateLimiter, RateLimits, retry_after_secs};

/// Time allowed to resolve a destination.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Rate-limited clients tracked at once.
const MAX_LIMITED_CLIENTS: usize = 10_000;

/// What an admitted request asks for, whatever proxy serves it.
pub(in crate::adapters::gateway) struct Admitted {
    /// The client's identity (for the access line).
    pub client: Option<String>,
    /// What each try asks the lease store for (target and selector set).
    pub ask: Ask,
    /// A sticky session and its lifetime.
    pub session: Option<(SessionKey, Duration)>,
}

/// A request the gateway will not take, and whether the connection closes
/// after the answer.
pub(super) struct Refused {
    pub error: GatewayError,
    pub close: bool,
}

fn refused(error: GatewayError, close: bool) -> Refused {
    Refused { error, close }
}

/// The admit phase's state.
pub(super) struct Admission {
    identities: SharedIdentities,
    client_networks: Vec<IpNet>,
    destinations: Arc<DestinationPolicy>,
    limiter: Option<Mutex<RateLimiter<String>>>,
    session_lifetime: Duration,
    max_session_lifetime: Duration,
}

impl Admission {
    pub fn new(
        settings: &GatewaySettings,
        destinations: Arc<DestinationPolicy>,
        identities: SharedIdentities,
    ) -> Self {
        let limiter = (settings.rate_per_client > 0.0).then(|| {
            let limits = RateLimits {
                per_client: settings.rate_per_client,
                per_client_burst: settings.burst_per_client,
                global: f64::INFINITY,
                global_burst: f64::INFINITY,
                max_clients: MAX_LIMITED_CLIENTS,
            };
            Mutex::new(RateLimiter::new(limits, Instant::now()))
        });
        Self {
            identities,
            client_networks: settings.client_networks.clone(),
            destinations,
            limiter,
            session_lifetime: settings.session_lifetime,
            max_session_lifetime: settings.max_session_lifetime,
        }
    }

    /// Admits `request`: what it asks for, and how it goes on (a plain
    /// request or a tunnel), or the refusal.
    pub async fn admit(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
        slot: &Slot,
        verdicts: &Verdicts,
    ) -> Result<(Admitted, Hop), Refused> {
        let tunnel = request.method() == http::Method::CONNECT;
        match verdicts.next() {
            Some(Verdict::Clear) => {}
            Some(Verdict::Ambiguous(why)) => return Err(refused(GatewayError::Framing(why), true)),
            None => {
                let lost = GatewayError::Framing("the connection's framing was lost");
                return Err(refused(lost, true));
            }
        }
        let mut admitted = self
            .identify(&request, peer, slot)
            .map_err(|e| refused(e, tunnel || holds_a_large_buffer(slot, verdicts)))?;
        let target = target_of(request.method(), request.uri()).map_err(|e| refused(e.into(), tunnel))?;
        let (host, port) = match &target {
            Target::Tunnel { host, port } => (host.clone(), *port),
            Target::Forward { uri, .. } => (
                uri.host().unwrap_or_default().to_owned(),
                uri.port_u16().unwrap_or(80),
            ),
        };
        admitted.ask.target = lease_target(&host).map_err(|e| refused(e, tunnel))?;
        // Every address the name resolves to is checked (one refused refuses
        // the request: a plain request's name is resolved again by the
        // leased proxy, which could pick it); a tunnel goes to the checked ones.
        let addresses = check_destination(&self.destinations, &host, port, tunnel, RESOLVE_TIMEOUT)
            .await
            .map_err(|e| {
                let error = match e {
                    CheckedConnectError::Refused { .. } => GatewayError::DestinationRefused(e.to_string()),
                    other => GatewayError::DestinationUnresolved(other.to_string()),
                };
                refused(error, tunnel)
            })?;
        let hop = match target {
            Target::Tunnel { .. } => Hop::Tunnel(Tunnel { request, addresses }),
            Target::Forward { uri, host } => Hop::Plain(plain(request, uri, host)),
        };
        Ok((admitted, hop))
    }

    /// Who the request is (the identity its token proves, or `anonymous`
    /// from a client network: [`identify`]), the username's parameters and
    /// the identity's rate. Credentials that pass mark the connection
    /// authenticated (its `slot`).
    fn identify(
        &self,
        request: &Request<Incoming>,
        peer: SocketAddr,
        slot: &Slot,
    ) -> Result<Admitted, GatewayError> {
        let presented = request.headers().get(header::PROXY_AUTHORIZATION);
        let identified = identify(
            &self.identities.current(),
            presented.map(HeaderValue::as_bytes),
            peer.ip(),
            &self.client_networks,
        );
        // Credentials that passed (bad parameters or not) authenticate the connection.
        if !matches!(identified, Err(GatewayError::AuthenticationRequired)) {
            slot.authenticated();
        }
        let identified = identified?;
        if let Some(limiter) = &self.limiter {
            let key = identified.rate_key(peer.ip());
            crate::adapters::gateway::locked(limiter)
                .check_key(key.clone(), Instant::now())
                .map_err(|limited| GatewayError::RateLimited {
                    client: key,
                    retry_after: u32::try_from(retry_after_secs(limited.retry_after)).unwrap_or(u32::MAX),
                })?;
        }
        let Identified { identity, params } = identified;
        let lifetime = params
            .lifetime
            .unwrap_or(self.session_lifetime)
            .min(self.max_session_lifetime);
        Ok(Admitted {
            // Sessions are the identity's: another crawler cannot claim them.
            session: params.session.map(|id| ((identity.clone(), id), lifetime)),
            ask: Ask {
                target: String::new(),
                selector: params.selector,
                client: format!("{GATEWAY_CLIENT}/{identity}"),
                owner: identity.clone(),
                ..Ask::default()
            },
            client: Some(identity),
        })
    }
}

/// A plain request as it goes on: its headers rewritten for the next hop
/// (the crawler's `Proxy-Authorization`, its token, goes with the
/// hop-by-hop headers), its body as yet unread.
fn plain(request: Request<Incoming>, uri: Uri, host: HeaderValue) -> Plain {
    let (mut parts, body) = request.into_parts();
    // hyper let through only `chunked` (the guard refused any other coding).
    let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
    forwarded_headers(&mut parts.headers, host, chunked);
    Plain::new(parts, uri, body, chunked)
}
