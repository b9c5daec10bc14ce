//! Crawlers for the tests of replicas that all serve (issue 53): what a
//! crawler does through a replica's gateway or lease API — a plain GET, a
//! tunnel held open, a lease used through its proxy — each call returning
//! how it went ([`Outcome`]) and the client's own end of the connection it
//! used, so that a test can ask the [`FakeService`](super::service::FakeService)
//! which replica that connection went to
//! ([`connection_of`](super::service::FakeService::connection_of)).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::service::FakeService;

/// How long one call may take before it counts as broken: past the
/// gateway's `capacityWait` (5 s) and a try.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How one call went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Served as asked (the site's `ok`, the lease granted or released).
    Served,
    /// Answered with a refusal: its status, the error code
    /// (`egress-gateway-error`, or the API's `error`), `Retry-After`.
    Refused {
        status: u16,
        code: Option<String>,
        retry_after: Option<String>,
    },
    /// No answer: refused, reset, cut off or silent.
    Broken(String),
}

impl Outcome {
    pub fn code(&self) -> Option<&str> {
        match self {
            Outcome::Refused { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// `Retry-After` in whole seconds, when the refusal named one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Refused { retry_after, .. } => retry_after
                .as_deref()
                .and_then(|s| s.trim().parse().ok())
                .map(Duration::from_secs),
            _ => None,
        }
    }
}

/// An HTTP answer: status, headers (names in lower case), body.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A gateway's refusal: its status and `egress-gateway-error`.
    fn gateway_refusal(&self) -> Outcome {
        Outcome::Refused {
            status: self.status,
            code: self.header("egress-gateway-error").map(str::to_owned),
            retry_after: self.header("retry-after").map(str::to_owned),
        }
    }

    /// The lease API's refusal: its status and the body's `error`.
    fn api_refusal(&self) -> Outcome {
        let code = serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned));
        Outcome::Refused {
            status: self.status,
            code,
            retry_after: self.header("retry-after").map(str::to_owned),
        }
    }
}

/// Reads one answer's head and body (by `Content-Length`, chunked, or to
/// the end) from `s`, bytes after the head already in `got`.
async fn read_answer<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    got: &mut Vec<u8>,
) -> Result<Answer, String> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) => return Err(format!("closed before an answer ({} bytes)", got.len())),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e.to_string()),
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {head:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let find = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut rest = got.split_off(head_end);
    got.clear();
    let body = if let Some(length) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < length {
            match s.read(&mut chunk).await {
                Ok(0) => return Err(format!("body cut at {} of {length} bytes", rest.len())),
                Ok(n) => rest.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
        *got = rest.split_off(length);
        rest
    } else if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        while !rest.windows(5).any(|w| w == b"0\r\n\r\n") {
            match s.read(&mut chunk).await {
                Ok(0) => return Err("chunked body cut off".to_owned()),
                Ok(n) => rest.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
        dechunk(&rest)
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        *got = rest;
        Vec::new()
    } else {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => rest.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
        rest
    };
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(at) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&raw[..at]);
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        raw = &raw[at + 2..];
        if n == 0 || raw.len() < n {
            break;
        }
        out.extend_from_slice(&raw[..n]);
        raw = raw[n..].strip_prefix(b"\r\n").unwrap_or(&raw[n..]);
    }
    out
}

