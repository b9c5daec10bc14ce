//! `egress-proxies-operator run --every-replica-serves`: the Kubernetes
//! mode's run when every replica serves. Each replica joins the members,
//! serves crawlers from its share at once, and follows the leader Lease;
//! the one that wins it runs the share desk and acts on Proxies too.
//!
//! Exits (so the pod restarts): a lost leadership, as before; a lapsed
//! membership once the API server answers again (the replica answered
//! 503 meanwhile, and its old shares are the leader's to reclaim).

use std::future::Future;
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::Arc;

use egress_proxies::adapters::leader::{LeaderElector, SystemClock, Tenure, Timings};
use egress_proxies::adapters::probe::Prober;
use egress_proxies::adapters::replicas::ReplicaError;
use egress_proxies::adapters::stores::configmap_lease_journal::{ConfigMapLeaseJournal, JournalName, Writer};
use egress_proxies::adapters::stores::installation;
use egress_proxies::domain::config::GatewaySettings;
use egress_proxies::domain::provider_contract::Providers;
use egress_proxies::telemetry::events::LeadershipChanged;

use super::member::{self, MemberParts};
use crate::health_server::{self, Readiness};
use crate::operator::{OperatorError, Options};
use crate::pool_actor::PoolTiming;
use crate::system;
use egress_proxies::adapters::lease_keeper::{LeaseKeeper, Release};

/// What `operator::run` has set up when every replica serves.
pub struct Start<'k> {
    pub options: Options,
    pub providers: Arc<Providers>,
    pub prober: Prober,
    pub health_listener: Option<TcpListener>,
    pub discovery_listener: Option<TcpListener>,
    pub gateway: Option<(TcpListener, GatewaySettings)>,
    pub replica_listener: TcpListener,
    pub client: kube::Client,
    /// On connections of its own: Lease renewals never queue behind the rest.
    pub election_client: kube::Client,
    pub identity: String,
    pub namespace: String,
    pub timings: Timings,
    pub clock: Arc<SystemClock>,
    pub elector: LeaderElector,
    /// The Leases' thread ([`LeaseKeeper`]).
    pub keeper: &'k LeaseKeeper,
    pub shutdown: Pin<Box<dyn Future<Output = std::io::Result<()>>>>,
}

