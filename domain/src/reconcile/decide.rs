//! What one reconcile does, decided purely. [`decide`] takes the Proxy,
//! what [observe](super::observe) saw of the world around it, what the
//! ProxyActor remembers, the rules and the time, and returns a [`Plan`]:
//! the status to write, the actions to take in order (finalizer, spec
//! hash, create, delete, release), the Events and telemetry to emit, what
//! the health engine should probe, and when to look again. Nothing here
//! awaits or touches the network; [`execute`](super::execute) carries the
//! plan out. Every transition docs/reconcile.md describes is a row of the
//! table in `decide/tests.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::first_status::{FirstStatus, first_status, first_verdict_due};
use super::schedule::{ReplacementBackoff, Schedule};
use super::status::StatusDraft;
use super::{Next, ProxyMemory, ReconcileError};
use crate::credentials::{ProxyCredentials, Salt, substitute_placeholders};
use crate::destinations::DestinationPolicy;
use crate::health::{CheckSpec, ProbeTarget, RecordedVerdict, Verdict};
use crate::installation::InstallationId;
use crate::provider_contract::{
    CloudInitBytes, CreateRequest, ErrorClass, Instance, InstanceState, ProviderError, ProviderId, SpecHash,
    instance_name,
};
use crate::resource::{
    FINALIZER, Mode, ObjectKey, Phase, Proxy, SKIP_CLEANUP_ANNOTATION, SPEC_HASH_ANNOTATION,
};

pub use super::endpoint_admission::EndpointRefused;
use crate::now::Now;

/// A delete still unfinished after this long is requested again; until
/// then polls only look.
const REDELETE_AFTER: Duration = Duration::from_secs(60);

/// What the decisions follow besides the object.
pub struct Rules<'a> {
    /// Written on every instance, checked before one is used, deleted or released.
    pub installation: &'a InstallationId,
    pub replacement: ReplacementBackoff,
    /// Where External endpoints may not point (Kubernetes mode).
    pub external_endpoints: Option<&'a Arc<DestinationPolicy>>,
}

/// What observe saw, by the path the object is on.
pub enum Seen {
    /// The object carries a deletion timestamp. The recorded instance is
    /// looked up only while the operator's finalizer is on it.
    Deleting(Recorded),
    Managed(ManagedSeen),
    External {
        /// An instance left from when the Proxy was Managed.
        leftover: Recorded,
        /// The declared endpoint, looked at once no instance is left.
        endpoint: Option<Result<EndpointSeen, ReconcileError>>,
    },
}

/// The instance `status.providerID` records, as looked up.
pub enum Recorded {
    /// None recorded.
    None,
    /// Its provider is not configured: it cannot be looked at.
    Unreachable(ProviderId),
    /// What `get` answered.
    Seen(ProviderId, Result<Instance, ProviderError>),
}

impl Recorded {
    /// Whether a Proxy that must be rid of this instance is rid of it: none
    /// recorded, NotFound, or an id that cannot be looked up at all (then
    /// nothing can be checked, so nothing is deleted).
    pub fn is_gone(&self) -> bool {
        match self {
            Recorded::None => true,
            Recorded::Seen(_, Err(e)) => e.is_not_found() || e.class == ErrorClass::Permanent,
            Recorded::Unreachable(_) | Recorded::Seen(_, Ok(_)) => false,
        }
    }
}

/// A Managed Proxy, as far as it could be looked at.
pub enum ManagedSeen {
    /// `spec.provider` names no configured provider; nothing else was looked at.
    NoProvider { name: String, configured: Vec<String> },
    /// What the instance should be could not be worked out (cloud-init,
    /// credentials); the instance was not looked up.
    Unresolved(ReconcileError),
    Resolved {
        desired: Box<Desired>,
        /// `get` of the recorded instance, when one is recorded.
        recorded: Option<(ProviderId, Result<Instance, ProviderError>)>,
    },
}