/// A plain GET of `http://{site}/page` through the gateway at `gateway`
/// (`Connection: close`); `Served` when the site's `200 ok` came back.
/// Also the proxy the gateway named (`egress-gateway-proxy`).
pub async fn gateway_get(
    gateway: SocketAddr,
    site: SocketAddr,
) -> (Option<SocketAddr>, Outcome, Option<String>) {
    let Ok(mut s) = TcpStream::connect(gateway).await else {
        return (None, Outcome::Broken("connection refused".to_owned()), None);
    };
    let local = s.local_addr().ok();
    let call = async {
        let head = format!("GET http://{site}/page HTTP/1.1\r\nHost: {site}\r\nConnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
        read_answer(&mut s, &mut Vec::new()).await
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Err(_) => (
            local,
            Outcome::Broken(format!("no answer in {CALL_TIMEOUT:?}")),
            None,
        ),
        Ok(Err(e)) => (local, Outcome::Broken(e), None),
        Ok(Ok(answer)) => {
            let proxy = answer.header("egress-gateway-proxy").map(str::to_owned);
            let outcome = if answer.status == 200 && answer.body == b"ok" {
                Outcome::Served
            } else {
                answer.gateway_refusal()
            };
            (local, outcome, proxy)
        }
    }
}

/// A `CONNECT` to `site` through the gateway, held open `hold` before one
/// GET inside; `Served` when the site's `200 ok` came back through it.
pub async fn gateway_tunnel(
    gateway: SocketAddr,
    site: SocketAddr,
    hold: Duration,
) -> (Option<SocketAddr>, Outcome) {
    let Ok(mut s) = TcpStream::connect(gateway).await else {
        return (None, Outcome::Broken("connection refused".to_owned()));
    };
    let local = s.local_addr().ok();
    let call = async {
        let connect = format!("CONNECT {site} HTTP/1.1\r\nHost: {site}\r\n\r\n");
        s.write_all(connect.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        let opened = read_tunnel_head(&mut s, &mut got).await?;
        if opened.status != 200 {
            return Ok(opened.gateway_refusal());
        }
        through_tunnel(&mut s, site, hold).await
    };
    match tokio::time::timeout(CALL_TIMEOUT + hold, call).await {
        Err(_) => (
            local,
            Outcome::Broken(format!("no answer in {:?}", CALL_TIMEOUT + hold)),
        ),
        Ok(Err(e)) => (local, Outcome::Broken(e)),
        Ok(Ok(outcome)) => (local, outcome),
    }
}

/// The answer to a `CONNECT`: a `200` has no body; a refusal's body is read.
async fn read_tunnel_head(s: &mut TcpStream, got: &mut Vec<u8>) -> Result<Answer, String> {
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => got.push(byte[0]),
            Ok(_) => return Err(format!("closed before the CONNECT answer ({} bytes)", got.len())),
            Err(e) => return Err(e.to_string()),
        }
    }
    let head = String::from_utf8_lossy(got).into_owned();
    if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
        return Ok(Answer {
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
        });
    }
    read_answer(s, got).await
}

/// Inside an open tunnel: waits `hold` (the site counts the connection
/// open meanwhile), then one GET; `Served` on the site's `200 ok`.
async fn through_tunnel(s: &mut TcpStream, site: SocketAddr, hold: Duration) -> Result<Outcome, String> {
    tokio::time::sleep(hold).await;
    let get = format!("GET /page HTTP/1.1\r\nHost: {site}\r\nConnection: close\r\n\r\n");
    s.write_all(get.as_bytes()).await.map_err(|e| e.to_string())?;
    let answer = read_answer(s, &mut Vec::new()).await?;
    Ok(if answer.status == 200 && answer.body == b"ok" {
        Outcome::Served
    } else {
        Outcome::Broken(format!(
            "the site answered {} {:?} in the tunnel",
            answer.status,
            answer.text()
        ))
    })
}

/// One kept-alive connection to a lease API (a replica's, or a Service's):
/// calls go over it until it breaks; then [`connect`](Self::connect) again.
pub struct ApiConnection {
    stream: TcpStream,
    /// The client's end: the Service's record of it names the replica.
    pub local: SocketAddr,
    addr: SocketAddr,
    pending: Vec<u8>,
    /// The server said `Connection: close`: no further call on it.
    closed: bool,
}

