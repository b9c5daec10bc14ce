//! The actor system both modes run: ProxyRegistry (with its ProxyActors),
//! HealthProber, LeaseStoreActor, GcSweeper, the discovery API, the gateway and
//! the PoolRegistry (with its PoolActors), over whichever object store the
//! mode provides; `operator::run` and `standalone::run` differ only in what
//! they hand to [`start`]. Every actor runs under a supervisor that
//! restarts it in place when it crashes (see [`crate::supervision`]).

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::leader::Tenure;
use egress_proxies::adapters::lease_store::LeaseStore;
use egress_proxies::adapters::probe::Prober;
use egress_proxies::adapters::stores::{FencedPools, FencedStore};
use egress_proxies::domain::config::GatewaySettings;
use egress_proxies::domain::destinations::IpNet;
use egress_proxies::domain::gc::Scope;
use egress_proxies::domain::installation::InstallationId;
use egress_proxies::domain::lease::LeaseSettings;
use egress_proxies::domain::provider_contract::Providers;
use egress_proxies::domain::reconcile;
use egress_proxies::domain::resource_store::{PoolStore, ProxyStore, StoreEvent};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::gc_sweeper::GcSweeper;
use crate::health_prober::{HealthProber, ProbeThreads};
use crate::lease_store_actor::LeaseStoreActor;
use crate::pool_actor::{PoolContext, PoolTiming};
use crate::pool_registry::PoolRegistry;
use crate::proxy_actor::Timing;
use crate::proxy_registry::ProxyRegistry;
use crate::supervision::{self, Node};

/// Settings shared by both modes.
pub struct Settings {
    pub health_workers: usize,
    pub trace_health_probes: bool,
    pub leases: LeaseSettings,
    /// Weights of crawler identities' fair shares (default: equal).
    pub fair_share: egress_proxies::domain::lease::FairShare,
    pub gc_interval: Duration,
    pub gc_grace_period: Duration,
    /// How long an autoscaled pool's demand must stay low before it shrinks.
    pub pool_scale_down_delay: Duration,
    /// Bearer tokens of the discovery API (`DISCOVERY_TOKEN`, `DISCOVERY_READ_TOKEN`).
    pub discovery_tokens: crate::discovery::Tokens,
    /// Where leases are kept across restarts (`None`: in memory only).
    pub lease_journal: Option<Box<dyn egress_proxies::domain::lease::LeaseJournal>>,
    /// With leader election: the store answers and leases are granted only
    /// while this lasts (set by `operator::run`).
    pub tenure: Option<Tenure>,
    /// `--proxy-namespace`: GC reaps only instances of Proxies in it.
    pub proxy_namespace: Option<String>,
    /// Where External endpoints may not point (Kubernetes mode, see
    /// `--allow-external-endpoint-networks`); `None` in standalone mode.
    pub external_endpoints: Option<Arc<egress_proxies::domain::destinations::DestinationPolicy>>,
}

/// Addresses of the started actors: what serves crawlers and what acts on Proxies.
pub struct Running {
    pub serving: Serving,
    pub leading: Leading,
}

/// The part every serving replica runs: the lease store, the discovery
/// API, the gateway and the health prober.
pub struct Serving {
    pub prober: Addr<HealthProber>,
    pub leases: Addr<LeaseStoreActor>,
    /// The store `leases` hosts, for the gateway to lease on its own threads.
    pub lease_store: LeaseStore,
    /// Where the health probes run (stopped when this is dropped).
    pub probe_threads: ProbeThreads,
}

/// The part only the acting replica runs: ProxyActors, orphan GC and pools,
/// every store write fenced by its tenure when it has one.
pub struct Leading {
    pub registry: Addr<ProxyRegistry>,
    pub gc: Addr<GcSweeper>,
}

/// What a mode hands to [`start`].
pub struct Parts {
    /// Where Proxies are kept, and their changes.
    pub store: Arc<dyn ProxyStore>,
    pub events: UnboundedReceiver<StoreEvent>,
    pub providers: Arc<Providers>,
    pub prober: Prober,
    pub settings: Settings,
    /// Tags every instance made and bounds what orphan GC may reap.
    pub installation: InstallationId,
    /// Where the discovery API listens (`None`: switched off).
    pub discovery: Option<TcpListener>,
    /// Where the gateway listens (`None`: switched off).
    pub gateway: Option<GatewayParts>,
    /// ProxyPools, where the mode keeps them (`None`: no pools).
    pub pools: Option<PoolParts>,
}

/// The gateway's listener and settings.
pub struct GatewayParts {
    pub listener: TcpListener,
    pub settings: GatewaySettings,
    /// Client networks served without credentials (Kubernetes mode's
    /// `--cluster-networks`; none in standalone mode).
    pub cluster_networks: Vec<IpNet>,
}

