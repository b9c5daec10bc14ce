//! One health probe: a real request *through* the proxy. For https targets:
//! TCP to the proxy, `CONNECT host:port`, TLS to the target inside the
//! tunnel, `GET`; for http targets: an absolute-URI `GET` to the proxy. A
//! proxy that accepts TCP but cannot egress fails. Only `Host`, `Accept` and
//! `Connection` headers are sent (and `Proxy-Authorization` to a proxy that
//! demands credentials, which the proxy consumes): nothing that identifies
//! the operator or carries trace context travels through a proxy toward a
//! target.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use super::{CheckSpec, ProbeTarget};
use crate::credentials::ProxyCredentials;
use crate::destinations::{CheckedConnectError, DestinationPolicy, connect_checked};

/// Largest response head read.
const MAX_HEAD: usize = 16 * 1024;

/// Why a probe failed; each is a distinct reason in status and metrics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeFailure {
    #[error("proxy refused the connection")]
    ProxyRefused,
    #[error("proxy unreachable: {0}")]
    ProxyUnreachable(String),
    /// The endpoint resolves to an address the operator does not connect
    /// to (an External Proxy on loopback or link-local, Kubernetes mode).
    #[error("{0}")]
    EndpointRefused(String),
    #[error("proxy refused CONNECT with status {0}")]
    ConnectRefused(u16),
    #[error("TLS to the target failed: {0}")]
    Tls(String),
    #[error("unexpected status {status} (expected {expected})")]
    UnexpectedStatus { status: u16, expected: String },
    #[error("timed out after {after:?} while {stage}")]
    Timeout { after: Duration, stage: &'static str },
    #[error("malformed response: {0}")]
    Protocol(String),
    /// A bug: the probe itself panicked (counted as a failure, so the proxy
    /// is still probed next time).
    #[error("the probe panicked: {0}")]
    Panicked(String),
}

impl ProbeFailure {
    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeFailure::ProxyRefused => "proxy_refused",
            ProbeFailure::ProxyUnreachable(_) => "proxy_unreachable",
            ProbeFailure::EndpointRefused(_) => "endpoint_refused",
            ProbeFailure::ConnectRefused(_) => "connect_refused",
            ProbeFailure::Tls(_) => "tls",
            ProbeFailure::UnexpectedStatus { .. } => "unexpected_status",
            ProbeFailure::Timeout { .. } => "timeout",
            ProbeFailure::Protocol(_) => "protocol",
            ProbeFailure::Panicked(_) => "panicked",
        }
    }
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResult {
    /// The target's status on success.
    pub outcome: Result<u16, ProbeFailure>,
    /// From the start of the probe to the target's status line (or failure).
    pub latency: Duration,
}

/// The TLS trust for probes could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProberError {
    #[error("reading extra CA file {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
}

/// Runs probes; cheap to share.
#[derive(Clone)]
pub struct Prober {
    tls: TlsConnector,
}

impl Prober {
    /// Trusts the Mozilla root set, plus the certificates in `extra_ca` (PEM).
    pub fn new(extra_ca: Option<&Path>) -> Result<Self, ProberError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = extra_ca {
            let ca_error = |reason: String| ProberError::Ca {
                path: path.display().to_string(),
                reason,
            };
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| ca_error(e.to_string()))?
                .collect::<Result<_, _>>()
                .map_err(|e| ca_error(e.to_string()))?;
            if certs.is_empty() {
                return Err(ca_error("no certificate in the file".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
            }
        }
        Ok(Self::with_roots(roots)?)
    }

