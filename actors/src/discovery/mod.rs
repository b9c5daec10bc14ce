//! The discovery API for crawler clients (`--discovery-bind-address`):
//! list proxies, take, report on and release leases. JSON in and out,
//! errors as `{error, message}`, optional bearer auth, bodies capped,
//! OpenAPI at `/v1/openapi.json`. The contract it serves — routes, bodies,
//! error codes, the document — is the library's
//! (`egress_proxies::adapters::discovery_api`); this is the actix-web side.

mod dashboard;
mod dashboard_feed;
mod errors;
mod forwarding;
mod handlers;
mod limiter;
mod middleware;

use std::net::TcpListener;

use actix::Addr;
use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpResponse, HttpServer, web};
use egress_proxies::adapters::discovery_api::{openapi_json, routes};
use egress_proxies::file_limit;
use egress_proxies::listener_limits::{Listener, ListenerLimits};
use egress_proxies::rate_limit::RateLimits;

use crate::lease_store_actor::LeaseStoreActor;
use errors::ApiError;
pub use forwarding::Forwarding;
pub use handlers::serve_forwarded;
pub use limiter::Limiter;
pub use middleware::{Identity, Tokens, TokensError};

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(openapi_json())
}

/// A resource whose handler panics answer 500 instead of killing the worker,
/// and which answers 405 with `Allow: allow` to other methods.
/// (Resource level: after routing, where holding a request clone is safe.)
pub fn guarded(
    path: &str,
    allow: &'static str,
) -> actix_web::Resource<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<actix_web::body::BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    resource(path, allow).wrap(from_fn(middleware::contain_panics))
}

/// A resource that answers 405 with `Allow` to any method but its own.
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move || async move {
        Err::<HttpResponse, _>(ApiError::MethodNotAllowed(allow))
    }))
}

/// Serves the discovery API on a bound listener, behind `tokens`, within
/// [`ListenerLimits`].
pub fn start(listener: TcpListener, store: Addr<LeaseStoreActor>, tokens: Tokens) -> std::io::Result<Server> {
    start_with(listener, store, tokens, Limiter::new(RateLimits::default()), None)
}

/// [`start`] with the given rate limiter (tests pass small limits and read
/// how many clients it tracks).
pub fn start_with(
    listener: TcpListener,
    store: Addr<LeaseStoreActor>,
    tokens: Tokens,
    limiter: Limiter,
    forwarding: Option<Forwarding>,
) -> std::io::Result<Server> {
    let addr = listener.local_addr()?;
    if tokens.is_open() {
        tracing::warn!(
            %addr,
            "DISCOVERY_TOKEN is not set: the discovery API serves WITHOUT authentication; \
             anyone who can reach it can lease proxies"
        );
    }
    let memory_limit = egress_proxies::memory_limit::current();
    let limits = ListenerLimits::of(Listener::Discovery, file_limit::current())
        .within_memory(Listener::Discovery, memory_limit);
    let workers = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    tracing::info!(
        %addr,
        max_connections = limits.max_connections,
        memory_limit = memory_limit.map(tracing::field::display),
        workers,
        "discovery API connection limits (the cap fits the file and memory limits)"
    );
    let token = tokens;
    let feed = web::Data::new(dashboard_feed::Feed::start(store.clone()));
    let store = web::Data::new(store);
    let forwarding = web::Data::new(forwarding);
    let server = HttpServer::new(move || {
        let token = token.clone();
        let json = web::JsonConfig::default()
            .limit(BODY_LIMIT)
            .error_handler(|err, _| {
                let api = match &err {
                    actix_web::error::JsonPayloadError::Overflow { .. }
                    | actix_web::error::JsonPayloadError::OverflowKnownLength { .. } => {
                        ApiError::TooLarge(BODY_LIMIT)
                    }
                    other => ApiError::Invalid(other.to_string()),
                };
                actix_web::error::InternalError::from_response(
                    err,
                    actix_web::ResponseError::error_response(&api),
                )
                .into()
            });
        // /healthz sits outside the middleware: never authenticated, never logged per request.
        let data_token = token.clone();
        let stream_token = token.clone();
        let limiter = limiter.clone();
        // The rate limits, outermost on every resource but /healthz: a flood
        // is refused before it is authenticated or logged. A stream counts
        // once, when it opens.
        let (data_limiter, stream_limiter, page_limiter) =
            (limiter.clone(), limiter.clone(), limiter.clone());
        App::new()
            .service(resource("/healthz", "GET").route(web::get().to(handlers::healthz)))
            // The dashboard's data: authenticated, but neither logged nor
            // traced per request (a stream lasts minutes, a script may poll).
            .service(
                guarded("/v1/dashboard", "GET")
                    .app_data(store.clone())
                    .wrap(from_fn(move |req, next| {
                        middleware::authenticate(data_token.clone(), req, next)
                    }))
                    .wrap(from_fn(move |req, next| {
                        limiter::limit(data_limiter.clone(), req, next)
                    }))
                    .route(web::get().to(dashboard::data)),
            )
            .service(
                guarded("/v1/dashboard/stream", "GET")
                    .app_data(store.clone())
                    .app_data(feed.clone())
                    .wrap(from_fn(move |req, next| {
                        middleware::authenticate(stream_token.clone(), req, next)
                    }))
                    .wrap(from_fn(move |req, next| {
                        limiter::limit(stream_limiter.clone(), req, next)
                    }))
                    .route(web::get().to(dashboard_feed::stream)),
            )
            // The page holds no data and asks for the token itself.
            .service(
                guarded("/dashboard", "GET")
                    .wrap(from_fn(move |req, next| {
                        limiter::limit(page_limiter.clone(), req, next)
                    }))
                    .route(web::get().to(dashboard::page)),
            )
            .service(
                web::scope("")
                    .app_data(store.clone())
                    .app_data(forwarding.clone())
                    .app_data(json)
                    .app_data(web::PayloadConfig::new(BODY_LIMIT))
                    .wrap(from_fn(move |req, next| {
                        middleware::authenticate(token.clone(), req, next)
                    }))
                    .wrap(from_fn(middleware::traced))
                    .wrap(from_fn(move |req, next| {
                        limiter::limit(limiter.clone(), req, next)
                    }))
                    .service(guarded(routes::PROXIES, "GET").route(web::get().to(handlers::list_proxies)))
                    .service(guarded(routes::LEASES, "POST").route(web::post().to(handlers::acquire)))
                    .service(guarded(routes::LEASE, "DELETE").route(web::delete().to(handlers::release)))
                    .service(guarded(routes::LEASE_REPORT, "POST").route(web::post().to(handlers::report)))
                    .service(guarded(routes::LEASE_RENEW, "POST").route(web::post().to(handlers::renew)))
                    .service(guarded(routes::OPENAPI, "GET").route(web::get().to(openapi)))
                    .default_service(web::to(|| async { Err::<HttpResponse, _>(ApiError::NotFound) })),
            )
    })
    .workers(workers)
    .max_connections(limits.per_worker(workers))
    .client_request_timeout(limits.request_head_timeout)
    .keep_alive(limits.keep_alive)
    .client_disconnect_timeout(limits.disconnect_timeout)
    .disable_signals()
    .listen(listener)?
    .run();
    Ok(server)
}
