//! A faithful in-memory fake of what the gcp provider uses of Google Cloud:
//! the Compute Engine v1 instance calls `insert`, `get`, `delete`,
//! `aggregatedList` and `setLabels`, and the OAuth 2.0 token endpoint a service-account key
//! points at (`token_uri`). Real HTTP on loopback, on its own thread, so
//! the real client (reqwest + gcp_auth) drives it unchanged.
//!
//! Documented semantics it keeps (and `tests/semantics.rs` checks):
//! - every Compute call needs `Authorization: Bearer <token>` with a token
//!   this fake issued and that has not expired → else 401;
//! - the token endpoint takes the JWT-bearer grant (`grant_type` +
//!   `assertion`, an RS256 JWT whose `aud` is the token URI and whose `scope`
//!   names a compute scope) and answers `access_token`/`expires_in`;
//! - insert validates the body (name syntax, `machineType` in the URL's
//!   zone, one boot disk with a source image, a network interface, label
//!   syntax) → 400 `invalid`; an existing name → 409 `alreadyExists`;
//!   insert and delete answer an Operation and act asynchronously: status
//!   goes PROVISIONING → STAGING → RUNNING (one `step` each), a deleted
//!   instance is STOPPING for one step, then gone (404 `notFound`);
//! - a RUNNING instance has an external `natIP` on its first access config;
//! - every instance has a `labelFingerprint`, a hash of its labels;
//!   `setLabels` needs the current one (missing or stale → 412
//!   `conditionNotMet`), validates the labels like insert, replaces them
//!   wholesale (the fingerprint changes with them), answers an Operation and
//!   applies at once, so `get` and label-filtered `aggregatedList` see it;
//! - aggregatedList filters on `labels.<key> = "<value>"`, pages with
//!   `maxResults`/`pageToken`, lists zones without matches with a
//!   `NO_RESULTS_ON_PAGE` warning, and with unreachable zones answers 503
//!   unless `returnPartialSuccess=true` (then `unreachables` names them);
//! - errors use Google's envelope `{"error": {code, message, errors: [{reason}]}}`.
//!
//! Not checked: the JWT's signature (the fake has no way to know the key
//! pair is genuine; it checks the structure and claims).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use base64::Engine;
use serde_json::{Value, json};

/// An error the next matching request gets instead of its answer.
#[derive(Clone, Debug)]
pub struct Fault {
    /// `GET`, `POST`, `DELETE`.
    pub method: String,
    /// A substring of the path (e.g. `/aggregated/`, `/instances/proxy-`).
    pub path_contains: String,
    pub status: u16,
    pub reason: String,
}

/// One instance as stored.
#[derive(Clone, Debug)]
struct Vm {
    body: Value,
    id: u64,
    created: jiff::Timestamp,
    since: Instant,
    /// Set by `force_status`: stays until changed.
    forced: Option<String>,
    deleting_since: Option<Instant>,
    internal_ip: String,
}

/// A request as the fake saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub status: u16,
    /// The bearer token presented, if any.
    pub token: Option<String>,
}

/// Everything the fake holds; tests read and steer it.
pub struct State {
    pub project: String,
    vms: BTreeMap<(String, String), Vm>,
    next_id: u64,
    /// Time per status step (PROVISIONING → STAGING → RUNNING; STOPPING → gone).
    pub step: Duration,
    /// External address given to RUNNING instances (tests point it at loopback).
    pub nat_ip: IpAddr,
    /// Lifetime of issued tokens.
    pub token_lifetime: Duration,
    tokens: HashMap<String, Instant>,
    /// Every token issued, in order.
    pub issued: Vec<String>,
    /// Zones aggregatedList cannot read.
    pub unreachable_zones: BTreeSet<String>,
    faults: VecDeque<Fault>,
    pub seen: Vec<Seen>,
    /// Bodies of accepted inserts, in order.
    pub inserted: Vec<Value>,
    /// Every setLabels request that reached an instance: its status and body, in order.
    pub label_sets: Vec<(u16, Value)>,
    /// Labels another client sets on an instance just before the next
    /// setLabels for it is served (a lost race on the fingerprint).
    racing_labels: Option<((String, String), Value)>,
}

