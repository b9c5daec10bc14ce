//! Standalone mode: the operator on one machine, Proxy manifests from a
//! directory, state in an embedded database, no cluster.

use std::path::Path;
use std::sync::Arc;

use egress_proxies::adapters::config_files;
use egress_proxies::adapters::providers::{BuildContext, BuildError};
use egress_proxies::adapters::stores::embedded::{
    self, EmbeddedStore, EmbeddedStoreError, FileLeaseJournal, ManifestDir,
};
use egress_proxies::domain::config::{ConfigError, StandaloneConfig, StandaloneConfigError};
use egress_proxies::telemetry::events::LeadershipChanged;

use crate::health_server::{self, Readiness};

/// Standalone mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error(transparent)]
    Config(#[from] StandaloneConfigError),
    #[error(transparent)]
    Providers(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Store(#[from] EmbeddedStoreError),
    #[error("manifest directory {0} does not exist")]
    NoManifests(String),
    #[error(transparent)]
    Tokens(#[from] crate::discovery::TokensError),
    #[error("locating the operator binary: {0}")]
    Exe(std::io::Error),
    /// A listener could not be bound (the error names the address).
    #[error("{0}")]
    Listen(std::io::Error),
    #[error("actor system: {0}")]
    System(std::io::Error),
    #[error("health probes: {0}")]
    Prober(#[from] egress_proxies::adapters::probe::ProberError),
    #[error(transparent)]
    Leases(egress_proxies::domain::lease::JournalError),
    #[error(transparent)]
    Gateway(#[from] egress_proxies::adapters::gateway::GatewayError),
}

impl From<crate::system::StartError> for StandaloneError {
    fn from(e: crate::system::StartError) -> Self {
        match e {
            crate::system::StartError::Io(e) => StandaloneError::System(e),
            crate::system::StartError::Gateway(e) => StandaloneError::Gateway(e),
        }
    }
}

/// What [`prepare`] checked, opened and bound, for [`run`].
pub struct Prepared {
    config: StandaloneConfig,
    providers: egress_proxies::domain::provider_contract::Providers,
    prober: egress_proxies::adapters::probe::Prober,
    discovery_listener: Option<std::net::TcpListener>,
    health_listener: Option<std::net::TcpListener>,
    metrics_listener: Option<std::net::TcpListener>,
    gateway_listener: Option<std::net::TcpListener>,
    store: Arc<EmbeddedStore>,
    events: tokio::sync::mpsc::UnboundedReceiver<egress_proxies::domain::resource_store::StoreEvent>,
    installation: egress_proxies::domain::installation::InstallationId,
    settings: crate::system::Settings,
    pool_timing: crate::pool_actor::PoolTiming,
}

/// Loads the configuration, builds the providers, binds the listeners and
/// opens the state, before any actor exists: a bad file, a taken port or a
/// second operator on the same state fails the start here.
pub fn prepare(config_path: &Path) -> Result<Prepared, StandaloneError> {
    let config = config_files::standalone_config(config_path)?;
    let providers_config = config_files::providers_config(&config.providers_config)?;
    if !config.manifests.is_dir() {
        return Err(StandaloneError::NoManifests(
            config.manifests.display().to_string(),
        ));
    }
    let build = BuildContext {
        state_dir: config.state_dir.clone(),
        operator_exe: std::env::current_exe().map_err(StandaloneError::Exe)?,
        kube_client: None,
        kvm_runner: Some(crate::kvm::runner_factory()),
        gcp: egress_proxies::adapters::providers::gcp::GcpOptions {
            wire_log_full_payloads: config.gcp_wire_log_full_payloads,
        },
        cluster_networks: Vec::new(),
    };
    let providers = egress_proxies::adapters::providers::build(&providers_config, &build)?;
    let prober = egress_proxies::adapters::probe::Prober::new(config.health_ca_file.as_deref())?;
    // Listeners first: a taken port fails the start before any actor exists.
    let discovery_listener =
        crate::system::bind(config.discovery_bind_address).map_err(StandaloneError::Listen)?;
    let health_listener =
        crate::system::bind(config.health_probe_bind_address).map_err(StandaloneError::Listen)?;
    let metrics_listener =
        crate::system::bind(config.metrics_bind_address).map_err(StandaloneError::Listen)?;
    let gateway_listener =
        crate::system::bind(config.gateway_bind_address).map_err(StandaloneError::Listen)?;
    // Standalone serves on loopback by default: a token is optional.
    let tokens = crate::discovery::Tokens::from_env(config.crawler_tokens_dir.clone())
        .map_err(StandaloneError::Tokens)?;
    if let Some(listener) = &gateway_listener {
        // Before anything starts: never an open proxy on a reachable address.
        let addr = listener.local_addr().map_err(StandaloneError::Listen)?;
        egress_proxies::adapters::gateway::check_exposure(addr, !tokens.is_open())?;
    }
    let (store, events) = EmbeddedStore::open(&config.state_dir)?;
    let installation = store.installation_id(config.installation_id.as_ref())?;
    let store = Arc::new(store);
    tracing::info!(
        manifests = %config.manifests.display(), state = %config.state_dir.display(),
        providers = ?providers.names(), %installation, "standalone mode starting"
    );

    let settings = crate::system::Settings {
        health_workers: config.health_workers,
        trace_health_probes: config.trace_health_probes,
        leases: lease_settings(&config),
        fair_share: config.fair_share.clone(),
        gc_interval: config.gc_interval,
        gc_grace_period: config.gc_grace_period,
        pool_scale_down_delay: config.pool_scale_down_delay,
        discovery_tokens: tokens.clone(),
        lease_journal: Some(Box::new(
            FileLeaseJournal::open(&config.state_dir).map_err(StandaloneError::Leases)?,
        )),
        tenure: None,
        proxy_namespace: None,
        // The manifests are the operator's own: any endpoint they name stands.
        external_endpoints: None,
    };
    let pool_timing = crate::pool_actor::PoolTiming::of(&settings);
    Ok(Prepared {
        config,
        providers,
        prober,
        discovery_listener,
        health_listener,
        metrics_listener,
        gateway_listener,
        store,
        events,
        installation,
        settings,
        pool_timing,
    })
}

/// Runs on the actix system (started by the binary) until SIGTERM or
/// Ctrl-C. Proxy processes keep running after exit and are re-adopted at
/// the next start.
pub async fn run(prepared: Prepared) -> Result<(), StandaloneError> {
    let Prepared {
        config,
        providers,
        prober,
        discovery_listener,
        health_listener,
        metrics_listener,
        gateway_listener,
        store,
        events,
        installation,
        settings,
        pool_timing,
    } = prepared;
    let providers = Arc::new(providers);
    let port: Arc<dyn egress_proxies::domain::resource_store::ProxyStore> = store.clone();
    let pools = store.pool_events().map(|events| crate::system::PoolParts {
        pools: store.clone(),
        proxies: port.clone(),
        events,
        timing: pool_timing,
    });
    // Held until this function returns: dropping it stops the probes.
    let _running = crate::system::start(crate::system::Parts {
        store: port,
        events,
        providers,
        prober,
        settings,
        installation,
        discovery: discovery_listener,
        gateway: gateway_listener.map(|listener| crate::system::GatewayParts {
            listener,
            settings: config.gateway.clone(),
            // Standalone mode has no cluster networks.
            cluster_networks: Vec::new(),
        }),
        pools,
    })?;
    store.resync();
    actix::spawn(embedded::watch_manifests(
        store.clone(),
        ManifestDir::new(&config.manifests),
        config.manifest_poll_interval,
    ));
    let readiness = Readiness::default();
    if let Some(listener) = health_listener {
        let addr = listener.local_addr().map_err(StandaloneError::System)?;
        let server = health_server::start(listener, readiness.clone()).map_err(StandaloneError::System)?;
        actix::spawn(server);
        tracing::info!(%addr, "health probes listening");
    }
    if let Some(listener) = metrics_listener {
        let addr = listener.local_addr().map_err(StandaloneError::System)?;
        actix::spawn(
            crate::metrics_server::start(listener, crate::metrics_server::Protection::Open, None)
                .map_err(StandaloneError::System)?,
        );
        tracing::info!(%addr, "metrics listening");
    }
    // The state database's lock makes this process the only one acting.
    LeadershipChanged {
        identity: "standalone",
        leading: true,
    }
    .emit();
    readiness.set(true);
    crate::system::wait_for_shutdown()
        .await
        .map_err(StandaloneError::System)?;
    tracing::info!("shutting down; proxies keep running and are re-adopted at the next start");
    Ok(())
}

/// Lease settings from the standalone configuration.
pub fn lease_settings(config: &StandaloneConfig) -> egress_proxies::domain::lease::LeaseSettings {
    crate::system::lease_settings(
        config.lease_cooldown,
        config.max_lease_ttl,
        config.max_leases_per_proxy,
    )
}

/// The stored proxies, read without disturbing a running operator.
pub fn snapshot(config_path: &Path) -> Result<Vec<egress_proxies::domain::resource::Proxy>, String> {
    let config = config_files::standalone_config(config_path).map_err(|e| e.to_string())?;
    if !config.state_dir.join(embedded::DATABASE_FILE).exists() {
        return Ok(Vec::new());
    }
    embedded::read_snapshot(&config.state_dir).map_err(|e| e.to_string())
}

/// What the running operator's gateway learnt per site (the dashboard
/// data's `gateway.sites`), asked of its discovery API with the crawler
/// token from `EGRESS_PROXIES_TOKEN` or `DISCOVERY_TOKEN`.
pub fn sites(
    config_path: &Path,
) -> Result<Vec<egress_proxies::telemetry::gateway_stats::SiteSummary>, String> {
    let config = config_files::standalone_config(config_path).map_err(|e| e.to_string())?;
    let egress_proxies::domain::config::BindAddress::Listen(mut addr) = config.discovery_bind_address else {
        return Err("the discovery API is disabled (discoveryBindAddress: 0)".into());
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let token = ["EGRESS_PROXIES_TOKEN", "DISCOVERY_TOKEN"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|t| !t.is_empty()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let body = runtime.block_on(dashboard_data(addr, token.as_deref()))?;
    let data: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("GET /v1/dashboard: {e}"))?;
    serde_json::from_value(data["gateway"]["sites"].clone()).map_err(|e| format!("GET /v1/dashboard: {e}"))
}

/// `GET /v1/dashboard` of the discovery API at `addr`.
async fn dashboard_data(addr: std::net::SocketAddr, token: Option<&str>) -> Result<Vec<u8>, String> {
    let unreachable = |e: &dyn std::fmt::Display| format!("the operator's discovery API at {addr}: {e}");
    egress_proxies::tls::ensure_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .no_proxy()
        .build()
        .map_err(|e| unreachable(&e))?;
    let mut request = client.get(format!("http://{addr}/v1/dashboard"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| unreachable(&e))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| unreachable(&e))?;
    match status.as_u16() {
        200 => Ok(body.to_vec()),
        401 => Err(format!(
            "GET /v1/dashboard at {addr}: 401; set EGRESS_PROXIES_TOKEN (or DISCOVERY_TOKEN) to the crawler token"
        )),
        other => Err(format!(
            "GET /v1/dashboard at {addr}: {other} {}",
            String::from_utf8_lossy(&body)
        )),
    }
}

/// The stored pools, read without disturbing a running operator.
pub fn pool_snapshot(config_path: &Path) -> Result<Vec<egress_proxies::domain::resource::ProxyPool>, String> {
    let config = config_files::standalone_config(config_path).map_err(|e| e.to_string())?;
    if !config.state_dir.join(embedded::DATABASE_FILE).exists() {
        return Ok(Vec::new());
    }
    embedded::read_pools_snapshot(&config.state_dir).map_err(|e| e.to_string())
}
