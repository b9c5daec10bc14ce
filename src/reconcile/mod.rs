//! Reconciling one Proxy: the decisions docs/reconcile.md describes, over the
//! object-store and provider ports. One call looks at the object once, does
//! at most one step of provider I/O that changes something, records what it
//! learnt, and says when to look again. The caller (the ProxyActor)
//! serialises calls per object and owns the timers.

mod endpoint_admission;
mod first_status;
mod replacement;
mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use tracing::Instrument;

use crate::credentials::{CredentialsError, ProxyCredentials, substitute_htpasswd};
use crate::destinations::DestinationPolicy;
use crate::health::{CheckSpec, ProbeTarget, RecordedVerdict, Verdict};
use crate::installation::InstallationId;
use crate::lease::Availability;
use crate::provider::{
    CloudInitBytes, CreateRequest, ErrorClass, Instance, InstanceState, Provider, ProviderError, ProviderId,
    Providers, instance_name, spec_hash,
};
use crate::resource::ObjectKey;
use crate::resource::{
    CredentialsSecretRef, FINALIZER, Mode, Phase, Proxy, ROTATE_CREDENTIALS_ANNOTATION,
    SKIP_CLEANUP_ANNOTATION, SPEC_HASH_ANNOTATION,
};
use crate::store::{CloudInitError, ProxyStore, StoreError};
use crate::telemetry::events::{InstanceLost, InstanceReplaced};

use first_status::{FirstStatus, first_status, first_verdict_due};
pub use replacement::{Loss, ReplacementBackoff};
pub use status::StatusDraft;

/// What the reconcile needs: where objects live and the providers.
#[derive(Clone)]
pub struct Context {
    pub store: Arc<dyn ProxyStore>,
    pub providers: Arc<Providers>,
    /// Injectable clock (condition and health timestamps).
    pub now: fn() -> Timestamp,
    /// How quickly lost instances are replaced.
    pub replacement: ReplacementBackoff,
    /// This installation: written on every instance, checked before one is
    /// used, deleted or released.
    pub installation: InstallationId,
    /// Where External endpoints may not point (Kubernetes mode); `None`
    /// admits every endpoint (standalone: the manifests are the operator's own).
    pub external_endpoints: Option<Arc<DestinationPolicy>>,
}

/// What a ProxyActor remembers between reconciles of its object. Lost on a
/// restart, which costs at most one repeated (idempotent) delete.
#[derive(Debug, Default)]
pub struct Memory {
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
    /// A health engine reports verdicts on what this memory serves (the
    /// ProxyActor has a prober): a first status may wait for the first one.
    verdicts: bool,
    /// Since when the first status of this incarnation (uid) has been held
    /// back for its first verdict.
    held: Option<(String, Instant)>,
    /// Deletes refused for good in a row (a Permanent error): how long the
    /// next attempt waits.
    delete_refusals: u32,
    /// The proxy's credentials and the spec generation they belong to
    /// (saves a store read per reconcile).
    credentials: Option<(String, ProxyCredentials)>,
}

/// A delete still unfinished after this long is requested again.
const REDELETE_AFTER: Duration = Duration::from_secs(60);
/// A deletion the provider refuses for good is retried after this long,
/// doubling up to [`MAX_DELETION_RETRY`]: something outside may fix it.
const FIRST_DELETION_RETRY: Duration = Duration::from_secs(30);
const MAX_DELETION_RETRY: Duration = Duration::from_secs(600);

impl Memory {
    /// What a restarted ProxyActor starts from: where the proxy serves and
    /// what the lease store was told (so it stays probed and leasable, as on
    /// a hiccup, until a reconcile says otherwise); the rest afresh.
    pub fn resuming(serving: Option<Arc<ProbeTarget>>, availability: Option<Arc<Availability>>) -> Memory {
        Memory {
            serving,
            availability,
            ..Memory::default()
        }
    }

    /// Verdicts on the proxies it serves will come (a prober watches them).
    pub fn with_verdicts(mut self, verdicts: bool) -> Memory {
        self.verdicts = verdicts;
        self
    }

    /// Whether the proxy's first status is held back for its first verdict:
    /// the verdict is recorded by a full reconcile, which writes it all.
    pub fn holds_first_status(&self) -> bool {
        self.held.is_some()
    }

    /// How long to wait after one more refused deletion.
    fn next_deletion_retry(&mut self) -> Duration {
        let wait = FIRST_DELETION_RETRY.saturating_mul(1 << self.delete_refusals.min(10));
        self.delete_refusals += 1;
        wait.min(MAX_DELETION_RETRY)
    }
}

