//! The supervisor dashboard: `GET /dashboard` serves one self-contained page
//! (HTML, CSS and JS embedded in the binary, nothing fetched from elsewhere)
//! that follows `GET /v1/dashboard/stream` ([`super::dashboard_feed`]):
//! every second the JSON `GET /v1/dashboard` answers, and the recent
//! history as charts.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use actix::Addr;
use actix_web::{HttpResponse, web};
use data_encoding::BASE64;
use egress_proxies::adapters::providers::kvm::host::{ImageInfo, images};
use egress_proxies::telemetry::gateway_stats::{GatewaySummary, gateway_stats};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::errors::ApiError;
use crate::lease_store_actor::{GetLeaseDashboard, LeaseStoreActor, PoolReport};
use crate::replicas::view::ReplicaFigures;
use crate::supervision::{self, ActorInfo};

const PAGE: &str = include_str!("dashboard.html");

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dashboard {
    generated_at: String,
    proxies: Vec<ProxyRow>,
    /// Proxies per phase.
    phases: BTreeMap<String, usize>,
    leases: LeaseSummary,
    pools: Vec<PoolRow>,
    /// Every replica serving: this replica's view of the replicas (`null`
    /// otherwise: the page leaves the section out).
    replicas: Option<ReplicasSection>,
    /// This process's gateway traffic (all zero without a gateway).
    gateway: GatewaySummary,
    kvm_hosts: Vec<HostRow>,
    images: Vec<ImageInfo>,
    actors: Vec<ActorInfo>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProxyRow {
    namespace: String,
    name: String,
    phase: String,
    healthy: Option<bool>,
    ready: bool,
    latency_ms: Option<u64>,
    url: Option<String>,
    /// The realm its own 407 names, when known (no secret).
    realm: Option<String>,
    active_leases: u32,
    attributes: BTreeMap<String, String>,
    /// Targets it was reported blocked by, and its reported errors.
    blocked_targets: u32,
    errors: u32,
}

/// One ProxyPool as its PoolActor last saw it: the figures of the status
/// it wrote, and its lease demand.
#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct PoolRow {
    namespace: String,
    name: String,
    /// Members aimed for (`spec.replicas`, or the autoscaler's choice).
    desired: u32,
    /// Members, retiring ones included.
    replicas: u32,
    /// Members Ready and not retiring.
    ready: u32,
    /// Leases held on its members.
    leased: u32,
    /// Members being replaced.
    rotating: u32,
    /// Leases its Ready members can hold at once; `None`: unlimited.
    capacity: Option<u32>,
    /// Acquires naming the pool refused for lack of capacity (since its actor started).
    denied: u64,
    /// The `Progressing` condition's reason: `Steady`, `Scaling`, `Rotating`.
    progress: Option<String>,
}

/// The replicas section: the replica's view, and the proxies it knows.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReplicasSection {
    #[serde(flatten)]
    view: ReplicaFigures,
    /// Proxies this replica's lease store knows (from the leader's feed), and the Ready ones.
    proxies_known: usize,
    proxies_ready: usize,
}

