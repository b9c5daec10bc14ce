//! The open connections of one listener: how many there may be, what each
//! is doing, when it last moved a byte, and which idle one to close when a
//! new connection needs room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::source_cap::SourceTicket;
use super::unauthenticated::Unauthenticated;
use crate::domain::config::UnauthenticatedLimits;

/// What a connection is doing, as far as closing it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Between requests (or before the first): may be evicted for a new
    /// connection; the server's header-read timeout ends it.
    Idle = 0,
    /// A request waits for a step bounded by its own timeout (connecting,
    /// the upstream's response head).
    Waiting = 1,
    /// Bytes are relayed (a response body, a tunnel): ended after the idle
    /// timeout without a byte either way.
    Relaying = 2,
}

impl Phase {
    fn of(value: u8) -> Self {
        match value {
            0 => Self::Idle,
            1 => Self::Waiting,
            _ => Self::Relaying,
        }
    }
}

/// The connections of one listener, at most `max` at a time.
pub struct ConnectionSlots {
    permits: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<SlotState>>>,
    next_id: AtomicU64,
    /// Activity times are milliseconds since this instant.
    epoch: Instant,
    /// What connections may hold before they authenticate.
    unauthenticated: Arc<Unauthenticated>,
}

/// One open connection's share of [`ConnectionSlots`]; the room is given
/// back when the last clone of its `Arc` is dropped (the connection and,
/// for a tunnel, the relay that outlives it).
pub struct Slot {
    id: u64,
    state: Arc<SlotState>,
    slots: Arc<ConnectionSlots>,
    _permit: OwnedSemaphorePermit,
    authenticated: AtomicBool,
    /// Counts the connection against its source until it authenticates.
    source: Mutex<Option<SourceTicket>>,
}

struct SlotState {
    phase: AtomicU8,
    last_activity_ms: AtomicU64,
    evicting: AtomicBool,
    evict: Notify,
}

impl ConnectionSlots {
    /// At most `max` connections, unauthenticated ones with the default limits.
    pub fn new(max: usize) -> Arc<Self> {
        Self::with_limits(
            max,
            Unauthenticated::new("listener", None, UnauthenticatedLimits::default()),
        )
    }