impl ApiConnection {
    pub async fn connect(addr: SocketAddr) -> Result<Self, String> {
        let stream = tokio::time::timeout(CALL_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().map_err(|e| e.to_string())?;
        Ok(Self {
            stream,
            local,
            addr,
            pending: Vec::new(),
            closed: false,
        })
    }

    /// One request, its answer; `Err` when the connection broke (it is
    /// then of no further use).
    pub async fn call(&mut self, method: &str, path: &str, body: Option<&str>) -> Result<Answer, String> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        match body {
            Some(b) => req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )),
            None => req.push_str("Content-Length: 0\r\n\r\n"),
        }
        let call = async {
            self.stream
                .write_all(req.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            read_answer(&mut self.stream, &mut self.pending).await
        };
        let answer = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| format!("no answer in {CALL_TIMEOUT:?}"))??;
        self.closed = answer
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        Ok(answer)
    }
}

/// A lease granted: its id and proxy.
#[derive(Clone, Debug)]
pub struct Lease {
    pub id: String,
    /// `namespace/name`.
    pub proxy: String,
    /// Where the proxy listens, and its credentials.
    pub proxy_addr: SocketAddr,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// `POST /v1/leases` for `target` over `conn`: the lease, or how it was
/// refused; `Err` when the connection broke.
pub async fn acquire(
    conn: &mut ApiConnection,
    target: &str,
    ttl_secs: u32,
) -> Result<Result<Lease, Outcome>, String> {
    let body = serde_json::json!({"target": target, "ttlSeconds": ttl_secs}).to_string();
    let answer = conn.call("POST", "/v1/leases", Some(&body)).await?;
    if answer.status != 201 {
        return Ok(Err(answer.api_refusal()));
    }
    let v: Value = serde_json::from_slice(&answer.body).map_err(|e| format!("the lease's body: {e}"))?;
    let url = url::Url::parse(v["proxy"]["url"].as_str().unwrap_or_default())
        .map_err(|e| format!("the lease's proxy url: {e}: {v}"))?;
    let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
    let proxy_addr = SocketAddr::new(
        host.parse()
            .map_err(|e| format!("the proxy's host {host:?}: {e}"))?,
        url.port().unwrap_or(80),
    );
    Ok(Ok(Lease {
        id: v["id"].as_str().unwrap_or_default().to_owned(),
        proxy: format!(
            "{}/{}",
            v["proxy"]["namespace"].as_str().unwrap_or_default(),
            v["proxy"]["name"].as_str().unwrap_or_default()
        ),
        proxy_addr,
        username: v["proxy"]["username"].as_str().map(str::to_owned),
        password: v["proxy"]["password"].as_str().map(str::to_owned),
    }))
}

/// `DELETE /v1/leases/<id>` over `conn`: `Served` on `204`.
pub async fn release(conn: &mut ApiConnection, id: &str) -> Result<Outcome, String> {
    let answer = conn.call("DELETE", &format!("/v1/leases/{id}"), None).await?;
    Ok(if answer.status == 204 {
        Outcome::Served
    } else {
        answer.api_refusal()
    })
}

/// What a crawler does with a lease: a `CONNECT` to `site` through the
/// leased proxy (with its credentials), held `hold`, one GET inside.
pub async fn use_lease(lease: &Lease, site: SocketAddr, hold: Duration) -> Outcome {
    let call = async {
        let mut s = TcpStream::connect(lease.proxy_addr)
            .await
            .map_err(|e| format!("the proxy {}: {e}", lease.proxy_addr))?;
        let auth = match (&lease.username, &lease.password) {
            (Some(u), Some(p)) => {
                use base64::Engine;
                let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
                format!("Proxy-Authorization: Basic {token}\r\n")
            }
            _ => String::new(),
        };
        let connect = format!("CONNECT {site} HTTP/1.1\r\nHost: {site}\r\n{auth}\r\n");
        s.write_all(connect.as_bytes()).await.map_err(|e| e.to_string())?;
        let opened = read_tunnel_head(&mut s, &mut Vec::new()).await?;
        if opened.status != 200 {
            return Err(format!("the leased proxy answered the CONNECT {}", opened.status));
        }
        through_tunnel(&mut s, site, hold).await
    };
    match tokio::time::timeout(CALL_TIMEOUT + hold, call).await {
        Err(_) => Outcome::Broken("no answer through the leased proxy".to_owned()),
        Ok(Err(e)) => Outcome::Broken(e),
        Ok(Ok(outcome)) => outcome,
    }
}

/// The dashboard row (`GET /v1/dashboard` at `addr`) of the proxy
/// `name`, if it lists one; `None` also while nothing answers `200`.
pub async fn dashboard_row(addr: SocketAddr, name: &str) -> Option<Value> {
    let look = async {
        let mut conn = ApiConnection::connect(addr).await.ok()?;
        conn.call("GET", "/v1/dashboard", None).await.ok()
    };
    let answer = tokio::time::timeout(Duration::from_secs(2), look).await.ok()??;
    if answer.status != 200 {
        return None;
    }
    let data: Value = serde_json::from_slice(&answer.body).ok()?;
    data["proxies"]
        .as_array()?
        .iter()
        .find(|row| row["name"] == name)
        .cloned()
}

/// What a crawler's attempt was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    /// A plain GET through the gateway.
    Get,
    /// A tunnel through the gateway, held open, one GET inside.
    Tunnel,
    /// `POST /v1/leases`.
    Acquire,
    /// The lease used: a tunnel through its proxy to the site.
    Use,
    /// `DELETE /v1/leases/<id>`.
    Release,
}

