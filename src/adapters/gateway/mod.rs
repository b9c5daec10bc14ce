//! The gateway: one forward-proxy endpoint for crawlers that cannot speak
//! the lease API. Each absolute-form request or `CONNECT` tunnel takes a
//! lease for its host from the same lease book as the API (so API leases
//! and gateway traffic never overbook a proxy), goes on through the leased
//! proxy with that proxy's credentials (crawlers never see them), and
//! gives the lease back when it ends. [`phases`] is the request pipeline
//! (admit, choose, forward, judge, log); the other modules hold what the
//! phases use: the block rules, sticky sessions, the site learning, the
//! upstream connections. The lease store itself is reached through
//! [`Leases`], which `crate::adapters::lease_store::LeaseStore` implements.

mod blocks;
mod challenge;
mod identify;
mod phases;
mod revocation;
mod sessions;
mod site_learning;
mod start;
mod upstream;
mod upstream_identity;
pub mod username;

use std::net::SocketAddr;

use data_encoding::BASE64;
use http::StatusCode;

use crate::adapters::forward_proxy::request::TargetError;
use crate::domain::credentials::ProxyCredentials;
use crate::domain::lease::Outcome;
use crate::domain::resource::ObjectKey;

pub use blocks::{BlockRules, HeadVerdict};
pub use challenge::challenge_realm;
pub use identify::{Identified, identify};
pub use phases::judge;
pub use phases::log::{Exchange, ExchangeOutcome, exchange_span};
pub use phases::serve;
pub use revocation::{Revocation, Revoker, revocation};
pub use sessions::{SessionKey, Sessions};
pub use site_learning::{PairView, SiteView};
pub use start::start;
pub use username::{Parameters, UsernameError};

/// Descriptors one client connection may need: its own and its upstream's.
pub const FDS_PER_CONNECTION: u64 = 2;

/// What the gateway enforces and where it leases.
pub struct Options {
    pub settings: crate::domain::config::GatewaySettings,
    pub destinations: std::sync::Arc<crate::domain::destinations::DestinationPolicy>,
    /// The crawler identities, whose tokens are presented as the proxy
    /// password; open (none): no auth (the caller binds loopback only, see
    /// [`check_exposure`]).
    pub identities: crate::domain::identity::SharedIdentities,
    pub leases: std::sync::Arc<dyn Leases>,
}

fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded state stays consistent across a panic elsewhere.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Response header naming why the gateway answered a request itself.
pub const REASON_HEADER: &str = "egress-gateway-error";
/// Seconds a client is told to wait after a `503`: about how long a
/// busy proxy takes to free up for short requests.
pub const RETRY_AFTER_SECONDS: u32 = 1;
/// Response headers naming the proxy that served a request or tunnel, its
/// lease (for reports through the lease API), a sticky session's move and
/// a learnt block.
pub const PROXY_HEADER: &str = "egress-gateway-proxy";
pub const LEASE_HEADER: &str = "egress-gateway-lease";
pub const SESSION_MOVED_HEADER: &str = "egress-gateway-session-moved-from";
pub const BLOCKED_HEADER: &str = "egress-gateway-blocked";

/// What one try of a request asks the lease store for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// The lease target (normalized host).
    pub target: String,
    pub selector: std::collections::BTreeMap<String, String>,
    /// `client` recorded on the lease: `gateway/<identity>`.
    pub client: String,
    /// The identity the request is made for (`crate::domain::identity`): the
    /// lease's owner, which fair shares and waiting turns count by.
    pub owner: String,
    /// A sticky session's proxy, granted if still eligible.
    pub prefer: Option<ObjectKey>,
    /// A sticky session's digest: without an eligible `prefer`, the proxy
    /// ranking highest for the session (`lease::rendezvous`).
    pub session: Option<u64>,
    /// Proxies not to grant: tried already for this request, or passed
    /// over for the target by the site learning.
    pub avoid: Vec<ObjectKey>,
}

