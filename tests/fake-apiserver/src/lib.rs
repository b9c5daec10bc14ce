//! A faithful in-memory Kubernetes API server for tests: real HTTP on
//! loopback, so the operator's unchanged `kube::Client` talks to it.
//!
//! Semantics kept (from the Kubernetes API conventions): a global
//! resourceVersion counter; list and watch (resume from a version, 410 Gone
//! when too old, bookmarks, synthetic ADDED without a version); the status
//! subresource (main writes keep status, status writes touch nothing else);
//! `generation` bumped only on spec changes; finalizers and
//! deletionTimestamp (a delete with finalizers only marks the object, removing
//! the last finalizer deletes it, no new finalizers while deleting); 409 on a
//! stale resourceVersion and on existing names; merge patch and JSON patch
//! (with `test`); label selectors (equality and set-based) and the
//! `metadata.name`/`metadata.namespace` field selectors; generateName; the
//! scale subresource (`autoscaling/v1` Scale over `.spec.replicas`); the
//! owner-reference garbage collector with background and orphan propagation
//! (run at once when an owner leaves storage, where the real one runs soon
//! after).
//!
//! A network partition: [`FakeApiServer::link`] opens another address to the
//! same server (another network path); [`FakeApiServer::stall`] holds every
//! request and watch event on one address unanswered, connection open, until
//! [`FakeApiServer::resume`] — then they are answered as if the packets had
//! finally arrived (a stale write then meets its 409).
//!
//! An outage: [`FakeApiServer::go_down`] stops serving on one address
//! (connections refused, open ones and their watches cut) and
//! [`FakeApiServer::come_back`] serves there again as a restarted API
//! server does: its watch cache starts afresh, so a watch resumed from a
//! version before the restart answers `410 Expired` and the client lists
//! again.
//!
//! `managedFields`: every write records its field manager (the request's
//! `fieldManager`, else the User-Agent up to the first `/`) with operation
//! `Update`, the time and the fields it changed; clients cannot set them.
//! Simplified: a manager's fields are not taken away from the others.
//! A denying validating admission webhook can be installed per resource
//! and name prefix ([`State::deny`]): writes answer `403` as the API
//! server's do.
//!
//! Discovery and OpenAPI v3 as kubectl reads them (see the `discovery`
//! module), so the real `kubectl apply` works against it. With
//! [`FakeApiServer::start_cluster`] it keeps a cluster's rules too: objects
//! only in namespaces that exist, namespace deletion emptying the namespace,
//! custom kinds served only while their CRD exists (see [`State::cluster`]).
//!
//! Request bodies in protobuf, as kubectl's typed commands send them, are
//! decoded for Secrets, ConfigMaps and Namespaces (the `protobuf` module).
//!
//! API Priority and Fairness, off by default (every request served):
//! [`FakeApiServer::limit_rate`]`(per_second, burst)` gives each priority
//! level a token bucket of that size; a request past it is answered `429
//! Too Many Requests` with `Retry-After` (whole seconds, at least 1) and a
//! `Status` of reason `TooManyRequests`. Lease requests
//! (`coordination.k8s.io`) are the leader-election level, with a budget of
//! their own that bulk traffic cannot spend; watches are long-running and
//! never refused. Simplified: no queueing before the refusal (the `fairness`
//! module). Over HTTP, `PUT /debug/rate` `{"perSecond", "burst"}` sets the
//! same limit at run time (`{"perSecond": null}` lifts it). Note that kube 5's `Client` retries a `429` by default after its
//! `Retry-After`; `kube::Config::default_retry = false` shows each answer.
//!
//! Every request served is counted by verb, group, resource (with its
//! subresource, `proxies/status`) and status code, refusals too:
//! [`FakeApiServer::requests`], and `GET /debug/requests` as JSON
//! (`{"total", "requests": [{"verb", "group", "resource", "code", "count"}]}`,
//! read back by [`RequestCounts::from_json`]; that path is never counted,
//! limited or stalled). Each address counts its own too, so a test that
//! gives every client its own [`link`](FakeApiServer::link) can tell whose
//! requests were whose: [`FakeApiServer::link_requests`], and the `link`
//! member of `GET /debug/requests` asked on that address (`{"addr",
//! "total", "requests"}`, the same shape).
//!
//! Whether the operator honours `Retry-After` (the `retry_after` module):
//! each `429` answered to a request with the kubeconfig's token is
//! remembered with its wait, and the same request sent again before the
//! wait is over counts as an early retry ([`FakeApiServer::retry_after`],
//! and the `retryAfter` member of `GET /debug/requests`: `{"refused",
//! "early", "onTime", "inFlight", "inFlightMs", "examples"}`, read back by
//! [`RetryAfterReport::from_json`]).
//!
//! As a process of its own (the `fake-apiserver` binary, for a benchmark
//! that must not share the operator's process): `fake-apiserver --listen
//! 127.0.0.1:PORT [--cluster] [--max-requests-per-second N [--burst M]]
//! [--links N] --kubeconfig-out PATH` serves until killed and writes, once
//! listening, a kubeconfig pointing at itself ([`FakeApiServer::kubeconfig`];
//! port 0 picks a free port, which the kubeconfig names); with `--links N`
//! first one kubeconfig per link, `PATH.link-0` to `PATH.link-<N-1>`, each
//! naming its own address (one per client whose requests are to be told
//! apart).
//!
//! Not modelled (no real API server can run here): schema validation and
//! defaulting (a `fieldValidation` parameter is accepted and not acted on),
//! other admission, RBAC, server-side apply, the schema's patch strategies
//! (strategic merge patch reads merge keys from kubectl's directives: the
//! `strategic` module), foreground deletion, controllers (no Deployment makes pods), pods
//! that actually run.

