//! The gateway (docs/gateway.md) against real crawler clients and hostile
//! ones, through the real binary in standalone mode, on loopback only: one
//! local proxy behind it leaving from an outgoing address of its own
//! (`127.0.9.1`), so a local site tells by the peer address that a request
//! came through the leased proxy.
//!
//! - curl, Python `requests` and a real Scrapy crawl (Scrapy's own
//!   `HttpProxyMiddleware` only, the proxy in `meta` and in the
//!   environment) fetch an http and an https page with the crawler token
//!   as the proxy password; the site sees every request from the proxy's
//!   address and never the token.
//! - Headless Chromium loads both pages through a gateway that serves its
//!   client network (`clientNetworks: [127.0.0.0/8]`) without credentials.
//! - Hostile clients get their 4xx (no or bad credentials, a private
//!   destination with no lease taken, an oversized head, a smuggling
//!   attempt), and a well-formed request still succeeds after each.
//! - 2,000 idle connections (from 40 loopback addresses) against a file
//!   limit of 1,024 neither kill the operator nor starve the gateway.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{Reaper, free_port, health_target};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

const TOKEN: &str = "gw-clients-t0ken-5e1d7a";
/// The one proxy's outgoing address (the first of the network).
const OUTGOING: &str = "127.0.9.1";
/// The built-in proxy, allowed to loopback on any port, leaving from `OUTGOING`.
const PROVIDER: &str = "providers:\n  - {name: local, type: local, local: {implementation: builtin, \
     destinations: {allow: [127.0.0.0/8, 1024-65535]}, outgoingAddresses: [127.0.9.0/30]}}\n";
/// Loopback on any port: the sites listen on random ones.
/// Loopback on any port; `::1` too, as `localhost` may resolve to it and
/// the gateway refuses a name with any refused address.
const DESTINATIONS: &str = "{allow: [127.0.0.0/8, '::1', 1024-65535]}";
/// Generous: the suite runs many test binaries on two cores.
const PATIENCE: Duration = Duration::from_secs(60);

fn basic(user: &str, password: &str) -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {pair}")
}

// ---------------------------------------------------------------- the site

/// One request a site received: from where, and its head.
#[derive(Clone, Debug)]
struct Visit {
    peer: IpAddr,
    head: String,
}

impl Visit {
    /// The request target (`/path`).
    fn path(&self) -> &str {
        self.head.split_whitespace().nth(1).unwrap_or_default()
    }
}

type Visits = Arc<std::sync::Mutex<Vec<Visit>>>;

/// A site on `127.0.0.1` answering every request with a small HTML page
/// naming its path; over TLS (a self-signed certificate for `localhost`)
/// when `tls` is given.
struct Site {
    addr: SocketAddr,
    visits: Visits,
}

/// The marker a page for `path` carries.
fn marker(path: &str) -> String {
    format!("served {path} by the gateway-clients site")
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, peer: IpAddr, visits: Visits) {
    let mut buf = vec![0u8; 8192];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let visit = Visit {
        peer,
        head: String::from_utf8_lossy(&got).into_owned(),
    };
    let path = visit.path().to_owned();
    visits.lock().unwrap().push(visit);
    let body = format!(
        "<!doctype html><html><head><title>gateway clients</title></head>\
         <body><p id=\"marker\">{}</p></body></html>\n",
        marker(&path)
    );
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body.as_bytes()).await;
    let _ = s.shutdown().await;
}

impl Site {
    async fn http() -> Self {
        Self::start(None).await
    }

    /// An https site; with its certificate.
    async fn https() -> (Self, CertificateDer<'static>) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let der = CertificateDer::from(cert.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![der.clone()], key)
                .unwrap();
        (Self::start(Some(TlsAcceptor::from(Arc::new(config)))).await, der)
    }

