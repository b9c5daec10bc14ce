//! The `kubernetes` provider: each instance is a Squid pod in the Proxy's
//! namespace. Its Squid configuration travels in the pod itself (an
//! environment variable the container writes out at start), so there is
//! nothing else to create or clean up. Pods share the cluster's egress IP:
//! this provider is for development, CI and lifecycle testing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::config::KubernetesConfig;
use crate::provider::{
    CreateRequest, ErrorClass, Instance, InstanceState, Op, Provider, ProviderError, ProviderId,
};

/// Label every operator-made pod carries.
pub const MANAGED_LABEL: &str = "crawl.example.com/managed";
/// Label with the owning Proxy's UID.
pub const UID_LABEL: &str = "crawl.example.com/uid";
/// Squid sizes its memory by the descriptor limit; unset it is OOM-killed in containers.
const MAX_FILEDESCRIPTORS: u32 = 4096;

/// Squid pods through the Kubernetes API.
pub struct KubernetesProvider {
    name: String,
    client: kube::Client,
    config: KubernetesConfig,
}

/// The squid.conf of a pod listening on `port`. `forwarded_for delete`:
/// `off` would still send `X-Forwarded-For: unknown` to every target.
pub fn squid_config(port: u16) -> String {
    format!(
        "http_port {port}\nhttp_access allow all\nvia off\nforwarded_for delete\n\
         max_filedescriptors {MAX_FILEDESCRIPTORS}\ncache deny all\ncache_mem 8 MB\npinger_enable off\n\
         shutdown_lifetime 1 seconds\npid_filename /tmp/squid.pid\ncoredump_dir /tmp\n\
         cache_log stdio:/dev/stderr\naccess_log stdio:/dev/stdout\n"
    )
}

/// `namespaces/<ns>/pods/<name>`.
fn provider_id(namespace: &str, name: &str) -> ProviderId {
    ProviderId(format!("namespaces/{namespace}/pods/{name}"))
}

fn parse_id(id: &ProviderId) -> Option<(&str, &str)> {
    let rest = id.as_str().strip_prefix("namespaces/")?;
    let (ns, name) = rest.split_once("/pods/")?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then_some((ns, name))
}

/// How an API error maps onto the provider taxonomy.
pub fn classify(e: &kube::Error) -> ErrorClass {
    match e {
        kube::Error::Api(s) => match s.code {
            404 => ErrorClass::NotFound,
            429 => ErrorClass::QuotaExceeded,
            403 if s.reason == "Forbidden" && s.message.contains("exceeded quota") => {
                ErrorClass::QuotaExceeded
            }
            400 | 403 | 405 | 413 | 415 | 422 => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        },
        _ => ErrorClass::Transient,
    }
}

/// Pod phase and readiness → instance state.
pub fn state_of(pod: &Pod) -> InstanceState {
    if pod.metadata.deletion_timestamp.is_some() {
        return InstanceState::Stopped;
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Running") if ready => InstanceState::Running,
        Some("Running") | Some("Pending") | None => InstanceState::Provisioning,
        // Succeeded, Failed, Unknown: it will not serve again by itself.
        _ => InstanceState::Stopped,
    }
}

impl KubernetesProvider {
    pub fn new(name: &str, config: KubernetesConfig, client: kube::Client) -> Self {
        Self {
            name: name.to_owned(),
            client,
            config,
        }
    }

    fn error(&self, op: Op, id: Option<&str>, e: kube::Error) -> ProviderError {
        ProviderError::new(classify(&e), op, &self.name, id, e.to_string())
    }

    fn instance(&self, pod: &Pod) -> Instance {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let state = state_of(pod);
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        Instance {
            id: provider_id(&namespace, &name),
            state,
            ip: if state == InstanceState::Running { ip } else { None },
            port: None,
            uid: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(UID_LABEL))
                .cloned(),
            created_at: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// The pod for a create request.
    pub fn pod(&self, req: &CreateRequest) -> Pod {
        let labels = BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "egress-proxy".to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "egress-proxies-operator".to_owned(),
            ),
            (MANAGED_LABEL.to_owned(), "true".to_owned()),
            (UID_LABEL.to_owned(), req.uid.clone()),
        ]);
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": req.name.as_str(), "namespace": req.namespace, "labels": labels},
            "spec": {
                "restartPolicy": "Always",
                "enableServiceLinks": false,
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "squid",
                    "image": self.config.image,
                    "command": ["/bin/sh", "-c", "printf '%s' \"$SQUID_CONFIG\" > /tmp/squid.conf && exec squid -N -f /tmp/squid.conf"],
                    "env": [{"name": "SQUID_CONFIG", "value": squid_config(req.port)}],
                    "ports": [{"name": "proxy", "containerPort": req.port, "protocol": "TCP"}],
                    "readinessProbe": {"tcpSocket": {"port": req.port}, "periodSeconds": 2},
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"memory": "256Mi"}
                    }
                }]
            }
        }))
        .expect("a static pod template deserializes")
    }
}

