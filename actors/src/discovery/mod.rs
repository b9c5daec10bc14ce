//! The discovery API for crawler clients (`--discovery-bind-address`):
//! list proxies, take, report on and release leases. JSON in and out,
//! errors as `{error, message}`, optional bearer auth, bodies capped,
//! OpenAPI at `/v1/openapi.json`.

mod dashboard;
mod errors;
mod handlers;
mod middleware;
pub mod types;

use std::net::TcpListener;
use std::sync::Arc;

use actix::Addr;
use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpResponse, HttpServer, web};
use utoipa::OpenApi;

use crate::lease_store::LeaseStore;
use errors::ApiError;
use middleware::Token;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "egress-proxies-operator discovery API",
        description = "Lists the egress proxy fleet and hands proxies out to crawler clients as leases."
    ),
    paths(handlers::list_proxies, handlers::acquire, handlers::release, handlers::report, handlers::healthz),
    components(schemas(
        types::ProxyInfo, types::LeaseRequest, types::Lease, types::LeasedProxy,
        types::LeaseReport, types::ReportOutcome, types::ErrorBody
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document as JSON.
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(openapi_json())
}

/// A resource whose handler panics answer 500 instead of killing the worker.
/// (Resource level: after routing, where holding a request clone is safe.)
pub fn guarded(
    path: &str,
) -> actix_web::Resource<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<actix_web::body::BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    web::resource(path).wrap(from_fn(middleware::contain_panics))
}

/// Serves the discovery API on a bound listener. `token` (from
/// `DISCOVERY_TOKEN`) enables bearer auth.
pub fn start(
    listener: TcpListener,
    store: Addr<LeaseStore>,
    token: Option<String>,
) -> std::io::Result<Server> {
    let addr = listener.local_addr()?;
    if token.is_none() {
        tracing::warn!(
            %addr,
            "DISCOVERY_TOKEN is not set: the discovery API serves WITHOUT authentication; \
             anyone who can reach it can lease proxies"
        );
    }
    let token = Token(token.map(Arc::new));
    let store = web::Data::new(store);
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
        let (page_token, data_token) = (token.clone(), token.clone());
        App::new()
            .route("/healthz", web::get().to(handlers::healthz))
            // The dashboard polls every second: authenticated, but neither
            // logged nor traced per request.
            .service(
                guarded("/v1/dashboard")
                    .app_data(store.clone())
                    .wrap(from_fn(move |req, next| {
                        middleware::authenticate(data_token.clone(), req, next)
                    }))
                    .route(web::get().to(dashboard::data)),
            )
            .service(
                guarded("/dashboard")
                    .wrap(from_fn(move |req, next| {
                        middleware::authenticate(page_token.clone(), req, next)
                    }))
                    .route(web::get().to(dashboard::page)),
            )
            .service(
                web::scope("")
                    .app_data(store.clone())
                    .app_data(json)
                    .app_data(web::PayloadConfig::new(BODY_LIMIT))
                    .wrap(from_fn(move |req, next| {
                        middleware::authenticate(token.clone(), req, next)
                    }))
                    .wrap(tracing_actix_web::TracingLogger::default())
                    .wrap(from_fn(middleware::traced))
                    .service(guarded("/v1/proxies").route(web::get().to(handlers::list_proxies)))
                    .service(guarded("/v1/leases").route(web::post().to(handlers::acquire)))
                    .service(guarded("/v1/leases/{id}").route(web::delete().to(handlers::release)))
                    .service(guarded("/v1/leases/{id}/report").route(web::post().to(handlers::report)))
                    .service(guarded("/v1/openapi.json").route(web::get().to(openapi)))
                    .default_service(web::to(|| async { Err::<HttpResponse, _>(ApiError::NotFound) })),
            )
    })
    .disable_signals()
    .listen(listener)?
    .run();
    Ok(server)
}
