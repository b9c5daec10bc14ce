//! Connections to the leased upstream proxies: opened fresh for a tunnel
//! (its own `CONNECT`) or for a request whose body streams, and otherwise
//! kept alive between plain-HTTP requests through the same proxy. A request
//! costs the proxy far less on a kept connection than on a new one (Squid
//! spends about twice the CPU on a request that brings its own connection).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{HeaderMap, Uri};
use hyper::client::conn::http1 as client;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::phases::log::{Counted, Meter};
use super::{GatewayError, Upstream};
use crate::adapters::forward_proxy::body::ProxyBody;
use crate::adapters::forward_proxy::tunnel::TunnelUpstream;
use crate::adapters::forward_proxy::zero_copy::End;

/// Time allowed to connect to an upstream proxy.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle connection is not reused after this long: proxies close idle
/// client connections themselves (the built-in one after 15 s).
const IDLE_FOR: Duration = Duration::from_secs(10);
/// Idle connections kept per proxy, and in all (each holds a descriptor).
const MAX_IDLE_PER_PROXY: usize = 32;
const MAX_IDLE: usize = 512;
/// How long a connection whose response ended may take to be ready again.
const READY_WITHIN: Duration = Duration::from_secs(2);

/// A connection that can carry requests to one proxy.
pub struct Connection {
    pub sender: client::SendRequest<ProxyBody>,
    pub meter: Meter,
    /// Taken from the pool (it may have been closed meanwhile: a failure
    /// before any answer is the connection's, not the proxy's).
    pub reused: bool,
}

struct Idle {
    sender: client::SendRequest<ProxyBody>,
    meter: Meter,
    since: Instant,
}

/// Idle connections by proxy URL.
#[derive(Default)]
pub struct UpstreamPool {
    idle: Mutex<(HashMap<String, Vec<Idle>>, usize)>,
}

impl UpstreamPool {
    fn locked(&self) -> MutexGuard<'_, (HashMap<String, Vec<Idle>>, usize)> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used idle connection to `url` still open.
    pub fn take(&self, url: &str) -> Option<Connection> {
        let mut guard = self.locked();
        let (by_url, count) = &mut *guard;
        let idle = by_url.get_mut(url)?;
        let mut found = None;
        while let Some(candidate) = idle.pop() {
            *count -= 1;
            if candidate.since.elapsed() < IDLE_FOR && candidate.sender.is_ready() {
                found = Some(Connection {
                    sender: candidate.sender,
                    meter: candidate.meter,
                    reused: true,
                });
                break;
            }
        }
        if idle.is_empty() {
            by_url.remove(url);
        }
        found
    }

    /// Keeps `connection` for the next request to `url` once its response
    /// has ended and it is ready again (never, if it closes).
    pub fn give_back(self: &Arc<Self>, url: String, mut connection: Connection) {
        // Usually ready already (the response has ended): kept at once,
        // without a task of its own.
        if connection.sender.is_ready() {
            return self.keep(url, connection);
        }
        let pool = self.clone();
        tokio::spawn(async move {
            let ready = tokio::time::timeout(READY_WITHIN, connection.sender.ready()).await;
            if matches!(ready, Ok(Ok(()))) {
                pool.keep(url, connection);
            }
        });
    }

    fn keep(&self, url: String, connection: Connection) {
        let mut guard = self.locked();
        let (by_url, count) = &mut *guard;
        if *count >= MAX_IDLE {
            return;
        }
        let idle = by_url.entry(url).or_default();
        if idle.len() >= MAX_IDLE_PER_PROXY {
            return;
        }
        idle.push(Idle {
            sender: connection.sender,
            meter: connection.meter,
            since: Instant::now(),
        });
        *count += 1;
    }
}

/// Adds the leased proxy's credentials (never the crawler's).
pub fn authorize(headers: &mut HeaderMap, upstream: &Upstream) {
    if let Some(credentials) = &upstream.credentials
        && let Ok(value) = HeaderValue::from_str(&credentials.basic_authorization())
    {
        headers.insert(header::PROXY_AUTHORIZATION, value);
    }
}

/// A fresh HTTP/1 connection to the leased proxy, its bytes counted by `meter`.
pub async fn open(upstream: &Upstream, meter: Meter) -> Result<Connection, GatewayError> {
    let uri: Uri = upstream
        .url
        .parse()
        .map_err(|e| upstream_failed(upstream, &format!("its URL does not parse: {e}")))?;
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port)))
        .await
        .map_err(|_| upstream_failed(upstream, &"connecting timed out"))?
        .map_err(|e| upstream_failed(upstream, &e))?;
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set on an upstream proxy connection");
    }
    let stream = Counted::new(stream, meter.clone());
    let (sender, connection) = client::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| upstream_failed(upstream, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "upstream proxy connection ended with an error");
        }
    });
    Ok(Connection {
        sender,
        meter,
        reused: false,
    })
}

/// A tunnel through a leased proxy is relayed on the proxy's socket, past
/// the counting wrapper (the relay counts instead).
impl TunnelUpstream for TokioIo<hyper::upgrade::Upgraded> {
    fn into_end(self) -> Result<End, Self> {
        match self.into_inner().downcast::<TokioIo<Counted<TcpStream>>>() {
            Ok(parts) => Ok(End {
                socket: parts.io.into_inner().into_inner(),
                early: parts.read_buf,
            }),
            Err(upgraded) => Err(TokioIo::new(upgraded)),
        }
    }
}

pub fn upstream_failed(upstream: &Upstream, why: &dyn std::fmt::Display) -> GatewayError {
    GatewayError::Upstream {
        proxy: upstream.proxy.to_string(),
        why: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::resource::ObjectKey;
    use http::{Request, Response};
    use http_body::Body as _;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A keep-alive HTTP server on loopback standing in for a proxy; counts
    /// the connections it accepts.
    async fn proxy() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(Response::new(ProxyBody::read_ahead(
                            bytes::Bytes::from_static(b"ok"),
                            None,
                            None,
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    async fn get(connection: &mut Connection) -> u16 {
        let request = Request::get("http://site.example/")
            .body(ProxyBody::empty(None))
            .unwrap();
        let mut response = connection.sender.send_request(request).await.unwrap();
        let body = response.body_mut();
        while std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx))
            .await
            .is_some()
        {}
        response.status().as_u16()
    }

    #[tokio::test]
    async fn a_connection_given_back_carries_the_next_request() {
        let (addr, accepted) = proxy().await;
        let upstream = Upstream {
            lease_id: "l".into(),
            proxy: ObjectKey::new("ns", "p"),
            url: format!("http://{addr}"),
            credentials: None,
            realm: None,
            ttl: Duration::from_secs(60),
            revoked: super::super::Revocation::never(),
        };
        let pool = Arc::new(UpstreamPool::default());
        let transferred = Arc::default();
        let mut first = open(&upstream, super::super::phases::log::meter(&transferred))
            .await
            .unwrap();
        assert_eq!(get(&mut first).await, 200);
        pool.give_back(upstream.url.clone(), first);
        let mut again = None;
        for _ in 0..100 {
            again = pool.take(&upstream.url);
            if again.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut again = again.expect("the connection came back to the pool");
        assert!(again.reused);
        assert_eq!(get(&mut again).await, 200);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "both requests on one connection"
        );
        assert!(pool.take(&upstream.url).is_none(), "taken: not kept twice");
        assert!(pool.take("http://127.0.0.1:1").is_none());
    }
}