/// A proxy the gateway leased for one try of a request or tunnel.
#[derive(Debug)]
pub struct Upstream {
    pub lease_id: String,
    pub proxy: ObjectKey,
    /// Where the proxy listens (`http://host:port`).
    pub url: String,
    pub credentials: Option<ProxyCredentials>,
    /// The realm the proxy's own 407 names, when known: a 407 naming
    /// another is not the proxy's (see [`challenge_realm`]).
    pub realm: Option<String>,
    /// How long the lease lasts unless renewed.
    pub ttl: std::time::Duration,
    /// Fires when the store takes the lease back (fair shares): the tunnel
    /// holding it closes.
    pub revoked: Revocation,
}

/// A lease being waited for.
pub type Waiting =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Upstream, GatewayError>> + Send>>;

/// The lease store, in process. Each call is done when it returns, so
/// calls reach the book in the order made (a failure reported on one try
/// counts before the next try is leased); none waits on I/O.
pub trait Leases: Send + Sync + 'static {
    /// A lease on the best proxy for the ask, or why not.
    fn acquire(&self, ask: Ask) -> Result<Upstream, GatewayError>;
    /// A lease as [`Self::acquire`], waiting in turn until `until` when no
    /// proxy is free: freed proxies go to waiters in fair order (the
    /// identity furthest below its share first, then first come). Dropping
    /// the future gives up the turn (and any lease granted meanwhile). A
    /// wait that ends unserved is one denial.
    fn acquire_within(&self, ask: Ask, until: std::time::Instant) -> Waiting;
    /// Gives a lease back; its proxy rests for the target for `rest`
    /// (none: the lease cooldown, as an API lease's).
    fn release(&self, lease_id: String, rest: Option<std::time::Duration>);
    /// Reports how the proxy did, like a crawler's report.
    fn report(&self, lease_id: String, outcome: Outcome, detail: String);
    /// Extends a lease by its TTL.
    fn renew(&self, lease_id: String) -> Result<(), GatewayError>;
}

/// Everything the gateway refuses or fails at, each answered with its own
/// status and a machine-readable reason ([`REASON_HEADER`]).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("proxy authentication required: present a crawler token as the proxy password (any username)")]
    AuthenticationRequired,
    #[error("request with ambiguous framing refused: {0}")]
    Framing(&'static str),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Username(#[from] UsernameError),
    #[error("too many requests from client {client:?}; retry in {retry_after}s")]
    RateLimited { client: String, retry_after: u32 },
    #[error("{0:?} is not a host the gateway can lease a proxy for")]
    BadHost(String),
    #[error("destination refused: {0}")]
    DestinationRefused(String),
    #[error("destination not resolved: {0}")]
    DestinationUnresolved(String),
    #[error("no proxy is available for {target:?} (all busy, resting or not ready)")]
    NoProxy { target: String },
    #[error("the lease store cannot lease now: {0}")]
    LeaseStore(String),
    #[error("upstream proxy {proxy}: {why}")]
    Upstream { proxy: String, why: String },
    #[error("no response from upstream proxy {proxy} within the idle timeout")]
    TimedOut { proxy: String },
    #[error("upstream proxy {proxy} rejected the request itself ({status})")]
    RequestRejected { proxy: String, status: u16 },
    #[error("the request body failed: {0}")]
    ClientBody(String),
    #[error("the client stopped sending its request body")]
    ClientTimeout,
    /// At start: the gateway would be an open proxy on a reachable address.
    #[error(
        "the gateway would serve {0} without authentication: set DISCOVERY_TOKEN (crawlers present it as the proxy password) or bind the gateway (gatewayBindAddress, --gateway-bind-address) to a loopback address"
    )]
    OpenOnReachableAddress(SocketAddr),
    /// At start: the listener could not be set up.
    #[error("gateway listener: {0}")]
    Listener(#[from] std::io::Error),
}

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::AuthenticationRequired => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            Self::Framing(_) | Self::Target(_) | Self::BadHost(_) | Self::Username(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::DestinationRefused(_) => StatusCode::FORBIDDEN,
            Self::DestinationUnresolved(_) | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::NoProxy { .. }
            | Self::LeaseStore(_)
            | Self::OpenOnReachableAddress(_)
            | Self::Listener(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::RequestRejected { status, .. } => StatusCode::from_u16(*status)
                .ok()
                .filter(StatusCode::is_client_error)
                .unwrap_or(StatusCode::BAD_REQUEST),
            Self::ClientBody(_) => StatusCode::BAD_REQUEST,
            Self::ClientTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The [`REASON_HEADER`] value.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::AuthenticationRequired => "authentication_required",
            Self::Framing(_) => "ambiguous_framing",
            Self::Target(_) | Self::BadHost(_) => "bad_request",
            Self::Username(_) => "bad_username",
            Self::RateLimited { .. } => "rate_limited",
            Self::DestinationRefused(_) => "destination_refused",
            Self::DestinationUnresolved(_) => "destination_unresolved",
            Self::NoProxy { .. } => "no_capacity",
            Self::LeaseStore(_) | Self::OpenOnReachableAddress(_) | Self::Listener(_) => "unavailable",
            Self::Upstream { .. } => "upstream_failed",
            Self::TimedOut { .. } => "upstream_timeout",
            Self::RequestRejected { .. } => "request_rejected",
            Self::ClientBody(_) => "bad_request_body",
            Self::ClientTimeout => "client_timeout",
        }
    }

    /// `Retry-After` seconds: only when waiting helps.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Self::NoProxy { .. } | Self::LeaseStore(_) => Some(RETRY_AFTER_SECONDS),
            Self::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Refuses to start an open proxy anywhere but on loopback.