/// The largest request body the fake takes, as the API server's default
/// `--max-request-bytes` (a larger one is answered `413`).
pub const MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;

mod counts;
mod discovery;
mod fairness;
mod kinds;
mod protobuf;
mod retry_after;
mod reviews;
mod selector;
mod state;
mod strategic;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use fairness::Fairness;

pub use counts::{RequestCounts, RequestKey};
pub use discovery::VERSION;
pub use fairness::Level;
pub use kinds::{KINDS, Kind};
pub use retry_after::{EarlyRetry, IN_FLIGHT, RetryAfterReport};
pub use reviews::Reviews;
pub use selector::Selector;
pub use state::{ApiError, Denial, State, Watcher};

/// One request a client made with the kubeconfig's token (the operator's
/// requests, as opposed to a test's own unauthenticated client).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// RBAC verb: get, list, watch, create, update, patch, delete.
    pub verb: String,
    pub group: String,
    /// Resource, with `/status` for the subresource.
    pub resource: String,
    /// The namespace of the request's path; `None` for a cluster-wide request.
    pub namespace: Option<String>,
}

/// A running fake API server.
#[derive(Clone)]
pub struct FakeApiServer {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    /// Requests made with the kubeconfig's bearer token.
    pub accesses: Arc<Mutex<Vec<Access>>>,
    /// Bookmark period for watches that allow them.
    pub bookmark_every: Duration,
    /// While true, nothing on this address is answered.
    stalled: Arc<watch::Sender<bool>>,
    /// Known tokens and grants for TokenReview and SubjectAccessReview.
    pub reviews: Arc<Mutex<Reviews>>,
    /// The HTTP server on this address, while it serves.
    running: Arc<Mutex<Option<actix_web::dev::ServerHandle>>>,
    /// The priority levels' budgets; `None` (the default) is unlimited.
    fairness: Arc<Mutex<Option<Fairness>>>,
    /// Requests served, by verb, resource and code (every link).
    counts: Arc<Mutex<RequestCounts>>,
    /// The same, on this address only.
    link_counts: Arc<Mutex<RequestCounts>>,
    /// Whether the operator waits out each `429`'s `Retry-After`.
    retries: Arc<Mutex<retry_after::RetryAfterCheck>>,
}

