//! Reconciling one Proxy: the decisions docs/reconcile.md describes, over the
//! object-store and provider ports. One call looks at the object once, does
//! at most one step of provider I/O that changes something, records what it
//! learnt, and says when to look again. The caller (the ProxyActor)
//! serialises calls per object and owns the timers.

//! Reconciling one Proxy: the decisions docs/reconcile.md describes, over the
//! object-store and provider ports. One reconcile runs in four steps, and
//! only the third is a decision:
//!
//! ```text
//!   store.get ──▶ observe ──▶ decide ──▶ execute ──▶ status write
//!   (the Proxy)   (reads:      (pure:     (actions in order:
//!                 provider     Plan)      finalizer, spec hash,
//!                 get, Secrets,           create, delete, release;
//!                 admission)              Events, metrics)
//! ```
//!
//! It does at most one provider call that changes something, and says when
//! to look again ([`Next`]); the ProxyActor serialises calls per object and
//! asks the Proxy's [`Schedule`] how long to wait.

mod decide;
pub mod endpoint_admission;
mod execute;
mod first_status;
mod observe;
mod schedule;
mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::credentials::{CredentialsError, ProxyCredentials, RandomSource};
use crate::destinations::{DestinationPolicy, NameResolver};
use crate::health::{ProbeTarget, RecordedVerdict, Verdict};
use crate::installation::InstallationId;
use crate::lease::Availability;
use crate::now::Now;
use crate::provider_contract::{ErrorClass, ProviderError, ProviderId, Providers};
use crate::resource::{Mode, ObjectKey, Phase, Proxy, SKIP_CLEANUP_ANNOTATION};
use crate::resource_store::{CloudInitError, ProxyStore, StoreError};

pub use decide::{
    Action, Desired, EndpointSeen, Loss, ManagedSeen, Notice, Plan, Recorded, Rules, Seen, decide,
    settle_error,
};
pub use schedule::{Job, ReplacementBackoff, Schedule, Timing, jobs_for_verdict};
pub use status::StatusDraft;

/// What the reconcile needs: where objects live and the providers.
#[derive(Clone)]
pub struct ReconcileContext {
    pub store: Arc<dyn ProxyStore>,
    pub providers: Arc<Providers>,
    /// The clock, read once per reconcile (conditions, health timestamps,
    /// waits); injected, so tests set the time.
    pub now: fn() -> Now,
    /// How quickly lost instances are replaced.
    pub replacement: ReplacementBackoff,
    /// This installation: written on every instance, checked before one is
    /// used, deleted or released.
    pub installation: InstallationId,
    /// Where External endpoints may not point (Kubernetes mode); `None`
    /// admits every endpoint (standalone: the manifests are the operator's own).
    pub external_endpoints: Option<Arc<DestinationPolicy>>,
    /// What External endpoints' names resolve to, for that check.
    pub names: Arc<dyn NameResolver>,
    /// Randomness: the salts of password hashes.
    pub random: Arc<dyn RandomSource>,
}

impl ReconcileContext {
    /// What the decisions follow.
    pub fn rules(&self) -> Rules<'_> {
        Rules {
            installation: &self.installation,
            replacement: self.replacement,
            external_endpoints: self.external_endpoints.as_ref(),
        }
    }
}

/// What a ProxyActor remembers between reconciles of its object. Lost on a
/// restart, which costs at most one repeated (idempotent) delete.
#[derive(Debug, Default)]
pub struct ProxyMemory {
    /// The instance a delete was last requested for, and when.
    delete_requested: Option<(ProviderId, Instant)>,
    /// The latest health verdict for the current instance (from the health engine).
    pub health: Option<Verdict>,
    /// What the health engine should probe: set while the proxy serves.
    /// Shared (the actor, the prober and this hold one copy), and kept
    /// as it is while a reconcile finds it unchanged.
    pub serving: Option<Arc<ProbeTarget>>,
    /// The verdict the stored status records for what `serving` names,
    /// when it is in force: where a prober that starts watching the proxy
    /// anew starts from (after a restart it confirms it, writing nothing).
    pub recorded: Option<RecordedVerdict>,
    /// What the lease store should know about the proxy, after the last job.
    pub availability: Option<Arc<Availability>>,
    /// When the next reconcile runs.
    pub schedule: Schedule,
    /// A health engine reports verdicts on what this memory serves (the
    /// ProxyActor has a prober): a first status may wait for the first one.
    verdicts: bool,
    /// Since when the first status of this incarnation (uid) has been held
    /// back for its first verdict.
    held: Option<(String, Instant)>,
    /// The proxy's credentials and the spec generation they belong to
    /// (saves a store read per reconcile).
    credentials: Option<(String, ProxyCredentials)>,
}