pub fn check_exposure(addr: SocketAddr, token_required: bool) -> Result<(), GatewayError> {
    if token_required || addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(GatewayError::OpenOnReachableAddress(addr))
    }
}

/// The username and password of a `Proxy-Authorization: Basic` value.
pub fn basic_credentials(header: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let header = header.trim_ascii();
    let space = header.iter().position(|b| *b == b' ')?;
    let (scheme, token) = header.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = BASE64.decode(token.trim_ascii()).ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

/// The lease target of a request for `host` (a name, an IPv4 address or a
/// bracketed IPv6 one): what an API client would pass as `target`.
pub fn lease_target(host: &str) -> Result<String, GatewayError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    crate::domain::lease::input::normalize_target(bare).map_err(|_| GatewayError::BadHost(host.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_split_at_the_first_colon() {
        let basic = |pair: &str| format!("Basic {}", BASE64.encode(pair.as_bytes())).into_bytes();
        let pair =
            |user: &str, password: &str| Some((user.as_bytes().to_vec(), password.as_bytes().to_vec()));
        assert_eq!(
            basic_credentials(&basic("crawler:s3cret")),
            pair("crawler", "s3cret")
        );
        assert_eq!(basic_credentials(&basic(":s3cret")), pair("", "s3cret"));
        assert_eq!(basic_credentials(&basic("user:a:b")), pair("user", "a:b"));
        assert_eq!(basic_credentials(&basic("s3cret")), None);
        assert_eq!(basic_credentials(b"Bearer s3cret"), None);
        assert_eq!(basic_credentials(b"Basic !!!"), None);
    }

    #[test]
    fn an_open_gateway_starts_only_on_loopback() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert!(check_exposure(at("127.0.0.1:8888"), false).is_ok());
        assert!(check_exposure(at("[::1]:8888"), false).is_ok());
        assert!(check_exposure(at("0.0.0.0:8888"), true).is_ok());
        let err = check_exposure(at("0.0.0.0:8888"), false).unwrap_err();
        assert!(err.to_string().contains("DISCOVERY_TOKEN"), "{err}");
        assert!(check_exposure(at("10.0.0.5:8888"), false).is_err());
    }

    #[test]
    fn lease_targets_are_the_api_s_targets() {
        assert_eq!(lease_target("Example.COM").unwrap(), "example.com");
        assert_eq!(lease_target("127.0.0.1").unwrap(), "127.0.0.1");
        assert_eq!(lease_target("[::1]").unwrap(), "::1");
        assert!(lease_target("bad host").is_err());
    }

    #[test]
    fn each_failure_has_its_status_and_reason() {
        let none = GatewayError::NoProxy { target: "a".into() };
        assert_eq!((none.status().as_u16(), none.reason()), (503, "no_capacity"));
        assert_eq!(none.retry_after(), Some(RETRY_AFTER_SECONDS));
        let refused = GatewayError::DestinationRefused("x".into());
        assert_eq!(
            (refused.status().as_u16(), refused.reason()),
            (403, "destination_refused")
        );
        assert_eq!(refused.retry_after(), None);
        assert_eq!(GatewayError::AuthenticationRequired.status().as_u16(), 407);
    }
}
