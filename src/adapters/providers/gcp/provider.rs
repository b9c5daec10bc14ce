//! The gcp provider: Compute Engine VMs with an ephemeral external IP.
//! Fire-and-forget: `create` returns once the insert is accepted and the
//! reconciler polls `get`. The providerID carries the zone
//! (`zones/<zone>/instances/<name>`), so get and delete stay right even
//! mid-replacement after the Proxy's zone was edited. Ownership travels in
//! labels (managed, UID, namespace, installation; released once left to
//! the admin), changed only through `setLabels` with the label fingerprint.

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::api::{ComputeApi, GcpError, TokenSource};
use super::body::{
    BodyError, INSTALLATION_LABEL, MANAGED_LABEL, NAMESPACE_LABEL, RELEASED_LABEL, UID_LABEL, instance_body,
    placement, released_labels,
};
use crate::domain::config::GcpConfig;
use crate::domain::provider_contract::{
    CreateRequest, ErrorClass, Instance, InstanceState, Op, Ownership, Provider, ProviderError, ProviderId,
};

/// setLabels attempts while someone else keeps changing the labels (412);
/// after that the release fails Transient and the reconciler retries later.
const RELEASE_ATTEMPTS: usize = 5;
/// setLabels returns before Google applies it: release looks this many
/// times, a second apart, for the new labels before it reports success —
/// until then this installation's GC could still see the VM as its orphan.
const RELEASE_CONFIRMATIONS: usize = 30;

pub struct GcpProvider {
    name: String,
    config: GcpConfig,
    api: ComputeApi,
}

/// Settings that come from the command line rather than the providers file.
#[derive(Clone, Debug, Default)]
pub struct GcpOptions {
    /// Wire log shows whole bodies (cloud-init stays redacted).
    pub wire_log_full_payloads: bool,
}

impl GcpProvider {
    /// Waits until the VM's labels read as released (or the VM is gone).
    async fn confirm_released(&self, zone: &str, name: &str, id: &ProviderId) -> Result<(), ProviderError> {
        for attempt in 0..RELEASE_CONFIRMATIONS {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            match self.api.get(zone, name).await {
                Err(e) if e.class() == ErrorClass::NotFound => return Ok(()),
                Err(e) => return Err(self.api_err(Op::Release, Some(id.as_str()), e)),
                Ok(vm) => {
                    let released = vm
                        .pointer(&format!("/labels/{RELEASED_LABEL}"))
                        .and_then(Value::as_str)
                        == Some("true");
                    let managed = vm.pointer(&format!("/labels/{MANAGED_LABEL}")).is_some();
                    if released && !managed {
                        return Ok(());
                    }
                }
            }
        }
        Err(self.err(
            ErrorClass::Transient,
            Op::Release,
            Some(id.as_str()),
            "setLabels was accepted but the released labels do not show yet; retried later",
        ))
    }

    pub fn new(
        name: &str,
        config: GcpConfig,
        tokens: Arc<dyn TokenSource>,
        options: &GcpOptions,
    ) -> Result<Self, String> {
        crate::tls::ensure_crypto_provider();
        let root = url::Url::parse(&config.api_endpoint)
            .map_err(|e| format!("gcp.apiEndpoint {:?}: {e}", config.api_endpoint))?;
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let api = ComputeApi::new(
            http,
            root,
            &config.project,
            tokens,
            options.wire_log_full_payloads,
        );
        Ok(Self {
            name: name.to_owned(),
            config,
            api,
        })
    }

    fn err(
        &self,
        class: ErrorClass,
        op: Op,
        id: Option<&str>,
        cause: impl std::fmt::Display,
    ) -> ProviderError {
        ProviderError::new(class, op, &self.name, id, cause.to_string())
    }

    fn api_err(&self, op: Op, id: Option<&str>, e: GcpError) -> ProviderError {
        self.err(e.class(), op, id, e)
    }

    /// `zones/<zone>/instances/<name>` → (zone, name).
    fn parse_id<'a>(&self, op: Op, id: &'a ProviderId) -> Result<(&'a str, &'a str), ProviderError> {
        match id.as_str().split('/').collect::<Vec<_>>()[..] {
            ["zones", zone, "instances", name] if !zone.is_empty() && !name.is_empty() => Ok((zone, name)),
            _ => Err(self.err(
                ErrorClass::Permanent,
                op,
                Some(id.as_str()),
                "not a gcp providerID (zones/<zone>/instances/<name>)",
            )),
        }
    }
}

pub fn provider_id(zone: &str, name: &str) -> ProviderId {
    ProviderId(format!("zones/{zone}/instances/{name}"))
}