/// One attempt of one crawler: where it connected, the client's end of
/// that connection (`None`: no connection was made), when, how it went.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub client: usize,
    /// The crawler's request it belongs to (a GET, a tunnel, or a lease's
    /// acquire, use and release), numbered per crawler from 1.
    pub request: u64,
    pub call: Call,
    pub via: SocketAddr,
    pub local: Option<SocketAddr>,
    pub started: Instant,
    pub ended: Instant,
    pub outcome: Outcome,
    /// The lease acquired or released.
    pub lease: Option<String>,
    /// The proxy that served it, when the answer named one
    /// (`egress-gateway-proxy`, or the lease's).
    pub proxy: Option<String>,
}

/// Where an attempt's connection went, as the Service recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    /// Not through these Services, no connection made, or no record kept.
    Unknown,
    /// The Service had no ready replica for it.
    NoReplica,
    /// Replica `i`, the connection accepted at that instant.
    Replica(usize, Instant),
}

impl Attempt {
    /// Which replica the attempt's connection went to, by the record of
    /// the one of `services` it went through (`Unknown` if none).
    pub fn landed(&self, services: &[&FakeService]) -> Landed {
        let Some(local) = self.local else {
            return Landed::Unknown;
        };
        let service = services.iter().find(|s| s.addr() == self.via);
        match service.and_then(|s| s.connection_of(local, self.ended)) {
            None => Landed::Unknown,
            Some(r) => match r.backend {
                None => Landed::NoReplica,
                Some(i) => Landed::Replica(i, r.accepted),
            },
        }
    }
}

/// Attempts counted by (call, how it went, where it landed): for failure messages.
pub fn tally<'a>(attempts: impl IntoIterator<Item = (&'a Attempt, Landed)>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (a, place) in attempts {
        let how = match &a.outcome {
            Outcome::Served => "served".to_owned(),
            Outcome::Refused { status, code, .. } => format!("{status} {}", code.as_deref().unwrap_or("-")),
            Outcome::Broken(why) => format!("broken: {why}"),
        };
        let place = match place {
            Landed::Unknown => "?".to_owned(),
            Landed::NoReplica => "no replica".to_owned(),
            Landed::Replica(i, _) => format!("replica-{i}"),
        };
        *counts
            .entry(format!("{:?} {how} on {place}", a.call))
            .or_default() += 1;
    }
    counts
}

/// One crawler request from start to end, retries included.
#[derive(Clone, Debug)]
pub struct Request {
    pub client: usize,
    pub request: u64,
    pub started: Instant,
    pub ended: Instant,
    /// Served in the end (within the retry budget).
    pub served: bool,
    /// Not served, and given up because the crawlers were stopped.
    pub abandoned: bool,
}

