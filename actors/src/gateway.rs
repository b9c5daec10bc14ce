//! The gateway's wiring (docs/gateway.md): its listener
//! (`egress_proxies::gateway`) leases from the lease store's book in
//! process, at its [`LeaseDesk`] on the gateway's own threads, so API
//! leases and gateway traffic share one book.

use std::sync::Arc;
use std::time::Duration;

use egress_proxies::config::GatewaySettings;
use egress_proxies::destinations::{DestinationPolicy, IpNet};
use egress_proxies::gateway::{self, Ask, GatewayError, Leases, Options, Upstream};
use egress_proxies::guarded_listener::ListenerSettings;
use egress_proxies::lease::{AcquireError, AcquireRequest, Outcome};

use crate::discovery::Tokens;
use crate::lease_store::LeaseDesk;

/// Asked for every gateway lease; the book caps it at `maxLeaseTtl`. A
/// tunnel's lease is renewed while it stays open, and every lease is
/// released the moment its request or tunnel ends.
const LEASE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The lease store as the gateway sees it: its desk, each call done when
/// it returns (in the order made).
struct StoreLeases(LeaseDesk);

impl Leases for StoreLeases {
    fn acquire(&self, ask: Ask) -> Result<Upstream, GatewayError> {
        let request = AcquireRequest {
            target: ask.target,
            selector: ask.selector,
            ttl: Some(LEASE_TTL),
            client: Some(ask.client),
            prefer: ask.prefer,
            session: ask.session,
        };
        self.0
            .acquire(&request)
            .map(|grant| Upstream {
                lease_id: grant.id,
                proxy: grant.proxy,
                url: grant.url,
                credentials: grant.credentials,
                realm: grant.realm,
                ttl: grant.ttl,
            })
            .map_err(|e| match e {
                AcquireError::NoCapacity { target } => GatewayError::NoProxy { target },
                other => GatewayError::LeaseStore(other.to_string()),
            })
    }

    fn release(&self, lease_id: String) {
        self.0.release(&lease_id);
    }

    fn report(&self, lease_id: String, outcome: Outcome, detail: String) {
        // Unknown: the lease ended meanwhile (expired); nothing to count.
        let _ = self.0.report(&lease_id, outcome, detail);
    }

    fn renew(&self, lease_id: String) -> Result<(), GatewayError> {
        self.0
            .renew(&lease_id)
            .map(|_| ())
            .map_err(|e| GatewayError::LeaseStore(e.to_string()))
    }
}

/// Starts the gateway on `listener` (call inside the actix system): with a
/// crawler token it demands it; without one it refuses any address but
/// loopback. `cluster_networks` (`--cluster-networks`) join its default
/// denies, as they do every proxy's.
pub fn start(
    listener: std::net::TcpListener,
    desk: LeaseDesk,
    tokens: &Tokens,
    settings: &GatewaySettings,
    cluster_networks: &[IpNet],
) -> Result<(), GatewayError> {
    let addr = listener.local_addr()?;
    let token = tokens.crawler_token();
    gateway::check_exposure(addr, token.is_some())?;
    listener.set_nonblocking(true)?;
    if token.is_some() {
        tracing::info!(%addr, "gateway listening; crawlers present DISCOVERY_TOKEN as the proxy password");
    } else {
        tracing::info!(
            %addr,
            "gateway listening WITHOUT authentication (DISCOVERY_TOKEN is not set), on loopback only"
        );
    }
    let options = Options {
        destinations: Arc::new(DestinationPolicy::new(&settings.destinations, cluster_networks)),
        settings: settings.clone(),
        token,
        leases: Arc::new(StoreLeases(desk)),
    };
    let settings =
        ListenerSettings::for_process_limits(gateway::FDS_PER_CONNECTION, options.settings.unauthenticated);
    tracing::info!(
        %addr,
        max_connections = settings.max_connections,
        file_limit = egress_proxies::file_limit::current(),
        memory_limit = egress_proxies::memory_limit::current().map(tracing::field::display),
        head_budget = settings.unauthenticated.head_budget,
        free_head = settings.unauthenticated.free_head,
        connections_per_source = settings.unauthenticated.connections_per_source,
        "gateway connection limits (the cap fits the file and memory limits)"
    );
    let threads = gateway_threads()?;
    threads.spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => return tracing::error!(error = %e, "gateway listener could not be set up"),
        };
        if let Err(e) = gateway::serve(listener, options, settings).await {
            tracing::error!(error = %e, "gateway stopped");
        }
    });
    Ok(())
}

/// The gateway's own threads: one per core the process may use (at most
/// 8), apart from the actors' thread, which every actor shares. They live
/// as long as the process.
fn gateway_threads() -> Result<&'static tokio::runtime::Runtime, GatewayError> {
    static THREADS: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(threads) = THREADS.get() {
        return Ok(threads);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.clamp(1, 8))
        .thread_name("gateway")
        .enable_all()
        .build()?;
    Ok(THREADS.get_or_init(|| runtime))
}
