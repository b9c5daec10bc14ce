//! One forward-proxy endpoint standing in for many External proxies, that
//! counts the health probes each receives: every External Proxy of a test
//! points its `endpoint` here, and its `healthCheck.url` names it
//! ([`ProbeCounter::health_url`]: `http://<proxy>.probe.test/generate_204`).
//!
//! It answers what a probe sends (src/adapters/probe.rs): for an `http`
//! URL an absolute-URI `GET http://<proxy>.probe.test/generate_204`
//! (`Connection: close`), answered `204`; for an `https` URL
//! ([`ProbeCounter::https_url`]) `CONNECT <proxy>.probe.test:443`, answered
//! `200`, then TLS with a certificate for `*.probe.test` (trusted by the
//! operator through `--health-ca-file`, [`ProbeCounter::write_ca`]) and the
//! `GET` inside, answered `204`. Each probe is recorded once its `GET`
//! arrives, as (proxy name, instant), the name read from its `Host`. The
//! names `probe.test` stand for are never resolved: the prober hands them
//! to the proxy, and this proxy fetches nothing.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// The domain the health URLs' hosts are in.
pub const DOMAIN: &str = "probe.test";
/// Probes kept per proxy (the oldest go first); counts are kept whole.
const KEPT_PER_PROXY: usize = 10_000;
/// Largest request head read.
const MAX_HEAD: usize = 16 * 1024;

#[derive(Default)]
struct Log {
    /// Per proxy: every probe counted, the latest instants kept.
    probes: BTreeMap<String, (u64, VecDeque<Instant>)>,
    /// Requests that named no proxy of ours (another host, a bad head).
    strays: u64,
}

/// A running counter; serves until the test's runtime ends.
pub struct ProbeCounter {
    addr: SocketAddr,
    ca_pem: String,
    log: Arc<Mutex<Log>>,
}

impl ProbeCounter {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let cert = rcgen::generate_simple_self_signed(vec![format!("*.{DOMAIN}")]).unwrap();
        let der = CertificateDer::from(cert.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![der], key)
                .unwrap();
        let tls = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Log::default()));
        let seen = log.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, tls.clone(), seen.clone()));
            }
        });
        Self {
            addr,
            ca_pem: cert.cert.pem(),
            log,
        }
    }

    /// The External proxies' endpoint.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The plain-HTTP health URL that names `proxy`.
    pub fn health_url(proxy: &str) -> String {
        format!("http://{proxy}.{DOMAIN}/generate_204")
    }

    /// The https health URL that names `proxy` (the operator needs
    /// `--health-ca-file` with [`write_ca`](Self::write_ca)'s file).
    pub fn https_url(proxy: &str) -> String {
        format!("https://{proxy}.{DOMAIN}/generate_204")
    }

    /// Writes the certificate the counter's TLS presents (PEM), for `--health-ca-file`.
    pub fn write_ca(&self, path: &Path) {
        std::fs::write(path, &self.ca_pem).unwrap();
    }

    /// An External Proxy's spec pointing here, probed every `interval` at `url`.
    pub fn external_spec(&self, url: &str, interval: &str) -> serde_json::Value {
        serde_json::json!({
            "mode": "External",
            "endpoint": {"host": self.addr.ip().to_string(), "port": self.addr.port()},
            "healthCheck": {"url": url, "interval": interval}
        })
    }

    /// Probes counted per proxy, every one.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.probes.iter().map(|(k, (n, _))| (k.clone(), *n)).collect()
    }

    /// When `proxy` was probed (the last 10,000), oldest first.
    pub fn probes_of(&self, proxy: &str) -> Vec<Instant> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.probes
            .get(proxy)
            .map(|(_, at)| at.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Every proxy's probe instants kept, oldest first.
    pub fn probes(&self) -> BTreeMap<String, Vec<Instant>> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.probes
            .iter()
            .map(|(k, (_, at))| (k.clone(), at.iter().copied().collect()))
            .collect()
    }

    /// Every probe counted.
    pub fn total(&self) -> u64 {
        self.counts().values().sum()
    }

    /// Requests that named no proxy (another host, a malformed head).
    pub fn strays(&self) -> u64 {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).strays
    }
}

/// The proxy a `Host` names: `<proxy>.probe.test`, with or without a port.
fn proxy_named(host: &str) -> Option<&str> {
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    name.strip_suffix(DOMAIN)?
        .strip_suffix('.')
        .filter(|p| !p.is_empty())
}

/// One connection: a probe's GET, or its CONNECT and the GET inside TLS.
async fn answer(mut stream: TcpStream, tls: TlsAcceptor, log: Arc<Mutex<Log>>) {
    let _ = stream.set_nodelay(true);
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    if head.starts_with("CONNECT ") {
        let named = head.split_whitespace().nth(1).and_then(proxy_named).is_some();
        if !named {
            stray(&log);
            let _ = stream
                .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
            return;
        }
        if stream
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        let Ok(mut inner) = tls.accept(stream).await else {
            return;
        };
        if let Some(head) = read_head(&mut inner).await {
            respond(&mut inner, &head, &log).await;
        }
        return;
    }
    respond(&mut stream, &head, &log).await;
}

/// Records the probe a `GET` head names and answers `204` (`404` to a stray).
async fn respond<S: AsyncWrite + Unpin>(stream: &mut S, head: &str, log: &Mutex<Log>) {
    let host = head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("host").then(|| v.trim().to_owned())
    });
    let proxy = host.as_deref().and_then(proxy_named);
    let answer: &[u8] = match proxy {
        Some(proxy) if head.starts_with("GET ") => {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            let (count, at) = log.probes.entry(proxy.to_owned()).or_default();
            *count += 1;
            if at.len() == KEPT_PER_PROXY {
                at.pop_front();
            }
            at.push_back(Instant::now());
            b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
        }
        _ => {
            stray(log);
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
    };
    let _ = stream.write_all(answer).await;
    let _ = stream.shutdown().await;
}

fn stray(log: &Mutex<Log>) {
    log.lock().unwrap_or_else(|p| p.into_inner()).strays += 1;
}

/// A request head, up to its blank line; `None` if the connection ends first.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || head.len() > MAX_HEAD {
            return None;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}