    pub fn with_limits(max: usize, unauthenticated: Arc<Unauthenticated>) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(max.max(1))),
            open: Mutex::default(),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            unauthenticated,
        })
    }

    pub fn unauthenticated(&self) -> &Arc<Unauthenticated> {
        &self.unauthenticated
    }

    /// How many connections are open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Room for one more connection, if there is some now.
    pub fn try_reserve(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// Waits up to `patience` for room to be given back.
    pub async fn reserve_within(&self, patience: Duration) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(patience, self.permits.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Registers a new connection in the room `permit` holds.
    pub fn admit(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Arc<Slot> {
        self.admit_counted(permit, None)
    }

    /// [`Self::admit`], the connection counted against its source by
    /// `source` until it authenticates.
    pub fn admit_counted(
        self: &Arc<Self>,
        permit: OwnedSemaphorePermit,
        source: Option<SourceTicket>,
    ) -> Arc<Slot> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(SlotState {
            phase: AtomicU8::new(Phase::Idle as u8),
            last_activity_ms: AtomicU64::new(self.now_ms()),
            evicting: AtomicBool::new(false),
            evict: Notify::new(),
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, state.clone());
        Arc::new(Slot {
            id,
            state,
            slots: self.clone(),
            _permit: permit,
            authenticated: AtomicBool::new(false),
            source: Mutex::new(source),
        })
    }

    /// Asks the idle connection that moved no byte for the longest time to
    /// close (as nginx reuses idle keep-alive connections when it runs out);
    /// false when every connection has a request in flight.
    pub fn evict_longest_idle(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let victim = open
            .values()
            .filter(|s| Phase::of(s.phase.load(Ordering::Relaxed)) == Phase::Idle)
            .filter(|s| !s.evicting.load(Ordering::Relaxed))
            .min_by_key(|s| s.last_activity_ms.load(Ordering::Relaxed));
        match victim {
            Some(state) => {
                state.evicting.store(true, Ordering::Relaxed);
                // A stored permit: the connection sees it even if it is not waiting yet.
                state.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl Slot {
    /// One of the connection's requests passed the credentials check (or
    /// needed none): from now on its heads draw on no budget and it no
    /// longer counts against its source.
    pub fn authenticated(&self) {
        if !self.authenticated.swap(true, Ordering::AcqRel) {
            drop(self.source.lock().unwrap_or_else(PoisonError::into_inner).take());
        }
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// The listener's limits on connections that have not authenticated.
    pub fn unauthenticated(&self) -> &Arc<Unauthenticated> {
        &self.slots.unauthenticated
    }

    /// Notes that a byte moved now.
    pub fn touch(&self) {
        let now = self.slots.now_ms();
        // Most reads and writes land in the same millisecond as the last one.
        if self.state.last_activity_ms.load(Ordering::Relaxed) != now {
            self.state.last_activity_ms.store(now, Ordering::Relaxed);
        }
    }

    pub fn phase(&self) -> Phase {
        Phase::of(self.state.phase.load(Ordering::Relaxed))
    }

    pub fn set_phase(&self, phase: Phase) {
        self.state.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// Marks a request in flight until the guard is dropped; then the
    /// connection is idle again.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.set_phase(Phase::Waiting);
        InFlight(self.clone())
    }

    /// Resolves when the listener wants this (idle) connection closed.
    pub async fn evicted(&self) {
        self.state.evict.notified().await;
    }

    /// Resolves once no byte moved for `timeout` while the connection was
    /// in `phase` (any phase when `None`).
    pub async fn stalled(&self, timeout: Duration, phase: Option<Phase>) {
        loop {
            let last =
                self.slots.epoch + Duration::from_millis(self.state.last_activity_ms.load(Ordering::Relaxed));
            let deadline = last + timeout;
            let now = Instant::now();
            if now >= deadline {
                if phase.is_none_or(|p| p == self.phase()) {
                    return;
                }
                tokio::time::sleep(timeout).await;
            } else {
                tokio::time::sleep_until(deadline).await;
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// A request in flight on a connection (see [`Slot::in_flight`]).
pub struct InFlight(Arc<Slot>);

impl InFlight {
    /// The request now relays bytes (its response body, a tunnel).
    pub fn relaying(&self) {
        self.0.set_phase(Phase::Relaying);
    }

    pub fn slot(&self) -> &Arc<Slot> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.set_phase(Phase::Idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_longest_idle_connection_is_evicted_and_busy_ones_never() {
        let slots = ConnectionSlots::new(3);
        let first = slots.admit(slots.try_reserve().unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = slots.admit(slots.try_reserve().unwrap());
        let busy = slots.admit(slots.try_reserve().unwrap());
        let _request = busy.in_flight();
        assert!(slots.try_reserve().is_none(), "the cap holds");

        assert!(slots.evict_longest_idle());
        tokio::time::timeout(Duration::from_secs(1), first.evicted())
            .await
            .unwrap();
        // Asked once: the next eviction picks another connection.
        assert!(slots.evict_longest_idle());
        tokio::time::timeout(Duration::from_secs(1), second.evicted())
            .await
            .unwrap();
        assert!(!slots.evict_longest_idle(), "only a busy connection is left");

        drop(first);
        assert!(
            slots.try_reserve().is_some(),
            "a closed connection gives its room back"
        );
        assert_eq!(slots.open(), 2);
    }

    #[tokio::test]
    async fn an_authenticated_connection_no_longer_counts_against_its_source() {
        let limits = UnauthenticatedLimits {
            connections_per_source: 1,
            ..UnauthenticatedLimits::default()
        };
        let slots = ConnectionSlots::with_limits(4, Unauthenticated::new("test", None, limits));
        let peer: std::net::SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let ticket = slots.unauthenticated().enter(peer).unwrap();
        let slot = slots.admit_counted(slots.try_reserve().unwrap(), Some(ticket));
        assert!(
            slots.unauthenticated().enter(peer).is_none(),
            "the source is full"
        );
        assert!(!slot.is_authenticated());
        slot.authenticated();
        slot.authenticated();
        assert!(slot.is_authenticated());
        let second = slots.unauthenticated().enter(peer);
        assert!(second.is_some(), "room once the first authenticated");
        drop(second);
        drop(slot);
        assert!(slots.unauthenticated().enter(peer).is_some());
    }

    #[tokio::test]
    async fn a_touched_connection_is_no_longer_the_longest_idle() {
        let slots = ConnectionSlots::new(2);
        let first = slots.admit(slots.try_reserve().unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = slots.admit(slots.try_reserve().unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
        first.touch();
        assert!(slots.evict_longest_idle());
        tokio::time::timeout(Duration::from_secs(1), second.evicted())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_connection_stalls_no_sooner_than_the_timeout_after_its_last_byte_and_only_in_its_phase() {
        let slots = ConnectionSlots::new(1);
        let slot = slots.admit(slots.try_reserve().unwrap());
        let request = slot.in_flight();
        let timeout = Duration::from_millis(500);
        // Waiting for a response head is not a stalled relay, however long.
        let not_relaying = tokio::time::timeout(
            Duration::from_millis(1500),
            slot.stalled(timeout, Some(Phase::Relaying)),
        );
        assert!(not_relaying.await.is_err(), "stalled while not relaying");

        request.relaying();
        slot.touch();
        let touched = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(30),
            slot.stalled(timeout, Some(Phase::Relaying)),
        )
        .await
        .expect("a relay without bytes stalls");
        // Activity is kept in whole milliseconds.
        assert!(
            touched.elapsed() + Duration::from_millis(2) >= timeout,
            "stalled after {:?}",
            touched.elapsed()
        );
    }
}