impl FakeApiServer {
    /// Serves on a loopback port; the server runs on the current actix/tokio runtime.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(State::default(), "127.0.0.1:0")
    }

    /// A server with a whole cluster's rules ([`State::cluster`]): the
    /// initial namespaces, objects only in namespaces that exist, custom
    /// kinds only while their CRD exists. What `kubectl apply` meets.
    pub fn start_cluster() -> std::io::Result<Self> {
        Self::start_with(State::cluster(), "127.0.0.1:0")
    }

    /// Serves on a given address (port 0 picks one); `cluster` as in
    /// [`start_cluster`](Self::start_cluster). For the `fake-apiserver`
    /// binary, which serves as a process of its own.
    pub fn start_on(addr: impl ToSocketAddrs, cluster: bool) -> std::io::Result<Self> {
        let state = if cluster {
            State::cluster()
        } else {
            State::default()
        };
        Self::start_with(state, addr)
    }

    fn start_with(state: State, addr: impl ToSocketAddrs) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let fake = Self {
            addr: listener.local_addr()?,
            state: Arc::new(Mutex::new(state)),
            accesses: Arc::new(Mutex::new(Vec::new())),
            bookmark_every: Duration::from_secs(1),
            stalled: Arc::new(watch::Sender::new(false)),
            reviews: Arc::default(),
            running: Arc::default(),
            fairness: Arc::default(),
            counts: Arc::default(),
            link_counts: Arc::default(),
            retries: Arc::default(),
        };
        fake.serve(listener)
    }

    /// Answers `429 Too Many Requests` with `Retry-After` past `per_second`
    /// requests a second (bursts of `burst`), as API Priority and Fairness
    /// does: Lease requests have a budget of their own of the same size, so
    /// bulk traffic does not starve leader election; watches are never
    /// refused. Shared by every [`link`](Self::link). Off by default.
    pub fn limit_rate(&self, per_second: f64, burst: u32) {
        *self.fairness.lock().unwrap_or_else(|p| p.into_inner()) = Some(Fairness::new(per_second, burst));
    }

    /// Serves every request again, however many.
    pub fn unlimit_rate(&self) {
        *self.fairness.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The requests served so far (on every link), by verb, resource and
    /// status code; also `GET /debug/requests` as JSON.
    pub fn requests(&self) -> RequestCounts {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The requests served on this address only (this link's clients'),
    /// counted as [`requests`](Self::requests) counts them; also the `link`
    /// member of `GET /debug/requests` asked on this address.
    pub fn link_requests(&self) -> RequestCounts {
        self.link_counts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `429`s answered to the operator (requests with the
    /// kubeconfig's token) and the requests it sent again before their
    /// `Retry-After` was over (see the `retry_after` module); also the
    /// `retryAfter` member of `GET /debug/requests`.
    pub fn retry_after(&self) -> RetryAfterReport {
        self.retries.lock().unwrap_or_else(|p| p.into_inner()).report()
    }

    /// Another address (a free port on this one's IP) serving the same
    /// objects: a separate network path one client can use, a test can
    /// [`stall`](Self::stall), with request counts of its own
    /// ([`link_requests`](Self::link_requests)).
    pub fn link(&self) -> std::io::Result<Self> {
        let listener = TcpListener::bind((self.addr.ip(), 0))?;
        let link = Self {
            addr: listener.local_addr()?,
            stalled: Arc::new(watch::Sender::new(false)),
            running: Arc::default(),
            link_counts: Arc::default(),
            ..self.clone()
        };
        link.serve(listener)
    }

    /// Cuts this address off: requests (new and held) and watch events get
    /// no answer and their connections stay open, as in a partition.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Heals the cut: everything held is answered now, in no promised order.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    /// Stops serving on this address, as an API server that goes down:
    /// new connections are refused, open ones (watches too) are cut. Other
    /// [`link`](Self::link)s keep serving the same objects.
    pub async fn go_down(&self) {
        let handle = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            handle.stop(false).await;
        }
    }

    /// Serves on this address again, as a restarted API server: the watch
    /// history starts afresh, so resuming a watch from a version before the
    /// restart answers `410 Expired`.
    pub async fn come_back(&self) -> std::io::Result<()> {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if tries >= 100 => return Err(e),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        self.lock().compact();
        self.clone().serve(listener).map(|_| ())
    }

    /// Waits while this address is stalled.
    async fn passable(stalled: &watch::Sender<bool>) {
        let mut rx = stalled.subscribe();
        let _ = rx.wait_for(|s| !*s).await;
    }

    fn serve(self, listener: TcpListener) -> std::io::Result<Self> {
        let fake = self;
        let data = web::Data::new(fake.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                // The API server's --max-request-bytes default: 3 MiB.
                .app_data(web::PayloadConfig::new(MAX_REQUEST_BYTES))
                .default_service(web::to(admit))
        })
        .workers(2)
        .disable_signals()
        .listen(listener)?
        .run();
        *fake.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(server.handle());
        actix_rt::spawn(server);
        Ok(fake)
    }

    /// A kubeconfig (YAML) pointing at this server.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: fake-token\n",
            addr = self.addr
        )
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, with writes recorded as made by `manager`.
    fn lock_as(&self, manager: &str) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.lock();
        manager.clone_into(&mut state.manager);
        state
    }
}