/// How long a crawler keeps asking again for one request (the Python
/// client's default `max_wait`).
pub const RETRY_BUDGET: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Record {
    attempts: Vec<Attempt>,
    requests: Vec<Request>,
}

/// Crawlers running until [`stop`](Self::stop), as a fleet of them does:
/// each does one request after another, asks again after a `503` or
/// `429` once `Retry-After` has passed (or after a backoff, without one)
/// and at once on a new connection after a broken one, for at most
/// [`RETRY_BUDGET`] per request; every attempt is recorded. They run on
/// the test's own runtime (`actix_rt::test`'s local set).
pub struct Crawlers {
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Default for Crawlers {
    fn default() -> Self {
        Self::new()
    }
}

impl Crawlers {
    pub fn new() -> Self {
        Self {
            stop: Arc::default(),
            record: Arc::default(),
            tasks: Vec::new(),
        }
    }

    fn next_client(&self) -> Crawler {
        Crawler {
            client: self.tasks.len(),
            request: 0,
            stop: self.stop.clone(),
            record: self.record.clone(),
        }
    }

    /// `n` crawlers fetching `site` through the gateway at `via`, plain
    /// GETs `pause` apart.
    pub fn gets(&mut self, n: usize, via: SocketAddr, site: SocketAddr, pause: (Duration, Duration)) {
        for _ in 0..n {
            let mut crawler = self.next_client();
            self.tasks.push(actix_rt::spawn(async move {
                while !crawler.stopped() {
                    crawler
                        .request(Call::Get, via, async || {
                            let (local, outcome, proxy) = gateway_get(via, site).await;
                            (local, outcome, None, proxy)
                        })
                        .await;
                    tokio::time::sleep(between(pause)).await;
                }
            }));
        }
    }

    /// `n` crawlers opening tunnels to `site` through the gateway at
    /// `via`, each held `hold` (drawn) before its GET, `pause` apart.
    pub fn tunnels(
        &mut self,
        n: usize,
        via: SocketAddr,
        site: SocketAddr,
        hold: (Duration, Duration),
        pause: (Duration, Duration),
    ) {
        for _ in 0..n {
            let mut crawler = self.next_client();
            self.tasks.push(actix_rt::spawn(async move {
                while !crawler.stopped() {
                    let held = between(hold);
                    crawler
                        .request(Call::Tunnel, via, async || {
                            let (local, outcome) = gateway_tunnel(via, site, held).await;
                            (local, outcome, None, None)
                        })
                        .await;
                    tokio::time::sleep(between(pause)).await;
                }
            }));
        }
    }

    /// `n` crawlers leasing a proxy for `target` from the lease API at
    /// `via` (one kept-alive connection each, a new one once it breaks),
    /// using it `hold` for a tunnel to `site`, releasing it, `pause` apart.
    pub fn leasers(
        &mut self,
        n: usize,
        via: SocketAddr,
        target: &str,
        site: SocketAddr,
        hold: Duration,
        pause: (Duration, Duration),
    ) {
        for _ in 0..n {
            let mut crawler = self.next_client();
            let target = target.to_owned();
            self.tasks.push(actix_rt::spawn(async move {
                let mut conn: Option<ApiConnection> = None;
                while !crawler.stopped() {
                    crawler.lease_once(&mut conn, via, &target, site, hold).await;
                    tokio::time::sleep(between(pause)).await;
                }
            }));
        }
    }

    /// Every attempt so far, by start.
    pub fn attempts(&self) -> Vec<Attempt> {
        let mut all = self.record.lock().unwrap().attempts.clone();
        all.sort_by_key(|a| a.started);
        all
    }

    /// Tells every crawler to stop after its current request, waits for
    /// them; every attempt and request, by start.
    pub async fn stop(self) -> (Vec<Attempt>, Vec<Request>) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let mut record = std::mem::take(&mut *self.record.lock().unwrap());
        record.attempts.sort_by_key(|a| a.started);
        record.requests.sort_by_key(|r| r.started);
        (record.attempts, record.requests)
    }
}