    /// Trusts exactly `roots`.
    pub fn with_roots(roots: rustls::RootCertStore) -> Result<Self, rustls::Error> {
        let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            tls: TlsConnector::from(Arc::new(config)),
        })
    }

    /// Fetches `check.url` through the proxy at `proxy` (`host:port`).
    pub async fn probe(&self, proxy: &str, check: &CheckSpec) -> ProbeResult {
        self.probe_as(proxy, None, check).await
    }

    /// Fetches `check.url` through the proxy at `proxy`, presenting
    /// `credentials` to it (Basic `Proxy-Authorization`).
    pub async fn probe_as(
        &self,
        proxy: &str,
        credentials: Option<&ProxyCredentials>,
        check: &CheckSpec,
    ) -> ProbeResult {
        self.timed(proxy, None, credentials, check).await
    }

    /// Probes `target` as the health engine does: with its credentials, and
    /// connecting only to addresses its endpoint policy allows.
    pub async fn probe_target(&self, target: &ProbeTarget) -> ProbeResult {
        let policy = target.endpoint_policy.as_deref();
        self.timed(
            &target.endpoint,
            policy,
            target.credentials.as_ref(),
            &target.check,
        )
        .await
    }

    async fn timed(
        &self,
        proxy: &str,
        policy: Option<&DestinationPolicy>,
        credentials: Option<&ProxyCredentials>,
        check: &CheckSpec,
    ) -> ProbeResult {
        let start = Instant::now();
        let deadline = start + check.timeout;
        let authorization = credentials
            .map(|c| format!("Proxy-Authorization: {}\r\n", c.basic_authorization()))
            .unwrap_or_default();
        let outcome = self.run(proxy, policy, &authorization, check, deadline).await;
        ProbeResult {
            outcome,
            latency: start.elapsed(),
        }
    }

    /// `authorization` is empty or a whole `Proxy-Authorization` header line.
    async fn run(
        &self,
        proxy: &str,
        policy: Option<&DestinationPolicy>,
        authorization: &str,
        check: &CheckSpec,
        deadline: Instant,
    ) -> Result<u16, ProbeFailure> {
        let timeout = |stage: &'static str| ProbeFailure::Timeout {
            after: check.timeout,
            stage,
        };
        let unreachable = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => ProbeFailure::ProxyRefused,
            _ => ProbeFailure::ProxyUnreachable(e.to_string()),
        };
        let mut stream = match policy {
            None => timeout_at(deadline, TcpStream::connect(proxy))
                .await
                .map_err(|_| timeout("connecting to the proxy"))?
                .map_err(unreachable)?,
            Some(policy) => {
                let (host, port) = split_endpoint(proxy)
                    .ok_or_else(|| ProbeFailure::ProxyUnreachable(format!("{proxy:?} is not host:port")))?;
                let left = deadline.saturating_duration_since(Instant::now());
                connect_checked(policy, host, port, false, left)
                    .await
                    .map_err(|e| match e {
                        CheckedConnectError::Refused { .. } => ProbeFailure::EndpointRefused(format!(
                            "endpoint {e}; External endpoints there are refused in Kubernetes mode \
                             unless --allow-external-endpoint-networks lists them"
                        )),
                        CheckedConnectError::Connect { source, .. } => unreachable(source),
                        CheckedConnectError::TimedOut { .. } => timeout("connecting to the proxy"),
                        other => ProbeFailure::ProxyUnreachable(other.to_string()),
                    })?
            }
        };
        // Probes are small request/response exchanges: do not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let url = &check.url;
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(443);
        let authority = match url.port() {
            Some(p) => format!("{}:{p}", bracketed(host)),
            None => bracketed(host),
        };
        let path = &url[url::Position::BeforePath..url::Position::AfterQuery];

        let status = if url.scheme() == "https" {
            let connect = format!(
                "CONNECT {h}:{port} HTTP/1.1\r\nHost: {h}:{port}\r\n{authorization}\r\n",
                h = bracketed(host)
            );
            timeout_at(deadline, stream.write_all(connect.as_bytes()))
                .await
                .map_err(|_| timeout("sending CONNECT"))?
                .map_err(|e| ProbeFailure::ProxyUnreachable(e.to_string()))?;
            let answer = timeout_at(deadline, read_connect_answer(&mut stream))
                .await
                .map_err(|_| timeout("waiting for the proxy's CONNECT answer"))??;
            if !(200..300).contains(&answer) {
                return Err(ProbeFailure::ConnectRefused(answer));
            }
            let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_owned())
                .map_err(|e| ProbeFailure::Tls(e.to_string()))?;
            let mut tls = timeout_at(deadline, self.tls.connect(name, stream))
                .await
                .map_err(|_| timeout("in the TLS handshake with the target"))?
                .map_err(|e| ProbeFailure::Tls(e.to_string()))?;
            crate::telemetry::events::ProbeTlsHandshake {
                resumed: tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
            }
            .emit();
            // Inside the tunnel the target answers: it gets no credentials.
            request(&mut tls, path, &authority, "", deadline, check.timeout).await?
        } else {
            // Absolute URI: the proxy itself fetches the target.
            let target = &url[..url::Position::AfterQuery];
            request(
                &mut stream,
                target,
                &authority,
                authorization,
                deadline,
                check.timeout,
            )
            .await?
        };
        if check.accepts(status) {
            Ok(status)
        } else {
            Err(ProbeFailure::UnexpectedStatus {
                status,
                expected: check.expectation(),
            })
        }
    }
}

fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

async fn request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    target: &str,
    authority: &str,
    authorization: &str,
    deadline: Instant,
    after: Duration,
) -> Result<u16, ProbeFailure> {
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\n{authorization}Accept: */*\r\nConnection: close\r\n\r\n"
    );
    timeout_at(deadline, stream.write_all(req.as_bytes()))
        .await
        .map_err(|_| ProbeFailure::Timeout {
            after,
            stage: "sending the request",
        })?
        .map_err(|e| ProbeFailure::Protocol(format!("sending the request: {e}")))?;
    timeout_at(deadline, read_status(stream))
        .await
        .map_err(|_| ProbeFailure::Timeout {
            after,
            stage: "waiting for the target's response",
        })?
}

/// Reads a response head and returns its status code and how many bytes
/// arrived after it.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(u16, usize), ProbeFailure> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let end = loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| ProbeFailure::Protocol(format!("reading the response: {e}")))?;
        if n == 0 {
            return Err(ProbeFailure::Protocol(
                "connection closed before a response".into(),
            ));
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(pos) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        if head.len() > MAX_HEAD {
            return Err(ProbeFailure::Protocol("response head too large".into()));
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(&head[..end]) {
        Ok(httparse::Status::Complete(_)) => match response.code {
            Some(code) => Ok((code, head.len() - end)),
            None => Err(ProbeFailure::Protocol("no status code".into())),
        },
        Ok(httparse::Status::Partial) => Err(ProbeFailure::Protocol("incomplete response head".into())),
        Err(e) => Err(ProbeFailure::Protocol(e.to_string())),
    }
}

/// The final response's status (its body is not needed).
async fn read_status<S: AsyncRead + Unpin>(stream: &mut S) -> Result<u16, ProbeFailure> {
    read_head(stream).await.map(|(status, _)| status)
}

/// The answer to CONNECT. Nothing may follow it: the target speaks only
/// after our TLS hello, so extra bytes mean a confused proxy.
/// `host:port` (the host an IPv6 address in brackets or not) split in two.
fn split_endpoint(endpoint: &str) -> Option<(&str, u16)> {
    let (host, port) = endpoint.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

async fn read_connect_answer<S: AsyncRead + Unpin>(stream: &mut S) -> Result<u16, ProbeFailure> {
    match read_head(stream).await? {
        (status, 0) => Ok(status),
        (status, _) if !(200..300).contains(&status) => Ok(status),
        (_, extra) => Err(ProbeFailure::Protocol(format!(
            "{extra} unexpected bytes after the CONNECT answer"
        ))),
    }
}
