//! The gateway's start (docs/gateway.md): its listener served on threads
//! of its own, leasing from the lease store it is given (the operator's
//! `LeaseStore`, `crate::adapters::lease_store`), so API leases and
//! gateway traffic share one book.

use std::sync::Arc;

use crate::adapters::gateway::{self, GatewayError, Leases, Options};
use crate::adapters::guarded_listener::ListenerSettings;
use crate::domain::config::GatewaySettings;
use crate::domain::destinations::{DestinationPolicy, IpNet};
use crate::domain::identity::SharedIdentities;

/// Starts the gateway on `listener`, leasing from `leases`: with crawler
/// tokens (`identities`) it demands one; without any it refuses any address
/// but loopback. `cluster_networks` (`--cluster-networks`) join its default
/// denies, as they do every proxy's.
pub fn start(
    listener: std::net::TcpListener,
    leases: Arc<dyn Leases>,
    identities: SharedIdentities,
    settings: &GatewaySettings,
    cluster_networks: &[IpNet],
) -> Result<(), GatewayError> {
    let addr = listener.local_addr()?;
    let open = identities.current().is_open();
    gateway::check_exposure(addr, !open)?;
    listener.set_nonblocking(true)?;
    if open {
        tracing::info!(
            %addr,
            "gateway listening WITHOUT authentication (no crawler token is set), on loopback only"
        );
    } else {
        tracing::info!(%addr, "gateway listening; crawlers present their crawler token as the proxy password");
    }
    let options = Options {
        destinations: Arc::new(DestinationPolicy::new(&settings.destinations, cluster_networks)),
        settings: settings.clone(),
        identities,
        leases,
    };
    let settings =
        ListenerSettings::for_process_limits(gateway::FDS_PER_CONNECTION, options.settings.unauthenticated);
    tracing::info!(
        %addr,
        max_connections = settings.max_connections,
        file_limit = crate::file_limit::current(),
        memory_limit = crate::memory_limit::current().map(tracing::field::display),
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
