//! The `kubernetes` provider: each instance is a Squid pod in the Proxy's
//! namespace. Its Squid configuration travels in the pod itself (an
//! environment variable the container writes out at start), so there is
//! nothing else to create or clean up. Pods share the cluster's egress IP:
//! this provider is for development, CI and lifecycle testing.
//!
//! Pods are read from a watch cache: the managed pods of every namespace
//! are watched from the provider's first use on, so a reconcile's `get`
//! and a GC sweep's `list_by_tag` cost no API request. Only a pod the
//! cache does not hold is read with a GET: a reconcile must tell a
//! vanished pod from one the watch has not brought yet (or a released
//! one, which leaves the watch).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, watcher};
use serde_json::json;

use crate::adapters::kube_client::watch_cache::WatchCache;
use crate::domain::config::KubernetesConfig;
use crate::domain::destinations::{DestinationPolicy, IpNet, squid_rules};
use crate::domain::provider_contract::squid_auth::with_auth;
use crate::domain::provider_contract::squid_identity::identity_section;
use crate::domain::provider_contract::squid_limits::MAX_FILEDESCRIPTORS;
use crate::domain::provider_contract::{
    CreateRequest, ErrorClass, Instance, InstanceState, Op, Ownership, Provider, ProviderError, ProviderId,
};
use crate::domain::provider_contract::{HTPASSWD_KEY, credentials_secret_name};
use crate::domain::resource::ObjectKey;

/// Label every operator-made pod carries.
pub const MANAGED_LABEL: &str = "crawl.example.com/managed";
/// Label with the owning Proxy's UID.
pub const UID_LABEL: &str = "crawl.example.com/uid";
/// Label with the installation that made the pod.
pub const INSTALLATION_LABEL: &str = "crawl.example.com/installation";
/// Label a pod released with skip-cleanup carries (instead of [`MANAGED_LABEL`]).
pub const RELEASED_LABEL: &str = "crawl.example.com/released";

/// How long a read waits for the pod watch's first list before it fails
/// (Transient: the reconcile or sweep is retried).
const FIRST_LIST_WAIT: Duration = Duration::from_secs(60);

/// Squid pods through the Kubernetes API.
pub struct KubernetesProvider {
    name: String,
    client: kube::Client,
    config: KubernetesConfig,
    destinations: DestinationPolicy,
    /// The managed pods, fed by a watch started at the first use.
    cache: Arc<WatchCache<Pod>>,
    /// The runtime the provider was built on, where its watch runs.
    runtime: Option<tokio::runtime::Handle>,
    /// The running watch (stopped with the provider).
    watch: OnceLock<tokio::task::AbortHandle>,
}

impl Drop for KubernetesProvider {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.get() {
            watch.abort();
        }
    }
}

/// Watches the managed pods into `cache` until aborted.
async fn watch_pods(api: Api<Pod>, cache: Arc<WatchCache<Pod>>) {
    let config = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    cache.follow(watcher(api, config), "managed pods").await;
}

/// The user the Squid container runs as: `proxy` (13) in the Debian and
/// Ubuntu images, which own nothing the container needs to write.
pub const SQUID_UID: u32 = 13;

/// The container's command: write the config into the writable `/tmp`,
/// then run Squid in the foreground.
pub const SQUID_COMMAND: [&str; 3] = [
    "/bin/sh",
    "-c",
    "printf '%s' \"$SQUID_CONFIG\" > /tmp/squid.conf && exec squid -N -f /tmp/squid.conf",
];

/// The squid.conf of a pod listening on `port`, naming neither itself nor
/// its node ([`identity_section`]). Every
/// file Squid writes is under `/tmp` (the pod's only writable directory) or
/// a standard stream; `netdb_filename none`: the netdb state would be saved
/// under /var/spool on shutdown.
pub fn squid_config(port: u16, destinations: &DestinationPolicy) -> String {
    format!(
        "http_port {port}\n{rules}http_access allow all\n{identity}\
         max_filedescriptors {MAX_FILEDESCRIPTORS}\ncache deny all\ncache_mem 8 MB\npinger_enable off\n\
         shutdown_lifetime 1 seconds\npid_filename /tmp/squid.pid\ncoredump_dir /tmp\n\
         netdb_filename none\ncache_log stdio:/dev/stderr\naccess_log stdio:/dev/stdout\n",
        rules = squid_rules(destinations),
        identity = identity_section(),
    )
}