/// What a Managed Proxy's instance should be.
pub struct Desired {
    pub provider: String,
    /// The resolved cloud-init, placeholders not yet substituted.
    pub cloud_init: Option<CloudInitBytes>,
    pub hash: SpecHash,
    /// The credentials of this spec generation.
    pub credentials: ProxyCredentials,
    /// A fresh salt, should the cloud-init's passwd line be hashed.
    pub salt: Salt,
    /// The realm the instance's 407 names, when the operator makes it name
    /// the credentials' own: the provider writes the proxy's configuration,
    /// or the cloud-init names it by placeholder. `None`: unknown.
    pub realm: Option<String>,
}

/// An External Proxy's endpoint, as looked at.
pub struct EndpointSeen {
    pub host: String,
    pub port: u16,
    /// From `endpoint.credentialsSecretRef`.
    pub credentials: Option<ProxyCredentials>,
    /// Admission refused it (Kubernetes mode).
    pub refused: Option<EndpointRefused>,
}

/// What one reconcile does.
pub struct Plan {
    /// The status, written at the end when it changed.
    pub status: StatusDraft,
    /// Emitted first, whatever the actions do.
    pub notices: Vec<Notice>,
    /// Taken in order; the first that fails ends the reconcile.
    pub actions: Vec<Action>,
    /// What holds once every action succeeded.
    pub outcome: Result<Next, ReconcileError>,
    /// What the health engine should probe (none: stop probing).
    pub serve: Option<ProbeTarget>,
    /// The verdict the stored status records for what `serve` names.
    pub recorded: Option<RecordedVerdict>,
    /// The first status is held back for its first verdict, since then.
    pub held_since: Option<Instant>,
    /// The recorded instance is forgotten: no delete of it pending, no verdict on it.
    pub forget: bool,
}

/// One change to the world, for the executor.
#[derive(Debug)]
pub enum Action {
    AddFinalizer,
    RemoveFinalizer,
    /// Writes the spec-hash annotation.
    SetSpecHash(SpecHash),
    Create {
        provider: String,
        request: Box<CreateRequest>,
    },
    Delete {
        provider: String,
        id: ProviderId,
    },
    /// skip-cleanup: marks the instance released and leaves it running.
    Release {
        provider: String,
        id: ProviderId,
    },
}

/// Something to tell: an Event, a log line, a metric.
#[derive(Debug, PartialEq)]
pub enum Notice {
    /// A Warning Event on the Proxy, logged as well when it names an instance.
    Event {
        reason: &'static str,
        note: String,
        instance: Option<ProviderId>,
    },
    /// A warning in the log only.
    Warn { instance: ProviderId, message: String },
    /// An instance was lost and will be replaced.
    Lost {
        provider: String,
        loss: Loss,
        reason: String,
        count: u32,
        retry_in: Duration,
    },
    /// The spec changed and the old instance is gone.
    Replaced { provider: String },
}

/// The kind of loss, a bounded metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The provider reports the instance stopped, crashed or exited.
    Stopped,
    /// The recorded instance no longer exists.
    Vanished,
}

impl Loss {
    pub fn as_str(self) -> &'static str {
        match self {
            Loss::Stopped => "stopped",
            Loss::Vanished => "vanished",
        }
    }

    /// The Event reason.
    pub fn event_reason(self) -> &'static str {
        match self {
            Loss::Stopped => "InstanceStopped",
            Loss::Vanished => "InstanceVanished",
        }
    }
}

/// Decides what one reconcile of `proxy` does.
pub fn decide(proxy: &Proxy, seen: Seen, memory: &ProxyMemory, rules: &Rules, now: Now) -> Plan {
    let mut d = Deciding {
        proxy,
        memory,
        rules,
        now,
        plan: Plan {
            status: StatusDraft::new(proxy, now.wall),
            notices: Vec::new(),
            actions: Vec::new(),
            outcome: Ok(Next::Idle),
            serve: None,
            recorded: None,
            held_since: None,
            forget: false,
        },
    };
    let outcome = match seen {
        Seen::Deleting(recorded) => d.deleting(recorded),
        Seen::Managed(seen) => d.managed(seen),
        Seen::External { leftover, endpoint } => d.external(leftover, endpoint),
    };
    d.plan.outcome = outcome;
    d.plan
}

