//! The status a reconcile is building, written once at the end and only
//! when it differs from what is stored (transition-only writes).

use std::net::IpAddr;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::health::{RecordedVerdict, Verdict};
use crate::provider_contract::ProviderId;
use crate::resource::ObjectKey;
use crate::resource::{
    HealthStatus, Mode, Phase, Proxy, ProxyStatus, ReplacementStatus, condition, set_condition,
};
use crate::resource_store::{ProxyStore, StoreError};

use super::ReconcileError;

/// Status edits of one reconcile.
pub struct StatusDraft {
    original: ProxyStatus,
    status: ProxyStatus,
    /// Managed: the operator created what serves it.
    managed: bool,
    uid: String,
    generation: Option<i64>,
    /// The reconcile's clock reading (conditions, the replacement record).
    now: Timestamp,
    /// Held back: nothing is written (see [`StatusDraft::hold`]).
    held: bool,
}

impl StatusDraft {
    pub fn new(proxy: &Proxy, now: Timestamp) -> Self {
        let original = proxy.status.clone().unwrap_or_default();
        let mut status = original.clone();
        status.phase.get_or_insert(Phase::Pending);
        Self {
            original,
            status,
            managed: proxy.spec.mode == Mode::Managed,
            uid: proxy.metadata.uid.clone().unwrap_or_default(),
            generation: proxy.metadata.generation,
            now,
            held: false,
        }
    }

    /// The status as it will be written.
    pub fn status(&self) -> &ProxyStatus {
        &self.status
    }

    pub fn provider_id(&self) -> Option<ProviderId> {
        self.status
            .provider_id
            .clone()
            .filter(|id| !id.is_empty())
            .map(ProviderId)
    }

    fn instance_condition(&mut self, ready: bool, reason: &str, message: &str) {
        self.condition(condition::INSTANCE_READY, ready, reason, message);
    }

