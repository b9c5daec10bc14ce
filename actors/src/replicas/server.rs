//! The internal listener (`--replica-bind-address`): what replicas call on
//! each other. `POST /internal/v1/sync` is answered by the leader's share
//! desk (a replica that does not lead answers 503 `not_leader`, and the
//! member looks for the leader again). Callers prove they are replicas
//! with the token derived from the discovery token; without one the
//! listener is on loopback (checked at start).

use std::net::TcpListener;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::Addr;
use actix_web::dev::Server;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use egress_proxies::adapters::replicas::desk::ShareDesk;
use egress_proxies::adapters::replicas::token::ReplicaToken;
use egress_proxies::adapters::replicas::wire::{ForwardedLeaseCall, LeaseOp, SYNC_PATH, SyncRequest};

use crate::discovery::Forwarding;
use crate::lease_store_actor::LeaseStoreActor;

/// A sync request is at most this large (a member's claims and outbox).
pub const BODY_LIMIT: usize = 32 * 1024 * 1024;
/// Connections the listener keeps at once: a few per replica.
const MAX_CONNECTIONS: usize = 256;

/// The desk this replica answers syncs with while it leads.
#[derive(Clone, Default)]
pub struct DeskSlot(Arc<RwLock<Option<Arc<ShareDesk>>>>);

impl DeskSlot {
    pub fn set(&self, desk: Option<Arc<ShareDesk>>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = desk;
    }

    pub fn get(&self) -> Option<Arc<ShareDesk>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[derive(Clone)]
struct Shared {
    desk: DeskSlot,
    token: Option<ReplicaToken>,
    leases: Addr<LeaseStoreActor>,
    forwarding: Forwarding,
}

impl Shared {
    /// Refuses a caller without the replicas' token (when there is one).
    fn refuses(&self, request: &HttpRequest) -> Option<HttpResponse> {
        let token = self.token.as_ref()?;
        let header = request
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        (!token.accepts(header)).then(|| {
            error(
                actix_web::http::StatusCode::UNAUTHORIZED,
                "unauthorized",
                "not a replica of this installation",
            )
        })
    }
}

fn error(status: actix_web::http::StatusCode, code: &str, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": code, "message": message }))
}

async fn sync(request: HttpRequest, body: web::Bytes, shared: web::Data<Shared>) -> HttpResponse {
    use actix_web::http::StatusCode;
    if let Some(token) = &shared.token {
        let header = request
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !token.accepts(header) {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "not a replica of this installation",
            );
        }
    }
    let sync: SyncRequest = match serde_json::from_slice(&body) {
        Ok(sync) => sync,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid",
                &format!("not a sync request: {e}"),
            );
        }
    };
    let Some(desk) = shared.desk.get() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            "this replica does not lead: look for the leader again",
        );
    };
    match desk.sync(sync).await {
        Ok(answer) => HttpResponse::Ok().json(answer),
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid", &e.to_string()),
    }
}

/// A lease call a replica forwarded to the one holding the lease.
async fn lease_call(
    request: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Bytes,
    shared: web::Data<Shared>,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    if let Some(refused) = shared.refuses(&request) {
        return refused;
    }
    let (id, op) = path.into_inner();
    let call: ForwardedLeaseCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid",
                &format!("not a forwarded lease call: {e}"),
            );
        }
    };
    if LeaseOp::parse(&op) != Some(call.call.op()) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "the path's operation differs from the body's",
        );
    }
    crate::discovery::serve_forwarded(&shared.leases, Some(&shared.forwarding), id, call).await
}

/// Serves the internal listener.
pub fn start(
    listener: TcpListener,
    desk: DeskSlot,
    token: Option<ReplicaToken>,
    leases: Addr<LeaseStoreActor>,
    forwarding: Forwarding,
) -> std::io::Result<Server> {
    let shared = web::Data::new(Shared {
        desk,
        token,
        leases,
        forwarding,
    });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(web::PayloadConfig::new(BODY_LIMIT))
            .route(SYNC_PATH, web::post().to(sync))
            .route("/internal/v1/leases/{id}/{op}", web::post().to(lease_call))
    })
    .max_connections(MAX_CONNECTIONS)
    .client_request_timeout(Duration::from_secs(10))
    .workers(2)
    .listen(listener)?
    .run();
    Ok(server)
}
