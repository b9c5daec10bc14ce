//! `GET /v1/dashboard/stream`: the dashboard pushed to the page as
//! Server-Sent Events instead of polled.
//!
//! ```text
//! retry: 2000
//!
//! event: history      on connect: every sample of the recent past
//! data: {"resolutionSecs":10,"samples":[{"at":…,"granted":…},…]}
//!
//! event: dashboard    on connect, then every second: what GET /v1/dashboard answers
//! data: {"generatedAt":…,"proxies":[…],…}
//!
//! event: sample       each time an interval closes (every 10 s)
//! data: {"at":…,"granted":…,"denied":…,"ready":…,"probeP50Ms":…}
//! ```
//!
//! One task builds the snapshot once a second, and only while a page
//! listens, whatever the number of pages; each stream sends the newest
//! snapshot when its client can take it (a slow reader skips snapshots
//! rather than queueing them). Streams are few ([`MAX_STREAMS`], at most
//! [`MAX_STREAMS_PER_CLIENT`] of one client address) and end after
//! [`STREAM_LIFETIME`]; the page reconnects.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, web};
use egress_proxies::rate_limit::{Limited, Scope, client_key};
use egress_proxies::telemetry::history::{self, Sample, history};
use futures::StreamExt as _;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::dashboard::snapshot;
use super::errors::ApiError;
use crate::lease_store_actor::LeaseStoreActor;

/// Streams open at once; more are refused with 503 until one closes.
pub const MAX_STREAMS: usize = 32;
/// Streams one client address (IPv6: its /64) may hold open at once; more
/// are refused with 429, so no one client takes every slot.
pub const MAX_STREAMS_PER_CLIENT: usize = 4;
/// `Retry-After` of a stream refused for its client's open streams.
const STREAM_RETRY: Duration = Duration::from_secs(5);
/// A stream ends after this (the page opens the next): a forgotten tab or
/// a client that stopped reading does not hold a slot for ever.
pub const STREAM_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// Time between two snapshots.
const PERIOD: Duration = Duration::from_secs(1);

/// The shared snapshot and the stream slots.
#[derive(Clone)]
pub struct Feed {
    snapshots: watch::Sender<Bytes>,
    slots: Arc<Semaphore>,
    /// Open streams per client key.
    per_client: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One client's share of the streams: counted while held.
struct ClientSlot {
    client: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl ClientSlot {
    /// A slot of `client`'s, unless it holds [`MAX_STREAMS_PER_CLIENT`].
    fn take(open: &Arc<Mutex<HashMap<IpAddr, usize>>>, client: IpAddr) -> Option<Self> {
        let client = client_key(client);
        let mut counts = open.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(client).or_default();
        if *count >= MAX_STREAMS_PER_CLIENT {
            return None;
        }
        *count += 1;
        Some(Self {
            client,
            open: open.clone(),
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

impl Feed {
    /// Starts the snapshot task (on the current actix system).
    pub fn start(store: Addr<LeaseStoreActor>) -> Self {
        let (snapshots, _) = watch::channel(Bytes::new());
        let sender = snapshots.clone();
        actix::spawn(async move {
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // Only this task's sender is left: the server that held the feed is gone.
                if sender.sender_count() == 1 {
                    return;
                }
                // No page listens: no work.
                if sender.receiver_count() == 0 {
                    continue;
                }
                match snapshot(&store).await {
                    Ok(dashboard) => {
                        sender.send_replace(event("dashboard", &dashboard));
                    }
                    Err(e) => tracing::warn!(error = %e, "dashboard snapshot failed"),
                }
            }
        });
        Self {
            snapshots,
            slots: Arc::new(Semaphore::new(MAX_STREAMS)),
            per_client: Arc::default(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HistoryEvent {
    resolution_secs: u64,
    samples: Vec<Sample>,
}

/// One SSE event; JSON has no raw newlines, so `data` is one line.
fn event(name: &str, data: &impl Serialize) -> Bytes {
    // Plain structs of strings and numbers: serializing them cannot fail.
    let json = serde_json::to_string(data).unwrap_or_default();
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// What one stream still has to do.
struct Stream {
    snapshots: watch::Receiver<Bytes>,
    /// The newest sample sent.
    last_sample: Option<i64>,
    until: tokio::time::Instant,
    /// Frees the slot when the stream is dropped (client gone or lifetime over).
    _slot: OwnedSemaphorePermit,
    _client_slot: ClientSlot,
}

impl Stream {
    /// The next chunk: a new snapshot with the samples closed since the last one.
    async fn next(mut self) -> Option<(Result<Bytes, std::convert::Infallible>, Self)> {
        tokio::time::timeout_at(self.until, self.snapshots.changed())
            .await
            .ok()?
            .ok()?;
        let mut chunk = Vec::new();
        let samples = history().since(self.last_sample);
        if let Some(newest) = samples.last() {
            self.last_sample = Some(newest.at);
        }
        for sample in &samples {
            chunk.extend_from_slice(&event("sample", sample));
        }
        chunk.extend_from_slice(&self.snapshots.borrow_and_update());
        Some((Ok(Bytes::from(chunk)), self))
    }
}

pub async fn stream(
    req: HttpRequest,
    feed: web::Data<Feed>,
    store: web::Data<Addr<LeaseStoreActor>>,
) -> Result<HttpResponse, ApiError> {
    // The peer address, as the rate limits count it.
    let client = req
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
    let client_slot = ClientSlot::take(&feed.per_client, client).ok_or(ApiError::RateLimited(Limited {
        scope: Scope::Streams,
        retry_after: STREAM_RETRY,
    }))?;
    let slot = feed.slots.clone().try_acquire_owned().map_err(|_| {
        ApiError::Unavailable(format!(
            "{MAX_STREAMS} dashboard streams are open, the most this server keeps; close a dashboard tab or try later"
        ))
    })?;
    let samples = history().since(None);
    let last_sample = samples.last().map(|s| s.at);
    let first = [
        Bytes::from_static(b"retry: 2000\n\n"),
        event(
            "history",
            &HistoryEvent {
                resolution_secs: history::RESOLUTION.as_secs(),
                samples,
            },
        ),
        event("dashboard", &snapshot(&store).await?),
    ];
    let rest = Stream {
        snapshots: feed.snapshots.subscribe(),
        last_sample,
        until: tokio::time::Instant::now() + STREAM_LIFETIME,
        _slot: slot,
        _client_slot: client_slot,
    };
    let body = futures::stream::iter(first.map(Ok)).chain(futures::stream::unfold(rest, Stream::next));
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-store"))
        // Proxies in front (nginx) must not buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}