/// A parsed resource path.
struct Target {
    kind: usize,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// The scale subresource.
    scale: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => (Some(ns.to_string()), [&[*plural][..], tail].concat()),
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(*sub)),
        _ => return None,
    };
    // `/api/v1/namespaces/{name}` is the Namespace object itself.
    let kind = kinds::find(group, version, plural)?;
    match sub {
        None | Some("status") => {}
        Some("scale") if KINDS[kind].scale => {}
        Some(_) => return None,
    }
    Some(Target {
        kind,
        namespace,
        name,
        status: sub == Some("status"),
        scale: sub == Some("scale"),
    })
}

fn respond(result: Result<Value, ApiError>, ok: u16) -> HttpResponse {
    match result {
        Ok(v) => HttpResponse::build(actix_web::http::StatusCode::from_u16(ok).unwrap_or_default()).json(v),
        Err(e) => HttpResponse::build(actix_web::http::StatusCode::from_u16(e.code).unwrap_or_default())
            .json(e.status()),
    }
}

fn query(req: &HttpRequest) -> Vec<(String, String)> {
    url::form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .collect()
}

/// The group and resource of a review's path.
fn review_path(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        "/apis/authentication.k8s.io/v1/tokenreviews" => Some(("authentication.k8s.io", "tokenreviews")),
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
            Some(("authorization.k8s.io", "subjectaccessreviews"))
        }
        _ => None,
    }
}

/// Reviews are created and answered, never stored.
fn review(req: &HttpRequest, body: &Bytes, fake: &FakeApiServer) -> Option<HttpResponse> {
    let (group, resource) = review_path(req.path())?;
    if req.method() != actix_web::http::Method::POST {
        return Some(respond(
            Err(ApiError::new(405, "MethodNotAllowed", "create only")),
            200,
        ));
    }
    if authorised(req)
        && let Ok(mut log) = fake.accesses.lock()
    {
        log.push(Access {
            verb: "create".into(),
            group: group.into(),
            resource: resource.into(),
            namespace: None,
        });
    }
    let body: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Some(respond(
                Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!("invalid JSON body: {e}"),
                )),
                200,
            ));
        }
    };
    let reviews = fake.reviews.lock().unwrap_or_else(|p| p.into_inner());
    let answer = match resource {
        "tokenreviews" => reviews.token_review(&body),
        _ => reviews.subject_access_review(&body),
    };
    Some(respond(Ok(answer), 201))
}

/// Made with the kubeconfig's token: the operator's request, not a test's
/// or a benchmark's own.
fn authorised(req: &HttpRequest) -> bool {
    req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer fake-token")
}

/// What a request asks for, as RBAC and the request counters name it.
struct Asked {
    verb: &'static str,
    group: String,
    /// With `/status` or `/scale` for a subresource; empty for none.
    resource: String,
    namespace: Option<String>,
}

fn asked(req: &HttpRequest) -> Asked {
    let method = req.method().as_str();
    if let Some((group, resource)) = review_path(req.path()) {
        return Asked {
            verb: "create",
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: None,
        };
    }
    let watching = query(req)
        .iter()
        .any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
    let target = parse_path(req.path());
    let named = target.as_ref().is_none_or(|t| t.name.is_some());
    let verb = match (method, named) {
        ("GET", false) if watching => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "unknown",
    };
    let Some(target) = target else {
        return Asked {
            verb,
            group: String::new(),
            resource: String::new(),
            namespace: None,
        };
    };
    let kind = &KINDS[target.kind];
    let resource = if target.status {
        format!("{}/status", kind.plural)
    } else if target.scale {
        format!("{}/scale", kind.plural)
    } else {
        kind.plural.to_owned()
    };
    Asked {
        verb,
        group: kind.group.to_owned(),
        resource,
        namespace: target.namespace,
    }
}