/// Where a pod mounts its Proxy's credentials Secret (the `htpasswd` key as `passwd`).
pub const AUTH_MOUNT: &str = "/etc/squid-auth";

/// The squid.conf of a pod that demands its Proxy's credentials (checked
/// before the destination rules: a stranger learns nothing of them); its
/// 407 names `realm`, the credentials' own.
pub fn authenticated_squid_config(port: u16, destinations: &DestinationPolicy, realm: &str) -> String {
    with_auth(
        &squid_config(port, destinations),
        &Path::new(AUTH_MOUNT).join("passwd"),
        realm,
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

/// Why a pod is not serving, from its status: the pod's own reason
/// (evicted, ...) and each container's waiting or terminated state. `None`
/// when it says nothing useful (a pod starting normally).
pub fn reason_of(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("pod is being deleted".into());
    }
    let status = pod.status.as_ref()?;
    let mut parts = Vec::new();
    if let Some(reason) = status.reason.as_deref().filter(|r| !r.is_empty()) {
        let phase = status.phase.as_deref().unwrap_or("Unknown");
        parts.push(match status.message.as_deref().filter(|m| !m.is_empty()) {
            Some(message) => format!("pod {phase}: {reason}: {message}"),
            None => format!("pod {phase}: {reason}"),
        });
    }
    let terminated = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        let mut text = format!(
            "{} (exit code {})",
            t.reason.as_deref().unwrap_or("terminated"),
            t.exit_code
        );
        if let Some(message) = t.message.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
            text.push_str(": ");
            text.push_str(message);
        }
        text
    };
    for c in status.container_statuses.iter().flatten() {
        let state = c.state.as_ref();
        let last = c
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| format!("; last exit: {}", terminated(t)))
            .unwrap_or_default();
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            parts.push(format!("container {} terminated: {}", c.name, terminated(t)));
        } else if let Some(w) = state
            .and_then(|s| s.waiting.as_ref())
            .filter(|w| w.reason.as_deref().is_some_and(|r| r != "ContainerCreating"))
        {
            let reason = w.reason.as_deref().unwrap_or_default();
            let message = w
                .message
                .as_deref()
                .filter(|m| !m.is_empty())
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            parts.push(format!("container {} waiting: {reason}{message}{last}", c.name));
        }
    }
    (!parts.is_empty()).then(|| crate::domain::provider_contract::reason::clip(&parts.join("; "), 600))
}

