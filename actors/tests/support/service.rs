//! A Kubernetes Service in front of operator replicas, as kube-proxy makes
//! one: a TCP address on 127.0.0.1 that sends each NEW connection to the
//! next ready backend, round-robin, and leaves it there for its life (a
//! connection is never moved, even when its backend turns unready or
//! dies). Readiness is each backend's `/readyz`, polled every 100 ms (a
//! readiness probe with `periodSeconds` 0.1). With no ready backend a
//! connection is reset at once, as a Service without endpoints rejects it;
//! a backend that refuses the connection or resets it makes the spreader
//! reset the client's side too, so the client sees what it would see
//! through kube-proxy's NAT.
//!
//! Every accepted connection is recorded — which backend took it, bytes
//! each way, how it ended — the last [`KEPT`] in full, counts per backend
//! whole.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Finished connections kept in full (the oldest go first).
pub const KEPT: usize = 50_000;

/// How often each backend's readiness is looked at, and how long one look may take.
const READINESS_EVERY: Duration = Duration::from_millis(100);
const READINESS_TIMEOUT: Duration = Duration::from_millis(500);

/// One endpoint behind the Service: where its readiness is asked, where
/// its connections go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Answers `GET /readyz` (200: ready).
    pub health: SocketAddr,
    /// The port the Service forwards to.
    pub serve: SocketAddr,
}

/// What happened to one accepted connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub id: u64,
    /// The client's address (its own end of the connection).
    pub peer: SocketAddr,
    pub accepted: Instant,
    /// The backend's index; `None`: no backend was ready.
    pub backend: Option<usize>,
    /// Once it has ended.
    pub ended: Option<Instant>,
    /// Bytes from the client to the backend, and back.
    pub sent: u64,
    pub received: u64,
    /// Why it ended other than by both sides closing: no ready backend,
    /// the backend refused the connection, a reset on either side.
    pub error: Option<String>,
}

#[derive(Default)]
struct Records {
    open: HashMap<u64, ConnectionRecord>,
    finished: VecDeque<ConnectionRecord>,
    /// Connections accepted per backend (`None`: refused for want of one).
    per_backend: BTreeMap<Option<usize>, u64>,
    /// Of those, how many ended with an error.
    failed_per_backend: BTreeMap<Option<usize>, u64>,
}

struct Shared {
    backends: Vec<Backend>,
    /// Each backend's last readiness verdict.
    ready: Vec<std::sync::atomic::AtomicBool>,
    next: AtomicUsize,
    ids: AtomicU64,
    records: Mutex<Records>,
}

impl Shared {
    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next ready backend after the last one chosen.
    fn choose(&self) -> Option<usize> {
        let n = self.backends.len();
        let start = self.next.fetch_add(1, Ordering::SeqCst);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.ready[i].load(Ordering::SeqCst))
    }

    fn finish(&self, id: u64, sent: u64, received: u64, error: Option<String>) {
        let mut records = self.records();
        let Some(mut record) = records.open.remove(&id) else {
            return;
        };
        record.ended = Some(Instant::now());
        record.sent = sent;
        record.received = received;
        if error.is_some() {
            *records.failed_per_backend.entry(record.backend).or_default() += 1;
        }
        record.error = error;
        if records.finished.len() == KEPT {
            records.finished.pop_front();
        }
        records.finished.push_back(record);
    }
}

/// A running Service; its tasks end when it is dropped.
pub struct FakeService {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for FakeService {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl FakeService {
    /// Listens on a free port of 127.0.0.1 and starts polling `backends`;
    /// every backend counts as unready until its first `/readyz` 200.
    pub async fn start(backends: Vec<Backend>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            ready: backends
                .iter()
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            backends,
            next: AtomicUsize::new(0),
            ids: AtomicU64::new(0),
            records: Mutex::default(),
        });
        let mut tasks: Vec<JoinHandle<()>> = (0..shared.backends.len())
            .map(|i| tokio::spawn(poll_readiness(shared.clone(), i)))
            .collect();
        tasks.push(tokio::spawn(accept(listener, shared.clone())));
        Self { addr, shared, tasks }
    }