impl Memory {
    /// Deletes `id` unless that was already requested recently: while a
    /// deletion is in flight, polls only look.
    async fn delete(&mut self, provider: &dyn Provider, id: &ProviderId) -> Result<(), ProviderError> {
        if let Some((pending, at)) = &self.delete_requested
            && pending == id
            && at.elapsed() < REDELETE_AFTER
        {
            return Ok(());
        }
        provider.delete(id).await?;
        self.delete_requested = Some((id.clone(), Instant::now()));
        Ok(())
    }

    fn forget(&mut self) {
        self.delete_requested = None;
        self.health = None;
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
            ReconcileError::ProviderMissingOnDelete(_) => "provider_missing",
            ReconcileError::InstanceConflict { .. } => "instance_conflict",
        }
    }
}

/// Reconciles the Proxy at `key` once.
pub async fn reconcile(key: &ObjectKey, ctx: &Context, memory: &mut Memory) -> Result<Next, ReconcileError> {
    let Some(proxy) = ctx.store.get(key).await? else {
        return Ok(Next::Gone);
    };
    let mut draft = StatusDraft::new(&proxy, ctx.now);
    // Set again below by whatever path finds the proxy serving.
    let served = memory.serving.take();
    memory.recorded = None;
    let mut step = Step {
        proxy: &proxy,
        ctx,
        draft: &mut draft,
        memory,
    };
    let result = if proxy.metadata.deletion_timestamp.is_some() {
        step.delete().await
    } else {
        match proxy.spec.mode {
            Mode::Managed => step.managed().await,
            Mode::External => step.external().await,
        }
    };
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    let result = match result {
        // A deletion never gives up: the finalizer stays and it is retried.
        Err(e) if e.class() == ErrorClass::Permanent && deleting => {
            let wait = memory.next_deletion_retry();
            let note = format!(
                "deleting the instance failed: {e}; retrying in {}s — set {SKIP_CLEANUP_ANNOTATION}: \"true\" to release the Proxy and leave the instance",
                wait.as_secs()
            );
            if !draft.says(&note[..note.find("; retrying").unwrap_or(note.len())]) {
                ctx.store
                    .publish_event(key, uid(&proxy), "DeletionBlocked", &note, true)
                    .await;
            }
            draft.deletion_blocked(&note);
            Ok(Next::After(wait))
        }
        Err(e) if e.class() == ErrorClass::Permanent => {
            draft.fail(&e.to_string());
            Ok(Next::Idle)
        }
        Err(e) => {
            // A hiccup (the provider or the store did not answer) is no news
            // about the instance: it keeps serving on its last known state.
            if memory.serving.is_none() && !deleting && !matches!(e, ReconcileError::InstanceConflict { .. })
            {
                memory.serving = served.filter(|s| Some(s.uid.as_str()) == proxy.metadata.uid.as_deref());
            }
            draft.retrying(&e);
            Err(e)
        }
        ok => {
            memory.delete_refusals = 0;
            ok
        }
    };
    match result {
        Ok(Next::Gone) => memory.availability = None,
        _ => {
            let now = availability(&proxy, draft.status(), memory);
            keep_if_same(&mut memory.availability, now);
        }
    }
    if !draft.is_held() {
        memory.held = None;
    }
    if !matches!(result, Ok(Next::Gone)) {
        match draft.write(ctx.store.as_ref(), key).await {
            Ok(()) | Err(StoreError::Gone { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    result
}

fn uid(proxy: &Proxy) -> &str {
    proxy.metadata.uid.as_deref().unwrap_or_default()
}

fn has_finalizer(proxy: &Proxy) -> bool {
    proxy
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

fn annotation<'a>(proxy: &'a Proxy, name: &str) -> Option<&'a str> {
    proxy.metadata.annotations.as_ref()?.get(name).map(String::as_str)
}

/// One reconcile of one object.
struct Step<'a> {
    proxy: &'a Proxy,
    ctx: &'a Context,
    draft: &'a mut StatusDraft,
    memory: &'a mut Memory,
}

impl Step<'_> {
    fn key(&self) -> ObjectKey {
        ObjectKey::of(self.proxy)
    }

    fn uid(&self) -> &str {
        uid(self.proxy)
    }

    #[tracing::instrument(name = "reconcile.managed", skip_all)]
    async fn managed(&mut self) -> Result<Next, ReconcileError> {
        let (proxy, ctx, key) = (self.proxy, self.ctx, self.key());
        if !has_finalizer(proxy) {
            ctx.store.add_finalizer(&key, self.uid()).await?;
        }
        let provider_name = proxy.spec.provider.clone().unwrap_or_default();
        let Some(provider) = ctx.providers.get(&provider_name).cloned() else {
            let known = ctx.providers.names().join(", ");
            self.draft.fail(&format!(
                "provider {provider_name:?} is not configured (configured: {known})"
            ));
            return Ok(Next::Idle);
        };

        let cloud_init = resolve_cloud_init(proxy, ctx).await?;
        let placement = proxy.spec.placement.clone().unwrap_or_default();
        let cloud_init_bytes = cloud_init.as_ref().map(|c| c.0.as_slice());
        let hash = spec_hash(&provider_name, &placement, proxy.spec.port, cloud_init_bytes)
            .rotated(annotation(proxy, ROTATE_CREDENTIALS_ANNOTATION));
        let recorded = annotation(proxy, SPEC_HASH_ANNOTATION);
        let credentials = self.credentials(hash.as_str()).await?;

        if let Some(id) = self.draft.provider_id() {
            let result = provider.get(&id).await;
            if let Ok(instance) = &result {
                self.check_owner(&id, instance).await?;
            }
            if recorded != Some(hash.as_str()) {
                // Replace: the old instance must be gone before the new one is
                // created (both carry the same name), so there are never two.
                // A new spec starts afresh: earlier losses no longer count.
                self.draft.clear_replacement();
                let why = "spec changed: deleting the old instance before creating a new one";
                self.draft.progress(Phase::Provisioning, why);
                match result {
                    Err(e) if e.is_not_found() => {
                        InstanceReplaced {
                            proxy: &key.to_string(),
                            provider: &provider_name,
                            reason: "spec_changed",
                        }
                        .emit();
                        self.forget_instance();
                    }
                    Ok(_) => {
                        self.memory
                            .delete(provider.as_ref(), &id)
                            .instrument(tracing::info_span!("reconcile.replaceInstance", providerID = %id))
                            .await?;
                        return Ok(Next::Poll);
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                let deleting_lost = self.draft.replacement().is_some_and(|r| r.deleting);
                match result {
                    // A lost instance is deleted before its successor is created.
                    Ok(_) if deleting_lost => {
                        self.draft.replacing();
                        self.memory.delete(provider.as_ref(), &id).await?;
                        return Ok(Next::Poll);
                    }
                    Ok(instance) => return self.observe(provider.as_ref(), &instance, &credentials).await,
                    Err(e) if e.is_not_found() => {
                        if deleting_lost {
                            self.draft.lost_instance_deleted();
                        } else {
                            let why = "the instance vanished (deleted outside the operator?)";
                            self.lose(provider.as_ref(), Loss::Vanished, why, None, false)
                                .await;
                        }
                        self.forget_instance();
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }

        if recorded != Some(hash.as_str()) {
            ctx.store
                .set_annotation(&key, self.uid(), SPEC_HASH_ANNOTATION, Some(hash.as_str()))
                .await?;
            self.draft.clear_replacement();
        }
        if let Some(retry_at) = self.draft.replacement().map(|r| r.retry_at.0) {
            let wait = retry_at.duration_since((ctx.now)());
            if wait.is_positive() {
                self.draft.replacing();
                return Ok(Next::After(wait.unsigned_abs()));
            }
        }
        // The VM's cloud-init gets the passwd line in place of its placeholder.
        let cloud_init = match cloud_init {
            Some(c) => Some(CloudInitBytes(substitute_htpasswd(&c.0, &credentials)?)),
            None => None,
        };
        let request = CreateRequest {
            name: instance_name(self.uid()),
            uid: self.uid().to_owned(),
            namespace: key.namespace.clone(),
            installation: ctx.installation.clone(),
            cloud_init,
            placement,
            port: proxy.spec.port,
            credentials: Some(credentials),
            quarantined: crate::pool::quarantined_of(proxy, (ctx.now)()),
        };
        let id = provider.create(&request).await?;
        tracing::info!(proxy = %key, providerID = %id, provider = %provider_name, "instance created");
        self.draft.created(&id);
        Ok(Next::Poll)
    }

    /// The credentials of spec generation `generation`, from memory or the store.
    async fn credentials(&mut self, generation: &str) -> Result<ProxyCredentials, ReconcileError> {
        if let Some((kept_for, kept)) = &self.memory.credentials
            && kept_for == generation
        {
            return Ok(kept.clone());
        }
        let credentials = self
            .ctx
            .store
            .proxy_credentials(&self.key(), self.uid(), generation)
            .await?;
        self.memory.credentials = Some((generation.to_owned(), credentials.clone()));
        Ok(credentials)
    }

    fn forget_instance(&mut self) {
        self.draft.forget_instance();
        self.memory.forget();
    }

    /// Records that the instance was lost, once per loss: counts it (from
    /// one again when the lost instance had stayed up, `up_since`), sets
    /// when its successor may be created, and tells the user why.
    async fn lose(
        &mut self,
        provider: &dyn Provider,
        loss: Loss,
        reason: &str,
        up_since: Option<Timestamp>,
        deleting: bool,
    ) {
        let (ctx, key) = (self.ctx, self.key());
        let now = (ctx.now)();
        let policy = ctx.replacement;
        let count = match self.draft.replacement() {
            Some(r) => {
                // The lost instance was created no earlier than its retry time.
                let since = up_since.map_or(r.retry_at.0, |t| t.max(r.retry_at.0));
                if policy.is_stable(since, now) {
                    1
                } else {
                    r.count.saturating_add(1)
                }
            }
            None => 1,
        };
        let delay = policy.delay(count);
        let retry_at = now.checked_add(delay).unwrap_or(now);
        self.draft.lost(count, reason, retry_at, deleting);
        InstanceLost {
            proxy: &key.to_string(),
            provider: provider.name(),
            loss: loss.as_str(),
            reason,
            count,
            retry_in: delay,
        }
        .emit();
        let note = format!("{reason}; replacement {count} in {}s", delay.as_secs());
        ctx.store
            .publish_event(&key, self.uid(), loss.event_reason(), &note, true)
            .await;
    }

    /// Records what `get` reported and decides the next step.
    async fn observe(
        &mut self,
        provider: &dyn Provider,
        instance: &Instance,
        credentials: &ProxyCredentials,
    ) -> Result<Next, ReconcileError> {
        match (instance.state, instance.ip) {
            (InstanceState::Running, Some(ip)) => {
                let port = instance.port.unwrap_or(self.proxy.spec.port);
                if let Some(r) = self.draft.replacement() {
                    let since = instance.created_at.map_or(r.retry_at.0, |t| t.max(r.retry_at.0));
                    if self.ctx.replacement.is_stable(since, (self.ctx.now)()) {
                        self.draft.clear_replacement();
                    }
                }
                self.draft
                    .running(&ip.to_string(), port, instance.outgoing_address);
                self.serve(Some(credentials.clone()));
                Ok(Next::Resync)
            }
            (InstanceState::Running, None) | (InstanceState::Provisioning, _) => {
                let message = match &instance.reason {
                    Some(why) => format!("instance is starting: {why}"),
                    None => "instance is starting".to_owned(),
                };
                self.draft.progress(Phase::Provisioning, &message);
                Ok(Next::Poll)
            }
            (InstanceState::Stopped, _) => {
                // Cattle: a stopped instance is replaced, not restarted.
                let why = instance
                    .reason
                    .as_deref()
                    .unwrap_or("the provider gives no reason");
                let reason = format!("instance stopped: {why}");
                self.lose(provider, Loss::Stopped, &reason, instance.created_at, true)
                    .await;
                self.memory.delete(provider, &instance.id).await?;
                Ok(Next::Poll)
            }
        }
    }

    #[tracing::instrument(name = "reconcile.delete", skip_all)]
    async fn delete(&mut self) -> Result<Next, ReconcileError> {
        let (proxy, ctx, key) = (self.proxy, self.ctx, self.key());
        if !has_finalizer(proxy) {
            return Ok(Next::Idle);
        }
        self.draft.progress(Phase::Terminating, "deleting the instance");
        // Checked before the provider lookup: it must free a Proxy whose provider left the config.
        if annotation(proxy, SKIP_CLEANUP_ANNOTATION) == Some("true") {
            self.leave_instance().await?;
            ctx.store.remove_finalizer(&key, self.uid()).await?;
            return Ok(Next::Gone);
        }
        if self.release_instance().await? {
            ctx.store.remove_finalizer(&key, self.uid()).await?;
            tracing::info!(proxy = %key, "Proxy released");
            return Ok(Next::Gone);
        }
        Ok(Next::Poll)
    }

    /// The instance is not this Proxy's in this installation: it is not
    /// touched, and the user is told (an Event the first time).
    async fn check_owner(&mut self, id: &ProviderId, instance: &Instance) -> Result<(), ReconcileError> {
        let Some(why) = instance.owner.conflict(self.uid(), &self.ctx.installation) else {
            return Ok(());
        };
        let error = ReconcileError::InstanceConflict { id: id.clone(), why };
        let note = error.to_string();
        if !self.draft.says(&note) {
            tracing::warn!(proxy = %self.key(), providerID = %id, "{note}");
            self.ctx
                .store
                .publish_event(&self.key(), self.uid(), "InstanceConflict", &note, true)
                .await;
        }
        Err(error)
    }

    /// skip-cleanup: marks the instance released (no GC of any installation
    /// deletes it) and leaves it running. An instance that is not this
    /// Proxy's is left untouched.
    async fn leave_instance(&mut self) -> Result<(), ReconcileError> {
        let key = self.key();
        let Some(id) = self.draft.provider_id() else {
            return Ok(());
        };
        let provider_name = self.proxy.spec.provider.clone().unwrap_or_default();
        let Some(provider) = self.ctx.providers.get(&provider_name).cloned() else {
            tracing::warn!(
                proxy = %key, providerID = %id, provider = %provider_name,
                "skip-cleanup: the provider is not configured, so the instance cannot be marked released; \
                 it is left running, but a later GC of this installation with the provider configured would reap it"
            );
            return Ok(());
        };
        match provider.get(&id).await {
            Ok(instance) => match instance.owner.conflict(self.uid(), &self.ctx.installation) {
                None => {
                    provider.release(&id).await?;
                    tracing::warn!(proxy = %key, providerID = %id, "skip-cleanup: instance marked released and left running");
                }
                Some(why) => {
                    tracing::warn!(proxy = %key, providerID = %id, "skip-cleanup: instance left untouched: it is not this Proxy's: {why}");
                }
            },
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Drives the recorded instance towards gone; true once it is.
    async fn release_instance(&mut self) -> Result<bool, ReconcileError> {
        let Some(id) = self.draft.provider_id() else {
            return Ok(true);
        };
        let provider_name = self.proxy.spec.provider.clone().unwrap_or_default();
        let Some(provider) = self.ctx.providers.get(&provider_name).cloned() else {
            return Err(ReconcileError::ProviderMissingOnDelete(provider_name));
        };
        match provider.get(&id).await {
            Err(e) if e.is_not_found() => {
                self.forget_instance();
                Ok(true)
            }
            Ok(instance) => {
                self.check_owner(&id, &instance).await?;
                self.memory.delete(provider.as_ref(), &id).await?;
                Ok(false)
            }
            // The id itself is what is wrong (malformed, an unknown host):
            // nothing can be checked, so nothing is deleted. An instance of
            // this installation left behind is reaped by orphan GC.
            Err(e) if e.class == ErrorClass::Permanent => {
                let note = format!("instance {id} cannot be looked up ({e}); nothing was deleted");
                tracing::warn!(proxy = %self.key(), providerID = %id, "{note}");
                self.ctx
                    .store
                    .publish_event(&self.key(), self.uid(), "InstanceUnverifiable", &note, true)
                    .await;
                self.forget_instance();
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn external(&mut self) -> Result<Next, ReconcileError> {
        let (proxy, ctx, key) = (self.proxy, self.ctx, self.key());
        // A Proxy switched from Managed: its instance goes first.
        if !self.release_instance().await? {
            let why = "switched to External: deleting the managed instance";
            self.draft.progress(Phase::Terminating, why);
            return Ok(Next::Poll);
        }
        if has_finalizer(proxy) {
            ctx.store.remove_finalizer(&key, self.uid()).await?;
        }
        // Instances it once lost are no concern of an External proxy.
        self.draft.clear_replacement();
        if let Some(endpoint) = &proxy.spec.endpoint {
            let credentials = match &endpoint.credentials_secret_ref {
                Some(r) => Some(external_credentials(ctx, &key.namespace, r).await?),
                None => None,
            };
            if let Some(policy) = &ctx.external_endpoints
                && let Err(refused) = endpoint_admission::admit(policy, &endpoint.host, endpoint.port).await
            {
                self.draft.forget_instance();
                self.draft.fail(&refused.to_string());
                return Ok(Next::Idle);
            }
            self.draft.external(&endpoint.host, endpoint.port);
            self.serve(credentials);
            if let FirstStatus::Hold(wait) = self.hold_first_status() {
                return Ok(Next::After(wait));
            }
        }
        Ok(Next::Idle)
    }

    /// Holds an interim first status back for the first verdict (see
    /// [`first_status`]), and says when to stop waiting.
    fn hold_first_status(&mut self) -> FirstStatus {
        let uid = uid(self.proxy);
        let due = self
            .memory
            .serving
            .as_ref()
            .filter(|_| self.memory.verdicts)
            .map(|target| first_verdict_due(&target.check));
        let known = self.memory.health.as_ref().is_some_and(|v| v.uid == uid);
        let since = match &self.memory.held {
            Some((held, since)) if held == uid => *since,
            _ => Instant::now(),
        };
        let decision = first_status(self.draft.first_serving(), due, known, since.elapsed());
        if let FirstStatus::Hold(_) = decision {
            self.draft.hold();
            self.memory.held = Some((uid.to_owned(), since));
        }
        decision
    }

    /// The proxy serves at the endpoint just recorded: tell the health
    /// engine what to probe and fold in the verdict known so far.
    fn serve(&mut self, credentials: Option<ProxyCredentials>) {
        // Probes keep to the admitted addresses, whatever the name resolves to later.
        let policy = (self.proxy.spec.mode == Mode::External)
            .then(|| self.ctx.external_endpoints.clone())
            .flatten();
        serve(self.proxy, self.draft, self.memory, credentials, policy);
    }
}

fn serve(
    proxy: &Proxy,
    draft: &mut StatusDraft,
    memory: &mut Memory,
    credentials: Option<ProxyCredentials>,
    endpoint_policy: Option<Arc<DestinationPolicy>>,
) {
    let Some(endpoint) = draft.status().endpoint.clone() else {
        return;
    };
    match CheckSpec::from_health_check(&proxy.spec.health_check()) {
        Ok(check) => {
            let target = ProbeTarget {
                uid: uid(proxy).to_owned(),
                endpoint,
                check,
                credentials,
                endpoint_policy,
            };
            memory.recorded = draft.recorded_verdict(&target.endpoint);
            keep_if_same(&mut memory.serving, target);
            if let Some(verdict) = memory.health.as_ref().filter(|v| v.uid == uid(proxy)) {
                draft.health(verdict);
            }
        }
        Err(e) => draft.unprobed(&e.to_string()),
    }
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
    ctx: &Context,
    memory: &mut Memory,
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
    let mut draft = StatusDraft::new(&proxy, ctx.now);
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
fn availability(proxy: &Proxy, status: &crate::resource::ProxyStatus, memory: &Memory) -> Availability {
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
        retiring: annotation(proxy, crate::resource::RETIRING_ANNOTATION).is_some(),
    }
}

/// The credentials an External proxy declares by Secret reference.
async fn external_credentials(
    ctx: &Context,
    namespace: &str,
    r: &CredentialsSecretRef,
) -> Result<ProxyCredentials, ReconcileError> {
    let read = async |key: &str| -> Result<String, ReconcileError> {
        let bytes = ctx
            .store
            .secret_key(namespace, &r.name, key)
            .await
            .map_err(ReconcileError::ExternalCredentials)?;
        String::from_utf8(bytes).map_err(|_| {
            ReconcileError::ExternalCredentials(CloudInitError::Backend {
                namespace: namespace.to_owned(),
                name: r.name.clone(),
                reason: format!("key {key:?} is not UTF-8"),
            })
        })
    };
    let (username, password) = (read(&r.username_key).await?, read(&r.password_key).await?);
    Ok(ProxyCredentials::new(
        username.trim_end_matches('\n'),
        password.trim_end_matches('\n'),
    )?)
}

async fn resolve_cloud_init(proxy: &Proxy, ctx: &Context) -> Result<Option<CloudInitBytes>, ReconcileError> {
    let Some(ci) = &proxy.spec.cloud_init else {
        return Ok(None);
    };
    if let Some(inline) = &ci.inline {
        return Ok(Some(CloudInitBytes(inline.as_bytes().to_vec())));
    }
    let Some(secret) = &ci.secret_ref else {
        return Ok(None);
    };
    let namespace = ObjectKey::of(proxy).namespace;
    Ok(Some(CloudInitBytes(
        ctx.store.cloud_init(&namespace, secret).await?,
    )))
}