/// Where ProxyPools and their members are kept, and the pools' changes.
pub struct PoolParts {
    pub pools: Arc<dyn PoolStore>,
    pub proxies: Arc<dyn ProxyStore>,
    pub events: UnboundedReceiver<StoreEvent>,
    pub timing: PoolTiming,
}

/// Starting the system failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Gateway(#[from] egress_proxies::adapters::gateway::GatewayError),
}

/// Starts every actor and server (call inside the actix system): what
/// serves crawlers, then what acts on Proxies. With a leader's tenure in the
/// settings, every grant and every store write is fenced by it.
pub fn start(parts: Parts) -> Result<Running, StartError> {
    let Parts {
        store,
        events,
        providers,
        prober,
        settings,
        installation,
        discovery,
        gateway,
        pools,
    } = parts;
    let Settings {
        health_workers,
        trace_health_probes,
        leases,
        fair_share,
        gc_interval,
        gc_grace_period,
        pool_scale_down_delay: _,
        discovery_tokens,
        lease_journal,
        tenure,
        proxy_namespace,
        external_endpoints,
    } = settings;
    let serving = serve(ServeParts {
        prober,
        health_workers,
        trace_health_probes,
        leases,
        fair_share,
        lease_journal,
        tenure: tenure.clone(),
        shares: None,
        forwarding: None,
        discovery_tokens,
        discovery,
        gateway,
    })?;
    let leading = lead(
        LeadParts {
            store,
            events,
            providers,
            installation,
            gc_interval,
            gc_grace_period,
            proxy_namespace,
            external_endpoints,
            tenure,
            pools,
            probes: None,
        },
        &serving,
    );
    Ok(Running { serving, leading })
}

/// What [`serve`] needs.
pub struct ServeParts {
    pub prober: Prober,
    pub health_workers: usize,
    pub trace_health_probes: bool,
    pub leases: LeaseSettings,
    pub fair_share: egress_proxies::domain::lease::FairShare,
    pub lease_journal: Option<Box<dyn egress_proxies::domain::lease::LeaseJournal>>,
    /// Grants only while this lasts.
    pub tenure: Option<Tenure>,
    /// Every replica serving: the store serves from a capacity share, and
    /// only while this replica's member Lease (this tenure) lasts; its
    /// lease ids carry this member's tag.
    pub shares: Option<(Tenure, egress_proxies::domain::membership::MemberTag)>,
    /// Every replica serving: lease calls for another replica's leases go there.
    pub forwarding: Option<crate::discovery::Forwarding>,
    pub discovery_tokens: crate::discovery::Tokens,
    pub discovery: Option<TcpListener>,
    pub gateway: Option<GatewayParts>,
}

/// Starts what serves crawlers: the health prober, the lease store on a
/// thread of its own, the discovery API and the gateway.
pub fn serve(parts: ServeParts) -> Result<Serving, StartError> {
    let probe_threads = ProbeThreads::per_core()?;
    let prober =
        HealthProber::new(parts.prober, parts.health_workers, parts.trace_health_probes).on(&probe_threads);
    let prober = supervision::start(Node::singleton("health_prober"), |_| prober);
    let mut leases = match parts.lease_journal {
        Some(journal) => {
            LeaseStore::durable(parts.leases, Default::default(), journal).map_err(std::io::Error::other)?
        }
        None => LeaseStore::new(parts.leases),
    };
    if let Some(tenure) = parts.tenure {
        leases = leases.with_tenure(tenure);
    }
    if let Some((member, tag)) = &parts.shares {
        leases = leases.with_shares(member.clone(), tag);
    }
    let lease_store = leases.with_fair_share(parts.fair_share);
    let hosted = lease_store.clone();
    // A thread of its own: lease answers never wait behind reconciles'
    // store writes or process scans on the system arbiter.
    let leases = supervision::start_in_arbiter(
        &Arbiter::new().handle(),
        Node::singleton("lease_store"),
        move |_| LeaseStoreActor::new(hosted),
    );
    actix::spawn(close_history_intervals());
    if let Some(listener) = parts.discovery {
        let addr = listener.local_addr()?;
        let server = crate::discovery::start_with(
            listener,
            leases.clone(),
            parts.discovery_tokens.clone(),
            crate::discovery::Limiter::new(egress_proxies::rate_limit::RateLimits::default()),
            parts.forwarding.clone(),
        )?;
        actix::spawn(server);
        tracing::info!(%addr, "discovery API listening");
    }
    if let Some(gateway) = parts.gateway {
        egress_proxies::adapters::gateway::start(
            gateway.listener,
            Arc::new(lease_store.clone()),
            parts.discovery_tokens.identities(),
            &gateway.settings,
            &gateway.cluster_networks,
        )?;
    }
    Ok(Serving {
        prober,
        leases,
        lease_store,
        probe_threads,
    })
}

