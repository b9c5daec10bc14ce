//! The discovery API's endpoints: one handler per operation of
//! `egress_proxies::adapters::discovery_api::operations`, under its name.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::Addr;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use egress_proxies::adapters::lease_store::{RenewRefused, ReportRefused};
use egress_proxies::adapters::replicas::wire::{ForwardedLeaseCall, LeaseCall};
use egress_proxies::domain::lease::input::{self, InputError, MAX_SELECTOR_PAIRS};
use egress_proxies::domain::lease::{AcquireError, AcquireRequest, Caller, Outcome, RenewError};
use futures::StreamExt;

use super::BODY_LIMIT;
use super::errors::ApiError;
use super::forwarding::Forwarding;
use super::middleware::Identity;
use crate::lease_store_actor::{Acquire, LeaseStoreActor, ListProxies, Release, Renew, Report};
use egress_proxies::adapters::discovery_api::bodies::{
    Lease, LeaseReport, LeaseRequest, LeasedProxy, Object, ProxyInfo, RenewRequest, Renewal, ReportOutcome,
};

/// The lease store did not answer: it is restarting after a crash (the
/// request was in its hands) — a retry is answered by the restarted store.
fn mailbox(e: actix::MailboxError) -> ApiError {
    ApiError::Unavailable(format!("the lease store is restarting ({e}); retry"))
}

impl From<InputError> for ApiError {
    fn from(e: InputError) -> Self {
        ApiError::Invalid(e.to_string())
    }
}

/// RFC 3339 time `ttl` from now.
fn expires_at(ttl: Duration) -> String {
    jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::ZERO))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// List proxies, optionally filtered by attributes (`attr=k=v`, repeatable) and health.