/// A duration drawn uniformly from `[low, high]`.
pub fn between((low, high): (Duration, Duration)) -> Duration {
    low + (high.saturating_sub(low)).mul_f64(fastrand::f64())
}

struct Crawler {
    client: usize,
    request: u64,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
}

/// What one attempt returns: the client's end, the outcome, the lease, the proxy.
type Tried = (Option<SocketAddr>, Outcome, Option<String>, Option<String>);

impl Crawler {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn note(&self, call: Call, via: SocketAddr, started: Instant, tried: Tried) -> Outcome {
        let (local, outcome, lease, proxy) = tried;
        self.record.lock().unwrap().attempts.push(Attempt {
            client: self.client,
            request: self.request,
            call,
            via,
            local,
            started,
            ended: Instant::now(),
            outcome: outcome.clone(),
            lease,
            proxy,
        });
        outcome
    }

    /// How long to wait before asking again after `outcome` (`None`:
    /// served); the backoff doubles from 0.2 s to 5 s without `Retry-After`.
    fn wait_after(outcome: &Outcome, failures: u32) -> Option<Duration> {
        match outcome {
            Outcome::Served => None,
            // A new connection, after a breath (not a busy loop while none is ready).
            Outcome::Broken(_) => Some(Duration::from_millis(50)),
            Outcome::Refused { .. } => Some(outcome.retry_after().unwrap_or_else(|| {
                let step = Duration::from_millis(200) * 2u32.saturating_pow(failures.min(5));
                step.min(Duration::from_secs(5))
            })),
        }
    }

    /// One request of `call` to `via`, asked again until served or out of budget.
    async fn request(&mut self, call: Call, via: SocketAddr, mut attempt: impl AsyncFnMut() -> Tried) {
        self.request += 1;
        let started = Instant::now();
        let mut failures = 0;
        let served = loop {
            let at = Instant::now();
            let outcome = self.note(call, via, at, attempt().await);
            match Self::wait_after(&outcome, failures) {
                None => break true,
                Some(wait) if self.again(started, wait) => {
                    failures += 1;
                    tokio::time::sleep(wait).await;
                }
                Some(_) => break false,
            }
        };
        self.done(started, served);
    }

    fn done(&self, started: Instant, served: bool) {
        self.record.lock().unwrap().requests.push(Request {
            client: self.client,
            request: self.request,
            started,
            ended: Instant::now(),
            served,
            abandoned: !served && self.stopped(),
        });
    }

    /// Whether to ask again after `wait`: within the budget from
    /// `started`, and not stopped.
    fn again(&self, started: Instant, wait: Duration) -> bool {
        !self.stopped() && started.elapsed() + wait < RETRY_BUDGET
    }

    /// Acquire (asked again as [`request`](Self::request) does), use, release.
    async fn lease_once(
        &mut self,
        conn: &mut Option<ApiConnection>,
        via: SocketAddr,
        target: &str,
        site: SocketAddr,
        hold: Duration,
    ) {
        self.request += 1;
        let started = Instant::now();
        let mut failures = 0;
        let lease = loop {
            let at = Instant::now();
            let (tried, lease) = match api_call(conn, via, async |c| acquire(c, target, 10).await).await {
                (local, Ok(Ok(lease))) => (
                    (
                        local,
                        Outcome::Served,
                        Some(lease.id.clone()),
                        Some(lease.proxy.clone()),
                    ),
                    Some(lease),
                ),
                (local, Ok(Err(refusal))) => ((local, refusal, None, None), None),
                (local, Err(broken)) => ((local, Outcome::Broken(broken), None, None), None),
            };
            let outcome = self.note(Call::Acquire, via, at, tried);
            if let Some(lease) = lease {
                break Some(lease);
            }
            match Self::wait_after(&outcome, failures) {
                Some(wait) if self.again(started, wait) => {
                    failures += 1;
                    tokio::time::sleep(wait).await;
                }
                _ => break None,
            }
        };
        let Some(lease) = lease else {
            return self.done(started, false);
        };
        let at = Instant::now();
        let used = use_lease(&lease, site, hold).await;
        let used_ok = used == Outcome::Served;
        self.note(
            Call::Use,
            lease.proxy_addr,
            at,
            (None, used, Some(lease.id.clone()), Some(lease.proxy.clone())),
        );
        let released_from = Instant::now();
        let mut failures = 0;
        let released = loop {
            let at = Instant::now();
            let (local, answer) = api_call(conn, via, async |c| release(c, &lease.id).await).await;
            let outcome = answer.unwrap_or_else(Outcome::Broken);
            let outcome = self.note(
                Call::Release,
                via,
                at,
                (local, outcome, Some(lease.id.clone()), None),
            );
            match Self::wait_after(&outcome, failures) {
                None => break true,
                Some(wait) if self.again(released_from, wait) => {
                    failures += 1;
                    tokio::time::sleep(wait).await;
                }
                Some(_) => break false,
            }
        };
        self.done(started, used_ok && released);
    }
}

