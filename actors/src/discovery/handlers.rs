//! The discovery API's endpoints.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::Addr;
use actix_web::{HttpRequest, HttpResponse, web};
use egress_proxies::lease::{AcquireError, AcquireRequest, Outcome};

use super::errors::ApiError;
use super::types::{ErrorBody, Lease, LeaseReport, LeaseRequest, LeasedProxy, ProxyInfo, ReportOutcome};
use crate::lease_store::{Acquire, LeaseStore, ListProxies, Release, Report};

fn mailbox(e: actix::MailboxError) -> ApiError {
    ApiError::Internal(format!("lease store unavailable: {e}"))
}

/// List proxies, optionally filtered by attributes (`attr=k=v`, repeatable) and health.
#[utoipa::path(
    get, path = "/v1/proxies", tag = "proxies",
    params(
        ("attr" = Option<Vec<String>>, Query, description = "`key=value` the proxy's attributes must contain; repeatable"),
        ("healthy" = Option<bool>, Query, description = "only proxies with this health verdict"),
    ),
    responses(
        (status = 200, description = "The proxies", body = [ProxyInfo]),
        (status = 400, description = "Malformed filter", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_proxies(
    req: HttpRequest,
    store: web::Data<Addr<LeaseStore>>,
) -> Result<HttpResponse, ApiError> {
    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    let mut healthy: Option<bool> = None;
    for (key, value) in url::form_urlencoded::parse(req.query_string().as_bytes()) {
        match key.as_ref() {
            "attr" => {
                let (k, v) = value
                    .split_once('=')
                    .ok_or_else(|| ApiError::Invalid(format!("attr {value:?} must be key=value")))?;
                wanted.insert(k.to_owned(), v.to_owned());
            }
            "healthy" => {
                healthy =
                    Some(value.parse().map_err(|_| {
                        ApiError::Invalid(format!("healthy {value:?} must be true or false"))
                    })?);
            }
            other => return Err(ApiError::Invalid(format!("unknown query parameter {other:?}"))),
        }
    }
    let proxies = store.send(ListProxies).await.map_err(mailbox)?;
    let listed: Vec<ProxyInfo> = proxies
        .into_iter()
        .filter(|p| {
            wanted
                .iter()
                .all(|(k, v)| p.availability.attributes.get(k) == Some(v))
        })
        .filter(|p| healthy.is_none_or(|h| p.availability.healthy == Some(h)))
        .map(|p| ProxyInfo {
            name: p.availability.key.name,
            namespace: p.availability.key.namespace,
            url: p.availability.url,
            attributes: p.availability.attributes,
            phase: p.availability.phase,
            healthy: p.availability.healthy,
            latency_ms: p.availability.latency.map(|l| l.as_millis() as u64),
            active_leases: p.active_leases,
        })
        .collect();
    Ok(HttpResponse::Ok().json(listed))
}

/// Take a lease on the best eligible proxy for a target.
#[utoipa::path(
    post, path = "/v1/leases", tag = "leases", request_body = LeaseRequest,
    responses(
        (status = 201, description = "Leased", body = Lease),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "No eligible proxy (`no_capacity`), or this replica is not the leader (`not_leader`)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn acquire(
    body: web::Json<LeaseRequest>,
    store: web::Data<Addr<LeaseStore>>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let request = AcquireRequest {
        target: body.target,
        selector: body.selector,
        ttl: body.ttl_seconds.map(Duration::from_secs),
        client: body.client,
    };
    let grant = store
        .send(Acquire(request))
        .await
        .map_err(mailbox)?
        .map_err(|e| match e {
            AcquireError::NoCapacity { .. } => ApiError::NoCapacity(e.to_string()),
            AcquireError::Unavailable(why) => ApiError::Unavailable(why),
            AcquireError::NotLeader => ApiError::NotLeader,
            other => ApiError::Invalid(other.to_string()),
        })?;
    let expires_at = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(grant.ttl).unwrap_or(jiff::SignedDuration::ZERO))
        .map(|t| t.to_string())
        .unwrap_or_default();
    Ok(HttpResponse::Created().json(Lease {
        id: grant.id,
        proxy: LeasedProxy {
            name: grant.proxy.name,
            namespace: grant.proxy.namespace,
            url: grant.url,
            attributes: grant.attributes,
        },
        target: grant.target,
        expires_at,
    }))
}

/// Release a lease (idempotent: unknown and expired ids also answer 204).
#[utoipa::path(
    delete, path = "/v1/leases/{id}", tag = "leases",
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 204, description = "Released (or already gone)"),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn release(
    id: web::Path<String>,
    store: web::Data<Addr<LeaseStore>>,
) -> Result<HttpResponse, ApiError> {
    store.send(Release(id.into_inner())).await.map_err(mailbox)?;
    Ok(HttpResponse::NoContent().finish())
}

/// Report how using a lease went (also after release, for a while).
#[utoipa::path(
    post, path = "/v1/leases/{id}/report", tag = "leases", request_body = LeaseReport,
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 204, description = "Recorded"),
        (status = 400, description = "Malformed report", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown lease (`unknown_lease`)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn report(
    id: web::Path<String>,
    body: web::Json<LeaseReport>,
    store: web::Data<Addr<LeaseStore>>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let outcome = match body.outcome {
        ReportOutcome::Ok => Outcome::Ok,
        ReportOutcome::Blocked => Outcome::Blocked,
        ReportOutcome::Error => Outcome::Error,
    };
    store
        .send(Report {
            id: id.into_inner(),
            outcome,
            detail: body.detail,
        })
        .await
        .map_err(mailbox)?
        .map_err(|e| ApiError::UnknownLease(e.to_string()))?;
    Ok(HttpResponse::NoContent().finish())
}

/// Liveness of the API (never authenticated, never traced).
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "Alive")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok")
}