impl KubernetesProvider {
    /// The watch of managed pods starts at the first use, on the runtime
    /// this is called on (if any).
    pub fn new(name: &str, config: KubernetesConfig, client: kube::Client) -> Self {
        Self {
            name: name.to_owned(),
            client,
            destinations: DestinationPolicy::new(&config.destinations, &[]),
            config,
            cache: Arc::default(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            watch: OnceLock::new(),
        }
    }

    /// The pod cache, its watch started if this is the first use.
    fn watching(&self) -> &WatchCache<Pod> {
        self.watch.get_or_init(|| {
            // Every namespace, as the cluster-wide list before it: GC
            // reports (never reaps) managed pods outside its scope.
            let watch = watch_pods(Api::all(self.client.clone()), self.cache.clone());
            match &self.runtime {
                Some(runtime) => runtime.spawn(watch).abort_handle(),
                None => tokio::spawn(watch).abort_handle(),
            }
        });
        &self.cache
    }

    /// The pod cache once its first list is in.
    async fn listed(&self, op: Op, id: Option<&str>) -> Result<&WatchCache<Pod>, ProviderError> {
        let cache = self.watching();
        tokio::time::timeout(FIRST_LIST_WAIT, cache.ready())
            .await
            .map_err(|_| {
                ProviderError::new(
                    ErrorClass::Transient,
                    op,
                    &self.name,
                    id,
                    "the watch of managed pods has not listed them yet",
                )
            })?;
        Ok(cache)
    }

    /// Denies the cluster's pod and service ranges unless `destinations.allow` lists them.
    pub fn with_cluster_networks(mut self, cluster_networks: &[IpNet]) -> Self {
        self.destinations = DestinationPolicy::new(&self.config.destinations, cluster_networks);
        self
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
            reason: (state != InstanceState::Running)
                .then(|| reason_of(pod))
                .flatten(),
            ip: if state == InstanceState::Running { ip } else { None },
            port: None,
            outgoing_address: None,
            owner: {
                let label = |name: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(name)).cloned();
                Ownership {
                    uid: label(UID_LABEL),
                    namespace: pod.metadata.namespace.clone(),
                    installation: label(INSTALLATION_LABEL),
                    released: label(RELEASED_LABEL).as_deref() == Some("true"),
                }
            },
            created_at: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// The pods API of `id`'s namespace, and the pod's name.
    fn pod_api<'a>(&self, id: &'a ProviderId, op: Op) -> Result<(Api<Pod>, &'a str), ProviderError> {
        let (ns, name) = parse_id(id).ok_or_else(|| {
            ProviderError::new(
                ErrorClass::Permanent,
                op,
                &self.name,
                Some(id.as_str()),
                "not a pod providerID",
            )
        })?;
        Ok((Api::namespaced(self.client.clone(), ns), name))
    }