/// What [`lead`] needs.
pub struct LeadParts {
    pub store: Arc<dyn ProxyStore>,
    pub events: UnboundedReceiver<StoreEvent>,
    pub providers: Arc<Providers>,
    pub installation: InstallationId,
    pub gc_interval: Duration,
    pub gc_grace_period: Duration,
    pub proxy_namespace: Option<String>,
    pub external_endpoints: Option<Arc<egress_proxies::domain::destinations::DestinationPolicy>>,
    /// Every store write is fenced by this when set.
    pub tenure: Option<Tenure>,
    pub pools: Option<PoolParts>,
    /// Where ProxyActors ask for probes (default: `serving`'s prober; the
    /// probe router when every replica serves).
    pub probes: Option<crate::health_prober::Probes>,
}

/// Starts what acts on Proxies: the ProxyRegistry (probing through
/// `serving`'s prober, publishing availability to its lease store), orphan
/// GC and the PoolRegistry.
pub fn lead(parts: LeadParts, serving: &Serving) -> Leading {
    let store = match &parts.tenure {
        Some(tenure) => Arc::new(FencedStore::new(parts.store, tenure.clone())) as Arc<dyn ProxyStore>,
        None => parts.store,
    };
    let ctx = reconcile::ReconcileContext {
        store: store.clone(),
        providers: parts.providers.clone(),
        now: egress_proxies::adapters::clock::now,
        replacement: Default::default(),
        installation: parts.installation.clone(),
        external_endpoints: parts.external_endpoints,
        names: Arc::new(egress_proxies::adapters::name_resolver::SystemResolver),
        random: Arc::new(egress_proxies::adapters::random::SystemRandom),
    };
    let scope = Scope {
        installation: parts.installation,
        namespaces: parts.proxy_namespace.map(|ns| BTreeSet::from([ns])),
    };
    let gc = GcSweeper::new(
        store,
        parts.providers,
        scope,
        parts.gc_interval,
        parts.gc_grace_period,
    );
    let gc = supervision::start(Node::singleton("gc_sweeper"), |_| gc);
    let probes = parts.probes.unwrap_or_else(|| serving.prober.clone().into());
    let registry = ProxyRegistry::new(ctx, Timing::default(), Some(probes))
        .with_leases(serving.leases.clone())
        .run(parts.events);
    if let Some(pools) = parts.pools {
        let (pool_store, proxies): (Arc<dyn PoolStore>, Arc<dyn ProxyStore>) = match &parts.tenure {
            Some(tenure) => (
                Arc::new(FencedPools::new(pools.pools, tenure.clone())),
                Arc::new(FencedStore::new(pools.proxies, tenure.clone())),
            ),
            None => (pools.pools, pools.proxies),
        };
        PoolRegistry::new(PoolContext {
            pools: pool_store,
            proxies,
            leases: Some(serving.leases.clone()),
            timing: pools.timing,
        })
        .run(pools.events);
    }
    Leading { registry, gc }
}

/// Ends the dashboard history's open interval every resolution step.
async fn close_history_intervals() {
    use egress_proxies::telemetry::history::{RESOLUTION, history};
    let mut tick = tokio::time::interval(RESOLUTION);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: the first interval starts now.
    tick.tick().await;
    loop {
        tick.tick().await;
        history().close(jiff::Timestamp::now().as_millisecond());
    }
}

/// Lease settings from the operator's flags; report rests scale with the cooldown.
pub fn lease_settings(cooldown: Duration, max_ttl: Duration, capacity: u32) -> LeaseSettings {
    LeaseSettings {
        cooldown,
        blocked_cooldown: (cooldown * 20).max(Duration::from_secs(600)),
        error_cooldown: (cooldown * 2).max(Duration::from_secs(60)),
        default_ttl: max_ttl.min(Duration::from_secs(60)),
        max_ttl,
        capacity,
        report_grace: max_ttl,
    }
}

/// Waits for SIGTERM or Ctrl-C.
pub async fn wait_for_shutdown() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        r = tokio::signal::ctrl_c() => { r?; tracing::info!("interrupt received") }
    }
    Ok(())
}

/// Binds a listener unless disabled.
pub fn bind(address: egress_proxies::domain::config::BindAddress) -> std::io::Result<Option<TcpListener>> {
    match address {
        egress_proxies::domain::config::BindAddress::Disabled => Ok(None),
        egress_proxies::domain::config::BindAddress::Listen(addr) => listen(addr)
            .map(Some)
            .map_err(|e| std::io::Error::new(e.kind(), format!("listener {addr}: {e}"))),
    }
}

/// Connections the kernel completes and queues while a listener is at its
/// connection cap (std's `bind` queues 128; more are refused until one is
/// accepted, and the client retries after a second or more).
const ACCEPT_QUEUE: i32 = 1024;

/// A listening socket on `addr` with [`ACCEPT_QUEUE`].
fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As std's bind: a restarted operator takes its port back at once.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(ACCEPT_QUEUE)?;
    Ok(socket.into())
}
