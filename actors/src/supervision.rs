//! The supervision tree as the dashboard shows it: every long-lived actor
//! reports itself here — kind, which supervisor restarts it, its restart
//! count, a one-word state and how much work it has waiting. Actix does not
//! expose mailbox depths, so "pending" is the work each actor knows it has
//! queued (a ProxyActor's running/queued jobs, a host's queued calls).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use egress_proxies::kvm::image::{CachedBase, ImageSpec, Progress};

use serde::Serialize;

/// One actor in the tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActorInfo {
    pub kind: String,
    pub id: String,
    /// What restarts it (`ProxyRegistry`, `Supervisor`, `System`).
    pub supervisor: String,
    pub restarts: u32,
    pub state: String,
    pub pending: usize,
}

static TREE: LazyLock<Mutex<BTreeMap<(String, String), ActorInfo>>> = LazyLock::new(Mutex::default);

fn tree() -> std::sync::MutexGuard<'static, BTreeMap<(String, String), ActorInfo>> {
    TREE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds or updates an actor's entry.
pub fn report(info: ActorInfo) {
    tree().insert((info.kind.clone(), info.id.clone()), info);
}

/// A singleton actor started by the system (not restarted).
pub fn report_singleton(kind: &str, state: &str, pending: usize) {
    report(ActorInfo {
        kind: kind.into(),
        id: kind.into(),
        supervisor: "System".into(),
        restarts: 0,
        state: state.into(),
        pending,
    });
}

/// Singletons beat once a second; one silent for this long is dead (its
/// task panicked) or wedged (its thread is stuck), and `/healthz` says so.
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(30);

static BEATS: LazyLock<Mutex<BTreeMap<String, Instant>>> = LazyLock::new(Mutex::default);

fn beats() -> std::sync::MutexGuard<'static, BTreeMap<String, Instant>> {
    BEATS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A singleton is alive and its thread turns: call once a second.
pub fn heartbeat(kind: &str) {
    beats().insert(kind.to_owned(), Instant::now());
}

/// Starts `kind`'s heartbeat: now, then every second while the actor runs.
pub fn beat_while_running<A>(kind: &'static str, ctx: &mut A::Context)
where
    A: actix::Actor<Context = actix::Context<A>>,
{
    use actix::AsyncContext;
    heartbeat(kind);
    ctx.run_interval(Duration::from_secs(1), move |_, _| heartbeat(kind));
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

#[cfg(test)]
pub(crate) fn heartbeat_at(kind: &str, at: Instant) {
    beats().insert(kind.to_owned(), at);
}

/// What a caught panic said (its `&str` or `String` payload).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// An actor that ended for good.
pub fn remove(kind: &str, id: &str) {
    tree().remove(&(kind.to_owned(), id.to_owned()));
}

/// Every actor, by kind then id.
pub fn snapshot() -> Vec<ActorInfo> {
    tree().values().cloned().collect()
}

/// The image cache as the dashboard shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    pub host: String,
    pub url: String,
    /// `fetching`, `cached` or `failed`.
    pub state: String,
    pub volume: Option<String>,
    pub digest: Option<String>,
    pub error: Option<String>,
    /// Seconds since the fetch started (while fetching).
    pub fetching_for_secs: Option<u64>,
    /// Bytes read so far of the current read, and of how many (while fetching).
    pub bytes_done: Option<u64>,
    pub bytes_total: Option<u64>,
}

/// A fetch under way: since when, and how far.
type Fetching = (std::time::Instant, Arc<Progress>);

/// (host, URL) → where it stands.
type ImageTable = BTreeMap<(String, String), (ImageInfo, Option<Fetching>)>;

static IMAGES: LazyLock<Mutex<ImageTable>> = LazyLock::new(Mutex::default);

/// A fetch of `image` onto `host` started; `progress` says how far it is.
pub fn report_fetching(host: &str, image: &ImageSpec, progress: Arc<Progress>) {
    let info = ImageInfo {
        host: host.to_owned(),
        url: image.url.clone(),
        state: "fetching".into(),
        volume: image.configured_base(),
        digest: image.sha256.clone(),
        error: None,
        fetching_for_secs: None,
        bytes_done: None,
        bytes_total: None,
    };
    let mut images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images.insert(
        (info.host.clone(), info.url.clone()),
        (info, Some((std::time::Instant::now(), progress))),
    );
}

/// A fetch ended: the base it produced, or why it failed.
pub fn report_fetched(host: &str, url: &str, result: Result<&CachedBase, &str>) {
    let info = ImageInfo {
        host: host.to_owned(),
        url: url.to_owned(),
        state: if result.is_ok() { "cached" } else { "failed" }.into(),
        volume: result.ok().map(|b| b.volume.clone()),
        digest: result.ok().map(|b| b.digest.clone()),
        error: result.err().map(str::to_owned),
        fetching_for_secs: None,
        bytes_done: None,
        bytes_total: None,
    };
    let mut images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images.insert((info.host.clone(), info.url.clone()), (info, None));
}

pub fn images() -> Vec<ImageInfo> {
    let images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images
        .values()
        .map(|(info, fetching)| ImageInfo {
            fetching_for_secs: fetching.as_ref().map(|(since, _)| since.elapsed().as_secs()),
            bytes_done: fetching.as_ref().map(|(_, p)| p.done.load(Ordering::Relaxed)),
            bytes_total: fetching
                .as_ref()
                .map(|(_, p)| p.total.load(Ordering::Relaxed))
                .filter(|t| *t > 0),
            ..info.clone()
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