/// Every request: the debug counters, then Priority and Fairness, then the
/// API; counts what was answered, and for the operator's requests whether
/// a refused one came back before its `Retry-After`.
async fn admit(req: HttpRequest, body: Bytes, fake: web::Data<FakeApiServer>) -> HttpResponse {
    if req.path() == "/debug/requests" && req.method() == actix_web::http::Method::GET {
        let mut answer = fake.requests().to_json();
        answer["retryAfter"] = fake.retry_after().to_json();
        let mut link = fake.link_requests().to_json();
        link["addr"] = json!(fake.addr.to_string());
        answer["link"] = link;
        return HttpResponse::Ok().json(answer);
    }
    if req.path() == "/debug/rate" && req.method() == actix_web::http::Method::PUT {
        return set_rate(&fake, &body);
    }
    // When the client's request got here, before any stall holds it.
    let arrived = Instant::now();
    FakeApiServer::passable(&fake.stalled).await;
    let asked = asked(&req);
    let level = Level::of(&asked.group, &asked.resource, asked.verb);
    let admitted = match fake.fairness.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        Some(fairness) => fairness.admit(level),
        None => Ok(()),
    };
    if authorised(&req) {
        let id = retry_after::request_id(asked.verb, req.path(), &query(&req), &body);
        fake.retries.lock().unwrap_or_else(|p| p.into_inner()).note(
            id,
            req.peer_addr(),
            arrived,
            admitted.err(),
            Instant::now(),
        );
    }
    let answer = match admitted {
        Ok(()) => route(req, body, fake.clone()).await,
        Err(retry_after) => HttpResponse::TooManyRequests()
            .insert_header(("Retry-After", retry_after.to_string()))
            .json(fairness::too_many_requests(retry_after)),
    };
    let key = RequestKey {
        verb: asked.verb.to_owned(),
        group: asked.group,
        resource: asked.resource,
        code: answer.status().as_u16(),
    };
    for counts in [&fake.counts, &fake.link_counts] {
        counts.lock().unwrap_or_else(|p| p.into_inner()).add(key.clone());
    }
    answer
}

/// `PUT /debug/rate` `{"perSecond": N, "burst": M}`: [`FakeApiServer::limit_rate`]
/// from now on (`burst` 1 if not given); `{"perSecond": null}` lifts it.
/// For a benchmark that fills the fake before the limit applies.
fn set_rate(fake: &FakeApiServer, body: &[u8]) -> HttpResponse {
    let Ok(asked) = serde_json::from_slice::<Value>(body) else {
        return respond(Err(ApiError::new(400, "BadRequest", "a JSON body")), 200);
    };
    match asked["perSecond"].as_f64() {
        Some(per_second) if per_second > 0.0 => {
            let burst = asked["burst"]
                .as_u64()
                .map_or(1, |b| b.clamp(1, u32::MAX.into()) as u32);
            fake.limit_rate(per_second, burst);
            HttpResponse::Ok().json(json!({"perSecond": per_second, "burst": burst}))
        }
        None if asked["perSecond"].is_null() => {
            fake.unlimit_rate();
            HttpResponse::Ok().json(json!({"perSecond": null}))
        }
        _ => respond(
            Err(ApiError::new(
                400,
                "BadRequest",
                "perSecond: a positive number or null",
            )),
            200,
        ),
    }
}