/// One call over the kept-alive connection (made first if there is none;
/// dropped once it breaks): the client's end, and the call's result.
async fn api_call<T>(
    conn: &mut Option<ApiConnection>,
    via: SocketAddr,
    call: impl AsyncFnOnce(&mut ApiConnection) -> Result<T, String>,
) -> (Option<SocketAddr>, Result<T, String>) {
    if conn.is_none() {
        match ApiConnection::connect(via).await {
            Ok(c) => *conn = Some(c),
            Err(e) => return (None, Err(e)),
        }
    }
    let c = conn.as_mut().expect("connected");
    let local = Some(c.local);
    let result = call(c).await;
    if result.is_err() || c.closed {
        *conn = None;
    }
    (local, result)
}

/// Waits until every replica of `bed` is ready, as every one should be
/// once it serves (every replica serves by default) and the proxies are up.
pub async fn wait_every_replica_ready(bed: &super::replicas::ReplicaBed) {
    let all: Vec<usize> = (0..bed.len()).collect();
    super::eventually_explained(
        "every replica ready",
        Duration::from_secs(60),
        || log_tails(bed, 400),
        async || {
            let ready = bed.ready_replicas().await;
            let leader = bed.leader().await;
            (ready == all)
                .then_some(())
                .ok_or(format!("ready: {ready:?}, the leader Lease's holder {leader:?}"))
        },
    )
    .await;
}

/// Waits until `service` routes to every replica of `bed`.
pub async fn wait_service_sees_all(service: &FakeService, bed: &super::replicas::ReplicaBed) {
    let all: Vec<usize> = (0..bed.len()).collect();
    super::eventually(
        "the Service to see every replica ready",
        Duration::from_secs(60),
        async || {
            let ready = service.ready();
            (ready == all).then_some(()).ok_or(format!("{ready:?}"))
        },
    )
    .await;
}

/// Each replica's warnings and errors (its last 40) and the last `lines`
/// lines of its log, each headed by its name (the whole of them runs long
/// with thousands of proxies, and the tail alone is mostly routine).
pub fn log_tails(bed: &super::replicas::ReplicaBed, lines: usize) -> String {
    (0..bed.len())
        .map(|i| {
            let log = bed.process(i).logs();
            let all: Vec<&str> = log.lines().collect();
            let troubles: Vec<&str> = all
                .iter()
                .copied()
                .filter(|l| l.contains(" WARN") || l.contains("ERROR") || l.starts_with("error:"))
                .collect();
            format!(
                "--- replica-{i} (exited: {:?}): last {} of its {} warnings and errors\n{}\n\
                 --- replica-{i}: last {} of {} lines\n{}",
                bed.process(i).exited(),
                troubles.len().min(40),
                troubles.len(),
                troubles[troubles.len().saturating_sub(40)..].join("\n"),
                lines.min(all.len()),
                all.len(),
                all[all.len().saturating_sub(lines)..].join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