    fn condition(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        let now = Time(self.now);
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            now,
        );
    }

    /// Folds in a health verdict: Ready or Unhealthy, with the health block.
    pub fn health(&mut self, verdict: &Verdict) {
        let previous = self.status.health.take();
        let last_transition = match previous {
            Some(p) if p.healthy == verdict.healthy && p.last_transition.is_some() => p.last_transition,
            _ => Some(Time(verdict.last_transition)),
        };
        self.status.health = Some(HealthStatus {
            healthy: verdict.healthy,
            latency_ms: verdict.latency.map(|l| l.as_millis() as u64),
            last_transition,
            consecutive_failures: verdict.consecutive_failures,
        });
        let reason = verdict.reason.clone().unwrap_or_default();
        if verdict.healthy {
            self.status.phase = Some(Phase::Ready);
            self.status.message = None;
            self.condition(condition::HEALTHY, true, "ProbeSucceeded", "");
            self.condition(condition::READY, true, "Healthy", "");
        } else {
            self.status.phase = Some(Phase::Unhealthy);
            self.status.message = Some(format!("health check failing: {reason}"));
            self.condition(condition::HEALTHY, false, "ProbeFailed", &reason);
            self.condition(condition::READY, false, "Unhealthy", &reason);
        }
    }

    /// Serving, but its health check cannot run as written.
    pub fn unprobed(&mut self, why: &str) {
        self.status.message = Some(format!("not probed: {why}"));
        self.condition(condition::HEALTHY, false, "InvalidHealthCheck", why);
    }

    /// The recorded instance is gone (or being replaced): its address and health go with it.
    pub fn forget_instance(&mut self) {
        self.status.provider_id = None;
        self.status.ip = None;
        self.status.endpoint = None;
        self.status.outgoing_address = None;
        self.status.health = None;
        self.status
            .conditions
            .retain(|c| c.type_ != condition::HEALTHY && c.type_ != condition::READY);
    }

    pub fn created(&mut self, id: &ProviderId) {
        self.status.provider_id = Some(id.to_string());
        let message = match &self.status.replacement {
            Some(r) => format!(
                "replacement {} created; waiting for it to start (the last instance was lost: {})",
                r.count, r.reason
            ),
            None => "instance created; waiting for it to start".to_owned(),
        };
        self.progress(Phase::Provisioning, &message);
    }

    /// The replacement backoff, when instances were lost.
    pub fn replacement(&self) -> Option<&ReplacementStatus> {
        self.status.replacement.as_ref()
    }

    /// An instance was lost (`count` in a row): replace it at `retry_at`,
    /// after deleting it when `deleting`.
    pub fn lost(&mut self, count: u32, reason: &str, retry_at: Timestamp, deleting: bool) {
        self.status.replacement = Some(ReplacementStatus {
            count,
            reason: reason.to_owned(),
            lost_at: Time(self.now),
            retry_at: Time(retry_at),
            deleting,
        });
        self.replacing();
    }

    /// Says where the replacement stands: deleting the lost instance, or
    /// waiting (phase BackOff) until its successor may be created.
    pub fn replacing(&mut self) {
        let Some(r) = self.status.replacement.clone() else {
            return;
        };
        let now = self.now;
        let waiting = r.retry_at.0 > now;
        let when = if waiting {
            let wait = jiff::SignedDuration::from_secs(r.retry_at.0.duration_since(now).as_secs().max(1));
            format!(
                "replacement {} at {} (backing off {wait:#})",
                r.count,
                r.retry_at.0.round(jiff::Unit::Second).unwrap_or(r.retry_at.0)
            )
        } else {
            format!("replacement {} now", r.count)
        };
        let step = if r.deleting { "deleting it; " } else { "" };
        let message = format!("{}; {step}{when}", r.reason);
        let phase = if waiting {
            Phase::BackOff
        } else {
            Phase::Provisioning
        };
        self.progress(phase, &message);
    }

    /// The lost instance is gone.
    pub fn lost_instance_deleted(&mut self) {
        if let Some(r) = self.status.replacement.as_mut() {
            r.deleting = false;
        }
    }

    /// Forgets earlier losses (an instance stayed up, or the spec changed).
    pub fn clear_replacement(&mut self) {
        self.status.replacement = None;
    }

    /// Work in progress (provisioning, replacing, terminating).
    pub fn progress(&mut self, phase: Phase, message: &str) {
        self.status.phase = Some(phase);
        self.status.message = Some(message.to_owned());
        self.instance_condition(false, phase.as_str(), message);
    }

    /// The instance runs at `ip:port`, connecting out from `outgoing` when
    /// the provider chose that. Health verdicts own Ready/Unhealthy, so
    /// those phases are kept.
    pub fn running(&mut self, ip: &str, port: u16, outgoing: Option<IpAddr>) {
        self.status.ip = Some(ip.to_owned());
        self.status.endpoint = Some(endpoint(ip, port));
        self.status.outgoing_address = outgoing.map(|a| a.to_string());
        self.serving("Running", "instance is running");
    }

    /// An External proxy at `host:port`.
    pub fn external(&mut self, host: &str, port: u16) {
        self.status.ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_string());
        self.status.endpoint = Some(endpoint(host, port));
        self.serving("External", "external endpoint");
    }

    fn serving(&mut self, reason: &str, message: &str) {
        if !matches!(self.status.phase, Some(Phase::Ready | Phase::Unhealthy)) {
            self.status.phase = Some(Phase::Running);
        }
        self.status.message = None;
        self.instance_condition(true, reason, message);
    }

    /// Whether this draft takes a proxy with nothing recorded yet (no
    /// status, or `Pending` with nothing to say) into `Running`: an interim
    /// status that the first health verdict supersedes.
    pub fn first_serving(&self) -> bool {
        matches!(self.original.phase, None | Some(Phase::Pending))
            && self.original.message.is_none()
            && self.status.phase == Some(Phase::Running)
    }

    /// Writes nothing this time: the stored status stays, and is what
    /// [`status`](Self::status) reports.
    pub fn hold(&mut self) {
        self.status = self.original.clone();
        self.held = true;
    }

    pub fn is_held(&self) -> bool {
        self.held
    }

    /// The health verdict the stored status records, when it is in force
    /// for the proxy probed at `endpoint`: the phase says the same and the
    /// endpoint is that one (a healthy record also carries its latency).
    pub fn recorded_verdict(&self, endpoint: &str) -> Option<RecordedVerdict> {
        let stored = &self.original;
        let health = stored.health.as_ref()?;
        let agrees = match stored.phase {
            Some(Phase::Ready) => health.healthy && health.latency_ms.is_some(),
            Some(Phase::Unhealthy) => !health.healthy,
            _ => false,
        };
        (agrees && stored.endpoint.as_deref() == Some(endpoint)).then(|| RecordedVerdict {
            healthy: health.healthy,
            latency: health.latency_ms.map(std::time::Duration::from_millis),
            last_transition: health.last_transition.as_ref().map(|t| t.0),
            consecutive_failures: health.consecutive_failures,
        })
    }

    /// A permanent error: no retry until the spec or configuration changes.
    pub fn fail(&mut self, message: &str) {
        self.status.phase = Some(Phase::Failed);
        self.status.message = Some(message.to_owned());
        self.instance_condition(false, "Failed", message);
    }

    /// A retryable error: say why the proxy is stuck, keep the phase.
    pub fn retrying(&mut self, error: &ReconcileError) {
        let message = format!("{error} (will retry)");
        self.status.message = Some(message.clone());
        match error {
            ReconcileError::CloudInit(_) => self.instance_condition(false, "CloudInitError", &message),
            ReconcileError::InstanceConflict { .. } => {
                self.instance_condition(false, "InstanceConflict", &message)
            }
            _ => {}
        }
    }

    /// The provider refuses to delete the instance; the deletion is retried.
    pub fn deletion_blocked(&mut self, message: &str) {
        self.status.phase = Some(Phase::Terminating);
        self.status.message = Some(message.to_owned());
        self.instance_condition(false, "DeletionBlocked", message);
    }

    /// Whether the stored status already tells `message` (as a retrying error).
    pub fn says(&self, message: &str) -> bool {
        self.original
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with(message))
    }

    /// Writes the status if it changed.
    #[tracing::instrument(name = "status.patch", skip_all)]
    pub async fn write(mut self, store: &dyn ProxyStore, key: &ObjectKey) -> Result<(), StoreError> {
        if self.held {
            return Ok(());
        }
        self.status.observed_generation = self.generation;
        if self.status == self.original {
            return Ok(());
        }
        store.write_status(key, &self.uid, &self.status).await?;
        if self.status.phase != self.original.phase {
            self.phase_changed(store, key).await;
        }
        Ok(())
    }

    /// Logs a phase change, and records it as an Event when a user would act on it.
    async fn phase_changed(&self, store: &dyn ProxyStore, key: &ObjectKey) {
        let phase = |p: Option<Phase>| p.map(Phase::as_str).unwrap_or("-");
        let note = match &self.status.message {
            Some(m) => format!(
                "{} → {}: {m}",
                phase(self.original.phase),
                phase(self.status.phase)
            ),
            None => format!("{} → {}", phase(self.original.phase), phase(self.status.phase)),
        };
        let warning = is_warning(self.status.phase);
        if worth_an_event(self.original.phase, self.status.phase, self.managed) {
            store
                .publish_event(key, &self.uid, phase(self.status.phase), &note, warning)
                .await;
        }
        tracing::info!(
            proxy = %key,
            from = phase(self.original.phase),
            to = phase(self.status.phase),
            endpoint = self.status.endpoint.as_deref().unwrap_or(""),
            message = self.status.message.as_deref().unwrap_or(""),
            "phase changed"
        );
    }
}

