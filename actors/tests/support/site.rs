//! A site on loopback that sees what proxies do to it: each proxy leaves
//! from an outgoing address of its own (the local provider's
//! `outgoingAddresses`), so the site counts per source address — the
//! connections open now and the most ever open at once (updated at every
//! open under one lock: exact, not sampled), and one line per request
//! (instant, source, host). It answers `200 ok`, or `403 blocked` to the
//! (source, host) pairs a test blocks, as a site blocking a proxy's address
//! does.
//!
//! One request per connection (`Connection: close`) unless started with
//! [`SiteOptions::keep_alive`]; a connection that sends nothing (a tunnel
//! held open) is counted while open.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How many requests and open/close events are kept (the oldest go first);
/// counters and maxima are kept whole.
const KEPT: usize = 200_000;

/// One request the site answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteRequest {
    pub at: Instant,
    pub source: IpAddr,
    /// The `Host` header as sent (with its port, if any).
    pub host: String,
    pub status: u16,
}

/// A connection opened or closed, with the source's open count after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteEvent {
    pub at: Instant,
    pub source: IpAddr,
    pub opened: bool,
    pub open_after: usize,
}

#[derive(Clone, Copy, Debug)]
pub struct SiteOptions {
    /// Serve requests on a connection until the client closes it or asks
    /// for `Connection: close` (default: one request, then close).
    pub keep_alive: bool,
    /// The address to listen on (a free port of it): sites on distinct
    /// loopback addresses are distinct targets for the lease book, as
    /// names would be (no `*.test` name resolves here). Default 127.0.0.1.
    pub ip: IpAddr,
}

impl Default for SiteOptions {
    fn default() -> Self {
        Self {
            keep_alive: false,
            ip: IpAddr::from([127, 0, 0, 1]),
        }
    }
}

#[derive(Default)]
struct State {
    open: usize,
    most_open: usize,
    open_by_source: BTreeMap<IpAddr, usize>,
    most_by_source: BTreeMap<IpAddr, usize>,
    requests_by_source: BTreeMap<IpAddr, usize>,
    requests: VecDeque<SiteRequest>,
    events: VecDeque<SiteEvent>,
    bodies: Vec<Vec<u8>>,
    /// (source, host) pairs answered 403; host `None`: every host.
    blocked: BTreeSet<(IpAddr, Option<String>)>,
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.len() == KEPT {
        queue.pop_front();
    }
    queue.push_back(item);
}

/// What the site saw; shared with the test.
#[derive(Default)]
pub struct SiteLog(Mutex<State>);

impl SiteLog {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn opened(&self, source: IpAddr) {
        let mut s = self.state();
        s.open += 1;
        s.most_open = s.most_open.max(s.open);
        let now = {
            let n = s.open_by_source.entry(source).or_default();
            *n += 1;
            *n
        };
        let most = s.most_by_source.entry(source).or_default();
        *most = (*most).max(now);
        let event = SiteEvent {
            at: Instant::now(),
            source,
            opened: true,
            open_after: now,
        };
        push_bounded(&mut s.events, event);
    }

    fn closed(&self, source: IpAddr) {
        let mut s = self.state();
        s.open -= 1;
        let now = {
            let n = s.open_by_source.entry(source).or_default();
            *n -= 1;
            *n
        };
        let event = SiteEvent {
            at: Instant::now(),
            source,
            opened: false,
            open_after: now,
        };
        push_bounded(&mut s.events, event);
    }

    /// The status for a request from `source` for `host`, logged.
    fn answer(&self, source: IpAddr, host: &str) -> u16 {
        let mut s = self.state();
        let bare = host_without_port(host);
        let blocked = s.blocked.contains(&(source, None))
            || s.blocked.contains(&(source, Some(host.to_owned())))
            || s.blocked.contains(&(source, Some(bare.to_owned())));
        let status = if blocked { 403 } else { 200 };
        *s.requests_by_source.entry(source).or_default() += 1;
        let request = SiteRequest {
            at: Instant::now(),
            source,
            host: host.to_owned(),
            status,
        };
        push_bounded(&mut s.requests, request);
        status
    }

    /// Answers `403` to requests from `source` for `host` (as sent, or
    /// without its port); `None`: for every host.
    pub fn block(&self, source: IpAddr, host: Option<&str>) {
        self.state().blocked.insert((source, host.map(str::to_owned)));
    }

    pub fn unblock(&self, source: IpAddr, host: Option<&str>) {
        self.state().blocked.remove(&(source, host.map(str::to_owned)));
    }

    /// Connections open now, from every source.
    pub fn open(&self) -> usize {
        self.state().open
    }

    /// The most connections open at once, from every source.
    pub fn most_open(&self) -> usize {
        self.state().most_open
    }

    /// Connections open now from `source`.
    pub fn open_from(&self, source: IpAddr) -> usize {
        self.state().open_by_source.get(&source).copied().unwrap_or(0)
    }

    /// The most connections open at once from each source (each proxy).
    pub fn most_open_by_source(&self) -> BTreeMap<IpAddr, usize> {
        self.state().most_by_source.clone()
    }

    /// Requests answered per source (every one, not only those kept).
    pub fn requests_by_source(&self) -> BTreeMap<IpAddr, usize> {
        self.state().requests_by_source.clone()
    }

    /// The requests answered, oldest first (the last 200,000).
    pub fn requests(&self) -> Vec<SiteRequest> {
        self.state().requests.iter().cloned().collect()
    }

    /// Connections opened and closed, oldest first (the last 200,000).
    pub fn events(&self) -> Vec<SiteEvent> {
        self.state().events.iter().copied().collect()
    }

    /// Request bodies received (by `Content-Length`), in order.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.state().bodies.clone()
    }
}

fn host_without_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => name,
        _ => host,
    }
}

/// A running site; serves until the test's runtime ends.
pub struct Site {
    pub addr: SocketAddr,
    pub log: Arc<SiteLog>,
}

impl Site {
    /// A site on a free port of 127.0.0.1, one request per connection.
    pub async fn start() -> Self {
        Self::start_with(SiteOptions::default()).await
    }

    pub async fn start_with(options: SiteOptions) -> Self {
        let listener = TcpListener::bind((options.ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(SiteLog::default());
        let seen = log.clone();
        tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let log = seen.clone();
                tokio::spawn(async move {
                    log.opened(peer.ip());
                    serve(stream, peer.ip(), &log, options).await;
                    log.closed(peer.ip());
                });
            }
        });
        Self { addr, log }
    }
}

/// Serves one connection: a request (or several, keeping alive), then closes.
async fn serve(mut s: TcpStream, source: IpAddr, log: &SiteLog, options: SiteOptions) {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let length = header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let close =
            !options.keep_alive || header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let host = header("host").unwrap_or_default();
        let mut body = got[head_end..].to_vec();
        while body.len() < length {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&buf[..n]),
            }
        }
        got = body.split_off(length.min(body.len()));
        if length > 0 {
            log.state().bodies.push(body);
        }
        let status = log.answer(source, &host);
        let connection = if close { "close" } else { "keep-alive" };
        let answer = match status {
            403 => format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nConnection: {connection}\r\n\r\nblocked"
            ),
            _ => format!("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: {connection}\r\n\r\nok"),
        };
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if close {
            let _ = s.shutdown().await;
            return;
        }
    }
}
