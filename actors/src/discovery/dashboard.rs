//! The supervisor dashboard: `GET /dashboard` serves one self-contained page
//! (HTML, CSS and JS embedded in the binary, nothing fetched from elsewhere)
//! that polls `GET /v1/dashboard` — the same JSON tests read.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use actix::Addr;
use actix_web::{HttpResponse, web};
use data_encoding::BASE64;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::errors::ApiError;
use crate::lease_store::{GetLeaseDashboard, LeaseStore};
use crate::supervision::{self, ActorInfo, ImageInfo};

const PAGE: &str = include_str!("dashboard.html");

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dashboard {
    generated_at: String,
    proxies: Vec<ProxyRow>,
    /// Proxies per phase.
    phases: BTreeMap<String, usize>,
    leases: LeaseSummary,
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
    active_leases: u32,
    attributes: BTreeMap<String, String>,
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

pub async fn data(store: web::Data<Addr<LeaseStore>>) -> Result<HttpResponse, ApiError> {
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
            active_leases: v.active_leases,
            attributes: v.availability.attributes.clone(),
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
        kvm_hosts,
        images: supervision::images(),
        actors,
    };
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(body))
}
