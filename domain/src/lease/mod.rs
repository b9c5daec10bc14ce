//! Lease bookkeeping: which proxies a crawler may use for a target right
//! now, and the leases it holds. A pure data structure with an injectable
//! clock (every operation takes `now`); the lease store
//! (`egress_proxies::adapters::lease_store::LeaseStore`) holds one.

pub mod allocator;
mod book;
pub mod fair_share;
pub mod fleet;
pub mod input;
pub mod journal;
pub mod lease_id;
mod limits;
mod owners;
mod reports;
pub mod shares;
#[cfg(test)]
mod tests;
mod wants;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::credentials::ProxyCredentials;
use crate::resource::ObjectKey;

/// Sticky sessions rank proxies by it (it lives above both the book and the members).
pub use crate::rendezvous;
pub use allocator::{Allocation, Allocator, Allotted, MemberShare, Report};
pub use book::{LeaseBook, owner_key};
pub use fair_share::FairShare;
pub use fleet::{FleetChange, Outbox};
pub use journal::{Durable, JournalError, LeaseChange, LeaseJournal, LeaseSnapshot, ProxyTally};
pub use limits::{Footprint, LeaseLimits, TableFull};
pub use owners::{Act, Caller, NotOwner, may_act};
pub use reports::{RecentReport, ReportCounts};
pub use shares::{Claim, Slots};
pub use wants::{WANT_WINDOW, Wants};

/// Tunables of the lease store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// After a release, the proxy rests this long for that target.
    pub cooldown: Duration,
    /// After a `blocked` report, the proxy rests this long for that target.
    pub blocked_cooldown: Duration,
    /// After an `error` report, the proxy rests this long for every target.
    pub error_cooldown: Duration,
    /// TTL when the request names none.
    pub default_ttl: Duration,
    /// Upper bound of any TTL.
    pub max_ttl: Duration,
    /// Concurrent leases per proxy; 0 = unlimited.
    pub capacity: u32,
    /// Ended leases still accept reports for this long.
    pub report_grace: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            cooldown: Duration::from_secs(30),
            blocked_cooldown: Duration::from_secs(600),
            error_cooldown: Duration::from_secs(60),
            default_ttl: Duration::from_secs(60),
            max_ttl: Duration::from_secs(600),
            capacity: 1,
            report_grace: Duration::from_secs(600),
        }
    }
}

/// What a ProxyActor tells the lease store about its proxy.
#[derive(Clone, Debug, PartialEq)]
pub struct Availability {
    pub key: ObjectKey,
    /// Ready: healthy and serving. Only ready proxies are leased.
    pub ready: bool,
    /// Lifecycle phase, for listings.
    pub phase: String,
    /// Health verdict, when known.
    pub healthy: Option<bool>,
    /// `http://host:port` clients configure as their proxy.
    pub url: Option<String>,
    pub attributes: BTreeMap<String, String>,
    pub latency: Option<Duration>,
    /// What the proxy demands, handed out with a lease only: never listed.
    pub credentials: Option<ProxyCredentials>,
    /// The realm the proxy's own 407 names (`Proxy-Authenticate: Basic
    /// realm="..."`), when known: every Managed proxy has one of its own
    /// (`credentials::realm_of`); External proxies: `None`. No secret.
    pub realm: Option<String>,
    /// Being retired by its pool: never leased, its leases not renewed, so
    /// it drains before it is deleted.
    pub retiring: bool,
}

impl Availability {
    /// The same, without the credentials (for listings).
    pub fn listed(&self) -> Availability {
        Availability {
            credentials: None,
            ..self.clone()
        }
    }
}

/// `client` of the gateway's leases (`gateway`, or `gateway/<client>` with
/// the crawler's client name): reserved, refused from API clients.
pub const GATEWAY_CLIENT: &str = "gateway";