/// What becomes of a reconcile that failed with `error`: a Permanent error
/// fails the Proxy (no retry until something changes), except while
/// deleting — a deletion never gives up, the schedule spaces its retries;
/// anything else is retried by its class, the phase kept.
pub fn settle_error(
    proxy: &Proxy,
    status: &mut StatusDraft,
    error: ReconcileError,
    schedule: &mut Schedule,
) -> (Result<Next, ReconcileError>, Option<Notice>) {
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    match error.class() {
        ErrorClass::Permanent if deleting => {
            let wait = schedule.deletion_refused();
            let told = format!(
                "deleting the instance failed: {error}; retrying in {}s — set {SKIP_CLEANUP_ANNOTATION}: \"true\" to release the Proxy and leave the instance",
                wait.as_secs()
            );
            let first = !status.says(&told[..told.find("; retrying").unwrap_or(told.len())]);
            status.deletion_blocked(&told);
            let event = first.then_some(Notice::Event {
                reason: "DeletionBlocked",
                note: told,
                instance: None,
            });
            (Ok(Next::After(wait)), event)
        }
        ErrorClass::Permanent => {
            status.fail(&error.to_string());
            (Ok(Next::Idle), None)
        }
        _ => {
            status.retrying(&error);
            (Err(error), None)
        }
    }
}

pub(super) fn has_finalizer(proxy: &Proxy) -> bool {
    proxy
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

pub(super) fn annotation<'a>(proxy: &'a Proxy, name: &str) -> Option<&'a str> {
    proxy.metadata.annotations.as_ref()?.get(name).map(String::as_str)
}

struct Deciding<'a> {
    proxy: &'a Proxy,
    memory: &'a ProxyMemory,
    rules: &'a Rules<'a>,
    now: Now,
    plan: Plan,
}