impl ProxyMemory {
    /// What a restarted ProxyActor starts from: where the proxy serves and
    /// what the lease store was told (so it stays probed and leasable, as on
    /// a hiccup, until a reconcile says otherwise); the rest afresh.
    pub fn resuming(
        serving: Option<Arc<ProbeTarget>>,
        availability: Option<Arc<Availability>>,
    ) -> ProxyMemory {
        ProxyMemory {
            serving,
            availability,
            ..ProxyMemory::default()
        }
    }

    /// Verdicts on the proxies it serves will come (a prober watches them).
    pub fn with_verdicts(mut self, verdicts: bool) -> ProxyMemory {
        self.verdicts = verdicts;
        self
    }

    /// Whether the proxy's first status is held back for its first verdict:
    /// the verdict is recorded by a full reconcile, which writes it all.
    pub fn holds_first_status(&self) -> bool {
        self.held.is_some()
    }
}

/// When to look at the object again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Something is in flight (creating, deleting): poll soon, backing off.
    Poll,
    /// Settled and running: check again after the resync period.
    Resync,
    /// Waiting on purpose (the replacement backoff): look again after this long.
    After(Duration),
    /// Nothing to do until the object or configuration changes.
    Idle,
    /// The object no longer exists.
    Gone,
}

/// A reconcile that could not finish; the class decides the retry.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cloud-init: {0}")]
    CloudInit(#[from] CloudInitError),
    #[error("proxy credentials: {0}")]
    Credentials(#[from] CredentialsError),
    #[error("endpoint.credentialsSecretRef: {0}")]
    ExternalCredentials(CloudInitError),
    #[error(
        "provider {0:?} is not configured; add it to the providers config, or set {SKIP_CLEANUP_ANNOTATION}: \"true\" to release the Proxy without cleanup"
    )]
    ProviderMissingOnDelete(String),
    /// A plan named a provider the configuration does not hold.
    #[error("provider {0:?} is not configured")]
    NotConfigured(String),
    /// The instance `status.providerID` names is not this Proxy's in this
    /// installation: it is neither used, deleted nor released.
    #[error(
        "instance {id} is not this Proxy's: {why}; nothing was deleted or adopted — fix the instance's tags or status.providerID, or set {SKIP_CLEANUP_ANNOTATION}: \"true\" to release the Proxy"
    )]
    InstanceConflict { id: ProviderId, why: String },
}

impl ReconcileError {
    /// How the caller should retry.
    pub fn class(&self) -> ErrorClass {
        match self {
            ReconcileError::Provider(e) => e.class,
            _ => ErrorClass::Transient,
        }
    }

    /// The provider's own retry hint, when it gave one.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ReconcileError::Provider(e) => e.retry_after,
            _ => None,
        }
    }

    /// The reconciles metric's `result` label: the kind, and for provider
    /// errors the class (`provider_transient`, `store`, `cloud_init` ...).
    pub fn metric_label(&self) -> String {
        match self {
            ReconcileError::Provider(e) => format!("provider_{}", e.class.as_str()),
            other => other.kind().to_owned(),
        }
    }

    /// Label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ReconcileError::Provider(_) => "provider",
            ReconcileError::Store(_) => "store",
            ReconcileError::CloudInit(_) => "cloud_init",
            ReconcileError::Credentials(_) => "credentials",
            ReconcileError::ExternalCredentials(_) => "external_credentials",
            ReconcileError::ProviderMissingOnDelete(_) | ReconcileError::NotConfigured(_) => {
                "provider_missing"
            }
            ReconcileError::InstanceConflict { .. } => "instance_conflict",
        }
    }
}