impl State {
    fn status_of(&self, vm: &Vm) -> Option<&'static str> {
        if let Some(since) = vm.deleting_since {
            return (since.elapsed() < self.step).then_some("STOPPING");
        }
        if let Some(forced) = &vm.forced {
            return Some(match forced.as_str() {
                "PROVISIONING" => "PROVISIONING",
                "STAGING" => "STAGING",
                "RUNNING" => "RUNNING",
                "STOPPING" => "STOPPING",
                "STOPPED" => "STOPPED",
                "SUSPENDING" => "SUSPENDING",
                "SUSPENDED" => "SUSPENDED",
                "REPAIRING" => "REPAIRING",
                "TERMINATED" => "TERMINATED",
                _ => "SOME_FUTURE_STATUS",
            });
        }
        let age = vm.since.elapsed();
        Some(if age < self.step {
            "PROVISIONING"
        } else if age < self.step * 2 {
            "STAGING"
        } else {
            "RUNNING"
        })
    }

    /// Drops instances whose deletion finished.
    fn settle(&mut self) {
        let step = self.step;
        self.vms
            .retain(|_, vm| vm.deleting_since.is_none_or(|since| since.elapsed() < step));
    }

    /// Sets an instance's status until changed (any string; unknown ones
    /// answer as a status this API version does not know).
    pub fn force_status(&mut self, zone: &str, name: &str, status: &str) -> bool {
        match self.vms.get_mut(&(zone.to_owned(), name.to_owned())) {
            Some(vm) => {
                vm.forced = Some(status.to_owned());
                true
            }
            None => false,
        }
    }

    /// Instance names per zone, as stored now.
    pub fn instances(&mut self) -> Vec<(String, String)> {
        self.settle();
        self.vms.keys().cloned().collect()
    }

    /// An instance someone else created (not through the API under test).
    pub fn seed(&mut self, zone: &str, body: Value) {
        let name = body["name"].as_str().unwrap_or_default().to_owned();
        self.next_id += 1;
        let vm = Vm {
            body,
            id: self.next_id,
            created: jiff::Timestamp::now(),
            since: Instant::now(),
            forced: None,
            deleting_since: None,
            internal_ip: "10.128.9.9".into(),
        };
        self.vms.insert((zone.to_owned(), name), vm);
    }

    /// The labels an instance has now.
    pub fn labels(&mut self, zone: &str, name: &str) -> Option<Value> {
        self.settle();
        let vm = self.vms.get(&(zone.to_owned(), name.to_owned()))?;
        Some(vm.body.get("labels").cloned().unwrap_or_else(|| json!({})))
    }

    /// Another client replaces an instance's labels just before the next
    /// setLabels for it is served, so that request's fingerprint is stale.
    pub fn race_next_set_labels(&mut self, zone: &str, name: &str, labels: Value) {
        self.racing_labels = Some(((zone.to_owned(), name.to_owned()), labels));
    }

    /// The next `times` requests matching get this error.
    pub fn inject(&mut self, fault: Fault, times: usize) {
        for _ in 0..times {
            self.faults.push_back(fault.clone());
        }
    }

    fn take_fault(&mut self, method: &str, path: &str) -> Option<Fault> {
        let at = self
            .faults
            .iter()
            .position(|f| f.method == method && path.contains(&f.path_contains))?;
        self.faults.remove(at)
    }

    fn render(&self, base: &str, zone: &str, vm: &Vm, status: &str) -> Value {
        let mut out = vm.body.clone();
        let zone_url = format!("{base}projects/{}/zones/{zone}", self.project);
        let name = out["name"].as_str().unwrap_or_default().to_owned();
        out["kind"] = json!("compute#instance");
        out["id"] = json!(vm.id.to_string());
        out["zone"] = json!(zone_url);
        out["selfLink"] = json!(format!("{zone_url}/instances/{name}"));
        out["status"] = json!(status);
        out["labelFingerprint"] = json!(label_fingerprint(&vm.body));
        // Compute Engine reports creation time in Pacific time with an offset.
        let pacific = jiff::tz::offset(-8).to_time_zone();
        out["creationTimestamp"] = json!(
            vm.created
                .to_zoned(pacific)
                .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
                .to_string()
        );
        if let Some(nics) = out["networkInterfaces"].as_array_mut() {
            for (i, nic) in nics.iter_mut().enumerate() {
                nic["name"] = json!(format!("nic{i}"));
                nic["networkIP"] = json!(vm.internal_ip);
                if let Some(configs) = nic["accessConfigs"].as_array_mut()
                    && i == 0
                    && status == "RUNNING"
                    && let Some(first) = configs.first_mut()
                {
                    first["natIP"] = json!(self.nat_ip.to_string());
                }
            }
        }
        out
    }
}