impl Deciding<'_> {
    fn uid(&self) -> &str {
        self.proxy.metadata.uid.as_deref().unwrap_or_default()
    }

    fn act(&mut self, action: Action) {
        self.plan.actions.push(action);
    }

    fn tell(&mut self, notice: Notice) {
        self.plan.notices.push(notice);
    }

    fn provider_name(&self) -> String {
        self.proxy.spec.provider.clone().unwrap_or_default()
    }

    fn managed(&mut self, seen: ManagedSeen) -> Result<Next, ReconcileError> {
        if !has_finalizer(self.proxy) {
            self.act(Action::AddFinalizer);
        }
        let (desired, recorded) = match seen {
            ManagedSeen::NoProvider { name, configured } => {
                let known = configured.join(", ");
                self.plan.status.fail(&format!(
                    "provider {name:?} is not configured (configured: {known})"
                ));
                return Ok(Next::Idle);
            }
            ManagedSeen::Unresolved(error) => return Err(error),
            ManagedSeen::Resolved { desired, recorded } => (desired, recorded),
        };
        let desired = *desired;
        let provider = desired.provider.clone();
        let spec_changed = annotation(self.proxy, SPEC_HASH_ANNOTATION) != Some(desired.hash.as_str());

        if let Some((id, result)) = recorded {
            if let Ok(instance) = &result {
                self.check_owner(&id, instance)?;
            }
            if spec_changed {
                // Replace: the old instance must be gone before the new one is
                // created (both carry the same name), so there are never two.
                // A new spec starts afresh: earlier losses no longer count.
                self.plan.status.clear_replacement();
                let why = "spec changed: deleting the old instance before creating a new one";
                self.plan.status.progress(Phase::Provisioning, why);
                match result {
                    Err(e) if e.is_not_found() => {
                        self.tell(Notice::Replaced {
                            provider: provider.clone(),
                        });
                        self.forget_instance();
                    }
                    Ok(_) => {
                        self.request_delete(&provider, id);
                        return Ok(Next::Poll);
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                let deleting_lost = self.plan.status.replacement().is_some_and(|r| r.deleting);
                match result {
                    // A lost instance is deleted before its successor is created.
                    Ok(_) if deleting_lost => {
                        self.plan.status.replacing();
                        self.request_delete(&provider, id);
                        return Ok(Next::Poll);
                    }
                    Ok(instance) => return Ok(self.instance_seen(&provider, instance, &desired)),
                    Err(e) if e.is_not_found() => {
                        if deleting_lost {
                            self.plan.status.lost_instance_deleted();
                        } else {
                            let why = "the instance vanished (deleted outside the operator?)";
                            self.lose(&provider, Loss::Vanished, why, None, false);
                        }
                        self.forget_instance();
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }

        if spec_changed {
            self.act(Action::SetSpecHash(desired.hash.clone()));
            self.plan.status.clear_replacement();
        }
        if let Some(retry_at) = self.plan.status.replacement().map(|r| r.retry_at.0) {
            let wait = retry_at.duration_since(self.now.wall);
            if wait.is_positive() {
                self.plan.status.replacing();
                return Ok(Next::After(wait.unsigned_abs()));
            }
        }
        // The VM's cloud-init gets the passwd line and the realm in place of their placeholders.
        let cloud_init = match &desired.cloud_init {
            Some(c) => Some(CloudInitBytes(substitute_placeholders(
                &c.0,
                &desired.credentials,
                &desired.salt,
            )?)),
            None => None,
        };
        let request = CreateRequest {
            name: instance_name(self.uid()),
            uid: self.uid().to_owned(),
            namespace: ObjectKey::of(self.proxy).namespace,
            installation: self.rules.installation.clone(),
            cloud_init,
            placement: self.proxy.spec.placement.clone().unwrap_or_default(),
            port: self.proxy.spec.port,
            credentials: Some(desired.credentials),
            quarantined: crate::pool::quarantined_of(self.proxy, self.now.wall),
        };
        self.act(Action::Create {
            provider,
            request: Box::new(request),
        });
        Ok(Next::Poll)
    }

    /// What `get` reported of the current instance, and the next step.
    fn instance_seen(&mut self, provider: &str, instance: Instance, desired: &Desired) -> Next {
        match (instance.state, instance.ip) {
            (InstanceState::Running, Some(ip)) => {
                let port = instance.port.unwrap_or(self.proxy.spec.port);
                if let Some(r) = self.plan.status.replacement() {
                    let since = instance.created_at.map_or(r.retry_at.0, |t| t.max(r.retry_at.0));
                    if self.rules.replacement.is_stable(since, self.now.wall) {
                        self.plan.status.clear_replacement();
                    }
                }
                self.plan
                    .status
                    .running(&ip.to_string(), port, instance.outgoing_address);
                self.serve(Some(desired.credentials.clone()), desired.realm.clone());
                Next::Resync
            }
            (InstanceState::Running, None) | (InstanceState::Provisioning, _) => {
                let message = match &instance.reason {
                    Some(why) => format!("instance is starting: {why}"),
                    None => "instance is starting".to_owned(),
                };
                self.plan.status.progress(Phase::Provisioning, &message);
                Next::Poll
            }
            (InstanceState::Stopped, _) => {
                // Cattle: a stopped instance is replaced, not restarted.
                let why = instance
                    .reason
                    .as_deref()
                    .unwrap_or("the provider gives no reason");
                let reason = format!("instance stopped: {why}");
                self.lose(provider, Loss::Stopped, &reason, instance.created_at, true);
                self.request_delete(provider, instance.id);
                Next::Poll
            }
        }
    }

    /// Records that the instance was lost, once per loss: counts it (from
    /// one again when the lost instance had stayed up, `up_since`), sets
    /// when its successor may be created, and tells the user why.
    fn lose(
        &mut self,
        provider: &str,
        loss: Loss,
        reason: &str,
        up_since: Option<Timestamp>,
        deleting: bool,
    ) {
        let now = self.now.wall;
        let policy = self.rules.replacement;
        let count = match self.plan.status.replacement() {
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
        self.plan.status.lost(count, reason, retry_at, deleting);
        self.tell(Notice::Lost {
            provider: provider.to_owned(),
            loss,
            reason: reason.to_owned(),
            count,
            retry_in: delay,
        });
        self.tell(Notice::Event {
            reason: loss.event_reason(),
            note: format!("{reason}; replacement {count} in {}s", delay.as_secs()),
            instance: None,
        });
    }

    /// Deletes `id` unless that was requested within [`REDELETE_AFTER`]:
    /// a slow provider is looked at, not asked again.
    fn request_delete(&mut self, provider: &str, id: ProviderId) {
        if let Some((pending, at)) = &self.memory.delete_requested
            && *pending == id
            && !self.plan.forget
            && self.now.mono.saturating_duration_since(*at) < REDELETE_AFTER
        {
            return;
        }
        self.act(Action::Delete {
            provider: provider.to_owned(),
            id,
        });
    }

    fn forget_instance(&mut self) {
        self.plan.status.forget_instance();
        self.plan.forget = true;
    }

    fn deleting(&mut self, recorded: Recorded) -> Result<Next, ReconcileError> {
        if !has_finalizer(self.proxy) {
            return Ok(Next::Idle);
        }
        self.plan
            .status
            .progress(Phase::Terminating, "deleting the instance");
        // Checked before the provider: it must free a Proxy whose provider left the config.
        if annotation(self.proxy, SKIP_CLEANUP_ANNOTATION) == Some("true") {
            self.leave_instance(recorded)?;
            self.act(Action::RemoveFinalizer);
            return Ok(Next::Gone);
        }
        if self.release_instance(recorded)? {
            self.act(Action::RemoveFinalizer);
            return Ok(Next::Gone);
        }
        Ok(Next::Poll)
    }

    /// The instance is not this Proxy's in this installation: it is not
    /// touched, and the user is told (an Event the first time).
    fn check_owner(&mut self, id: &ProviderId, instance: &Instance) -> Result<(), ReconcileError> {
        let Some(why) = instance.owner.conflict(self.uid(), self.rules.installation) else {
            return Ok(());
        };
        let error = ReconcileError::InstanceConflict { id: id.clone(), why };
        let note = error.to_string();
        if !self.plan.status.says(&note) {
            self.tell(Notice::Event {
                reason: "InstanceConflict",
                note,
                instance: Some(id.clone()),
            });
        }
        Err(error)
    }

    /// skip-cleanup: the instance is marked released (no GC of any
    /// installation deletes it) and left running. One that is not this
    /// Proxy's is left untouched.
    fn leave_instance(&mut self, recorded: Recorded) -> Result<(), ReconcileError> {
        let provider = self.provider_name();
        match recorded {
            Recorded::None => Ok(()),
            Recorded::Unreachable(id) => {
                self.tell(Notice::Warn {
                    instance: id,
                    message: format!(
                        "skip-cleanup: provider {provider:?} is not configured, so the instance cannot be marked released; \
                         it is left running, but a later GC of this installation with the provider configured would reap it"
                    ),
                });
                Ok(())
            }
            Recorded::Seen(id, Ok(instance)) => {
                match instance.owner.conflict(self.uid(), self.rules.installation) {
                    None => self.act(Action::Release { provider, id }),
                    Some(why) => self.tell(Notice::Warn {
                        instance: id,
                        message: format!(
                            "skip-cleanup: instance left untouched: it is not this Proxy's: {why}"
                        ),
                    }),
                }
                Ok(())
            }
            Recorded::Seen(_, Err(e)) if e.is_not_found() => Ok(()),
            Recorded::Seen(_, Err(e)) => Err(e.into()),
        }
    }

    /// Drives the recorded instance towards gone; true once it is.
    fn release_instance(&mut self, recorded: Recorded) -> Result<bool, ReconcileError> {
        match recorded {
            Recorded::None => Ok(true),
            Recorded::Unreachable(_) => Err(ReconcileError::ProviderMissingOnDelete(self.provider_name())),
            Recorded::Seen(_, Err(e)) if e.is_not_found() => {
                self.forget_instance();
                Ok(true)
            }
            Recorded::Seen(id, Ok(instance)) => {
                self.check_owner(&id, &instance)?;
                let provider = self.provider_name();
                self.request_delete(&provider, id);
                Ok(false)
            }
            // The id itself is what is wrong (malformed, an unknown host):
            // nothing can be checked, so nothing is deleted. An instance of
            // this installation left behind is reaped by orphan GC.
            Recorded::Seen(id, Err(e)) if e.class == ErrorClass::Permanent => {
                self.tell(Notice::Event {
                    reason: "InstanceUnverifiable",
                    note: format!("instance {id} cannot be looked up ({e}); nothing was deleted"),
                    instance: Some(id),
                });
                self.forget_instance();
                Ok(true)
            }
            Recorded::Seen(_, Err(e)) => Err(e.into()),
        }
    }

    fn external(
        &mut self,
        leftover: Recorded,
        endpoint: Option<Result<EndpointSeen, ReconcileError>>,
    ) -> Result<Next, ReconcileError> {
        // A Proxy switched from Managed: its instance goes first.
        if !self.release_instance(leftover)? {
            let why = "switched to External: deleting the managed instance";
            self.plan.status.progress(Phase::Terminating, why);
            return Ok(Next::Poll);
        }
        if has_finalizer(self.proxy) {
            self.act(Action::RemoveFinalizer);
        }
        // Instances it once lost are no concern of an External proxy.
        self.plan.status.clear_replacement();
        let Some(endpoint) = endpoint else {
            return Ok(Next::Idle);
        };
        let endpoint = endpoint?;
        if let Some(refused) = endpoint.refused {
            self.plan.status.forget_instance();
            self.plan.status.fail(&refused.to_string());
            return Ok(Next::Idle);
        }
        self.plan.status.external(&endpoint.host, endpoint.port);
        // Whatever an External proxy's 407 names is its operator's choice.
        self.serve(endpoint.credentials, None);
        if let FirstStatus::Hold(wait) = self.hold_first_status() {
            return Ok(Next::After(wait));
        }
        Ok(Next::Idle)
    }

    /// The latest verdict on this incarnation, unless its instance was just forgotten.
    fn verdict(&self) -> Option<&Verdict> {
        let uid = self.uid();
        self.memory
            .health
            .as_ref()
            .filter(|v| !self.plan.forget && v.uid == uid)
    }

    /// The proxy serves at the endpoint just recorded: tell the health
    /// engine what to probe and fold in the verdict known so far.
    fn serve(&mut self, credentials: Option<ProxyCredentials>, realm: Option<String>) {
        let Some(endpoint) = self.plan.status.status().endpoint.clone() else {
            return;
        };
        // Probes keep to the admitted addresses, whatever the name resolves to later.
        let endpoint_policy = (self.proxy.spec.mode == Mode::External)
            .then(|| self.rules.external_endpoints.cloned())
            .flatten();
        match CheckSpec::from_health_check(&self.proxy.spec.health_check()) {
            Ok(check) => {
                let target = ProbeTarget {
                    uid: self.uid().to_owned(),
                    endpoint,
                    check,
                    credentials,
                    realm,
                    endpoint_policy,
                };
                self.plan.recorded = self.plan.status.recorded_verdict(&target.endpoint);
                self.plan.serve = Some(target);
                if let Some(verdict) = self.verdict().cloned() {
                    self.plan.status.health(&verdict);
                }
            }
            Err(e) => self.plan.status.unprobed(&e.to_string()),
        }
    }

    /// Holds an interim first status back for the first verdict (see
    /// [`first_status`]), and says when to stop waiting.
    fn hold_first_status(&mut self) -> FirstStatus {
        let due = self
            .plan
            .serve
            .as_ref()
            .filter(|_| self.memory.verdicts)
            .map(|target| first_verdict_due(&target.check));
        let known = self.verdict().is_some();
        let since = match &self.memory.held {
            Some((held, since)) if held == self.uid() => *since,
            _ => self.now.mono,
        };
        let waited = self.now.mono.saturating_duration_since(since);
        // Held only when nothing else changes: were an action to fail, its
        // error would have to be written.
        let interim = self.plan.status.first_serving() && self.plan.actions.is_empty();
        let decision = first_status(interim, due, known, waited);
        if let FirstStatus::Hold(_) = decision {
            self.plan.status.hold();
            self.plan.held_since = Some(since);
        }
        decision
    }
}

#[cfg(test)]
mod tests;
