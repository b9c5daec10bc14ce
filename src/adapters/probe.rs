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

use crate::adapters::checked_connect::{CheckedConnectError, connect_checked};
use crate::domain::credentials::ProxyCredentials;
use crate::domain::destinations::DestinationPolicy;
use crate::domain::health::{CheckSpec, ProbeTarget};

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
        let config = ClientConfig::builder_with_provider(Arc::new(probe_crypto()))
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
            // Inside the tunnel the target answers: it gets no credentials.
            let get = request_head(path, &authority, "");
            self.get_over_tls(name, stream, &get, deadline, check.timeout)
                .await?
        } else {
            // Absolute URI: the proxy itself fetches the target.
            let get = request_head(&url[..url::Position::AfterQuery], &authority, authorization);
            timeout_at(deadline, stream.write_all(get.as_bytes()))
                .await
                .map_err(|_| timeout("sending the request"))?
                .map_err(|e| ProbeFailure::Protocol(format!("sending the request: {e}")))?;
            response_status(&mut stream, deadline, check.timeout).await?
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

    /// TLS to `name` over `stream` (the tunnel), then `get`; the response's
    /// status. `get` is queued before the handshake, so it leaves in the
    /// same write as the client's Finished: one write and one packet fewer
    /// per probe for the prober, the proxy and the target. It is not early
    /// data: rustls holds it until the handshake is done.
    async fn get_over_tls<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        name: ServerName<'static>,
        stream: S,
        get: &str,
        deadline: Instant,
        after: Duration,
    ) -> Result<u16, ProbeFailure> {
        let mut queued: std::io::Result<()> = Ok(());
        let connect = self.tls.connect_with(name, stream, |tls| {
            // Room for the whole request, however long its URL: the probe
            // sends nothing else.
            tls.set_buffer_limit(None);
            queued = std::io::Write::write_all(&mut tls.writer(), get.as_bytes());
        });
        let mut tls = timeout_at(deadline, connect)
            .await
            .map_err(|_| ProbeFailure::Timeout {
                after,
                stage: "in the TLS handshake with the target",
            })?
            .map_err(|e| ProbeFailure::Tls(e.to_string()))?;
        queued.map_err(|e| ProbeFailure::Protocol(format!("sending the request: {e}")))?;
        crate::telemetry::events::ProbeTlsHandshake {
            resumed: tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
        }
        .emit();
        response_status(&mut tls, deadline, after).await
    }
}

/// ring's suites with AES-128-GCM first, as Go and BoringSSL order them
/// where the CPU has AES instructions. Its SHA-256 key schedule runs on the
/// CPU's SHA instructions, where SHA-384's does not (in a resumed probe's
/// profile it cost as much as the key exchange). The target still picks;
/// every suite stays on offer.
fn probe_crypto() -> rustls::crypto::CryptoProvider {
    use rustls::CipherSuite::{
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        TLS13_AES_128_GCM_SHA256,
    };
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            TLS13_AES_128_GCM_SHA256
                | TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    provider
}

fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// A `GET` for `target` (an origin-form path, or an absolute URI for a proxy).
fn request_head(target: &str, authority: &str, authorization: &str) -> String {
    format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\n{authorization}Accept: */*\r\nConnection: close\r\n\r\n"
    )
}

/// The final response's status (its body is not needed).
async fn response_status<S: AsyncRead + Unpin>(
    stream: &mut S,
    deadline: Instant,
    after: Duration,
) -> Result<u16, ProbeFailure> {
    timeout_at(deadline, read_head(stream))
        .await
        .map_err(|_| ProbeFailure::Timeout {
            after,
            stage: "waiting for the target's response",
        })?
        .map(|(status, _)| status)
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

/// `host:port` (the host an IPv6 address in brackets or not) split in two.
fn split_endpoint(endpoint: &str) -> Option<(&str, u16)> {
    let (host, port) = endpoint.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// The answer to CONNECT. Nothing may follow it: the target speaks only
/// after our TLS hello, so extra bytes mean a confused proxy.
async fn read_connect_answer<S: AsyncRead + Unpin>(stream: &mut S) -> Result<u16, ProbeFailure> {
    match read_head(stream).await? {
        (status, 0) => Ok(status),
        (status, _) if !(200..300).contains(&status) => Ok(status),
        (_, extra) => Err(ProbeFailure::Protocol(format!(
            "{extra} unexpected bytes after the CONNECT answer"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

    use super::*;

    /// The client's side of the tunnel: each write call is logged (its
    /// size), and a vectored write goes out whole, as `writev` on a socket.
    struct LoggedWrites {
        inner: DuplexStream,
        writes: Arc<Mutex<Vec<usize>>>,
    }

    impl AsyncRead for LoggedWrites {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for LoggedWrites {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let whole: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let written = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &whole))?;
            self.writes.lock().unwrap().push(written);
            Poll::Ready(Ok(written))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// The client's end of the pipe, what to trust, and what the target was asked.
    type Target = (
        DuplexStream,
        rustls::RootCertStore,
        tokio::task::JoinHandle<String>,
    );

    /// A TLS target (speaking only `versions`) on the other end of a pipe:
    /// answers one request with 204.
    fn target(versions: &[&'static rustls::SupportedProtocolVersion]) -> Target {
        let cert = rcgen::generate_simple_self_signed(vec!["target.test".to_owned()]).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.cert.der().clone()],
                    rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
                )
                .unwrap();
        let (client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(async move {
            let mut tls = tokio_rustls::TlsAcceptor::from(Arc::new(config))
                .accept(server)
                .await
                .unwrap();
            let mut asked = Vec::new();
            while !asked.ends_with(b"\r\n\r\n") {
                let mut chunk = [0u8; 512];
                let n = tls.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the request never came");
                asked.extend_from_slice(&chunk[..n]);
            }
            tls.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            tls.shutdown().await.unwrap();
            String::from_utf8(asked).unwrap()
        });
        (client, roots, served)
    }

    /// Probes `target` over a tunnel that logs the client's writes; their sizes.
    async fn probe_logged(target: Target) -> Vec<usize> {
        probe_path_logged(target, "/generate_204").await
    }

    async fn probe_path_logged((pipe, roots, served): Target, path: &str) -> Vec<usize> {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let tunnel = LoggedWrites {
            inner: pipe,
            writes: writes.clone(),
        };
        let prober = Prober::with_roots(roots).unwrap();
        let get = request_head(path, "target.test", "");
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = prober
            .get_over_tls(
                ServerName::try_from("target.test").unwrap(),
                tunnel,
                &get,
                deadline,
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(status, 204);
        assert_eq!(served.await.unwrap(), get, "the target got the request");
        writes.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn the_request_leaves_in_the_same_write_as_the_tls_finished() {
        let writes = probe_logged(target(&[&rustls::version::TLS13])).await;
        // The ClientHello, then the client's Finished with the request.
        assert_eq!(writes.len(), 2, "writes: {writes:?}");
    }

    #[tokio::test]
    async fn a_request_longer_than_rustls_buffers_by_default_is_sent_whole() {
        let path = format!("/{}", "a".repeat(100 * 1024));
        let writes = probe_path_logged(target(&[&rustls::version::TLS13]), &path).await;
        assert!(writes.iter().sum::<usize>() > 100 * 1024, "writes: {writes:?}");
    }

    #[tokio::test]
    async fn a_tls_1_2_target_gets_the_request_once_the_handshake_is_done() {
        // TLS 1.2's client Finished comes before the server's: the queued
        // request waits for the server's Finished.
        let writes = probe_logged(target(&[&rustls::version::TLS12])).await;
        assert_eq!(writes.len(), 3, "writes: {writes:?}");
    }

    #[test]
    fn aes_128_gcm_is_offered_first_and_every_suite_stays_on_offer() {
        let ours: Vec<_> = probe_crypto().cipher_suites.iter().map(|s| s.suite()).collect();
        let ring: Vec<_> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(ours[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        let first_tls12 = ours
            .iter()
            .position(|s| format!("{s:?}").starts_with("TLS_ECDHE"))
            .unwrap();
        assert!(format!("{:?}", ours[first_tls12]).contains("AES_128_GCM"));
        let (mut a, mut b) = (ours.clone(), ring);
        a.sort_by_key(|s| u16::from(*s));
        b.sort_by_key(|s| u16::from(*s));
        assert_eq!(a, b);
    }
}