async fn route(req: HttpRequest, body: Bytes, fake: web::Data<FakeApiServer>) -> HttpResponse {
    FakeApiServer::passable(&fake.stalled).await;
    if let Some(answer) = review(&req, &body, &fake) {
        return answer;
    }
    if req.method() == actix_web::http::Method::GET
        && let Some(answer) = discovery::answer(req.path(), &fake.lock())
    {
        return respond(Ok(answer), 200);
    }
    let target = parse_path(req.path()).filter(|t| fake.lock().serves(t.kind));
    let Some(target) = target else {
        return respond(
            Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({})",
                    req.path()
                ),
            )),
            200,
        );
    };
    let kind = &KINDS[target.kind];
    let namespace = target.namespace.clone().unwrap_or_default();
    if kind.namespaced && target.name.is_some() && target.namespace.is_none() {
        return respond(Err(ApiError::new(404, "NotFound", "namespace required")), 200);
    }
    let params = query(&req);
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let protobuf = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(protobuf::CONTENT_TYPE));
    let parse_body = || -> Result<Value, ApiError> {
        if protobuf {
            return protobuf::decode(&body);
        }
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(400, "BadRequest", format!("invalid JSON body: {e}")))
    };
    let method = req.method().as_str();
    let manager = param("fieldManager").unwrap_or_else(|| {
        let agent = req
            .headers()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown");
        agent.split('/').next().unwrap_or(agent).to_owned()
    });
    if authorised(&req)
        && let Ok(mut log) = fake.accesses.lock()
    {
        let asked = asked(&req);
        log.push(Access {
            verb: asked.verb.to_owned(),
            group: asked.group,
            resource: asked.resource,
            namespace: asked.namespace,
        });
    }
    if target.scale {
        return scale(&req, &body, &fake, &target, &namespace);
    }
    match (method, &target.name) {
        ("GET", None) => {
            let labels = match Selector::parse(&param("labelSelector").unwrap_or_default()) {
                Ok(s) => s,
                Err(e) => return respond(Err(ApiError::new(400, "BadRequest", e)), 200),
            };
            let fields = match state::parse_fields(&param("fieldSelector").unwrap_or_default()) {
                Ok(f) => f,
                Err(e) => return respond(Err(e), 200),
            };
            let ns = target.namespace.as_deref();
            if param("watch").is_some_and(|w| w == "true" || w == "1") {
                return watch(&fake, target.kind, ns, labels, fields, &params);
            }
            respond(Ok(fake.lock().list(target.kind, ns, &labels, &fields)), 200)
        }
        ("GET", Some(name)) => respond(fake.lock().get(target.kind, &namespace, name), 200),
        ("POST", None) => match parse_body() {
            Ok(v) => respond(fake.lock_as(&manager).create(target.kind, &namespace, v), 201),
            Err(e) => respond(Err(e), 200),
        },
        ("PUT", Some(name)) => match parse_body() {
            Ok(v) => respond(
                fake.lock_as(&manager)
                    .replace(target.kind, &namespace, name, v, target.status),
                200,
            ),
            Err(e) => respond(Err(e), 200),
        },
        ("PATCH", Some(name)) => {
            let content_type = req
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .split(';')
                .next()
                .unwrap_or_default()
                .to_owned();
            if content_type == "application/apply-patch+yaml" {
                return respond(
                    Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "server-side apply is not modelled by this fake",
                    )),
                    200,
                );
            }
            match parse_body() {
                Ok(v) => respond(
                    fake.lock_as(&manager).patch(
                        target.kind,
                        &namespace,
                        name,
                        &content_type,
                        v,
                        target.status,
                    ),
                    200,
                ),
                Err(e) => respond(Err(e), 200),
            }
        }
        ("DELETE", Some(name)) => {
            let mut options: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
            if let Some(policy) = param("propagationPolicy") {
                options["propagationPolicy"] = json!(policy);
            }
            let result = fake
                .lock_as(&manager)
                .delete(target.kind, &namespace, name, &options);
            if result.is_ok() && (kind.group, kind.kind) == ("", "Namespace") {
                namespace_controller(fake.state.clone());
            }
            respond(result, 200)
        }
        _ => HttpResponse::MethodNotAllowed().json(
            ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
            .status(),
        ),
    }
}

/// The namespace controller, after a namespace was deleted: empties
/// terminating namespaces every half second until none is left.
fn namespace_controller(state: Arc<Mutex<State>>) {
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.empty_terminating_namespaces();
            if !state.namespaces_terminating() {
                return;
            }
        }
    });
}