/// The pools' rows, by namespace and name.
fn pool_rows(reports: Vec<PoolReport>) -> Vec<PoolRow> {
    let mut rows: Vec<PoolRow> = reports
        .into_iter()
        .map(|r| {
            let s = r.status;
            PoolRow {
                namespace: r.key.namespace,
                name: r.key.name,
                desired: s.desired_replicas.unwrap_or_default(),
                replicas: s.replicas,
                ready: s.ready,
                leased: s.leased,
                rotating: s.rotating,
                capacity: (r.leases_per_member > 0).then(|| s.ready.saturating_mul(r.leases_per_member)),
                denied: r.denied,
                progress: s
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Progressing")
                    .map(|c| c.reason.clone()),
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LeaseSummary {
    active: usize,
    granted: u64,
    denied: u64,
    expired: u64,
    released: u64,
    recent_denials: Vec<Denial>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Denial {
    target: String,
    at: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HostRow {
    host: String,
    state: String,
    connected: bool,
    restarts: u32,
}

/// The page's Content-Security-Policy: its own inline script and style
/// (by hash) and requests to this origin only; nothing may frame it.
static CSP: LazyLock<String> = LazyLock::new(|| {
    let hash = |open: &str, close: &str| {
        let body = PAGE
            .split_once(open)
            .and_then(|(_, rest)| rest.split_once(close))
            .map_or("", |(inner, _)| inner);
        format!("'sha256-{}'", BASE64.encode(&Sha256::digest(body.as_bytes())))
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash("<script>", "</script>"),
        hash("<style>", "</style>"),
    )
});

/// The page holds no data (that comes from `/v1/dashboard`, behind the
/// token), so it is served to anyone; it asks for the token itself.
pub async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("Content-Security-Policy", CSP.as_str()))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(PAGE)
}

pub async fn data(store: web::Data<Addr<LeaseStoreActor>>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(snapshot(&store).await?))
}

/// The page's data as of now.
pub async fn snapshot(store: &Addr<LeaseStoreActor>) -> Result<Dashboard, ApiError> {
    let leases = store
        .send(GetLeaseDashboard)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut proxies: Vec<ProxyRow> = leases
        .proxies
        .into_iter()
        .map(|v| ProxyRow {
            namespace: v.availability.key.namespace.clone(),
            name: v.availability.key.name.clone(),
            phase: v.availability.phase.clone(),
            healthy: v.availability.healthy,
            ready: v.availability.ready,
            latency_ms: v.availability.latency.map(|l| l.as_millis() as u64),
            url: v.availability.url.clone(),
            realm: v.availability.realm.clone(),
            active_leases: v.active_leases,
            attributes: v.availability.attributes.clone(),
            blocked_targets: v.blocked_targets,
            errors: v.errors,
        })
        .collect();
    proxies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut phases = BTreeMap::new();
    for p in &proxies {
        *phases.entry(p.phase.clone()).or_insert(0) += 1;
    }
    let actors = supervision::snapshot();
    let kvm_hosts = actors
        .iter()
        .filter(|a| a.kind == "kvm_host")
        .map(|a| HostRow {
            host: a.id.clone(),
            state: a.state.clone(),
            connected: a.state == "connected",
            restarts: a.restarts,
        })
        .collect();
    let replicas = leases.replicas.map(|view| ReplicasSection {
        view,
        proxies_known: proxies.len(),
        proxies_ready: proxies.iter().filter(|p| p.ready).count(),
    });
    let body = Dashboard {
        generated_at: jiff::Timestamp::now().to_string(),
        proxies,
        phases,
        leases: LeaseSummary {
            active: leases.stats.active,
            granted: leases.stats.granted,
            denied: leases.stats.denied,
            expired: leases.stats.expired,
            released: leases.stats.released,
            recent_denials: leases
                .recent_denials
                .into_iter()
                .map(|(target, at)| Denial {
                    target,
                    at: at.to_string(),
                })
                .collect(),
        },
        pools: pool_rows(leases.pools),
        replicas,
        gateway: gateway_stats().summary(),
        kvm_hosts,
        images: images(),
        actors,
    };
    Ok(body)
}

#[cfg(test)]
mod tests {
    use egress_proxies::domain::resource::ObjectKey;
    use egress_proxies::domain::resource::ProxyPoolStatus;
    use serde_json::json;

    use super::*;

    fn report(namespace: &str, name: &str, leases_per_member: u32, status: serde_json::Value) -> PoolReport {
        PoolReport {
            key: ObjectKey::new(namespace, name),
            status: serde_json::from_value::<ProxyPoolStatus>(status).unwrap(),
            denied: 7,
            leases_per_member,
        }
    }

    #[test]
    fn the_pools_panel_reads_each_pool_s_status_and_demand() {
        let rotating = json!({
            "replicas": 3, "ready": 2, "leased": 5, "rotating": 1, "desiredReplicas": 2,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllReady", "message": "2 of 2 members Ready",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Progressing", "status": "True", "reason": "Rotating",
                 "message": "1 rotating, 3 members for 2 wanted", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        });
        let rows = pool_rows(vec![
            report("crawl", "us", 0, json!({"replicas": 1, "ready": 0})),
            report("crawl", "eu", 4, rotating),
        ]);
        assert_eq!(
            serde_json::to_value(&rows).unwrap(),
            json!([
                {"namespace": "crawl", "name": "eu", "desired": 2, "replicas": 3, "ready": 2, "leased": 5,
                 "rotating": 1, "capacity": 8, "denied": 7, "progress": "Rotating"},
                {"namespace": "crawl", "name": "us", "desired": 0, "replicas": 1, "ready": 0, "leased": 0,
                 "rotating": 0, "capacity": null, "denied": 7, "progress": null}
            ]),
            "sorted by name; capacity is Ready members times leases per member, null when unlimited"
        );
    }
}