    async fn start(tls: Option<TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let visits = Visits::default();
        let record = visits.clone();
        tokio::spawn(async move {
            while let Ok((s, peer)) = listener.accept().await {
                let (tls, record) = (tls.clone(), record.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(s).await {
                                answer(s, peer.ip(), record).await;
                            }
                        }
                        None => answer(s, peer.ip(), record).await,
                    }
                });
            }
        });
        Self { addr, visits }
    }

    fn visits(&self) -> Vec<Visit> {
        self.visits.lock().unwrap().clone()
    }

    /// The visits to `path`.
    fn visits_to(&self, path: &str) -> Vec<Visit> {
        self.visits().into_iter().filter(|v| v.path() == path).collect()
    }

    /// Every visit came through the proxy and carried no credential.
    fn assert_only_proxied_and_clean(&self) {
        for visit in self.visits() {
            assert_eq!(
                visit.peer.to_string(),
                OUTGOING,
                "a request reached the site from elsewhere than the leased proxy: {visit:?}"
            );
            let head = visit.head.to_ascii_lowercase();
            assert!(
                !visit.head.contains(TOKEN) && !visit.head.contains(&basic("crawler", TOKEN)),
                "the crawler's token reached the site: {visit:?}"
            );
            assert!(
                !head.contains("proxy-authorization"),
                "a proxy credential reached the site: {visit:?}"
            );
        }
    }
}

