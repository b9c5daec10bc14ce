//! The API's operations as its OpenAPI document describes them: path,
//! method, parameters, bodies and answers. `actors/src/discovery/handlers.rs`
//! serves each one under the same name. The functions have no body: utoipa
//! reads their attribute, their doc comment (the operation's summary) and
//! their name (its `operationId`, which the document's links name).

use super::bodies::{ErrorBody, Lease, LeaseReport, LeaseRequest, ProxyInfo, RenewRequest, Renewal};

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
pub fn list_proxies() {}

/// Take a lease on the best eligible proxy for a target.
#[utoipa::path(
    post, path = "/v1/leases", tag = "leases", request_body = LeaseRequest,
    responses(
        (status = 201, description = "Leased", body = Lease),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "No eligible proxy (`no_capacity`), the lease store is full (`lease_store_full`, with `Retry-After`), the lease could not be made durable (`unavailable`), or this replica is not the leader (`not_leader`)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub fn acquire() {}

/// Release a lease (idempotent: unknown and expired ids also answer 204).
#[utoipa::path(
    delete, path = "/v1/leases/{id}", tag = "leases",
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 204, description = "Released (or already gone)"),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 403, description = "The lease is another identity's, or the gateway's (`not_owner`)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub fn release() {}

/// Report how using a lease went (also after release, for a while).
#[utoipa::path(
    post, path = "/v1/leases/{id}/report", tag = "leases", request_body = LeaseReport,
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 204, description = "Recorded"),
        (status = 400, description = "Malformed report", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 403, description = "The lease is another identity's, or the gateway's (`not_owner`)", body = ErrorBody),
        (status = 404, description = "Unknown lease (`unknown_lease`)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub fn report() {}

/// Extend a held lease from now, by `ttlSeconds` or by its TTL as granted.
#[utoipa::path(
    post, path = "/v1/leases/{id}/renew", tag = "leases",
    request_body(content = RenewRequest, description = "Optional; without it the lease's own TTL applies"),
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 200, description = "Renewed", body = Renewal),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 403, description = "The lease is another identity's, or the gateway's (`not_owner`)", body = ErrorBody),
        (status = 404, description = "Unknown or ended lease (`unknown_lease`)", body = ErrorBody),
        (status = 409, description = "The lease's proxy is being retired by its pool (`proxy_retiring`): release the lease and acquire another", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub fn renew() {}

/// Liveness of the API (never authenticated, never traced).
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "Alive")))]
pub fn healthz() {}