#[async_trait]
impl Provider for KubernetesProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let id = provider_id(&req.namespace, req.name.as_str());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &req.namespace);
        match api.create(&PostParams::default(), &self.pod(req)).await {
            Ok(_) => Ok(id),
            // Keyed on the name: a repeat after a crash finds the pod it made.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(id),
            Err(e) => Err(self.error(Op::Create, Some(id.as_str()), e)),
        }
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let (ns, name) = parse_id(id).ok_or_else(|| {
            ProviderError::new(
                ErrorClass::Permanent,
                Op::Get,
                &self.name,
                Some(id.as_str()),
                "not a pod providerID",
            )
        })?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api.get(name).await {
            Ok(pod) => Ok(self.instance(&pod)),
            Err(e) => Err(self.error(Op::Get, Some(id.as_str()), e)),
        }
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (ns, name) = parse_id(id).ok_or_else(|| {
            ProviderError::new(
                ErrorClass::Permanent,
                Op::Delete,
                &self.name,
                Some(id.as_str()),
                "not a pod providerID",
            )
        })?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.error(Op::Delete, Some(id.as_str()), e)),
        }
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let pods = api
            .list(&ListParams::default().labels(&format!("{MANAGED_LABEL}=true")))
            .await
            .map_err(|e| self.error(Op::List, None, e))?;
        Ok(pods.items.iter().map(|p| self.instance(p)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: Option<&str>, ready: bool, deleting: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n", "deletionTimestamp": if deleting { json!("2026-01-01T00:00:00Z") } else { json!(null) }},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    #[test]
    fn state_mapping_table() {
        for (phase, ready, deleting, want) in [
            (None, false, false, InstanceState::Provisioning),
            (Some("Pending"), false, false, InstanceState::Provisioning),
            (Some("Running"), false, false, InstanceState::Provisioning),
            (Some("Running"), true, false, InstanceState::Running),
            (Some("Running"), true, true, InstanceState::Stopped),
            (Some("Succeeded"), false, false, InstanceState::Stopped),
            (Some("Failed"), false, false, InstanceState::Stopped),
            (Some("Unknown"), false, false, InstanceState::Stopped),
        ] {
            assert_eq!(
                state_of(&pod(phase, ready, deleting)),
                want,
                "{phase:?} ready={ready} deleting={deleting}"
            );
        }
    }

    #[test]
    fn provider_ids_round_trip_and_reject_foreign_ones() {
        let id = provider_id("crawl", "proxy-abc");
        assert_eq!(id.as_str(), "namespaces/crawl/pods/proxy-abc");
        assert_eq!(parse_id(&id), Some(("crawl", "proxy-abc")));
        for bad in [
            "zones/a/instances/b",
            "namespaces//pods/x",
            "namespaces/a/pods/",
            "namespaces/a/pods/b/c",
        ] {
            assert_eq!(parse_id(&ProviderId(bad.into())), None, "{bad}");
        }
    }

    #[test]
    fn api_errors_map_onto_the_taxonomy() {
        let api = |code: u16, reason: &str, message: &str| {
            kube::Error::Api(
                serde_json::from_value(
                    json!({"status": "Failure", "message": message, "reason": reason, "code": code}),
                )
                .unwrap(),
            )
        };
        for (code, reason, message, want) in [
            (404, "NotFound", "pods \"x\" not found", ErrorClass::NotFound),
            (
                403,
                "Forbidden",
                "pods is forbidden: User cannot create",
                ErrorClass::Permanent,
            ),
            (
                403,
                "Forbidden",
                "exceeded quota: compute-resources",
                ErrorClass::QuotaExceeded,
            ),
            (429, "TooManyRequests", "slow down", ErrorClass::QuotaExceeded),
            (
                422,
                "Invalid",
                "spec.containers[0].image: Required value",
                ErrorClass::Permanent,
            ),
            (500, "InternalError", "etcd", ErrorClass::Transient),
            (503, "ServiceUnavailable", "", ErrorClass::Transient),
            (409, "Conflict", "modified", ErrorClass::Transient),
        ] {
            assert_eq!(classify(&api(code, reason, message)), want, "{code} {message}");
        }
    }

    #[test]
    fn squid_config_has_what_containers_need() {
        let conf = squid_config(3128);
        for line in [
            "http_port 3128",
            "http_access allow all",
            "via off",
            "forwarded_for delete",
            "max_filedescriptors 4096",
        ] {
            assert!(conf.lines().any(|l| l == line), "missing {line:?}");
        }
    }
}