fn pem(der: &[u8]) -> String {
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

// ------------------------------------------------------------ the operator

/// An operator with one local proxy (`p1`) and the gateway on a free
/// loopback port; `gateway` is its `gateway:` block. Returns once the proxy
/// is Ready and the gateway serves a request to `site` (with the token).
async fn operator_with_gateway(
    dir: &OperatorDir,
    gateway_settings: &str,
    file_limit: Option<u64>,
    site: SocketAddr,
) -> (OperatorProcess, SocketAddr) {
    let health = health_target();
    dir.write_manifest(
        "p1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p1, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut builder = dir
        .standalone()
        .discovery()
        .metrics()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting("gateway", gateway_settings)
        .setting("maxLeasesPerProxy", "4")
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN);
    if let Some(n) = file_limit {
        builder = builder.file_limit(n, n);
    }
    let operator = builder.start().await;
    operator.wait_ready(1).await;
    let outgoing = dir
        .proxy("p1")
        .and_then(|p| p.status)
        .and_then(|s| s.outgoing_address);
    assert_eq!(
        outgoing.as_deref(),
        Some(OUTGOING),
        "the proxy's outgoing address"
    );
    operator
        .eventually("the gateway to listen", PATIENCE, async || {
            TcpStream::connect(gateway).await
        })
        .await;
    // The proxy turns Ready before its health verdict reaches the book.
    operator
        .eventually("a gateway request served", PATIENCE, async || {
            let got = fetch(gateway, Some(&basic("crawler", TOKEN)), site, "/warm-up").await;
            if got.status == 200 { Ok(()) } else { Err(got.head) }
        })
        .await;
    (operator, gateway)
}

async fn api(operator: &OperatorProcess, path: &str) -> Value {
    let auth = format!("Bearer {TOKEN}");
    let (status, text) = support::http::request(
        operator.discovery(),
        "GET",
        path,
        &[("Authorization", &auth)],
        None,
    )
    .await;
    assert_eq!(status, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Leases held now, as `/v1/proxies` counts them.
async fn active_leases(operator: &OperatorProcess) -> u64 {
    api(operator, "/v1/proxies")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum()
}

/// `egress_proxies_leases_granted_total`: every lease ever handed out.
async fn leases_granted(operator: &OperatorProcess) -> f64 {
    let (status, text) = support::http::request(operator.metrics(), "GET", "/metrics", &[], None).await;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("egress_proxies_leases_granted_total "))
        .unwrap_or_else(|| panic!("no leases_granted_total in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

async fn all_leases_released(operator: &OperatorProcess) {
    operator
        .eventually(
            "every gateway lease released",
            Duration::from_secs(15),
            async || match active_leases(operator).await {
                0 => Ok(()),
                n => Err(format!("{n} active")),
            },
        )
        .await;
}

fn assert_alive(operator: &OperatorProcess, when: &str) {
    assert!(
        operator.exited().is_none(),
        "the operator died {when}: {:?}\n{}",
        operator.exited(),
        operator.logs()
    );
}

fn assert_token_not_logged(operator: &OperatorProcess) {
    let logs = operator.logs();
    assert!(!logs.contains(TOKEN), "the token reached the log");
    assert!(
        !logs.contains(&basic("crawler", TOKEN)),
        "the credentials reached the log"
    );
}

// ------------------------------------------------------ raw HTTP exchanges

/// An answer to a raw request: its status, head (lower case), body, and
/// whether the gateway closed the connection after it.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
    closed: bool,
}

/// Writes `request` on a new connection to `gateway` and reads the answer:
/// the head, the body by its `Content-Length`, then whether the connection
/// ends within a few seconds.
async fn exchange(gateway: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    // A server may answer and close before reading all of a large request.
    let _ = s.write_all(request).await;
    read_answer(&mut s).await
}

async fn read_answer(s: &mut TcpStream) -> Answer {
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 16384];
    let mut eof = false;
    let read_head = tokio::time::timeout(PATIENCE, async {
        while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    eof = true;
                    break;
                }
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read_head.is_ok(), "no answer within {PATIENCE:?}");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let head = head.to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = rest.as_bytes().to_vec();
    while !eof && body.len() < length {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => body.extend_from_slice(&buf[..n]),
            _ => eof = true,
        }
    }
    let closed = eof
        || matches!(
            tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        );
    Answer {
        status,
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
        closed,
    }
}

/// `GET http://<site><path>` through the gateway, presenting `authorization`.
async fn fetch(gateway: SocketAddr, authorization: Option<&str>, site: SocketAddr, path: &str) -> Answer {
    let auth = authorization
        .map(|a| format!("Proxy-Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET http://{site}{path} HTTP/1.1\r\nHost: {site}\r\n{auth}Connection: close\r\n\r\n");
    exchange(gateway, request.as_bytes()).await
}

/// A well-formed request with the token is served, the page from the site
/// through the proxy.
async fn assert_still_serves(gateway: SocketAddr, site: &Site, path: &str, after: &str) {
    let got = tokio::time::timeout(
        PATIENCE,
        fetch(gateway, Some(&basic("crawler", TOKEN)), site.addr, path),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer within {PATIENCE:?} after {after}"));
    assert_eq!(got.status, 200, "a well-formed request after {after}: {got:?}");
    assert!(got.body.contains(&marker(path)), "after {after}: {got:?}");
    // The client is told which proxy served it, by name only.
    let named = got
        .head
        .lines()
        .find_map(|l| l.strip_prefix("egress-gateway-proxy:"))
        .map(str::trim);
    assert!(named.is_some_and(|p| p.ends_with("p1")), "after {after}: {got:?}");
    assert!(
        !got.head.contains("127.0.9."),
        "the proxy's address reached the client: {got:?}"
    );
    let visits = site.visits_to(path);
    assert_eq!(visits.len(), 1, "after {after}: {visits:?}");
    assert_eq!(visits[0].peer.to_string(), OUTGOING, "after {after}");
}

// ------------------------------------------------------------ the clients

/// The clients' virtual environment (requests, Scrapy), as
/// `actors/tests/python_clients.rs` finds it.
fn python() -> Option<PathBuf> {
    let path = std::env::var_os("EPO_CLIENTS_PYTHON").map_or_else(
        || PathBuf::from("/var/cache/egress-proxies-operator/venv-clients/bin/python"),
        PathBuf::from,
    );
    path.exists().then_some(path)
}

/// Runs a client with a clean environment (no `http_proxy` or `no_proxy`
/// of the runner's), in `home`, killed if it outlives `PATIENCE`.
async fn run(program: &Path, args: &[&str], env: &[(&str, &str)], home: &Path) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().copied())
        .current_dir(home)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PATIENCE, command.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} did not finish in {PATIENCE:?}", program.display()))
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `curl -x proxy url`: the status and body.
async fn curl(proxy: &str, url: &str, extra: &[&str], home: &Path) -> (u16, String) {
    let mut args = vec!["-q", "-s", "-w", "\n%{http_code}", "-x", proxy, url];
    args.extend_from_slice(extra);
    let (_, out, err) = run(Path::new("curl"), &args, &[], home).await;
    let (body, status) = out.rsplit_once('\n').unwrap_or(("", &out));
    let status = status
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("curl gave no status: {out} {err}"));
    (status, body.to_owned())
}

/// A Scrapy crawl with nothing but Scrapy's own middlewares: argv is the
/// mode (`meta`: the proxy in each request's meta; `env`: `http_proxy` and
/// `https_proxy`, read by `HttpProxyMiddleware` at start), the proxy URL,
/// then the URLs. Prints one JSON list of what each URL got.
const SPIDER: &str = r#"
import json, os, sys
import scrapy
from scrapy.crawler import CrawlerProcess

mode, proxy, *urls = sys.argv[1:]
if mode == "env":
    os.environ["http_proxy"] = proxy
    os.environ["https_proxy"] = proxy
results = []


class Through(scrapy.Spider):
    name = "through-the-gateway"

    async def start(self):
        for url in urls:
            meta = {"proxy": proxy} if mode == "meta" else {}
            yield scrapy.Request(url, meta=meta, dont_filter=True, errback=self.failed)

    def parse(self, response):
        results.append({"url": response.url, "status": response.status, "body": response.text})

    def failed(self, failure):
        results.append({"url": failure.request.url, "error": repr(failure.value)})


process = CrawlerProcess({
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 20,
    "LOG_LEVEL": "INFO",
})
process.crawl(Through)
process.start()
print(json.dumps(results))
"#;

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_requests_and_scrapy_fetch_http_and_https_pages_through_the_gateway() {
    let Some(python) = python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the Python clients' venv (tests/python-clients-setup.sh)"
        );
        eprintln!("SKIP: the Python clients' venv is missing; run tests/python-clients-setup.sh");
        return;
    };
    let dir = OperatorDir::new(PROVIDER);
    let site = Site::http().await;
    let (tls_site, cert) = Site::https().await;
    let settings = format!("{{destinations: {DESTINATIONS}}}");
    let (operator, gateway) = operator_with_gateway(&dir, &settings, None, site.addr).await;
    let home = dir.path().join("client-home");
    std::fs::create_dir(&home).unwrap();
    let ca = dir.path().join("site-ca.pem");
    std::fs::write(&ca, pem(&cert)).unwrap();
    let ca = ca.to_str().unwrap().to_owned();
    let proxy = format!("http://crawler:{TOKEN}@{gateway}");
    let page = |path: &str| format!("http://{}{path}", site.addr);
    let tls_page = |path: &str| format!("https://localhost:{}{path}", tls_site.addr.port());

    // curl.
    let (status, body) = curl(&proxy, &page("/curl"), &[], &home).await;
    assert_eq!((status, body.contains(&marker("/curl"))), (200, true), "{body}");
    let (status, body) = curl(&proxy, &tls_page("/curl-tls"), &["--cacert", &ca], &home).await;
    assert_eq!(
        (status, body.contains(&marker("/curl-tls"))),
        (200, true),
        "{body}"
    );

    // Python requests, as a crawler script would use it.
    let script = format!(
        "import requests\nproxies = {{'http': '{proxy}', 'https': '{proxy}'}}\n\
         for url, verify in [('{}', True), ('{}', '{ca}')]:\n\
         \x20   r = requests.get(url, proxies=proxies, verify=verify, timeout=20)\n\
         \x20   print(r.status_code, 'marker' if '{}' in r.text or '{}' in r.text else 'no-marker')\n",
        page("/requests"),
        tls_page("/requests-tls"),
        marker("/requests"),
        marker("/requests-tls"),
    );
    let (ok, out, err) = run(&python, &["-c", &script], &[], &home).await;
    assert!(ok, "python requests failed: {out} {err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["200 marker", "200 marker"],
        "{err}"
    );

    // Scrapy, its own HttpProxyMiddleware only: the proxy per request, then from the environment.
    let spider = dir.path().join("spider.py");
    std::fs::write(&spider, SPIDER).unwrap();
    let spider = spider.to_str().unwrap().to_owned();
    for mode in ["meta", "env"] {
        let (http_path, tls_path) = (format!("/scrapy-{mode}"), format!("/scrapy-{mode}-tls"));
        let urls = [page(&http_path), tls_page(&tls_path)];
        let (ok, out, err) = run(&python, &[&spider, mode, &proxy, &urls[0], &urls[1]], &[], &home).await;
        assert!(ok, "scrapy ({mode}) failed: {out}\n{err}");
        let results: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("scrapy ({mode}) printed no results ({e}): {out}\n{err}"));
        for (url, path) in urls.iter().zip([&http_path, &tls_path]) {
            let got = results
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["url"] == url.as_str())
                .unwrap_or_else(|| panic!("scrapy ({mode}) fetched no {url}: {results}\n{err}"));
            assert_eq!(got["status"], 200, "scrapy ({mode}) {url}: {got}\n{err}");
            assert!(
                got["body"].as_str().unwrap_or_default().contains(&marker(path)),
                "scrapy ({mode}) {url}: {got}"
            );
        }
    }

    // At the sites: each page once, from the leased proxy's address, with no credential.
    for path in ["/curl", "/requests", "/scrapy-meta", "/scrapy-env"] {
        assert_eq!(site.visits_to(path).len(), 1, "{path}: {:?}", site.visits());
    }
    for path in [
        "/curl-tls",
        "/requests-tls",
        "/scrapy-meta-tls",
        "/scrapy-env-tls",
    ] {
        assert_eq!(
            tls_site.visits_to(path).len(),
            1,
            "{path}: {:?}",
            tls_site.visits()
        );
    }
    site.assert_only_proxied_and_clean();
    tls_site.assert_only_proxied_and_clean();
    all_leases_released(&operator).await;
    assert_token_not_logged(&operator);
    operator.stop().await;
}

