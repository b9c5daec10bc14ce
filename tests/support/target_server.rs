//! Probe targets on loopback: an HTTPS server with a self-signed certificate
//! and a plain HTTP server, both answering `204 No Content`, and a client
//! that fetches through a forward proxy the way the health engine will.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How a target answers.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    Status(u16),
    /// Reads the request and never answers.
    Silent,
}

/// Request heads a target received.
pub type Seen = Arc<std::sync::Mutex<Vec<String>>>;

async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    how: Behaviour,
    seen: Seen,
) {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    seen.lock()
        .unwrap()
        .push(String::from_utf8_lossy(&got).into_owned());
    match how {
        Behaviour::Status(code) => {
            let reason = if code == 204 { "No Content" } else { "Test" };
            let head = format!("HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.shutdown().await;
        }
        Behaviour::Silent => tokio::time::sleep(std::time::Duration::from_secs(60)).await,
    }
}

/// A plain HTTP target answering 204.
pub async fn http_target() -> SocketAddr {
    http_target_with(Behaviour::Status(204)).await.0
}

/// A plain HTTP target with the given behaviour.
pub async fn http_target_with(how: Behaviour) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer(s, how, record.clone()));
        }
    });
    (addr, seen)
}

/// An HTTPS target for `localhost` answering 204; returns its address and certificate.
pub async fn https_target() -> (SocketAddr, CertificateDer<'static>) {
    let (addr, cert, _) = https_target_with(Behaviour::Status(204)).await;
    (addr, cert)
}

/// An HTTPS target for `localhost` with the given behaviour.
pub async fn https_target_with(how: Behaviour) -> (SocketAddr, CertificateDer<'static>, Seen) {
    let (addr, der, seen, _) = https_target_noting_resumptions(how).await;
    (addr, der, seen)
}

/// Whether each TLS handshake the target accepted resumed an earlier session.
pub type Resumptions = Arc<std::sync::Mutex<Vec<bool>>>;

/// [`https_target_with`], also noting for every handshake whether it
/// resumed a session (the target issues TLS 1.3 tickets, as public sites do).
pub async fn https_target_noting_resumptions(
    how: Behaviour,
) -> (SocketAddr, CertificateDer<'static>, Seen, Resumptions) {
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
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let resumptions = Resumptions::default();
    let (record, handshakes) = (seen.clone(), resumptions.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, record, handshakes) = (acceptor.clone(), record.clone(), handshakes.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                    handshakes.lock().unwrap().push(resumed);
                    answer(tls, how, record).await;
                }
            });
        }
    });
    (addr, der, seen, resumptions)
}

async fn status_line<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(0) | Err(_) => break,
            Ok(_) => got.push(byte[0]),
        }
    }
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `CONNECT localhost:<port>` through `proxy`, TLS to the target, `GET /`; the final status line.
pub async fn get_via_connect(proxy: SocketAddr, target_port: u16, ca: &CertificateDer<'static>) -> String {
    get_via_connect_as(proxy, None, target_port, ca).await
}

/// [`get_via_connect`], presenting `authorization` (a `Proxy-Authorization` value) on CONNECT.
pub async fn get_via_connect_as(
    proxy: SocketAddr,
    authorization: Option<&str>,
    target_port: u16,
    ca: &CertificateDer<'static>,
) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let auth = proxy_authorization(authorization);
    let connect =
        format!("CONNECT localhost:{target_port} HTTP/1.1\r\nHost: localhost:{target_port}\r\n{auth}\r\n");
    s.write_all(connect.as_bytes()).await.unwrap();
    let answer = status_line(&mut s).await;
    if !answer.contains(" 200") {
        return format!("CONNECT refused: {answer}");
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), s)
        .await
        .unwrap();
    tls.write_all(format!("GET / HTTP/1.1\r\nHost: localhost:{target_port}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    status_line(&mut tls).await
}

/// Absolute-URI `GET http://<target>/` through `proxy`; the status line.
pub async fn get_via_absolute_uri(proxy: SocketAddr, target: SocketAddr) -> String {
    get_via_absolute_uri_as(proxy, None, target).await
}

/// [`get_via_absolute_uri`], presenting `authorization` (a `Proxy-Authorization` value).
pub async fn get_via_absolute_uri_as(
    proxy: SocketAddr,
    authorization: Option<&str>,
    target: SocketAddr,
) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let auth = proxy_authorization(authorization);
    s.write_all(format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    status_line(&mut s).await
}

fn proxy_authorization(value: Option<&str>) -> String {
    value
        .map(|v| format!("Proxy-Authorization: {v}\r\n"))
        .unwrap_or_default()
}