fn is_warning(phase: Option<Phase>) -> bool {
    matches!(phase, Some(Phase::Failed | Phase::Unhealthy | Phase::BackOff))
}

/// Whether a phase change becomes a Kubernetes Event: every change into or
/// out of trouble (`Failed`, `Unhealthy`, `BackOff`), and every change of a
/// Managed proxy (its instance's life); an External proxy's routine steps
/// (`Pending` → `Running` → `Ready`, `Terminating`) are not, so that a
/// fleet of them coming up healthy fills no one's event list.
fn worth_an_event(from: Option<Phase>, to: Option<Phase>, managed: bool) -> bool {
    managed || is_warning(from) || is_warning(to)
}

/// `host:port`, with IPv6 addresses in brackets.
fn endpoint(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(mode: &str, status: serde_json::Value) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "crawl", "uid": "u1", "generation": 1},
            "spec": {"mode": mode, "endpoint": {"host": "10.0.0.1", "port": 3128}},
            "status": status
        }))
        .unwrap()
    }

    fn at() -> Timestamp {
        Timestamp::from_second(1_000).unwrap()
    }

    #[test]
    fn only_a_proxy_with_nothing_recorded_taken_into_running_is_first_serving() {
        use serde_json::json;
        let healthy = json!({"healthy": true, "latencyMs": 20, "consecutiveFailures": 0});
        // (stored status, first serving?)
        let table = [
            (json!(null), true),
            (json!({"phase": "Pending"}), true),
            // Something to say that is no longer so: said at once.
            (
                json!({"phase": "Pending", "message": "endpoint.credentialsSecretRef: no such Secret (will retry)"}),
                false,
            ),
            (json!({"phase": "Running", "endpoint": "10.0.0.1:3128"}), false),
            (
                json!({"phase": "Ready", "endpoint": "10.0.0.1:3128", "health": healthy}),
                false,
            ),
            (json!({"phase": "Failed", "message": "refused"}), false),
            (json!({"phase": "Terminating"}), false),
        ];
        for (stored, want) in table {
            let mut draft = StatusDraft::new(&proxy("External", stored.clone()), at());
            draft.external("10.0.0.1", 3128);
            assert_eq!(draft.first_serving(), want, "{stored}");
        }
        // A draft that does not serve is none.
        let draft = StatusDraft::new(&proxy("External", json!(null)), at());
        assert!(!draft.first_serving());
    }

    #[test]
    fn a_held_draft_reports_and_writes_the_stored_status() {
        let mut draft = StatusDraft::new(&proxy("External", serde_json::json!(null)), at());
        draft.external("10.0.0.1", 3128);
        draft.hold();
        assert!(draft.is_held());
        assert_eq!(draft.status(), &ProxyStatus::default());
    }

    #[test]
    fn the_recorded_verdict_is_the_stored_one_when_it_is_in_force_at_the_endpoint() {
        use serde_json::json;
        let healthy = json!({"healthy": true, "latencyMs": 20, "lastTransition": "2026-01-01T00:00:00Z", "consecutiveFailures": 0});
        let failing = json!({"healthy": false, "consecutiveFailures": 3});
        let ready = RecordedVerdict {
            healthy: true,
            latency: Some(std::time::Duration::from_millis(20)),
            last_transition: Some("2026-01-01T00:00:00Z".parse().unwrap()),
            consecutive_failures: 0,
        };
        let unhealthy = RecordedVerdict {
            healthy: false,
            latency: None,
            last_transition: None,
            consecutive_failures: 3,
        };
        let here = "10.0.0.1:3128";
        // (stored status, recorded verdict)
        let table = [
            (
                json!({"phase": "Ready", "endpoint": here, "health": healthy}),
                Some(ready),
            ),
            (
                json!({"phase": "Unhealthy", "endpoint": here, "health": failing}),
                Some(unhealthy),
            ),
            // Another endpoint (the spec moved it): judged afresh.
            (
                json!({"phase": "Ready", "endpoint": "10.0.0.2:3128", "health": healthy}),
                None,
            ),
            // The phase says otherwise (a failure or a restart left the health behind).
            (
                json!({"phase": "Running", "endpoint": here, "health": healthy}),
                None,
            ),
            (
                json!({"phase": "Failed", "endpoint": here, "health": healthy}),
                None,
            ),
            (
                json!({"phase": "Ready", "endpoint": here, "health": failing}),
                None,
            ),
            (
                json!({"phase": "Unhealthy", "endpoint": here, "health": healthy}),
                None,
            ),
            // Healthy without its latency: nothing to measure changes against.
            (
                json!({"phase": "Ready", "endpoint": here, "health": {"healthy": true}}),
                None,
            ),
            (json!({"phase": "Ready", "endpoint": here}), None),
            (json!(null), None),
        ];
        for (stored, want) in table {
            let draft = StatusDraft::new(&proxy("External", stored.clone()), at());
            assert_eq!(draft.recorded_verdict(here), want, "{stored}");
        }
    }

    #[test]
    fn events_are_for_trouble_its_end_and_managed_instances() {
        use Phase::*;
        // (from, to, managed, an Event?)
        let table = [
            (None, Some(Pending), false, false),
            (Some(Pending), Some(Running), false, false),
            (Some(Running), Some(Ready), false, false),
            (Some(Ready), Some(Terminating), false, false),
            (Some(Ready), Some(Unhealthy), false, true),
            (Some(Unhealthy), Some(Ready), false, true),
            (Some(Pending), Some(Failed), false, true),
            (Some(Failed), Some(Running), false, true),
            (Some(Running), Some(BackOff), false, true),
            (Some(Pending), Some(Running), true, true),
            (Some(Running), Some(Ready), true, true),
            (Some(Ready), Some(Terminating), true, true),
        ];
        for (from, to, managed, expected) in table {
            assert_eq!(
                worth_an_event(from, to, managed),
                expected,
                "{from:?} → {to:?}, managed {managed}"
            );
        }
    }
}