/// The running fake.
#[derive(Clone)]
pub struct FakeCompute {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
}

impl FakeCompute {
    /// Starts the fake for `project` on a loopback port, on its own thread.
    pub fn start(project: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            project: project.to_owned(),
            vms: BTreeMap::new(),
            next_id: 1_000_000,
            step: Duration::from_millis(300),
            nat_ip: IpAddr::from([127, 0, 0, 1]),
            token_lifetime: Duration::from_secs(3600),
            tokens: HashMap::new(),
            issued: Vec::new(),
            unreachable_zones: BTreeSet::new(),
            faults: VecDeque::new(),
            seen: Vec::new(),
            inserted: Vec::new(),
            label_sets: Vec::new(),
            racing_labels: None,
        }));
        let fake = Self { addr, state };
        let data = web::Data::new(fake.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("fake-compute".into())
            .spawn(move || {
                actix_rt::System::new().block_on(async move {
                    let server = HttpServer::new(move || {
                        App::new()
                            .app_data(data.clone())
                            .app_data(web::PayloadConfig::new(1 << 20))
                            .default_service(web::to(route))
                    })
                    .workers(1)
                    .disable_signals()
                    .listen(listener);
                    match server {
                        Ok(server) => {
                            let _ = tx.send(Ok(()));
                            let _ = server.run().await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                })
            })?;
        rx.recv()
            .map_err(|_| std::io::Error::other("fake-compute thread ended"))??;
        Ok(fake)
    }

    /// The API root to configure as `apiEndpoint`.
    pub fn api_root(&self) -> String {
        format!("http://{}/compute/v1/", self.addr)
    }

    /// The token URI to put into a service-account key file.
    pub fn token_uri(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn error(status: u16, reason: &str, message: &str) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap_or_default()).json(json!({
        "error": {"code": status, "message": message, "errors": [{"domain": "global", "reason": reason, "message": message}]}
    }))
}

async fn route(req: HttpRequest, body: Bytes, fake: web::Data<FakeCompute>) -> HttpResponse {
    let method = req.method().as_str().to_owned();
    let path = req.path().to_owned();
    let token = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let response = answer(&fake, &req, &method, &path, token.as_deref(), &body);
    let mut state = fake.state();
    state.seen.push(Seen {
        method,
        path,
        query: req.query_string().to_owned(),
        status: response.status().as_u16(),
        token,
    });
    response
}

fn answer(
    fake: &FakeCompute,
    req: &HttpRequest,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> HttpResponse {
    if method == "POST" && path == "/token" {
        return issue_token(fake, body);
    }
    let mut state = fake.state();
    state.settle();
    let valid = token.is_some_and(|t| state.tokens.get(t).is_some_and(|exp| Instant::now() < *exp));
    if !valid {
        return error(
            401,
            "authError",
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        );
    }
    if let Some(fault) = state.take_fault(method, path) {
        return error(fault.status, &fault.reason, &format!("injected {}", fault.reason));
    }
    let base = format!("http://{}/compute/v1/", fake.addr);
    let prefix = format!("/compute/v1/projects/{}/", state.project);
    let Some(rest) = path.strip_prefix(&prefix) else {
        return error(404, "notFound", &format!("The resource '{path}' was not found"));
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let query: HashMap<String, String> = url::form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .collect();
    match (method, &parts[..]) {
        ("POST", ["zones", zone, "instances"]) => insert(&mut state, &base, zone, body),
        ("GET", ["zones", zone, "instances", name]) => {
            let key = (zone.to_string(), name.to_string());
            match state.vms.get(&key) {
                Some(vm) => match state.status_of(vm) {
                    Some(status) => HttpResponse::Ok().json(state.render(&base, zone, vm, status)),
                    None => not_found(&state.project, zone, name),
                },
                None => not_found(&state.project, zone, name),
            }
        }
        ("DELETE", ["zones", zone, "instances", name]) => {
            let key = (zone.to_string(), name.to_string());
            let project = state.project.clone();
            match state.vms.get_mut(&key) {
                Some(vm) => {
                    if vm.deleting_since.is_none() {
                        vm.deleting_since = Some(Instant::now());
                    }
                    HttpResponse::Ok().json(operation(&base, &project, zone, name, "delete"))
                }
                None => not_found(&project, zone, name),
            }
        }
        ("POST", ["zones", zone, "instances", name, "setLabels"]) => {
            set_labels(&mut state, &base, zone, name, body)
        }
        ("GET", ["aggregated", "instances"]) => aggregated_list(&state, &base, &query),
        _ => error(404, "notFound", &format!("no such method {method} {path}")),
    }
}

fn not_found(project: &str, zone: &str, name: &str) -> HttpResponse {
    error(
        404,
        "notFound",
        &format!("The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"),
    )
}

fn operation(base: &str, project: &str, zone: &str, name: &str, kind: &str) -> Value {
    json!({
        "kind": "compute#operation",
        "name": format!("operation-{}", jiff::Timestamp::now().as_nanosecond()),
        "operationType": kind,
        "status": "RUNNING",
        "zone": format!("{base}projects/{project}/zones/{zone}"),
        "targetLink": format!("{base}projects/{project}/zones/{zone}/instances/{name}"),
        "progress": 0,
    })
}

/// RFC 1035 names as Compute Engine requires them.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

fn valid_label(s: &str, key: bool) -> bool {
    s.len() <= 63
        && (!key || s.starts_with(|c: char| c.is_ascii_lowercase()))
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// The label syntax error of a `labels` map, if any.
fn check_labels(labels: &Value, field: &str) -> Option<HttpResponse> {
    let Some(labels) = labels.as_object() else {
        return Some(invalid(field, "must be a map"));
    };
    if labels.len() > 64 {
        return Some(invalid(field, "at most 64 labels"));
    }
    labels
        .iter()
        .find(|(k, v)| !valid_label(k, true) || !v.as_str().is_some_and(|v| valid_label(v, false)))
        .map(|(k, _)| {
            invalid(
                &format!("{field}.{k}"),
                "label keys and values must be lowercase letters, digits, '-' or '_'",
            )
        })
}

/// The `labelFingerprint` of an instance `body`.
fn label_fingerprint(body: &Value) -> String {
    fingerprint_of(body.get("labels").unwrap_or(&Value::Null))
}

/// Google's `labelFingerprint` for a set of labels: base64 of a hash of
/// them, so it changes whenever they do (the same labels give the same one).
pub fn fingerprint_of(labels: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let sorted: BTreeMap<&str, &str> = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
        .collect();
    // DefaultHasher::new() has fixed keys: stable for the fake's lifetime.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    sorted.hash(&mut hasher);
    base64::engine::general_purpose::STANDARD.encode(hasher.finish().to_be_bytes())
}

fn set_labels(state: &mut State, base: &str, zone: &str, name: &str, body: &[u8]) -> HttpResponse {
    let key = (zone.to_owned(), name.to_owned());
    if !state.vms.contains_key(&key) {
        return not_found(&state.project, zone, name);
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return error(400, "parseError", "Parse Error");
    };
    if let Some((racing, labels)) = state.racing_labels.take_if(|(k, _)| *k == key)
        && let Some(vm) = state.vms.get_mut(&racing)
    {
        vm.body["labels"] = labels;
    }
    let labels = request.get("labels").cloned().unwrap_or_else(|| json!({}));
    let project = state.project.clone();
    let answer = match state.vms.get_mut(&key) {
        None => not_found(&project, zone, name),
        Some(vm) => {
            let given = request.get("labelFingerprint").and_then(Value::as_str);
            if given != Some(label_fingerprint(&vm.body).as_str()) {
                error(
                    412,
                    "conditionNotMet",
                    "Labels fingerprint either invalid or resource labels have changed",
                )
            } else if let Some(bad) = check_labels(&labels, "labels") {
                bad
            } else {
                vm.body["labels"] = labels;
                HttpResponse::Ok().json(operation(base, &project, zone, name, "setLabels"))
            }
        }
    };
    state.label_sets.push((answer.status().as_u16(), request));
    answer
}

fn invalid(field: &str, why: &str) -> HttpResponse {
    error(
        400,
        "invalid",
        &format!("Invalid value for field 'resource.{field}': {why}"),
    )
}

fn insert(state: &mut State, base: &str, zone: &str, body: &[u8]) -> HttpResponse {
    let Ok(vm) = serde_json::from_slice::<Value>(body) else {
        return error(400, "parseError", "Parse Error");
    };
    let name = vm["name"].as_str().unwrap_or_default().to_owned();
    if !valid_name(&name) {
        return invalid("name", "must match [a-z]([-a-z0-9]{0,61}[a-z0-9])?");
    }
    let machine = vm["machineType"].as_str().unwrap_or_default();
    let prefix = format!("zones/{zone}/machineTypes/");
    if machine.strip_prefix(&prefix).is_none_or(|m| m.is_empty()) {
        return invalid(
            "machineType",
            &format!("must be {prefix}<type> in the request's zone"),
        );
    }
    let disks = vm["disks"].as_array().cloned().unwrap_or_default();
    let boot: Vec<&Value> = disks.iter().filter(|d| d["boot"] == json!(true)).collect();
    if boot.len() != 1
        || boot[0]["initializeParams"]["sourceImage"]
            .as_str()
            .is_none_or(str::is_empty)
    {
        return invalid(
            "disks",
            "exactly one boot disk with initializeParams.sourceImage is required",
        );
    }
    if let Some(size) = boot[0]["initializeParams"].get("diskSizeGb")
        && size.as_str().and_then(|s| s.parse::<u64>().ok()).is_none()
        && size.as_u64().is_none()
    {
        return invalid("disks[0].initializeParams.diskSizeGb", "not an int64");
    }
    if vm["networkInterfaces"].as_array().is_none_or(Vec::is_empty) {
        return invalid("networkInterfaces", "at least one network interface is required");
    }
    if let Some(labels) = vm.get("labels")
        && let Some(bad) = check_labels(labels, "labels")
    {
        return bad;
    }
    if let Some(items) = vm["metadata"]["items"].as_array() {
        let total: usize = items
            .iter()
            .filter_map(|i| i["value"].as_str())
            .map(str::len)
            .sum();
        if total > 512 * 1024 {
            return invalid("metadata", "metadata is limited to 512 KB in total");
        }
    }
    let key = (zone.to_owned(), name.clone());
    if state.vms.contains_key(&key) {
        return error(
            409,
            "alreadyExists",
            &format!(
                "The resource 'projects/{}/zones/{zone}/instances/{name}' already exists",
                state.project
            ),
        );
    }
    state.next_id += 1;
    let n = state.vms.len() as u32 + 2;
    state.vms.insert(
        key,
        Vm {
            body: vm.clone(),
            id: state.next_id,
            created: jiff::Timestamp::now(),
            since: Instant::now(),
            forced: None,
            deleting_since: None,
            internal_ip: format!("10.128.{}.{}", n / 250, n % 250 + 2),
        },
    );
    state.inserted.push(vm);
    HttpResponse::Ok().json(operation(base, &state.project, zone, &name, "insert"))
}

fn aggregated_list(state: &State, base: &str, query: &HashMap<String, String>) -> HttpResponse {
    let partial = query.get("returnPartialSuccess").is_some_and(|v| v == "true");
    if !state.unreachable_zones.is_empty() && !partial {
        return error(
            503,
            "backendError",
            "Some zones are unavailable; retry or set returnPartialSuccess",
        );
    }
    let filter = match query.get("filter").map(|f| parse_filter(f)) {
        None => None,
        Some(Some(f)) => Some(f),
        Some(None) => return error(400, "invalid", "Invalid value for field 'filter'"),
    };
    let max = query
        .get("maxResults")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(500)
        .clamp(1, 500);
    let offset = match query.get("pageToken") {
        Some(t) => match t.parse::<usize>() {
            Ok(o) => o,
            Err(_) => return error(400, "invalid", "Invalid value for field 'pageToken'"),
        },
        None => 0,
    };
    let matching: Vec<(&(String, String), &Vm, &str)> = state
        .vms
        .iter()
        .filter(|((zone, _), _)| !state.unreachable_zones.contains(zone))
        .filter_map(|(k, vm)| Some((k, vm, state.status_of(vm)?)))
        .filter(|(_, vm, _)| {
            filter
                .as_ref()
                .is_none_or(|(k, v)| vm.body["labels"][k].as_str() == Some(v.as_str()))
        })
        .collect();
    let page = &matching[offset.min(matching.len())..(offset + max).min(matching.len())];
    let mut items = serde_json::Map::new();
    for ((zone, _), vm, status) in page {
        let entry = items
            .entry(format!("zones/{zone}"))
            .or_insert_with(|| json!({"instances": []}));
        if let Some(list) = entry["instances"].as_array_mut() {
            list.push(state.render(base, zone, vm, status));
        }
    }
    let known: BTreeSet<&String> = state.vms.keys().map(|(z, _)| z).collect();
    for zone in known {
        if !state.unreachable_zones.contains(zone) {
            items.entry(format!("zones/{zone}")).or_insert_with(|| {
                json!({"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/…' on this page."}})
            });
        }
    }
    let mut out = json!({"kind": "compute#instanceAggregatedList", "items": items});
    if offset + max < matching.len() {
        out["nextPageToken"] = json!((offset + max).to_string());
    }
    if partial && !state.unreachable_zones.is_empty() {
        out["unreachables"] = json!(
            state
                .unreachable_zones
                .iter()
                .map(|z| format!("zones/{z}"))
                .collect::<Vec<_>>()
        );
    }
    HttpResponse::Ok().json(out)
}

/// `labels.<key> = "<value>"` (quotes optional, spaces optional).
fn parse_filter(filter: &str) -> Option<(String, String)> {
    let (left, right) = filter.split_once('=')?;
    let key = left.trim().strip_prefix("labels.")?;
    let value = right.trim().trim_matches('"');
    (!key.is_empty() && !value.is_empty()).then(|| (key.to_owned(), value.to_owned()))
}

/// The JWT-bearer grant of a service-account key.
fn issue_token(fake: &FakeCompute, body: &[u8]) -> HttpResponse {
    let form: HashMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    let oauth_error = |what: &str| {
        HttpResponse::BadRequest().json(json!({"error": "invalid_grant", "error_description": what}))
    };
    if form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return oauth_error("grant_type must be urn:ietf:params:oauth:grant-type:jwt-bearer");
    }
    let Some(assertion) = form.get("assertion") else {
        return oauth_error("assertion missing");
    };
    let parts: Vec<&str> = assertion.split('.').collect();
    let decode = |s: &str| {
        // JWTs are unpadded base64url; Google also takes padded segments (gcp_auth sends them).
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    };
    let (Some(header), Some(claims)) = (
        parts.first().and_then(|p| decode(p)),
        parts.get(1).and_then(|p| decode(p)),
    ) else {
        return oauth_error("assertion is not a JWT");
    };
    if parts.len() != 3 || parts[2].is_empty() || header["alg"] != "RS256" {
        return oauth_error("assertion must be an RS256-signed JWT");
    }
    let token_uri = fake.token_uri();
    if claims["aud"].as_str() != Some(token_uri.as_str()) {
        return oauth_error("aud must be the token URI");
    }
    if !claims["scope"]
        .as_str()
        .is_some_and(|s| s.contains("/auth/compute") || s.contains("/auth/cloud-platform"))
    {
        return oauth_error("scope must include a compute scope");
    }
    if claims["iss"].as_str().is_none_or(str::is_empty) || claims["exp"].as_i64() <= claims["iat"].as_i64() {
        return oauth_error("iss, iat and exp are required");
    }
    let mut state = fake.state();
    let token = format!(
        "ya29.fake-{}-{}",
        state.issued.len() + 1,
        jiff::Timestamp::now().as_nanosecond()
    );
    let lifetime = state.token_lifetime;
    state.tokens.insert(token.clone(), Instant::now() + lifetime);
    state.issued.push(token.clone());
    HttpResponse::Ok()
        .json(json!({"access_token": token, "expires_in": lifetime.as_secs(), "token_type": "Bearer"}))
}