    /// Where clients connect (the Service's address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The backends a new connection may go to now.
    pub fn ready(&self) -> Vec<usize> {
        (0..self.shared.backends.len())
            .filter(|&i| self.shared.ready[i].load(Ordering::SeqCst))
            .collect()
    }

    /// Every connection kept: the last [`KEPT`] finished ones, then the open ones, by id.
    pub fn connections(&self) -> Vec<ConnectionRecord> {
        let records = self.shared.records();
        let mut all: Vec<ConnectionRecord> = records
            .finished
            .iter()
            .chain(records.open.values())
            .cloned()
            .collect();
        all.sort_by_key(|r| r.id);
        all
    }

    /// The connection kept whose client end is `peer` (a client's
    /// `local_addr()`) and which was accepted by `by`: the latest such (a
    /// port is used again only once its connection ended). Which backend
    /// took it, and when.
    pub fn connection_of(&self, peer: SocketAddr, by: Instant) -> Option<ConnectionRecord> {
        let records = self.shared.records();
        records
            .open
            .values()
            .chain(records.finished.iter())
            .filter(|r| r.peer == peer && r.accepted <= by)
            .max_by_key(|r| r.accepted)
            .cloned()
    }

    /// Connections accepted and not yet ended (both sides closed).
    pub fn open_connections(&self) -> usize {
        self.shared.records().open.len()
    }

    /// Connections accepted per backend (`None`: none was ready), every one.
    pub fn accepted_per_backend(&self) -> BTreeMap<Option<usize>, u64> {
        self.shared.records().per_backend.clone()
    }

    /// Of those, the ones that ended with an error, per backend.
    pub fn failed_per_backend(&self) -> BTreeMap<Option<usize>, u64> {
        self.shared.records().failed_per_backend.clone()
    }
}

/// Looks at backend `i`'s `/readyz` every 100 ms.
async fn poll_readiness(shared: Arc<Shared>, i: usize) {
    let health = shared.backends[i].health;
    let mut ticker = tokio::time::interval(READINESS_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let look = super::http::try_request(health, "GET", "/readyz");
        let ready = matches!(tokio::time::timeout(READINESS_TIMEOUT, look).await, Ok(Ok(200)));
        shared.ready[i].store(ready, Ordering::SeqCst);
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, peer)) = listener.accept().await {
        let id = shared.ids.fetch_add(1, Ordering::SeqCst);
        let backend = shared.choose();
        {
            let mut records = shared.records();
            *records.per_backend.entry(backend).or_default() += 1;
            records.open.insert(
                id,
                ConnectionRecord {
                    id,
                    peer,
                    accepted: Instant::now(),
                    backend,
                    ended: None,
                    sent: 0,
                    received: 0,
                    error: None,
                },
            );
        }
        tokio::spawn(relay(shared.clone(), id, client, backend));
    }
}

/// Pipes `client` to `backend` until both sides have closed.
async fn relay(shared: Arc<Shared>, id: u64, client: TcpStream, backend: Option<usize>) {
    let Some(backend) = backend else {
        reset(&client);
        return shared.finish(id, 0, 0, Some("no ready backend".to_owned()));
    };
    let mut upstream = match TcpStream::connect(shared.backends[backend].serve).await {
        Ok(s) => s,
        Err(e) => {
            reset(&client);
            return shared.finish(id, 0, 0, Some(format!("connecting to the backend: {e}")));
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut client = Counted::new(client);
    let error = match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok(_) => None,
        Err(e) => {
            // Pass a reset on: the client's side is reset too.
            reset(&client.inner);
            Some(e.to_string())
        }
    };
    let (sent, received) = (
        client.read.load(Ordering::SeqCst),
        client.written.load(Ordering::SeqCst),
    );
    shared.finish(id, sent, received, error);
}

/// Closing now sends RST, not FIN.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// The client's stream, counting bytes each way (read: from the client).
struct Counted {
    inner: TcpStream,
    read: AtomicU64,
    written: AtomicU64,
}

impl Counted {
    fn new(inner: TcpStream) -> Self {
        Self {
            inner,
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::SeqCst);
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.written.fetch_add(*n as u64, Ordering::SeqCst);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