pub async fn run(start: Start<'_>) -> Result<(), OperatorError> {
    let Start {
        options,
        providers,
        prober,
        health_listener,
        discovery_listener,
        gateway,
        replica_listener,
        client,
        election_client,
        identity,
        namespace,
        timings,
        clock,
        elector,
        keeper,
        mut shutdown,
    } = start;
    let advertise = match options.replica_advertise {
        Some(advertise) => advertise,
        None => {
            return Err(OperatorError::ReplicaAddressUnknown(
                replica_listener.local_addr()?,
            ));
        }
    };
    let parts = MemberParts {
        client: client.clone(),
        lease_client: election_client.clone(),
        namespace: namespace.clone(),
        identity: identity.clone(),
        timings,
        clock: clock.clone(),
        advertise,
        token: options.replica_token.clone(),
        endpoint_policy: options.settings.external_endpoints.clone(),
    };
    let (member, mut keeping) = member::join(&parts, keeper).await?;
    let forwarding = member.forwarding(&parts)?;
    let installation = match options.installation_id.clone() {
        Some(id) => id,
        None => installation::from_cluster(client.clone(), &namespace).await?,
    };
    tracing::info!(%installation, member = %member.tag, "installation");
    let settings = options.settings;
    // This member's own journal, fenced by its membership: its API leases
    // outlive it (the leader adopts them when it dies).
    let journal = ConfigMapLeaseJournal::open_named(
        client.clone(),
        &namespace,
        JournalName::member(&member.tag),
        Writer {
            identity: format!("{identity}/{}", member.tag),
            tenure: Some(member.tenure.clone()),
            give_up_after: timings.renew_deadline,
        },
    )
    .await?;
    let capacity = settings.leases.capacity;
    let cluster_networks = options.cluster_networks.clone();
    let serving = system::serve(system::ServeParts {
        prober,
        health_workers: settings.health_workers,
        trace_health_probes: settings.trace_health_probes,
        leases: settings.leases,
        fair_share: settings.fair_share.clone(),
        lease_journal: Some(Box::new(journal)),
        tenure: None,
        shares: Some((member.tenure.clone(), member.tag.clone())),
        forwarding: Some(forwarding.clone()),
        discovery_tokens: settings.discovery_tokens.clone(),
        discovery: discovery_listener,
        gateway: gateway.map(|(listener, settings)| system::GatewayParts {
            listener,
            settings,
            cluster_networks: cluster_networks.clone(),
        }),
    })?;
    let shared = member.serve(&serving, &parts, replica_listener, forwarding)?;
    // Ready while this replica holds a valid share: the Service sends
    // crawlers to every replica that can serve them.
    let store = serving.lease_store.clone();
    let readiness = Readiness::serving(move || {
        let share = store.share_status();
        share.member && share.left.is_some()
    });
    readiness.set(true);
    if let Some(listener) = health_listener {
        actix::spawn(health_server::start(listener, readiness.clone())?);
    }

    let tenure = Tenure::new(clock.clone());
    tracing::info!(
        identity, member = %member.tag, namespace = %namespace,
        leaseDuration = ?timings.lease_duration, "serving from a share; following the leader Lease"
    );
    let mut election = keeper.elect(elector, tenure.clone());
    let leading = tokio::select! {
        leading = member::follow_until_leading(&member, &mut election, shutdown.as_mut()) => leading?,
        kept = &mut keeping => {
            readiness.set(false);
            election.stop(Release::Keep).await;
            return lapsed(kept, &client, &namespace, &member.tag, timings, shutdown.as_mut()).await;
        }
        () = share_lost(&serving.lease_store, timings) => {
            readiness.set(false);
            election.stop(Release::Keep).await;
            member.leave(keeping).await;
            return Err(OperatorError::MembershipLapsed(SHARE_LOST.to_owned()));
        }
    };
    if !leading {
        readiness.set(false);
        election.stop(Release::Keep).await;
        member.leave(keeping).await;
        return Ok(());
    }
    LeadershipChanged {
        identity: &identity,
        leading: true,
    }
    .emit();
    let _desk = member
        .lead(&shared, &serving.leases, capacity, options.lease_duration)
        .await;
    let (store, events, pool_stream) =
        crate::operator::watched_store(client.clone(), options.proxy_namespace.clone(), &identity);
    let timing = PoolTiming::of(&settings);
    let _leading = system::lead(
        system::LeadParts {
            store: store.clone(),
            events,
            providers,
            installation,
            gc_interval: settings.gc_interval,
            gc_grace_period: settings.gc_grace_period,
            proxy_namespace: settings.proxy_namespace.clone(),
            external_endpoints: settings.external_endpoints.clone(),
            tenure: Some(tenure.clone()),
            pools: Some(system::PoolParts {
                pools: store.clone(),
                proxies: store,
                events: pool_stream,
                timing,
            }),
            probes: Some(shared.router.clone().into()),
        },
        &serving,
    );
    let mut kept_to_the_end = false;
    let outcome = tokio::select! {
        why = election.lost() => Err(OperatorError::LeadershipLost(why)),
        r = shutdown.as_mut() => r.map_err(OperatorError::from),
        kept = &mut keeping => {
            kept_to_the_end = true;
            tenure.end();
            Err(OperatorError::MembershipLapsed(match kept {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => "stopped".to_owned(),
                Err(e) => e.to_string(),
            }))
        }
        () = share_lost(&serving.lease_store, timings) => {
            tenure.end();
            Err(OperatorError::MembershipLapsed(SHARE_LOST.to_owned()))
        }
    };
    // Before the release lands another replica may lead: stop acting first.
    tenure.end();
    readiness.set(false);
    LeadershipChanged {
        identity: &identity,
        leading: false,
    }
    .emit();
    let release = match outcome {
        Ok(()) | Err(OperatorError::MembershipLapsed(_)) => Release::Release,
        Err(_) => Release::Keep,
    };
    election.stop(release).await;
    if !kept_to_the_end {
        member.leave(keeping).await;
    }
    outcome
}

const SHARE_LOST: &str = "no answer from the leader for a share's lifetime";

/// Resolves once this replica held a share and the leader has let it run
/// out (no answer for a share's lifetime): it releases its member Lease
/// (dead at once, so the leader adopts its journal and frees its shares,
/// which a rebuild waits for) and restarts as a new member.
async fn share_lost(store: &egress_proxies::adapters::lease_store::LeaseStore, timings: Timings) {
    let mut tick = tokio::time::interval(timings.retry_period);
    loop {
        tick.tick().await;
        let share = store.share_status();
        if share.applied > 0 && share.member && share.left.is_none() {
            tracing::error!("{SHARE_LOST}: leaving the members");
            return;
        }
    }
}

/// The membership lapsed: this replica grants nothing (its store refuses,
/// `/readyz` says 503) until the API server answers again, then exits so
/// the pod restarts as a new member.
async fn lapsed(
    kept: Result<Result<(), ReplicaError>, tokio::task::JoinError>,
    client: &kube::Client,
    namespace: &str,
    tag: &egress_proxies::domain::membership::MemberTag,
    timings: Timings,
    mut shutdown: Pin<&mut dyn Future<Output = std::io::Result<()>>>,
) -> Result<(), OperatorError> {
    let why = match kept {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(())) => "stopped".to_owned(),
        Err(e) => e.to_string(),
    };
    tracing::error!(member = %tag, reason = %why, "membership lapsed: serving nothing until the API server answers again");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(timings.retry_period) => {}
            r = &mut shutdown => { r?; return Ok(()) }
        }
        if egress_proxies::adapters::replicas::members::api_answers(
            client.clone(),
            namespace,
            tag,
            timings.call_timeout,
        )
        .await
        {
            return Err(OperatorError::MembershipLapsed(why));
        }
    }
}
