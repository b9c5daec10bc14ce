//! Kubernetes mode (`egress-proxies-operator run`): Proxies from the API
//! server (in-cluster, or the kubeconfig), status through the status
//! subresource, Events, optional leader election on a Lease. Only the leader
//! runs ProxyActors, the health prober, GC and the lease store; a leader
//! that cannot renew within the renew deadline stops acting at that instant
//! and exits (code 1) so its pod restarts as a follower; `/readyz` answers
//! 200 only while leading. Timings and the safety argument:
//! [`egress_proxies::adapters::leader`].

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use egress_proxies::adapters::config_files;
use egress_proxies::adapters::leader::{LeaderElector, SystemClock, Tenure, Timings};
use egress_proxies::adapters::probe::Prober;
use egress_proxies::adapters::providers::BuildContext;
use egress_proxies::adapters::stores::configmap_lease_journal::{ConfigMapLeaseJournal, Writer};
use egress_proxies::adapters::stores::installation;
use egress_proxies::adapters::stores::kubernetes::KubeStore;
use egress_proxies::domain::config::BindAddress;
use egress_proxies::domain::config::{GatewaySettings, ProvidersConfig};
use egress_proxies::domain::installation::InstallationId;
use egress_proxies::telemetry::events::LeadershipChanged;

use crate::health_server::{self, Readiness};
use crate::pool_actor::PoolTiming;
use crate::system;
use egress_proxies::adapters::lease_keeper::{LeaseKeeper, Release};

/// Name of the leader-election Lease.
pub const LEASE_NAME: &str = "egress-proxies-operator";

/// Everything `run` needs.
pub struct Options {
    pub providers_config: PathBuf,
    pub state_dir: PathBuf,
    pub health_probe_bind_address: BindAddress,
    pub metrics_bind_address: BindAddress,
    /// Metrics over HTTPS to authorized bearer tokens only.
    pub metrics_secure: bool,
    pub metrics_cert_dir: Option<PathBuf>,
    pub discovery_bind_address: BindAddress,
    /// The gateway (docs/gateway.md), served by the leader like the discovery API.
    pub gateway_bind_address: BindAddress,
    /// `--gateway-config`: the gateway's settings file (default settings without).
    pub gateway_config: Option<PathBuf>,
    pub leader_elect: bool,
    pub lease_duration: Duration,
    pub proxy_namespace: Option<String>,
    pub health_ca_file: Option<PathBuf>,
    pub gcp: egress_proxies::adapters::providers::gcp::GcpOptions,
    /// `--cluster-networks`: pod and service ranges every proxy denies by default.
    pub cluster_networks: Vec<egress_proxies::domain::destinations::IpNet>,
    pub settings: system::Settings,
    /// `--installation-id`: overrides the id kept in the cluster.
    pub installation_id: Option<InstallationId>,
    /// `--kube-api-qps`, `--kube-api-burst`: none by default.
    pub kube_api_budget: Option<egress_proxies::adapters::kube_client::ApiBudget>,
    /// `--every-replica-serves` (on by default): with `--leader-elect`
    /// every replica serves crawlers from a capacity share.
    pub every_replica_serves: bool,
    /// `--replica-bind-address`: the internal listener replicas sync on.
    pub replica_bind_address: BindAddress,
    /// Where other replicas reach this one's internal listener.
    pub replica_advertise: Option<std::net::SocketAddr>,
    /// The replicas' token (derived from `DISCOVERY_TOKEN`); `None`: the
    /// internal listener must be on loopback.
    pub replica_token: Option<egress_proxies::adapters::replicas::token::ReplicaToken>,
}