    /// The pod for a create request.
    #[expect(
        clippy::expect_used,
        reason = "a fixed template; the unit tests build pods from it"
    )]
    pub fn pod(&self, req: &CreateRequest) -> Pod {
        let labels = BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "egress-proxy".to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "egress-proxies-operator".to_owned(),
            ),
            (MANAGED_LABEL.to_owned(), "true".to_owned()),
            (UID_LABEL.to_owned(), req.uid.clone()),
            (INSTALLATION_LABEL.to_owned(), req.installation.to_string()),
        ]);
        // The passwd file comes from the Proxy's credentials Secret, which the
        // store keeps in the Proxy's (and so the pod's) namespace.
        // `/tmp` is the only writable place (config, pid file, core dumps;
        // logs go to stdout/stderr). The passwd file comes from the Proxy's
        // credentials Secret, which the store keeps in the Proxy's (and so
        // the pod's) namespace.
        let mut volumes = vec![json!({"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}})];
        let mut mounts = vec![json!({"name": "tmp", "mountPath": "/tmp"})];
        let config = match &req.credentials {
            Some(credentials) => {
                volumes.push(json!({"name": "auth", "secret": {
                    "secretName": credentials_secret_name(&req.uid),
                    "items": [{"key": HTPASSWD_KEY, "path": "passwd"}],
                    "defaultMode": 0o444
                }}));
                mounts.push(json!({"name": "auth", "mountPath": AUTH_MOUNT, "readOnly": true}));
                authenticated_squid_config(req.port, &self.destinations, &credentials.realm())
            }
            None => squid_config(req.port, &self.destinations),
        };
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": req.name.as_str(), "namespace": req.namespace, "labels": labels},
            "spec": {
                "restartPolicy": "Always",
                "enableServiceLinks": false,
                "automountServiceAccountToken": false,
                // The Pod Security Standards' `restricted` profile: not root,
                // no privilege escalation, no capabilities, the runtime's
                // seccomp profile, a read-only root filesystem.
                "securityContext": {
                    "runAsNonRoot": true,
                    "runAsUser": SQUID_UID,
                    "runAsGroup": SQUID_UID,
                    "seccompProfile": {"type": "RuntimeDefault"}
                },
                "containers": [{
                    "name": "squid",
                    "image": self.config.image,
                    "command": SQUID_COMMAND,
                    "env": [{"name": "SQUID_CONFIG", "value": config}],
                    "ports": [{"name": "proxy", "containerPort": req.port, "protocol": "TCP"}],
                    "readinessProbe": {"tcpSocket": {"port": req.port}, "periodSeconds": 2},
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi", "ephemeral-storage": "16Mi"},
                        "limits": {"cpu": "1", "memory": "256Mi", "ephemeral-storage": "128Mi"}
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]}
                    },
                    "volumeMounts": mounts
                }],
                "volumes": volumes
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

    // Its Squid's (or built-in proxy's) configuration is written here, with
    // the credentials' realm.
    fn names_own_realm(&self) -> bool {
        true
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let id = provider_id(&req.namespace, req.name.as_str());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &req.namespace);
        // The next `get` finds it even before the watch brings it (a write
        // before the first list is superseded by it).
        let cache = self.watching();
        let ticket = cache.ticket();
        match api.create(&PostParams::default(), &self.pod(req)).await {
            Ok(created) => {
                cache.wrote(ticket, created);
                Ok(id)
            }
            // Keyed on the name: a repeat after a crash finds the pod it made.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(id),
            Err(e) => Err(self.error(Op::Create, Some(id.as_str()), e)),
        }
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let (api, name) = self.pod_api(id, Op::Get)?;
        let cache = self.listed(Op::Get, Some(id.as_str())).await?;
        let namespace = parse_id(id).map(|(ns, _)| ns).unwrap_or_default();
        if let Some(pod) = cache.get(&ObjectKey::new(namespace, name)) {
            return Ok(self.instance(&pod));
        }
        // Not among the managed pods the watch has seen: gone (404,
        // NotFound: the reconcile treats it as vanished), released, or not
        // delivered yet. Only the API server can tell.
        match api.get(name).await {
            Ok(pod) => Ok(self.instance(&pod)),
            Err(e) => Err(self.error(Op::Get, Some(id.as_str()), e)),
        }
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (api, name) = self.pod_api(id, Op::Delete)?;
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.error(Op::Delete, Some(id.as_str()), e)),
        }
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (api, name) = self.pod_api(id, Op::Release)?;
        // Without the managed label no installation's GC lists the pod.
        let patch = json!({"metadata": {"labels": {MANAGED_LABEL: null, RELEASED_LABEL: "true"}}});
        let cache = self.watching();
        // Read back as released until the watch sees it leave.
        let ticket = cache.ticket();
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(released) => {
                cache.wrote(ticket, released);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.error(Op::Release, Some(id.as_str()), e)),
        }
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let cache = self.listed(Op::List, None).await?;
        // A pod this process just released is still among the written
        // copies: the label decides.
        let managed = |p: &Pod| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_LABEL))
                .map(String::as_str)
                == Some("true")
        };
        Ok(cache
            .all()
            .iter()
            .filter(|p| managed(p))
            .map(|p| self.instance(p))
            .collect())
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
    fn reasons_come_from_the_pod_and_its_containers() {
        let evicted: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        }))
        .unwrap();
        assert_eq!(
            reason_of(&evicted).as_deref(),
            Some("pod Failed: Evicted: The node was low on resource: memory.")
        );
        let crashing: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "squid", "image": "squid", "imageID": "", "ready": false, "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting failed container"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}
            }]}
        }))
        .unwrap();
        assert_eq!(
            reason_of(&crashing).as_deref(),
            Some(
                "container squid waiting: CrashLoopBackOff: back-off 1m20s restarting failed container; last exit: Error (exit code 1)"
            )
        );
        let done: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "squid", "image": "squid", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
            }]}
        }))
        .unwrap();
        assert_eq!(
            reason_of(&done).as_deref(),
            Some("container squid terminated: OOMKilled (exit code 137)")
        );
        let starting: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "squid", "image": "squid", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}
            }]}
        }))
        .unwrap();
        assert_eq!(reason_of(&starting), None, "a normal start needs no reason");
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
        let conf = squid_config(3128, &DestinationPolicy::default());
        for line in [
            "http_port 3128",
            "http_access allow all",
            "via off",
            "forwarded_for delete",
            "httpd_suppress_version_string on",
            "visible_hostname egress-proxy",
            "reply_header_access X-Cache deny all",
            "max_filedescriptors 16384",
            "http_access deny manager",
        ] {
            assert!(conf.lines().any(|l| l == line), "missing {line:?}");
        }
    }
}