/// Whether `client` names a lease of the gateway.
pub fn is_gateway_client(client: &str) -> bool {
    client
        .strip_prefix(GATEWAY_CLIENT)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A request for a lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcquireRequest {
    /// What the crawler will fetch through the proxy (a host, usually).
    pub target: String,
    /// Attributes the proxy must carry (all of them).
    pub selector: BTreeMap<String, String>,
    pub ttl: Option<Duration>,
    /// Free-form name of the client, for listings and logs.
    pub client: Option<String>,
    /// The identity taking the lease (`crate::identity`): only it may
    /// release, report on or renew an API lease ([`Caller`]); fair shares
    /// count by it. None: nobody in particular (any identity may act).
    pub owner: Option<String>,
    /// A proxy to grant if it is eligible (a sticky session's); otherwise
    /// the best one, as without.
    pub prefer: Option<ObjectKey>,
    /// A sticky session's [`rendezvous::session_digest`]: when `prefer` is
    /// not eligible (or not given), the eligible proxy that ranks highest
    /// for the session rather than the least busy one, so that a session
    /// lands where it did in any process that sees the same fleet.
    pub session: Option<u64>,
    /// Proxies not to grant for this request (the gateway's: tried already,
    /// or learnt to fail for the target).
    pub avoid: Vec<ObjectKey>,
}

/// A granted lease.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub id: String,
    pub proxy: ObjectKey,
    pub url: String,
    pub attributes: BTreeMap<String, String>,
    pub target: String,
    pub ttl: Duration,
    /// What the proxy demands (Basic proxy authentication), if anything.
    pub credentials: Option<ProxyCredentials>,
    /// The realm the proxy's own 407 names, when known ([`Availability::realm`]).
    pub realm: Option<String>,
}

/// How the use of a lease went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    /// The target blocked the proxy: rest it longer for that target.
    Blocked,
    /// The proxy itself failed: rest it for every target.
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Blocked => "blocked",
            Outcome::Error => "error",
        }
    }
}

/// Why no lease was granted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    #[error(
        "no proxy is available for {target:?} with the requested attributes (all busy, cooling down or not ready)"
    )]
    NoCapacity { target: String },
    /// The identity holds its fair share while another below its own waits.
    #[error(
        "no proxy for {target:?} now: this identity holds {held} leases, its fair share ({share}) while other crawlers wait for theirs"
    )]
    OverShare { target: String, held: u32, share: u64 },
    #[error("target must not be empty")]
    EmptyTarget,
    #[error("ttlSeconds must be greater than zero")]
    ZeroTtl,
    /// The lease could not be kept (its journal failed); try again later.
    #[error("{0}")]
    Unavailable(String),
    /// This replica's leadership lapsed (or never began): its book grants nothing.
    #[error("this replica is not the leader")]
    NotLeader,
    #[error(transparent)]
    Full(#[from] TableFull),
}

/// Why a lease was not renewed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    #[error(transparent)]
    Unknown(#[from] UnknownLease),
    #[error("ttlSeconds must be greater than zero")]
    ZeroTtl,
    /// The renewal could not be made durable; the lease still runs until its old expiry at least.
    #[error("{0}")]
    Unavailable(String),
    #[error("this replica is not the leader")]
    NotLeader,
    /// The proxy is being retired by its pool: the client moves to another.
    #[error("proxy {0} is being retired by its pool: release this lease and acquire another")]
    Retiring(ObjectKey),
}

/// A report named a lease the store does not know (never, or ended too long ago).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("lease {0} is unknown or ended too long ago")]
pub struct UnknownLease(pub String);

/// A proxy as listed by the discovery API.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyView {
    pub availability: Availability,
    pub active_leases: u32,
    /// Distinct targets that reported it `blocked` (at most [`MAX_BLOCKED_TARGETS`] counted).
    pub blocked_targets: u32,
    /// `error` reports on its leases.
    pub errors: u32,
}

/// What a pool's control loop learns from the lease store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolFigures {
    /// Per member: active leases, distinct blocking targets, error reports.
    pub members: std::collections::HashMap<ObjectKey, crate::pool::LeaseFigures>,
    /// Acquires for the pool refused for lack of capacity since the last ask.
    pub denied: u32,
}

/// Distinct blocking targets counted per proxy (the schema's bound on a
/// pool's rotation threshold).
pub use crate::resource::MAX_BLOCKED_TARGETS;

/// A target as a blocked tally keeps it: the first 8 bytes of its SHA-256,
/// so a tally costs 8 bytes per target in memory and in the journal however
/// long the names are (a collision would merely count two targets as one).
pub fn target_digest(target: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(target.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(first)
}
