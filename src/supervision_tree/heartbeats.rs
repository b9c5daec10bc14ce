//! Heartbeats: each singleton beats once a second from its own context
//! (`actors/src/supervision/`), so a dead actor or a stuck thread shows as
//! silence.

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Singletons beat once a second; one silent for this long is dead (its
/// task panicked) or wedged (its thread is stuck), and `/healthz` says so.
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(30);

static BEATS: LazyLock<Mutex<BTreeMap<String, Instant>>> = LazyLock::new(Mutex::default);

fn beats() -> std::sync::MutexGuard<'static, BTreeMap<String, Instant>> {
    BEATS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A singleton is alive and its thread turns: call once a second.
pub fn heartbeat(kind: &str) {
    heartbeat_at(kind, Instant::now());
}

/// A singleton stopped on purpose (shutdown): no longer expected to beat.
pub fn stop_beating(kind: &str) {
    beats().remove(kind);
}

/// Singletons silent for longer than `deadline`, with how long.
pub fn silent(deadline: Duration) -> Vec<(String, Duration)> {
    beats()
        .iter()
        .map(|(kind, at)| (kind.clone(), at.elapsed()))
        .filter(|(_, quiet)| *quiet > deadline)
        .collect()
}

/// A beat at `at` (tests set one in the past).
pub fn heartbeat_at(kind: &str, at: Instant) {
    beats().insert(kind.to_owned(), at);
}