impl Options {
    /// Every replica serves crawlers: the default with `--leader-elect`;
    /// without it the one process is the whole system.
    pub fn serves_on_every_replica(&self) -> bool {
        self.leader_elect && self.every_replica_serves
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    Config(#[from] egress_proxies::domain::config::ConfigError),
    #[error(transparent)]
    Build(#[from] egress_proxies::adapters::providers::BuildError),
    #[error(transparent)]
    Prober(#[from] egress_proxies::adapters::probe::ProberError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("connecting to the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("leadership lost ({0}); stopping so the pod restarts as a follower")]
    LeadershipLost(&'static str),
    #[error("stepped down: {0}; stopping so the pod restarts as a follower")]
    SteppedDown(String),
    #[error(transparent)]
    Leases(#[from] egress_proxies::domain::lease::JournalError),
    #[error(transparent)]
    Installation(#[from] installation::InstallationRecordError),
    #[error("metrics listener: {0}")]
    MetricsCert(#[from] egress_proxies::serving_cert::ServingCertError),
    #[error("--gateway-config {path}: {source}")]
    GatewayConfig {
        path: String,
        #[source]
        source: egress_proxies::domain::config::GatewaySettingsError,
    },
    #[error(transparent)]
    Gateway(#[from] egress_proxies::adapters::gateway::GatewayError),
    #[error(transparent)]
    Replicas(#[from] egress_proxies::adapters::replicas::ReplicaError),
    #[error(
        "every replica serves (the default with --leader-elect) but --replica-bind-address is 0: \
         give the replicas' internal listener an address (:8091), or set \
         --every-replica-serves=false so only the leader serves"
    )]
    ReplicaListenerOff,
    #[error(
        "every replica serves (the default with --leader-elect) but nothing names the address \
         the other replicas reach this one at (its listener is {0}): set POD_IP from the pod's \
         status.podIP (the downward API), or --replica-advertise-address, or \
         --every-replica-serves=false so only the leader serves"
    )]
    ReplicaAddressUnknown(std::net::SocketAddr),
    #[error("this replica's membership lapsed ({0}); stopping so the pod restarts as a new member")]
    MembershipLapsed(String),
    #[error("the lease keeper's thread failed ({0}); stopping so the pod restarts")]
    LeaseKeeper(String),
}

impl From<system::StartError> for OperatorError {
    fn from(e: system::StartError) -> Self {
        match e {
            system::StartError::Io(e) => e.into(),
            system::StartError::Gateway(e) => e.into(),
        }
    }
}

/// The gateway as `run` sets it up before anything starts.
struct Gateway {
    listener: TcpListener,
    settings: GatewaySettings,
}

/// What [`prepare`] checked and bound, for [`run`].
pub struct Prepared {
    options: Options,
    providers_config: ProvidersConfig,
    prober: Prober,
    health_listener: Option<TcpListener>,
    metrics_listener: Option<TcpListener>,
    discovery_listener: Option<TcpListener>,
    gateway: Option<Gateway>,
    /// Every replica serving: the internal listener.
    replica_listener: Option<TcpListener>,
}

/// Loads the configuration and binds the listeners, before any actor
/// exists: a bad file or a taken port fails the start here.
pub fn prepare(options: Options) -> Result<Prepared, OperatorError> {
    let providers_config = config_files::providers_config(&options.providers_config)?;
    let prober = Prober::new(options.health_ca_file.as_deref())?;
    let health_listener = system::bind(options.health_probe_bind_address)?;
    let metrics_listener = system::bind(options.metrics_bind_address)?;
    let discovery_listener = system::bind(options.discovery_bind_address)?;
    let gateway = gateway(&options)?;
    let replica_listener = if options.serves_on_every_replica() {
        let listener =
            system::bind(options.replica_bind_address)?.ok_or(OperatorError::ReplicaListenerOff)?;
        let bound = listener.local_addr()?;
        if options.replica_advertise.is_none() {
            return Err(OperatorError::ReplicaAddressUnknown(bound));
        }
        egress_proxies::adapters::replicas::token::check_listener(bound, options.replica_token.as_ref())?;
        Some(listener)
    } else {
        None
    };
    Ok(Prepared {
        options,
        providers_config,
        prober,
        health_listener,
        metrics_listener,
        discovery_listener,
        gateway,
        replica_listener,
    })
}

/// The gateway's settings and listener, checked before any actor exists: a
/// bad settings file, a taken port or an open proxy on a reachable address
/// fail the start.
fn gateway(options: &Options) -> Result<Option<Gateway>, OperatorError> {
    let settings = match &options.gateway_config {
        Some(path) => {
            config_files::gateway_settings(path).map_err(|source| OperatorError::GatewayConfig {
                path: path.display().to_string(),
                source,
            })?
        }
        None => GatewaySettings::default(),
    };
    let Some(listener) = system::bind(options.gateway_bind_address)? else {
        return Ok(None);
    };
    let open = options.settings.discovery_tokens.is_open();
    egress_proxies::adapters::gateway::check_exposure(listener.local_addr()?, !open)?;
    Ok(Some(Gateway { listener, settings }))
}

/// Runs on the actix system (started by the binary) until SIGTERM (Ok) or
/// a lost leadership (Err).
pub async fn run(prepared: Prepared) -> Result<(), OperatorError> {
    let Prepared {
        mut options,
        providers_config,
        prober,
        health_listener,
        metrics_listener,
        discovery_listener,
        gateway,
        replica_listener,
    } = prepared;
    // kube's default client with our layer: 429s waited out, the budget
    // if asked for, every request counted (docs/kubernetes.md, API budget).
    let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    let client = egress_proxies::adapters::kube_client::client(config.clone(), options.kube_api_budget)?;
    // The Leases on a client, connections and a thread of their own: a
    // renewal never queues behind the bulk of a start or a busy actor
    // system (a missed renew deadline would end this replica's leadership).
    let keeper = LeaseKeeper::start()?;
    let election_client = keeper.client(config)?;
    let build = BuildContext {
        state_dir: options.state_dir.clone(),
        operator_exe: std::env::current_exe()?,
        kube_client: Some(client.clone()),
        kvm_runner: Some(crate::kvm::runner_factory()),
        gcp: options.gcp.clone(),
        cluster_networks: options.cluster_networks.clone(),
    };
    let providers = Arc::new(egress_proxies::adapters::providers::build(
        &providers_config,
        &build,
    )?);
    tracing::info!(
        namespace = options.proxy_namespace.as_deref().unwrap_or("<all>"),
        providers = ?providers.names(), leaderElect = options.leader_elect, "Kubernetes mode starting"
    );
    let clock: Arc<SystemClock> = Arc::new(SystemClock);
    let tenure = Tenure::new(clock.clone());
    // Every replica serves metrics, leader or not.
    if let Some(listener) = metrics_listener {
        use crate::metrics_server::Protection;
        let (protection, tls) = if options.metrics_secure {
            let names = vec![hostname(), "localhost".to_owned()];
            let tls =
                egress_proxies::serving_cert::server_config(options.metrics_cert_dir.as_deref(), &names)?;
            let access = egress_proxies::metrics_access::MetricsAccess::new(client.clone());
            (Protection::Kubernetes(Arc::new(access)), Some(tls))
        } else {
            tracing::warn!(
                "metrics are served over plain HTTP to anyone who reaches the port (--metrics-secure=false)"
            );
            (Protection::Open, None)
        };
        actix::spawn(crate::metrics_server::start(listener, protection, tls)?);
    }
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            format!(
                "{}-{}",
                hostname(),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            )
        });
    let lease_namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let timings = Timings::from_lease_duration(options.lease_duration);
    if let Some(replica_listener) = replica_listener {
        let (elector, shutdown) = (
            LeaderElector::new(
                election_client.clone(),
                &lease_namespace,
                LEASE_NAME,
                &identity,
                timings,
                clock.clone(),
            ),
            system::wait_for_shutdown(),
        );
        return crate::replicas::every_replica::run(crate::replicas::every_replica::Start {
            options,
            providers,
            prober,
            health_listener,
            discovery_listener,
            gateway: gateway.map(|Gateway { listener, settings }| (listener, settings)),
            replica_listener,
            client,
            election_client,
            identity,
            namespace: lease_namespace,
            timings,
            clock,
            elector,
            keeper: &keeper,
            shutdown: Box::pin(shutdown),
        })
        .await;
    }
    let readiness = if options.leader_elect {
        Readiness::bounded_by(tenure.clone())
    } else {
        Readiness::default()
    };
    if let Some(listener) = health_listener {
        actix::spawn(health_server::start(listener, readiness.clone())?);
    }
    let mut election = options.leader_elect.then(|| {
        tracing::info!(
            identity, namespace = %lease_namespace,
            leaseDuration = ?timings.lease_duration, renewDeadline = ?timings.renew_deadline,
            retryPeriod = ?timings.retry_period, "waiting for leadership"
        );
        keeper.elect(
            LeaderElector::new(
                election_client,
                &lease_namespace,
                LEASE_NAME,
                &identity,
                timings,
                clock.clone(),
            ),
            tenure.clone(),
        )
    });
    // One listener for the whole run: no SIGTERM slips between two selects.
    let shutdown = system::wait_for_shutdown();
    tokio::pin!(shutdown);

    if let Some(election) = &mut election {
        tokio::select! {
            leading = election.leading() => if !leading {
                return Err(OperatorError::LeadershipLost(election.lost().await));
            },
            // The dropped election ends the campaign.
            r = &mut shutdown => { r?; return Ok(()) }
        }
        LeadershipChanged {
            identity: &identity,
            leading: true,
        }
        .emit();
        options.settings.tenure = Some(tenure.clone());
    }

    // The renewals start at once, racing the start below: a start that
    // waits on a busy API server (429s on its reads) must not cost the
    // Lease before the first renewal.
    let electing = election.is_some();
    let cluster_networks = options.cluster_networks.clone();
    let acting = {
        let (client, identity, lease_namespace, tenure) = (
            client.clone(),
            identity.clone(),
            lease_namespace.clone(),
            tenure.clone(),
        );
        let readiness = readiness.clone();
        async move {
            // Leases as the previous leader (or this replica before a restart) left them.
            let installation = match options.installation_id {
                Some(id) => id,
                None => installation::from_cluster(client.clone(), &lease_namespace).await?,
            };
            tracing::info!(%installation, "installation");
            let mut settings = options.settings;
            let journal = ConfigMapLeaseJournal::open(
                client.clone(),
                &lease_namespace,
                Writer {
                    identity: identity.clone(),
                    tenure: settings.tenure.clone(),
                    give_up_after: timings.renew_deadline,
                },
            )
            .await?;
            let mut unwritable = journal.unwritable();
            settings.lease_journal = Some(Box::new(journal));
            let (store, events, pool_stream) =
                watched_store(client.clone(), options.proxy_namespace.clone(), &identity);
            // Held until this future ends: dropping it stops the probes.
            // Like the discovery API, only the leader serves the gateway: its
            // lease store is the book (a replica whose tenure lapsed answers
            // 503 `unavailable` until it exits), and only the leader is ready,
            // so the Service routes crawlers to it.
            let timing = PoolTiming::of(&settings);
            let running = system::start(system::Parts {
                store: store.clone(),
                events,
                providers,
                prober,
                settings,
                installation,
                discovery: discovery_listener,
                gateway: gateway.map(|Gateway { listener, settings }| system::GatewayParts {
                    listener,
                    settings,
                    cluster_networks: cluster_networks.clone(),
                }),
                pools: Some(system::PoolParts {
                    pools: store.clone(),
                    proxies: store,
                    events: pool_stream,
                    timing,
                }),
            })?;
            if !electing {
                // Without election this replica acts alone, as the leader would.
                LeadershipChanged {
                    identity: &identity,
                    leading: true,
                }
                .emit();
            }
            readiness.set(true);
            if !electing {
                return std::future::pending().await;
            }
            // A leader whose lease checkpoint stays unwritable steps down
            // (and releases the Lease) instead of refusing every grant.
            let why = stuck(&mut unwritable).await;
            tenure.end();
            tracing::error!(identity, reason = %why, "stepping down: releasing the leader Lease");
            drop(running);
            Err(OperatorError::SteppedDown(why))
        }
    };
    let leading = async {
        match &mut election {
            None => shutdown.as_mut().await.map_err(OperatorError::from),
            Some(election) => tokio::select! {
                why = election.lost() => Err(OperatorError::LeadershipLost(why)),
                r = shutdown.as_mut() => r.map_err(OperatorError::from),
            },
        }
    };
    let outcome = tokio::select! {
        outcome = leading => outcome,
        outcome = acting => outcome,
    };
    // Before the release lands a follower may act: stop acting first.
    tenure.end();
    LeadershipChanged {
        identity: &identity,
        leading: false,
    }
    .emit();
    readiness.set(false);
    // After a shutdown or a step-down another replica may take over at once.
    if let Some(election) = election {
        let release = match outcome {
            Ok(()) | Err(OperatorError::SteppedDown(_)) => Release::Release,
            Err(_) => Release::Keep,
        };
        election.stop(release).await;
    }
    outcome
}

/// The Proxies' store on the API server, its watches started: the store,
/// its Proxy events and its ProxyPool events.
pub(crate) fn watched_store(
    client: kube::Client,
    proxy_namespace: Option<String>,
    identity: &str,
) -> (
    Arc<KubeStore>,
    tokio::sync::mpsc::UnboundedReceiver<egress_proxies::domain::resource_store::StoreEvent>,
    tokio::sync::mpsc::UnboundedReceiver<egress_proxies::domain::resource_store::StoreEvent>,
) {
    let (store, events) = KubeStore::new(
        client,
        proxy_namespace,
        "egress-proxies-operator",
        Some(identity.to_owned()),
    );
    let store = Arc::new(store);
    actix::spawn(store.clone().watch_proxies());
    actix::spawn(store.clone().watch_secrets());
    actix::spawn(store.clone().watch_credentials());
    let (pool_events, pool_stream) = tokio::sync::mpsc::unbounded_channel();
    actix::spawn(store.clone().watch_pools(pool_events));
    (store, events, pool_stream)
}

/// Resolves with the reason once the checkpoint is unwritable; never if its writer is gone.
async fn stuck(unwritable: &mut tokio::sync::watch::Receiver<Option<String>>) -> String {
    match unwritable.wait_for(Option::is_some).await {
        Ok(why) => why.clone().unwrap_or_default(),
        Err(_) => std::future::pending().await,
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "operator".into())
}