/// `GET`, `PATCH` (merge) and `PUT` on `.../{name}/scale`.
fn scale(
    req: &HttpRequest,
    body: &Bytes,
    fake: &FakeApiServer,
    target: &Target,
    namespace: &str,
) -> HttpResponse {
    let name = target.name.as_deref().unwrap_or_default();
    let parsed = || -> Result<Value, ApiError> {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::new(400, "BadRequest", format!("invalid JSON body: {e}")))
    };
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .to_owned();
    let result = match req.method().as_str() {
        "GET" => fake.lock().get_scale(target.kind, namespace, name),
        "PATCH" => parsed().and_then(|v| {
            fake.lock()
                .write_scale(target.kind, namespace, name, Some(&content_type), v)
        }),
        "PUT" => parsed().and_then(|v| fake.lock().write_scale(target.kind, namespace, name, None, v)),
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    };
    respond(result, 200)
}

fn watch(
    fake: &FakeApiServer,
    kind: usize,
    namespace: Option<&str>,
    labels: Selector,
    fields: Vec<(String, String)>,
    params: &[(String, String)],
) -> HttpResponse {
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let bookmarks = param("allowWatchBookmarks").is_some_and(|v| v == "true");
    // A streaming list (client-go's WatchList, on by default in newer
    // kubectl): the current objects as ADDED, then a bookmark annotated
    // `k8s.io/initial-events-end`, then the watch goes on. The API server
    // demands `resourceVersionMatch=NotOlderThan` and bookmarks with it.
    let initial_events = param("sendInitialEvents").is_some_and(|v| v == "true");
    if initial_events {
        let refusal = if param("resourceVersionMatch").as_deref() != Some("NotOlderThan") {
            Some(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )
        } else if !bookmarks {
            Some(
                "allowWatchBookmarks: Required: sendInitialEvents requires setting allowWatchBookmarks to true",
            )
        } else {
            None
        };
        if let Some(message) = refusal {
            return respond(Err(ApiError::new(422, "Invalid", message.to_owned())), 200);
        }
    }
    let from = param("resourceVersion")
        .filter(|v| !v.is_empty() && v != "0" && !initial_events)
        .map(|v| v.parse::<u64>().unwrap_or(0));
    let timeout = Duration::from_secs(
        param("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1800),
    );
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Result<Bytes, actix_web::Error>>();
    let initial_end = tx.clone();
    let watcher = Watcher {
        kind,
        namespace: namespace.map(str::to_owned),
        labels,
        fields,
        tx,
    };
    let api_version = KINDS[kind].api_version();
    let kind_name = KINDS[kind].kind;
    {
        let mut state = fake.lock();
        if let Err(e) = state.watch(watcher, from) {
            // Kubernetes reports an expired version as an ERROR event on a 200 stream.
            let line = format!("{}\n", json!({"type": "ERROR", "object": e.status()}));
            return HttpResponse::Ok().content_type("application/json").body(line);
        }
        if initial_events {
            // Queued under the same lock as the ADDED events: nothing slips between.
            let rv = state.resource_version().to_string();
            let _ = initial_end.send(json!({"type": "BOOKMARK", "object": {
                "apiVersion": api_version, "kind": kind_name,
                "metadata": {"resourceVersion": rv, "annotations": {"k8s.io/initial-events-end": "true"}}}}));
        }
    }
    drop(initial_end);
    let state = fake.state.clone();
    let every = fake.bookmark_every;
    let stalled = fake.stalled.clone();
    actix_rt::spawn(async move {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        loop {
            let line = tokio::select! {
                ev = rx.recv() => match ev { Some(ev) => ev, None => break },
                _ = ticker.tick(), if bookmarks => {
                    let rv = state.lock().map(|s| s.resource_version()).unwrap_or(0);
                    json!({"type": "BOOKMARK", "object": {"apiVersion": api_version, "kind": kind_name, "metadata": {"resourceVersion": rv.to_string()}}})
                }
                _ = &mut deadline => break,
            };
            FakeApiServer::passable(&stalled).await;
            if out_tx.send(Ok(Bytes::from(format!("{line}\n")))).is_err() {
                break;
            }
        }
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .streaming(tokio_stream::wrappers::UnboundedReceiverStream::new(out_rx))
}
