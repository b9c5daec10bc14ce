//! The supervision tree as the dashboard shows it: every long-lived actor
//! reports itself here — kind, which supervisor restarts it, its restart
//! count, a one-word state and how much work it has waiting. Actix does not
//! expose mailbox depths, so "pending" is the work each actor knows it has
//! queued (a ProxyActor's running/queued jobs, a host's queued calls).

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

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
}

/// (host, URL) → where it stands, and since when it is being fetched.
type ImageTable = BTreeMap<(String, String), (ImageInfo, Option<std::time::Instant>)>;

static IMAGES: LazyLock<Mutex<ImageTable>> = LazyLock::new(Mutex::default);

/// Records where an image stands on a host.
pub fn report_image(info: ImageInfo) {
    let mut images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    let started = (info.state == "fetching").then(std::time::Instant::now);
    images.insert((info.host.clone(), info.url.clone()), (info, started));
}

pub fn images() -> Vec<ImageInfo> {
    let images = IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    images
        .values()
        .map(|(info, started)| ImageInfo {
            fetching_for_secs: started.map(|s| s.elapsed().as_secs()),
            ..info.clone()
        })
        .collect()
}
