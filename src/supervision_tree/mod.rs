//! The record of the running system's supervision tree: each supervised
//! actor's kind, where it sits, its restart count, a one-word state and how
//! much work it has waiting, and the singletons' [heartbeats]. Plain data
//! kept process-wide: the actors (`actors/src/supervision/`) report into
//! it, `/healthz` and the dashboard read it. Actix does not expose mailbox
//! depths, so "pending" is the work each actor knows it has queued (a
//! ProxyActor's running/queued jobs, a host's queued calls).

pub mod heartbeats;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// One actor in the tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActorInfo {
    pub kind: String,
    pub id: String,
    /// The node it hangs under: `system`, or the kind of the actor that
    /// started it (`proxy_registry` for ProxyActors).
    pub supervisor: String,
    /// How often its supervisor restarted it.
    pub restarts: u32,
    pub state: String,
    pub pending: usize,
}

/// Where a supervised actor sits in the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: &'static str,
    pub id: String,
    pub parent: &'static str,
    /// The process cannot do its job without it: while it keeps crashing,
    /// `/healthz` says so.
    pub vital: bool,
}

impl Node {
    /// The one actor of its kind, started by the system.
    pub fn singleton(kind: &'static str) -> Self {
        Self {
            kind,
            id: kind.to_owned(),
            parent: "system",
            vital: true,
        }
    }

    /// One of many (a proxy, a host) under `parent`: one of them crashing
    /// does not make the process unhealthy.
    pub fn member(kind: &'static str, id: impl Into<String>, parent: &'static str) -> Self {
        Self {
            kind,
            id: id.into(),
            parent,
            vital: false,
        }
    }
}

/// Restarts are counted over this window for pauses and crash loops.
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// A vital actor restarted this often within [`RESTART_WINDOW`] is crash-looping.
pub const CRASH_LOOP: usize = 5;

/// An actor in the tree (its kind and id are the tree's keys).
struct Entry {
    supervisor: &'static str,
    restarts: u32,
    state: String,
    pending: usize,
    vital: bool,
    /// When it was restarted lately (within [`RESTART_WINDOW`]).
    recent: VecDeque<Instant>,
}

impl Entry {
    fn new(supervisor: &'static str) -> Self {
        Self {
            supervisor,
            restarts: 0,
            state: "starting".into(),
            pending: 0,
            vital: false,
            recent: VecDeque::new(),
        }
    }

    fn recent_restarts(&mut self, now: Instant) -> usize {
        while self
            .recent
            .front()
            .is_some_and(|at| now.duration_since(*at) > RESTART_WINDOW)
        {
            self.recent.pop_front();
        }
        self.recent.len()
    }
}

/// Kind → id → entry: found by `&str` without building a key, and no
/// copy of the kind per actor.
type Tree = BTreeMap<&'static str, BTreeMap<String, Entry>>;

static TREE: LazyLock<Mutex<Tree>> = LazyLock::new(Mutex::default);

fn tree() -> std::sync::MutexGuard<'static, Tree> {
    TREE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The entry of `kind`/`id`, made with `supervisor` when missing (the id
/// is copied only then).
fn entry<'t>(
    tree: &'t mut Tree,
    kind: &'static str,
    id: &str,
    supervisor: &'static str,
) -> Option<&'t mut Entry> {
    let ids = tree.entry(kind).or_default();
    if !ids.contains_key(id) {
        ids.insert(id.to_owned(), Entry::new(supervisor));
    }
    ids.get_mut(id)
}

/// A supervised actor starts: in the tree until its supervisor ends.
pub fn register(node: &Node) {
    let mut tree = tree();
    if let Some(entry) = entry(&mut tree, node.kind, &node.id, node.parent) {
        entry.supervisor = node.parent;
        entry.vital = node.vital;
    }
}

/// Its supervisor ended (nobody holds the actor's address any more).
pub fn unregister(node: &Node) {
    let mut tree = tree();
    if let Some(ids) = tree.get_mut(node.kind) {
        ids.remove(&node.id);
        if ids.is_empty() {
            tree.remove(node.kind);
        }
    }
}

/// Counts a restart; returns how many happened within [`RESTART_WINDOW`].
pub fn record_restart(node: &Node) -> usize {
    let now = Instant::now();
    let mut tree = tree();
    let Some(entry) = tree.get_mut(node.kind).and_then(|ids| ids.get_mut(&node.id)) else {
        return 1;
    };
    entry.restarts = entry.restarts.saturating_add(1);
    entry.recent.push_back(now);
    entry.recent_restarts(now)
}

/// An actor says what it is doing and how much work waits.
pub fn report_state(kind: &'static str, id: &str, state: &str, pending: usize) {
    let mut tree = tree();
    // "system" for an actor started without a supervisor (a test wiring actors by hand).
    if let Some(entry) = entry(&mut tree, kind, id, "system") {
        if entry.state != state {
            entry.state = state.to_owned();
        }
        entry.pending = pending;
    }
}

/// A singleton says what it is doing.
pub fn report_singleton(kind: &'static str, state: &str, pending: usize) {
    report_state(kind, kind, state, pending);
}

/// Vital actors restarted [`CRASH_LOOP`] times or more within
/// [`RESTART_WINDOW`], with how often.
pub fn crash_looping() -> Vec<(String, usize)> {
    let now = Instant::now();
    tree()
        .iter_mut()
        .flat_map(|(kind, ids)| ids.values_mut().map(move |e| (kind, e)))
        .filter(|(_, e)| e.vital)
        .filter_map(|(kind, e)| {
            let recent = e.recent_restarts(now);
            (recent >= CRASH_LOOP).then(|| ((*kind).to_owned(), recent))
        })
        .collect()
}

/// What a caught panic said (its `&str` or `String` payload).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Every actor, by kind then id.
pub fn snapshot() -> Vec<ActorInfo> {
    tree()
        .iter()
        .flat_map(|(kind, ids)| {
            ids.iter().map(move |(id, e)| ActorInfo {
                kind: (*kind).to_owned(),
                id: id.clone(),
                supervisor: e.supervisor.to_owned(),
                restarts: e.restarts,
                state: e.state.clone(),
                pending: e.pending,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panics_message_is_read_from_either_payload() {
        let caught = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "plain");
        let caught = std::panic::catch_unwind(|| panic!("formatted {}", 7)).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "formatted 7");
        let caught = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "a panic without a message");
    }
}
