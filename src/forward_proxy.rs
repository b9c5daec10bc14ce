//! A small forward HTTP proxy: `CONNECT host:port` tunnels and absolute-URI
//! requests (`GET http://host/path`). The local provider runs it as a
//! separate process when Squid is not installed. Like the Squid config the
//! operator generates, it adds no `Via` or `X-Forwarded-For` header, so
//! targets see a plain client. Given credentials, it demands them in
//! `Proxy-Authorization` (Basic) before relaying anything; then every
//! destination passes the provider's destination rules (see
//! `destinations`): refused ones get 403. Given an outgoing address, it
//! connects to destinations from that address.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::credentials::BasicAuthorization;
use crate::destinations::{CheckedConnectError, DestinationPolicy, connect_checked_from};

/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// Time allowed for the client's request head and for the upstream connect.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Headers that concern only the hop to this proxy.
const HOP_HEADERS: [&str; 5] = [
    "proxy-connection",
    "proxy-authorization",
    "connection",
    "keep-alive",
    "te",
];

/// The realm named in a 407's `Proxy-Authenticate`.
const REALM: &str = "egress-proxies";

/// Serves until the listener fails. With `auth`, every request must present it.
pub async fn serve(
    listener: TcpListener,
    destinations: Arc<DestinationPolicy>,
    auth: Option<BasicAuthorization>,
) -> io::Result<()> {
    serve_from(listener, destinations, auth, None).await
}

/// [`serve`], connecting to destinations from `outgoing` (those of its IP
/// family; see [`connect_checked_from`]).
pub async fn serve_from(
    listener: TcpListener,
    destinations: Arc<DestinationPolicy>,
    auth: Option<BasicAuthorization>,
    outgoing: Option<IpAddr>,
) -> io::Result<()> {
    let auth = auth.map(Arc::new);
    loop {
        let (client, peer) = listener.accept().await?;
        let (destinations, auth) = (destinations.clone(), auth.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(client, &destinations, auth.as_deref(), outgoing).await {
                tracing::debug!(%peer, error = %e, "proxied connection ended with an error");
            }
        });
    }
}

async fn handle(
    mut client: TcpStream,
    destinations: &DestinationPolicy,
    auth: Option<&BasicAuthorization>,
    outgoing: Option<IpAddr>,
) -> io::Result<()> {
    let (head, rest) = match tokio::time::timeout(STEP_TIMEOUT, read_head(&mut client)).await {
        Ok(result) => result?,
        Err(_) => return reply(&mut client, 408, "Request Timeout").await,
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    if !matches!(request.parse(&head), Ok(httparse::Status::Complete(_))) {
        return reply(&mut client, 400, "Bad Request").await;
    }
    if let Some(auth) = auth {
        let presented = request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
            .map(|h| h.value);
        if !presented.is_some_and(|value| auth.admits(value)) {
            return refuse_unauthenticated(&mut client).await;
        }
    }
    let method = request.method.unwrap_or_default().to_owned();
    let target = request.path.unwrap_or_default().to_owned();

    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = target.rsplit_once(':') else {
            return reply(&mut client, 400, "Bad Request").await;
        };
        let Ok(port) = port.parse::<u16>() else {
            return reply(&mut client, 400, "Bad Request").await;
        };
        let mut upstream =
            match connect_checked_from(destinations, host, port, true, STEP_TIMEOUT, outgoing).await {
                Ok(upstream) => upstream,
                Err(e) => return refuse(&mut client, e).await,
            };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        upstream.write_all(&rest).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }

    let Ok(url) = url::Url::parse(&target) else {
        return reply(&mut client, 400, "Bad Request").await;
    };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return reply(&mut client, 400, "Bad Request").await;
    };
    if url.scheme() != "http" {
        return reply(&mut client, 400, "Bad Request").await;
    }
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    };
    let mut upstream =
        match connect_checked_from(destinations, host, port, false, STEP_TIMEOUT, outgoing).await {
            Ok(upstream) => upstream,
            Err(e) => return refuse(&mut client, e).await,
        };
    let path = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    let mut has_host = false;
    for h in request.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if HOP_HEADERS.contains(&name.as_str()) {
            continue;
        }
        has_host |= name == "host";
        out.push_str(h.name);
        out.push_str(": ");
        out.push_str(&String::from_utf8_lossy(h.value));
        out.push_str("\r\n");
    }
    if !has_host {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    // One request per connection keeps the relay a plain byte copy.
    out.push_str("Connection: close\r\n\r\n");
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Reads up to the end of the request head; returns the head and any bytes after it.
async fn read_head(client: &mut TcpStream) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client closed before the request head ended",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
    }
}

/// 403 for a refused destination, 502 when it could not be reached.
async fn refuse(client: &mut TcpStream, e: CheckedConnectError) -> io::Result<()> {
    tracing::info!(error = %e, "destination not reached");
    match e {
        CheckedConnectError::Refused { .. } => reply(client, 403, "Forbidden").await,
        _ => reply(client, 502, "Bad Gateway").await,
    }
}

async fn refuse_unauthenticated(client: &mut TcpStream) -> io::Result<()> {
    let response = format!(
        "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"{REALM}\"\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    client.write_all(response.as_bytes()).await
}

async fn reply(client: &mut TcpStream, code: u16, reason: &str) -> io::Result<()> {
    let response = format!("HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    client.write_all(response.as_bytes()).await
}