/// Reconciles the Proxy at `key` once: observe, decide, execute, write.
pub async fn reconcile(
    key: &ObjectKey,
    ctx: &ReconcileContext,
    memory: &mut ProxyMemory,
) -> Result<Next, ReconcileError> {
    let Some(proxy) = ctx.store.get(key).await? else {
        return Ok(Next::Gone);
    };
    let uid = proxy.metadata.uid.clone().unwrap_or_default();
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    // Set again below when the plan finds the proxy serving.
    let served = memory.serving.take();
    memory.recorded = None;
    let span = match (deleting, proxy.spec.mode) {
        (true, _) => tracing::info_span!("reconcile.delete"),
        (false, Mode::Managed) => tracing::info_span!("reconcile.managed"),
        (false, Mode::External) => tracing::info_span!("reconcile.external"),
    };
    let execute::Executed {
        mut status,
        result,
        serving,
    } = async {
        let seen = observe::observe(&proxy, ctx, memory).await;
        let now = (ctx.now)();
        let plan = decide::decide(&proxy, seen, memory, &ctx.rules(), now);
        execute::execute(plan, key, &uid, ctx, memory, now).await
    }
    .instrument(span)
    .await;
    memory.serving = match (serving, &result) {
        (Some(target), _) => Some(
            served
                .filter(|s| **s == target)
                .unwrap_or_else(|| Arc::new(target)),
        ),
        // A hiccup (the provider or the store did not answer) is no news
        // about the instance: it keeps serving on its last known state.
        (None, Err(e))
            if e.class() != ErrorClass::Permanent
                && !deleting
                && !matches!(e, ReconcileError::InstanceConflict { .. }) =>
        {
            served.filter(|s| s.uid == uid)
        }
        (None, _) => None,
    };
    let result = match result {
        Err(e) => {
            let (settled, notice) = decide::settle_error(&proxy, &mut status, e, &mut memory.schedule);
            if let Some(notice) = notice {
                execute::tell(notice, key, &uid, ctx).await;
            }
            settled
        }
        ok => ok,
    };
    match result {
        Ok(Next::Gone) => {
            tracing::info!(proxy = %key, "Proxy released");
            memory.availability = None;
        }
        _ => {
            let now = availability(&proxy, status.status(), memory);
            keep_if_same(&mut memory.availability, now);
            match status.write(ctx.store.as_ref(), key).await {
                Ok(()) | Err(StoreError::Gone { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    result
}

/// Puts `next` in `slot` unless it holds an equal value: the shared copy
/// stays shared, and the owners see no change.
fn keep_if_same<T: PartialEq>(slot: &mut Option<Arc<T>>, next: T) {
    if slot.as_deref() != Some(&next) {
        *slot = Some(Arc::new(next));
    }
}

/// Records the latest health verdict without provider I/O (a healthy
/// proxy's flips and latency changes need no call to the provider).
pub async fn record_health(
    key: &ObjectKey,
    ctx: &ReconcileContext,
    memory: &mut ProxyMemory,
) -> Result<(), ReconcileError> {
    let Some(proxy) = ctx.store.get(key).await? else {
        return Ok(());
    };
    let serving = memory
        .serving
        .as_ref()
        .is_some_and(|s| Some(s.uid.as_str()) == proxy.metadata.uid.as_deref());
    // A held-back first status: the full reconcile the verdict asked for writes it all.
    if proxy.metadata.deletion_timestamp.is_some() || !serving || memory.holds_first_status() {
        return Ok(());
    }
    let mut draft = StatusDraft::new(&proxy, (ctx.now)().wall);
    if let Some(verdict) = &memory.health {
        draft.health(verdict);
    }
    let now = availability(&proxy, draft.status(), memory);
    keep_if_same(&mut memory.availability, now);
    match draft.write(ctx.store.as_ref(), key).await {
        Ok(()) | Err(StoreError::Gone { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The proxy as the lease store sees it: leasable only while Ready and serving.
fn availability(proxy: &Proxy, status: &crate::resource::ProxyStatus, memory: &ProxyMemory) -> Availability {
    let serving = memory.serving.is_some() && proxy.metadata.deletion_timestamp.is_none();
    let scheme = match proxy.spec.endpoint.as_ref().and_then(|e| e.scheme) {
        Some(crate::resource::ProxyScheme::Https) if proxy.spec.mode == Mode::External => "https",
        _ => "http",
    };
    let health = status.health.as_ref();
    Availability {
        key: ObjectKey::of(proxy),
        ready: serving && status.phase == Some(Phase::Ready),
        phase: status.phase.map(|p| p.as_str().to_owned()).unwrap_or_default(),
        healthy: health.map(|h| h.healthy),
        url: status.endpoint.as_ref().map(|e| format!("{scheme}://{e}")),
        attributes: proxy.spec.attributes.clone(),
        latency: health
            .and_then(|h| h.latency_ms)
            .map(std::time::Duration::from_millis),
        credentials: memory.serving.as_ref().and_then(|s| s.credentials.clone()),
        realm: memory.serving.as_ref().and_then(|s| s.realm.clone()),
        retiring: decide::annotation(proxy, crate::resource::RETIRING_ANNOTATION).is_some(),
    }
}