/// Compute Engine status → instance state; an unknown status counts as
/// Stopped (docs/providers.md#instance-states).
pub fn state_of(status: &str) -> InstanceState {
    match status {
        "PROVISIONING" | "STAGING" | "REPAIRING" => InstanceState::Provisioning,
        "RUNNING" => InstanceState::Running,
        _ => InstanceState::Stopped,
    }
}

/// The instance as the provider contract sees it.
pub fn instance_of(id: ProviderId, vm: &Value) -> Instance {
    let status = vm.get("status").and_then(Value::as_str).unwrap_or("");
    let state = state_of(status);
    // Compute Engine's own explanation, when it gives one (`statusMessage`).
    let reason = (state == InstanceState::Stopped).then(|| {
        let status = if status.is_empty() {
            "without a status"
        } else {
            status
        };
        match vm
            .get("statusMessage")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
        {
            Some(message) => format!("instance {status}: {message}"),
            None => format!("instance {status}"),
        }
    });
    let ip = (state == InstanceState::Running)
        .then(|| external_ip(vm))
        .flatten();
    Instance {
        id,
        state,
        reason,
        ip,
        port: None,
        outgoing_address: None,
        owner: owner_of(vm),
        created_at: vm
            .get("creationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse().ok()),
    }
}

/// Who the VM belongs to, from its labels (any may be missing: a VM of an
/// earlier version has only the managed and UID labels).
pub fn owner_of(vm: &Value) -> Ownership {
    let label = |key: &str| {
        vm.get("labels")
            .and_then(|l| l.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    Ownership {
        uid: label(UID_LABEL),
        namespace: label(NAMESPACE_LABEL),
        installation: label(INSTALLATION_LABEL),
        released: label(RELEASED_LABEL).as_deref() == Some("true"),
    }
}

/// The first interface's external (NAT) address.
fn external_ip(vm: &Value) -> Option<IpAddr> {
    vm.pointer("/networkInterfaces/0/accessConfigs")?
        .as_array()?
        .iter()
        .find_map(|ac| ac.get("natIP")?.as_str()?.parse().ok())
}

/// `https://…/zones/europe-west1-b` or `zones/europe-west1-b` → `europe-west1-b`.
fn zone_of(vm: &Value) -> Option<&str> {
    vm.get("zone")?.as_str()?.rsplit('/').next()
}

#[async_trait]
impl Provider for GcpProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "gcp"
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let name = Some(req.name.as_str());
        let permanent = |e: BodyError| self.err(ErrorClass::Permanent, Op::Create, name, e);
        let zone = placement(req).map_err(permanent)?.zone.to_owned();
        let body = instance_body(&self.config, req).map_err(permanent)?;
        self.api
            .insert(&zone, &body)
            .await
            .map_err(|e| self.api_err(Op::Create, name, e))?;
        Ok(provider_id(&zone, req.name.as_str()))
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let (zone, name) = self.parse_id(Op::Get, id)?;
        let vm = self
            .api
            .get(zone, name)
            .await
            .map_err(|e| self.api_err(Op::Get, Some(id.as_str()), e))?;
        Ok(instance_of(id.clone(), &vm))
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (zone, name) = self.parse_id(Op::Delete, id)?;
        match self.api.delete(zone, name).await {
            Err(e) if e.class() == ErrorClass::NotFound => Ok(()),
            other => other.map_err(|e| self.api_err(Op::Delete, Some(id.as_str()), e)),
        }
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (zone, name) = self.parse_id(Op::Release, id)?;
        let fail = |e: GcpError| self.api_err(Op::Release, Some(id.as_str()), e);
        for _ in 0..RELEASE_ATTEMPTS {
            // setLabels replaces the whole set, guarded by the fingerprint read with it.
            let vm = match self.api.get(zone, name).await {
                Err(e) if e.class() == ErrorClass::NotFound => return Ok(()),
                other => other.map_err(fail)?,
            };
            let empty = serde_json::Map::new();
            let current = vm.get("labels").and_then(Value::as_object).unwrap_or(&empty);
            let wanted = released_labels(current);
            if wanted == *current {
                return Ok(());
            }
            let fingerprint = vm
                .get("labelFingerprint")
                .and_then(Value::as_str)
                .ok_or_else(|| fail(GcpError::Decode("the instance has no labelFingerprint".into())))?;
            match self.api.set_labels(zone, name, &wanted, fingerprint).await {
                Ok(()) => return self.confirm_released(zone, name, id).await,
                Err(e) if e.class() == ErrorClass::NotFound => return Ok(()),
                // Someone changed the labels since the read: read them again.
                Err(e) if e.is_stale_fingerprint() => continue,
                Err(e) => return Err(fail(e)),
            }
        }
        Err(self.err(
            ErrorClass::Transient,
            Op::Release,
            Some(id.as_str()),
            format!(
                "the labels kept changing under setLabels (HTTP 412 {RELEASE_ATTEMPTS} times); retried later"
            ),
        ))
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let listed = self
            .api
            .aggregated_list(&format!("labels.{MANAGED_LABEL} = \"true\""))
            .await
            .map_err(|e| self.api_err(Op::List, None, e))?;
        if !listed.unreachable.is_empty() {
            // GC only deletes what it sees, so a partial view is safe: it just sees less.
            tracing::warn!(provider = %self.name, unreachable = ?listed.unreachable, "gcp list: some zones could not be read");
        }
        Ok(listed
            .instances
            .iter()
            .filter_map(|vm| {
                let name = vm.get("name")?.as_str()?;
                Some(instance_of(provider_id(zone_of(vm)?, name), vm))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_status_maps_to_a_state() {
        for (status, state) in [
            ("PROVISIONING", InstanceState::Provisioning),
            ("STAGING", InstanceState::Provisioning),
            ("REPAIRING", InstanceState::Provisioning),
            ("RUNNING", InstanceState::Running),
            ("STOPPING", InstanceState::Stopped),
            ("STOPPED", InstanceState::Stopped),
            ("SUSPENDING", InstanceState::Stopped),
            ("SUSPENDED", InstanceState::Stopped),
            ("TERMINATED", InstanceState::Stopped),
            ("SOMETHING_NEW", InstanceState::Stopped),
            ("", InstanceState::Stopped),
        ] {
            assert_eq!(state_of(status), state, "{status}");
        }
    }

    #[test]
    fn a_running_vm_has_its_external_ip_uid_and_creation_time() {
        let vm = json!({
            "name": "proxy-abc", "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/europe-west1-b",
            "status": "RUNNING", "creationTimestamp": "2026-11-30T01:02:03.456-08:00",
            "labels": {"egress-proxies-managed": "true", "egress-proxies-uid": "u-1"},
            "networkInterfaces": [{"networkIP": "10.0.0.2", "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": "203.0.113.7"}]}],
        });
        let i = instance_of(provider_id("europe-west1-b", "proxy-abc"), &vm);
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(
            i.ip,
            Some("203.0.113.7".parse().unwrap()),
            "the external, not the internal address"
        );
        assert_eq!(
            i.owner,
            Ownership {
                uid: Some("u-1".into()),
                ..Default::default()
            },
            "an earlier version's labels: no installation, no namespace"
        );
        assert_eq!(i.created_at.unwrap().to_string(), "2026-11-30T09:02:03.456Z");
        assert_eq!(zone_of(&vm), Some("europe-west1-b"));

        let mut staging = vm.clone();
        staging["status"] = json!("STAGING");
        assert_eq!(
            instance_of(i.id.clone(), &staging).ip,
            None,
            "no IP before RUNNING"
        );
        let mut no_nat = vm.clone();
        no_nat["networkInterfaces"][0]["accessConfigs"] = json!([]);
        assert_eq!(instance_of(i.id.clone(), &no_nat).ip, None);
        assert_eq!(i.reason, None, "a running VM needs no explanation");

        let mut preempted = vm.clone();
        preempted["status"] = json!("TERMINATED");
        preempted["statusMessage"] = json!("Instance was preempted.");
        let stopped = instance_of(i.id.clone(), &preempted);
        assert_eq!(stopped.state, InstanceState::Stopped);
        assert_eq!(
            stopped.reason.as_deref(),
            Some("instance TERMINATED: Instance was preempted.")
        );
        preempted["statusMessage"] = json!("");
        assert_eq!(
            instance_of(i.id, &preempted).reason.as_deref(),
            Some("instance TERMINATED")
        );
    }

    #[test]
    fn the_owner_comes_from_every_label() {
        let vm = json!({"labels": {"egress-proxies-managed": "true", "egress-proxies-uid": "u-1",
            "egress-proxies-namespace": "crawl", "egress-proxies-installation": "prod-eu"}});
        let mine = Ownership {
            uid: Some("u-1".into()),
            namespace: Some("crawl".into()),
            installation: Some("prod-eu".into()),
            released: false,
        };
        assert_eq!(owner_of(&vm), mine);
        let released = json!({"labels": released_labels(vm["labels"].as_object().unwrap())});
        assert_eq!(
            owner_of(&released),
            Ownership {
                released: true,
                ..mine
            }
        );
        assert_eq!(owner_of(&json!({})), Ownership::default(), "a VM without labels");
        let not_true = json!({"labels": {"egress-proxies-released": "no"}});
        assert!(!owner_of(&not_true).released);
    }
}