pub async fn list_proxies(
    req: HttpRequest,
    store: web::Data<Addr<LeaseStoreActor>>,
) -> Result<HttpResponse, ApiError> {
    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    let mut healthy: Option<bool> = None;
    let mut filters = 0;
    for (key, value) in url::form_urlencoded::parse(req.query_string().as_bytes()) {
        match key.as_ref() {
            "attr" => {
                filters += 1;
                if filters > MAX_SELECTOR_PAIRS {
                    return Err(InputError::TooManyPairs {
                        field: "attr",
                        count: filters,
                    }
                    .into());
                }
                let (k, v) = value
                    .split_once('=')
                    .ok_or_else(|| ApiError::Invalid(format!("attr {value:?} must be key=value")))?;
                input::check_pair("attr", k, v)?;
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
pub async fn acquire(
    identity: Option<web::ReqData<Identity>>,
    body: web::Json<Object<LeaseRequest>>,
    store: web::Data<Addr<LeaseStoreActor>>,
) -> Result<HttpResponse, ApiError> {
    let owner = caller(identity)?;
    let mut body = body.into_inner().0;
    input::check_attributes("selector", &body.selector)?;
    input::check_client(body.client.as_deref())?;
    input::check_ttl(body.ttl_seconds)?;
    input::select_pool(&mut body.selector, body.pool.as_deref())?;
    let request = AcquireRequest {
        target: input::normalize_target(&body.target)?,
        selector: body.selector,
        ttl: body.ttl_seconds.map(Duration::from_secs),
        client: body.client,
        owner: Some(owner),
        ..AcquireRequest::default()
    };
    let grant = store
        .send(Acquire(request))
        .await
        .map_err(mailbox)?
        .map_err(|e| match e {
            AcquireError::NoCapacity { .. } | AcquireError::OverShare { .. } => {
                ApiError::NoCapacity(e.to_string())
            }
            AcquireError::Unavailable(why) => ApiError::Unavailable(why),
            AcquireError::NotLeader => ApiError::NotLeader,
            AcquireError::Full(full) => ApiError::StoreFull(full),
            other => ApiError::Invalid(other.to_string()),
        })?;
    let expires_at = expires_at(grant.ttl);
    let url = match &grant.credentials {
        Some(c) => c.url_with_userinfo(&grant.url).unwrap_or(grant.url),
        None => grant.url,
    };
    let (username, password) = grant.credentials.map(|c| (c.username, c.password)).unzip();
    Ok(HttpResponse::Created().json(Lease {
        id: grant.id,
        proxy: LeasedProxy {
            name: grant.proxy.name,
            namespace: grant.proxy.namespace,
            url,
            attributes: grant.attributes,
            username,
            password,
        },
        target: grant.target,
        expires_at,
    }))
}

/// Release a lease (idempotent: unknown and expired ids also answer 204).
pub async fn release(
    identity: Option<web::ReqData<Identity>>,
    id: web::Path<String>,
    store: web::Data<Addr<LeaseStoreActor>>,
    forwarding: web::Data<Option<Forwarding>>,
) -> Result<HttpResponse, ApiError> {
    let by = caller(identity)?;
    let id = id.into_inner();
    if let Some(f) = forwarding.as_ref()
        && let Some(answer) = f.elsewhere(&id, &by, LeaseCall::Release, false).await?
    {
        return Ok(answer);
    }
    release_here(&store, id, by).await
}

/// A release served by this replica's lease store.
pub async fn release_here(
    store: &Addr<LeaseStoreActor>,
    id: String,
    by: String,
) -> Result<HttpResponse, ApiError> {
    store
        .send(Release {
            id,
            by: Caller::Identity(by),
        })
        .await
        .map_err(mailbox)?
        .map_err(|e| ApiError::NotOwner(e.to_string()))?;
    Ok(HttpResponse::NoContent().finish())
}

/// The identity the request authenticated as. Every crawler route sits
/// behind the authentication that sets it (the read-only token, which
/// does not, may only `GET`).
fn caller(identity: Option<web::ReqData<Identity>>) -> Result<String, ApiError> {
    identity.map(|i| i.into_inner().0).ok_or(ApiError::Unauthorized)
}

/// Report how using a lease went (also after release, for a while).
pub async fn report(
    identity: Option<web::ReqData<Identity>>,
    id: web::Path<String>,
    body: web::Json<Object<LeaseReport>>,
    store: web::Data<Addr<LeaseStoreActor>>,
    forwarding: web::Data<Option<Forwarding>>,
) -> Result<HttpResponse, ApiError> {
    let by = caller(identity)?;
    let body = body.into_inner().0;
    input::check_detail(body.detail.as_deref())?;
    let id = id.into_inner();
    if let Some(f) = forwarding.as_ref() {
        let call = LeaseCall::Report {
            outcome: body.outcome.clone(),
            detail: body.detail.clone(),
        };
        if let Some(answer) = f.elsewhere(&id, &by, call, false).await? {
            return Ok(answer);
        }
    }
    report_here(&store, id, body.outcome, body.detail, by).await
}

/// A report served by this replica's lease store.
pub async fn report_here(
    store: &Addr<LeaseStoreActor>,
    id: String,
    outcome: ReportOutcome,
    detail: Option<String>,
    by: String,
) -> Result<HttpResponse, ApiError> {
    let outcome = match outcome {
        ReportOutcome::Ok => Outcome::Ok,
        ReportOutcome::Blocked => Outcome::Blocked,
        ReportOutcome::Error => Outcome::Error,
    };
    store
        .send(Report {
            id,
            outcome,
            detail,
            by: Caller::Identity(by),
        })
        .await
        .map_err(mailbox)?
        .map_err(|e| match e {
            ReportRefused::Unknown(e) => ApiError::UnknownLease(e.to_string()),
            ReportRefused::NotOwner(e) => ApiError::NotOwner(e.to_string()),
        })?;
    Ok(HttpResponse::NoContent().finish())
}

/// Extend a held lease from now, by `ttlSeconds` or by its TTL as granted.
pub async fn renew(
    identity: Option<web::ReqData<Identity>>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
    store: web::Data<Addr<LeaseStoreActor>>,
    forwarding: web::Data<Option<Forwarding>>,
) -> Result<HttpResponse, ApiError> {
    let by = caller(identity)?;
    let Object(body) = optional_json::<Object<RenewRequest>>(&req, payload).await?;
    input::check_ttl(body.ttl_seconds)?;
    let id = id.into_inner();
    if let Some(f) = forwarding.as_ref() {
        let call = LeaseCall::Renew {
            ttl_seconds: body.ttl_seconds,
        };
        if let Some(answer) = f.elsewhere(&id, &by, call, false).await? {
            return Ok(answer);
        }
    }
    renew_here(&store, id, body.ttl_seconds, by).await
}

/// A renewal served by this replica's lease store.
pub async fn renew_here(
    store: &Addr<LeaseStoreActor>,
    id: String,
    ttl_seconds: Option<u64>,
    by: String,
) -> Result<HttpResponse, ApiError> {
    let ttl = store
        .send(Renew {
            id: id.clone(),
            ttl: ttl_seconds.map(Duration::from_secs),
            by: Caller::Identity(by),
        })
        .await
        .map_err(mailbox)?
        .map_err(|e| match e {
            RenewRefused::NotOwner(e) => ApiError::NotOwner(e.to_string()),
            RenewRefused::Renew(RenewError::Unknown(u)) => ApiError::UnknownLease(u.to_string()),
            RenewRefused::Renew(RenewError::Unavailable(why)) => ApiError::Unavailable(why),
            RenewRefused::Renew(RenewError::NotLeader) => ApiError::NotLeader,
            RenewRefused::Renew(retiring @ RenewError::Retiring(_)) => {
                ApiError::ProxyRetiring(retiring.to_string())
            }
            RenewRefused::Renew(other) => ApiError::Invalid(other.to_string()),
        })?;
    Ok(HttpResponse::Ok().json(Renewal {
        id,
        expires_at: expires_at(ttl),
        ttl_seconds: ttl.as_secs(),
    }))
}

/// A lease call another replica forwarded here (its client's identity
/// with it), answered as this replica's own API would answer it.
pub async fn serve_forwarded(
    store: &Addr<LeaseStoreActor>,
    forwarding: Option<&Forwarding>,
    id: String,
    call: ForwardedLeaseCall,
) -> HttpResponse {
    let answer = async {
        if let Some(f) = forwarding
            && let Some(answer) = f.elsewhere(&id, &call.caller, call.call.clone(), true).await?
        {
            return Ok(answer);
        }
        match call.call {
            LeaseCall::Release => release_here(store, id, call.caller).await,
            LeaseCall::Renew { ttl_seconds } => {
                input::check_ttl(ttl_seconds)?;
                renew_here(store, id, ttl_seconds, call.caller).await
            }
            LeaseCall::Report { outcome, detail } => {
                input::check_detail(detail.as_deref())?;
                report_here(store, id, outcome, detail, call.caller).await
            }
        }
    }
    .await;
    answer.unwrap_or_else(|e| actix_web::ResponseError::error_response(&e))
}

/// A JSON body that may be absent (empty reads as `{}`), read up to the body limit.
async fn optional_json<T: serde::de::DeserializeOwned>(
    req: &HttpRequest,
    mut payload: web::Payload,
) -> Result<T, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::Invalid(format!("reading the body: {e}")))?;
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(ApiError::TooLarge(BODY_LIMIT));
        }
        body.extend_from_slice(&chunk);
    }
    if body.is_empty() {
        body.extend_from_slice(b"{}");
    } else {
        let content_type = req.content_type().to_ascii_lowercase();
        if content_type != "application/json" && !content_type.ends_with("+json") {
            return Err(ApiError::Invalid(
                "Content type error: a body must be application/json".into(),
            ));
        }
    }
    serde_json::from_slice(&body).map_err(|e| ApiError::Invalid(format!("Json deserialize error: {e}")))
}

/// Liveness of the API (never authenticated, never traced).
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok")
}
