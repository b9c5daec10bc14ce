//! Accepting TCP connections so that no client, however many connections
//! it opens and however long it leaves them idle, can end or starve the
//! process: an accept error (`EMFILE`, `ENFILE`, `ECONNABORTED`…) never
//! ends the loop — it backs off briefly and is logged once per burst; at
//! most [`ListenerSettings::max_connections`] are open at a time, sized to
//! the file limit; at the cap the connection idle for the longest time is
//! closed to make room (as nginx reuses idle keep-alive connections), so
//! queued connections keep being accepted; each connection's [`Slot`]
//! tells what it is doing and when it last moved a byte, for the
//! server's timeouts ([`ListenerSettings::header_read_timeout`],
//! [`ListenerSettings::idle_timeout`]). The cap also fits the process's
//! memory limit. Until a connection has authenticated it may hold only a
//! small head allowance of its own and a share of a budget all connections
//! draw on (`head_budget`), and one source may hold only so many such
//! connections (`source_cap`): what a client without credentials can make
//! the process hold is bounded ([`Unauthenticated`]). The built-in forward
//! proxy and the gateway serve through it (docs/standalone.md and
//! docs/security.md name the settings).

mod bursts;
mod connection_cap;
pub mod head_budget;
mod slots;
pub mod source_cap;
mod tracked;
mod unauthenticated;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

pub use bursts::Bursts;
pub use connection_cap::{MAX_CONNECTIONS, RESERVED_FDS, connection_cap};
pub use slots::{ConnectionSlots, InFlight, Phase, Slot};
pub use tracked::Tracked;
pub use unauthenticated::{LINGER, Refusal, Unauthenticated};

use crate::domain::backoff::{Attempts, ladders};
use crate::domain::config::UnauthenticatedLimits;
use crate::listener_limits::{MEMORY_PER_CONNECTION, PROXY_LISTENER_PART, memory_cap};

/// At the cap, how long to wait for an evicted connection to close before
/// looking for another one to evict.
const EVICTION_PATIENCE: Duration = Duration::from_millis(200);
/// A burst of accept errors or of full-cap moments ends after this long
/// without one.
const BURST_QUIET: Duration = Duration::from_secs(10);

/// How a listener limits its connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerSettings {
    /// At most this many connections open at a time.
    pub max_connections: usize,
    /// A complete request head must arrive within this, counted from the
    /// connection's start or from the end of the previous response: the
    /// header-read timeout is also the keep-alive idle timeout.
    pub header_read_timeout: Duration,
    /// A request or tunnel that moves no byte either way for this long is
    /// ended; a response head must come within it too.
    pub idle_timeout: Duration,
    /// What connections may hold before they authenticate.
    pub unauthenticated: UnauthenticatedLimits,
}

impl ListenerSettings {
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

    /// The default timeouts, `unauthenticated`, and a connection cap that
    /// fits the process's current soft file limit when each connection may
    /// need `fds_per_connection` descriptors, and its memory limit (see
    /// [`memory_cap`]).
    pub fn for_process_limits(fds_per_connection: u64, unauthenticated: UnauthenticatedLimits) -> Self {
        let files = connection_cap(crate::file_limit::current(), fds_per_connection);
        let memory = memory_cap(
            crate::memory_limit::current(),
            PROXY_LISTENER_PART,
            u64::try_from(unauthenticated.head_budget).unwrap_or(u64::MAX),
            MEMORY_PER_CONNECTION,
        );
        Self {
            max_connections: files.min(memory),
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            unauthenticated,
        }
    }
}

/// Accepts connections on `listener` forever, at most
/// `settings.max_connections` open at a time, spawning `handle(stream,
/// peer, slot)` for each; the connection's room is given back when the
/// last clone of `slot` is dropped. `handle` should close the connection
/// when [`Slot::evicted`] resolves, and call [`Slot::authenticated`] once a
/// request passed its credentials check. A connection from a source that
/// already holds `settings.unauthenticated.connections_per_source`
/// unauthenticated ones is answered `429` and closed. `name` names the
/// listener in logs and metrics; its own answers carry their reason in
/// `reason_header`, if it has one.
pub async fn serve_connections<H, F>(
    listener: TcpListener,
    settings: &ListenerSettings,
    name: &'static str,
    reason_header: Option<&'static str>,
    mut handle: H,
) -> Infallible
where
    H: FnMut(TcpStream, SocketAddr, Arc<Slot>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let max_connections = settings.max_connections;
    let unauthenticated = Unauthenticated::new(name, reason_header, settings.unauthenticated);
    let slots = ConnectionSlots::with_limits(max_connections, unauthenticated.clone());
    let mut accept_errors = Bursts::new(BURST_QUIET);
    // Accept errors in a row: the pause after each is
    // `ladders::ACCEPT_EXHAUSTED` (no descriptors or memory) or
    // `ladders::ACCEPT_ERROR` (anything else).
    let mut failed_accepts = Attempts::default();
    let mut full = Bursts::new(BURST_QUIET);
    loop {
        let permit = loop {
            if let Some(permit) = slots.try_reserve() {
                break permit;
            }
            if let Some(unlogged) = full.occurred(Instant::now()) {
                tracing::warn!(
                    listener = name,
                    max_connections,
                    more_since_last_report = unlogged,
                    "connection cap reached; closing the longest-idle connections to make room"
                );
            }
            slots.evict_longest_idle();
            if let Some(permit) = slots.reserve_within(EVICTION_PATIENCE).await {
                break permit;
            }
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                failed_accepts.reset();
                accepted
            }
            Err(e) => {
                let exhausted = is_exhaustion(&e);
                if let Some(unlogged) = accept_errors.occurred(Instant::now()) {
                    tracing::warn!(
                        listener = name, error = %e, more_since_last_report = unlogged,
                        open = slots.open(), "accepting a connection failed; backing off"
                    );
                }
                if exhausted {
                    // Give a descriptor back if an idle connection holds one.
                    slots.evict_longest_idle();
                }
                drop(permit);
                let ladder = if exhausted {
                    ladders::ACCEPT_EXHAUSTED
                } else {
                    ladders::ACCEPT_ERROR
                };
                tokio::time::sleep(failed_accepts.next_step(&ladder)).await;
                continue;
            }
        };
        let Some(source) = unauthenticated.enter(peer) else {
            // The refusal keeps its room (a descriptor) until it has closed.
            let unauthenticated = unauthenticated.clone();
            tokio::spawn(async move {
                unauthenticated
                    .refuse(stream, peer, Refusal::TooManyFromSource)
                    .await;
                drop(permit);
            });
            continue;
        };
        let slot = slots.admit_counted(permit, Some(source));
        tokio::spawn(handle(stream, peer, slot));
    }
}

/// Whether an accept error means the process or system ran out of
/// descriptors or memory.
fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_and_memory_errors_count_as_exhaustion() {
        for errno in [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM] {
            assert!(
                is_exhaustion(&io::Error::from_raw_os_error(errno as i32)),
                "{errno}"
            );
        }
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(
            Errno::ECONNABORTED as i32
        )));
        assert!(!is_exhaustion(&io::Error::other("not an OS error")));
    }
}