/// `/usr/bin/chromium` headless: the DOM of `url` loaded through `proxy`
/// (loopback included, certificate errors ignored), every process of it
/// reaped by its profile directory.
async fn chromium_dump_dom(proxy: SocketAddr, url: &str) -> (bool, String, String) {
    let profile = tempfile::tempdir().unwrap();
    let _browser = Reaper(profile.path().to_owned());
    let args = [
        "--headless=new".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--disable-quic".to_owned(),
        "--no-first-run".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--disable-dev-shm-usage".to_owned(),
        format!("--user-data-dir={}", profile.path().display()),
        format!("--proxy-server=http://{proxy}"),
        // Chromium sends loopback destinations past the proxy unless told.
        "--proxy-bypass-list=<-loopback>".to_owned(),
        "--ignore-certificate-errors".to_owned(),
        "--dump-dom".to_owned(),
        url.to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(Path::new("/usr/bin/chromium"), &args, &[], profile.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_loads_pages_through_a_gateway_open_to_its_client_network() {
    if !Path::new("/usr/bin/chromium").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI must install chromium");
        eprintln!("SKIPPED: no /usr/bin/chromium (tests/system-packages.sh test installs it)");
        return;
    }
    let dir = OperatorDir::new(PROVIDER);
    let site = Site::http().await;
    let (tls_site, _) = Site::https().await;
    let settings = format!("{{clientNetworks: [127.0.0.0/8], destinations: {DESTINATIONS}}}");
    let (operator, gateway) = operator_with_gateway(&dir, &settings, None, site.addr).await;

    // From the client network, no credentials are needed.
    let got = fetch(gateway, None, site.addr, "/no-credentials").await;
    assert_eq!(
        got.status, 200,
        "a request from 127.0.0.0/8 without credentials (clientNetworks): {got:?}"
    );

    for (url, path, visits) in [
        (format!("http://{}/chromium", site.addr), "/chromium", &site),
        (
            format!("https://localhost:{}/chromium-tls", tls_site.addr.port()),
            "/chromium-tls",
            &tls_site,
        ),
    ] {
        let (ok, dom, err) = chromium_dump_dom(gateway, &url).await;
        assert!(
            ok && dom.contains(&marker(path)),
            "Chromium did not load {url} through the gateway (ok: {ok}); DOM:\n{dom}\nstderr (end):\n{}",
            err.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
        let seen = visits.visits_to(path);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].peer.to_string(), OUTGOING, "through the leased proxy");
    }
    site.assert_only_proxied_and_clean();
    tls_site.assert_only_proxied_and_clean();
    all_leases_released(&operator).await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_are_refused_and_the_gateway_keeps_serving() {
    let dir = OperatorDir::new(PROVIDER);
    let site = Site::http().await;
    let settings = format!("{{destinations: {DESTINATIONS}}}");
    let (operator, gateway) = operator_with_gateway(&dir, &settings, None, site.addr).await;
    let auth = basic("crawler", TOKEN);
    let granted = leases_granted(&operator).await;
    let mut step = 0;
    let mut still_serves = async |after: &str| {
        step += 1;
        assert_still_serves(gateway, &site, &format!("/after-{step}"), after).await;
        assert_alive(&operator, after);
    };

    // No credentials: 407 with the challenge, for a request and a tunnel.
    let got = fetch(gateway, None, site.addr, "/no-credentials").await;
    assert_eq!(got.status, 407, "{got:?}");
    assert!(
        got.head
            .contains("proxy-authenticate: basic realm=\"egress-proxies\""),
        "{got:?}"
    );
    let connect = format!(
        "CONNECT localhost:{0} HTTP/1.1\r\nHost: localhost:{0}\r\n\r\n",
        site.addr.port()
    );
    let got = exchange(gateway, connect.as_bytes()).await;
    assert_eq!(got.status, 407, "CONNECT without credentials: {got:?}");
    assert!(got.head.contains("proxy-authenticate: basic"), "{got:?}");
    still_serves("no credentials").await;

    // Bad credentials: a wrong password, the token as the username, another scheme.
    for wrong in [
        basic("crawler", "wrong"),
        basic(TOKEN, "wrong"),
        format!("Bearer {TOKEN}"),
        "Basic !!!not-base64!!!".to_owned(),
    ] {
        let got = fetch(gateway, Some(&wrong), site.addr, "/bad-credentials").await;
        assert_eq!(got.status, 407, "{wrong}: {got:?}");
        assert!(got.head.contains("proxy-authenticate: basic"), "{got:?}");
    }
    still_serves("bad credentials").await;

    // Private destinations: 403 destination_refused, and no lease taken.
    let before = leases_granted(&operator).await;
    for request in [
        format!("GET http://10.0.0.1/ HTTP/1.1\r\nHost: 10.0.0.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
        format!(
            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\
             Proxy-Authorization: {auth}\r\n\r\n"
        ),
        format!("CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\nProxy-Authorization: {auth}\r\n\r\n"),
        format!(
            "CONNECT 169.254.169.254:443 HTTP/1.1\r\nHost: 169.254.169.254:443\r\n\
             Proxy-Authorization: {auth}\r\n\r\n"
        ),
    ] {
        let got = exchange(gateway, request.as_bytes()).await;
        let line = request.lines().next().unwrap();
        assert_eq!(got.status, 403, "{line}: {got:?}");
        assert!(
            got.head.contains("egress-gateway-error: destination_refused"),
            "{line}: {got:?}"
        );
    }
    assert_eq!(active_leases(&operator).await, 0);
    assert_eq!(
        leases_granted(&operator).await,
        before,
        "a refused destination took a lease"
    );
    still_serves("private destinations").await;

    // An oversized head (a 100 KiB header): a 4xx, and the connection ends.
    let big = format!(
        "GET http://{0}/oversized HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: {auth}\r\nX-Big: {1}\r\n\r\n",
        site.addr,
        "a".repeat(100 * 1024)
    );
    let got = exchange(gateway, big.as_bytes()).await;
    eprintln!("a 100 KiB header got: {:?}", got.head);
    assert!(
        (400..500).contains(&got.status),
        "a 100 KiB header: {} {:?}",
        got.status,
        got.head
    );
    assert!(
        got.closed,
        "the connection stays open after an oversized head: {got:?}"
    );
    // Too many header fields (300 small ones): a 4xx too.
    let many: String = (0..300).map(|i| format!("X-Field-{i}: {i}\r\n")).collect();
    let crowded = format!(
        "GET http://{0}/crowded HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: {auth}\r\n{many}\r\n",
        site.addr
    );
    let got = exchange(gateway, crowded.as_bytes()).await;
    eprintln!("300 header fields got: {:?}", got.head.lines().next());
    assert!((400..500).contains(&got.status), "300 header fields: {got:?}");
    still_serves("an oversized head").await;

    // Smuggling: Content-Length and Transfer-Encoding together, a request hidden in the body.
    let hidden = format!("GET http://{0}/smuggled HTTP/1.1\r\nHost: {0}\r\n\r\n", site.addr);
    let smuggle = format!(
        "POST http://{0}/front HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: {auth}\r\n\
         Content-Length: {1}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}",
        site.addr,
        5 + hidden.len()
    );
    let got = exchange(gateway, smuggle.as_bytes()).await;
    assert_eq!(got.status, 400, "{got:?}");
    assert!(
        got.head.contains("egress-gateway-error: ambiguous_framing"),
        "{got:?}"
    );
    assert!(got.closed, "the connection stays open after a smuggling attempt");
    // Two Content-Lengths that disagree.
    let twice = format!(
        "POST http://{0}/front HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: {auth}\r\n\
         Content-Length: 4\r\nContent-Length: 40\r\n\r\nabcd",
        site.addr
    );
    let got = exchange(gateway, twice.as_bytes()).await;
    assert_eq!(got.status, 400, "two Content-Lengths: {got:?}");
    still_serves("smuggling attempts").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for path in [
        "/front",
        "/smuggled",
        "/oversized",
        "/crowded",
        "/no-credentials",
        "/bad-credentials",
    ] {
        assert!(
            site.visits_to(path).is_empty(),
            "{path} reached the site: {:?}",
            site.visits()
        );
    }

    site.assert_only_proxied_and_clean();
    all_leases_released(&operator).await;
    // Only the well-formed requests took leases.
    assert_eq!(leases_granted(&operator).await, granted + 5.0);
    assert_token_not_logged(&operator);
    assert_alive(&operator, "after the hostile clients");
    operator.stop().await;
}

/// This test process needs a few thousand sockets of its own.
fn raise_own_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// 2,000 connections to the gateway that send nothing or half a head,
/// against an operator whose file limit is 1,024: it stays alive within
/// its limit, and a well-formed request through the gateway is served
/// within seconds (the listener evicts the longest idle at its cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_connections_under_a_file_limit_of_1024_do_not_starve_the_gateway() {
    raise_own_file_limit();
    let dir = OperatorDir::new(PROVIDER);
    let site = Site::http().await;
    let settings = format!("{{destinations: {DESTINATIONS}}}");
    let (operator, gateway) = operator_with_gateway(&dir, &settings, Some(1024), site.addr).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", operator.pid())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert_eq!(
        line.split_whitespace().skip(3).take(2).collect::<Vec<_>>(),
        ["1024", "1024"],
        "{line}"
    );

    let started = Instant::now();
    let mut idle = Vec::new();
    let mut peak = 0;
    for batch in 0..40u8 {
        // 50 from each of 40 addresses: under the per-address cap on
        // unauthenticated connections, so the file limit is what holds.
        let from = SocketAddr::from(([127, 0, 11, batch + 1], 0));
        let connects = (0..50).map(|i| async move {
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(from).ok()?;
            let mut s = tokio::time::timeout(Duration::from_secs(5), socket.connect(gateway))
                .await
                .ok()?
                .ok()?;
            if i % 2 == 0 {
                // A slow client: half a head, never finished.
                let _ = s.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nX-Slow: ").await;
            }
            Some(s)
        });
        idle.extend(futures::future::join_all(connects).await.into_iter().flatten());
        if batch % 10 == 9 {
            peak = peak.max(open_files(operator.pid()));
            assert_alive(&operator, "while idle connections were opened");
        }
    }
    eprintln!(
        "{} of 2000 idle connections open in {:?}; the operator holds {} files (peak seen {peak})",
        idle.len(),
        started.elapsed(),
        open_files(operator.pid())
    );
    assert!(idle.len() >= 1500, "only {} of 2000 connected", idle.len());

    // A well-formed request on a new connection: served within seconds.
    for round in 1..=3 {
        let asked = Instant::now();
        let path = format!("/during-{round}");
        let got = tokio::time::timeout(
            Duration::from_secs(15),
            fetch(gateway, Some(&basic("crawler", TOKEN)), site.addr, &path),
        )
        .await
        .unwrap_or_else(|_| panic!("round {round}: no answer within 15 s beside 2000 idle connections"));
        eprintln!("round {round}: {} in {:?}", got.status, asked.elapsed());
        assert_eq!(got.status, 200, "round {round}: {got:?}");
        assert!(got.body.contains(&marker(&path)), "{got:?}");
        let files = open_files(operator.pid());
        peak = peak.max(files);
        assert!(files <= 1024, "the operator holds {files} files");
        assert_alive(&operator, "beside 2000 idle connections");
    }
    // The gateway closed the longest idle ones to make room.
    let mut closed = 0;
    let mut buf = [0u8; 64];
    for s in &mut idle {
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            closed += 1;
        }
    }
    eprintln!(
        "{closed} of {} idle connections were closed by the gateway",
        idle.len()
    );
    assert!(closed > 0, "no idle connection was evicted");
    assert!(peak <= 1024, "the operator held {peak} files");
    let logs = operator.logs();
    let out_of_files: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("Too many open files"))
        .collect();
    assert!(
        out_of_files.is_empty(),
        "the operator ran out of files {} times:\n{}",
        out_of_files.len(),
        out_of_files.join("\n")
    );

    drop(idle);
    assert_still_serves(gateway, &site, "/after", "the idle connections closed").await;
    site.assert_only_proxied_and_clean();
    all_leases_released(&operator).await;
    assert_alive(&operator, "after the flood");
    operator.stop().await;
}
