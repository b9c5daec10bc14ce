//! What the watches have seen, so reads cost no API request.
//!
//! A [`WatchCache`] wraps kube-runtime's reflector store: its watch applies
//! every event before the operator hears of the change, so a reconcile
//! reads the object it was woken for from memory. Alone that cache lags
//! behind the operator's own writes until the watch delivers them, and a
//! reconcile that runs in between would write the same status again or
//! meet a conflict. So each object a write returns is kept beside the cache
//! ("written") until the watch delivers that very resourceVersion; reads
//! prefer it meanwhile.
//!
//! A written copy must never hide a newer version. Watch events come in
//! resourceVersion order, so until the watch delivers the written version
//! nothing newer can come: the copy is kept unless the written version
//! itself or a deletion arrived while the write was under way (an older
//! event may arrive then: the watch delivering a pod's creation after a
//! patch of it was answered), and dropped at the watch's
//! delivery of its version, a deletion, the end of a re-list, or after
//! [`WRITTEN_TTL`] — whichever comes first. Resource versions are compared
//! only for equality, as Kubernetes asks of clients.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store, store};
use kube::runtime::watcher::{self, Event};

use super::watch_retry::retrying;
use crate::domain::resource::ObjectKey;

/// The longest a written copy is preferred: a watch that has not delivered
/// it by then is lagging, and the cache is as good as anything we know.
pub const WRITTEN_TTL: Duration = Duration::from_secs(30);

/// How long a writer that met a conflict waits for the cache to show a
/// newer version before trying again.
pub const CATCH_UP: Duration = Duration::from_secs(2);

/// A watch-fed cache of one kind of object.
pub struct WatchCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    reader: Store<K>,
    state: Mutex<State<K>>,
    /// True from the end of the first list on. (The reflector store's own
    /// readiness wakes only one of several waiters.)
    listed: tokio::sync::watch::Sender<bool>,
}

struct State<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    writer: Writer<K>,
    /// Counts the watch's events; a write's ticket is its value at the start.
    seq: u64,
    /// The last few events for each object.
    last_event: HashMap<ObjectKey, LastEvents>,
    written: HashMap<ObjectKey, Written<K>>,
}

/// How many recent events are remembered per object: enough to cover the
/// few that can arrive while one write is under way.
const RECENT_EVENTS: usize = 4;

/// The last few events for an object: when each came, and the version it
/// carried (`None` for a deletion).
#[derive(Default)]
struct LastEvents {
    recent: std::collections::VecDeque<(u64, Option<String>)>,
    /// The `seq` of the newest event no longer remembered.
    forgotten: u64,
}

impl LastEvents {
    fn push(&mut self, seq: u64, version: Option<String>) {
        if self.recent.len() == RECENT_EVENTS
            && let Some((dropped, _)) = self.recent.pop_front()
        {
            self.forgotten = dropped;
        }
        self.recent.push_back((seq, version));
    }

    /// Whether a write sent at `ticket` and answered with version
    /// `written` may be shown. Watch events come in resourceVersion order,
    /// so events that arrived meanwhile are older than the write as long as
    /// none of them is the written version itself (or a deletion): the
    /// watch delivers the creation of an object late, after a patch of it
    /// was answered. Versions are compared only for equality; when the
    /// events since the ticket are no longer all remembered, the answer is
    /// not shown.
    fn allow(&self, ticket: Ticket, written: Option<&str>) -> bool {
        if self.forgotten > ticket.0 {
            return false;
        }
        self.recent
            .iter()
            .filter(|(seq, _)| *seq > ticket.0)
            .all(|(_, v)| v.is_some() && written.is_some() && v.as_deref() != written)
    }
}

struct Written<K> {
    object: Arc<K>,
    at: Instant,
}

/// Taken before a write is sent; hands the written object to the cache.
#[derive(Clone, Copy, Debug)]
pub struct Ticket(u64);

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

fn version<K: Resource>(object: &K) -> Option<&str> {
    object.meta().resource_version.as_deref()
}

impl<K> Default for WatchCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn default() -> Self {
        let (reader, writer) = store();
        Self {
            reader,
            state: Mutex::new(State {
                writer,
                seq: 0,
                last_event: HashMap::new(),
                written: HashMap::new(),
            }),
            listed: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl<K> WatchCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies a watch's events until it ends; errors pause as
    /// [`WatchRetry`](super::watch_retry::WatchRetry) says while the watcher re-lists and resumes by itself.
    /// `what` names the watch in the log.
    pub async fn follow(&self, watch: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send, what: &str)
    where
        K: Send,
    {
        let mut events = std::pin::pin!(retrying(watch, what));
        while let Some(event) = events.next().await {
            self.apply(event);
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        // A panic while holding it cannot leave the maps half-changed in a
        // way that matters more than losing the cache: keep serving.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one watch event (managed fields dropped: nothing reads them
    /// and they are most of an object's size).
    pub fn apply(&self, mut event: Event<K>) {
        match &mut event {
            Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => {
                o.meta_mut().managed_fields = None;
            }
            Event::Init | Event::InitDone => {}
        }
        let mut state = self.state();
        state.writer.apply_watcher_event(&event);
        state.seq += 1;
        let seq = state.seq;
        match &event {
            Event::Apply(o) | Event::InitApply(o) => {
                let key = key_of(o);
                if state
                    .written
                    .get(&key)
                    .is_some_and(|w| version(w.object.as_ref()) == version(o))
                {
                    state.written.remove(&key);
                }
                let version = version(o).map(str::to_owned);
                state.last_event.entry(key).or_default().push(seq, version);
            }
            Event::Delete(o) => {
                // Its mark stays (until the next re-list): a write answered
                // after the deletion must not bring the object back.
                let key = key_of(o);
                state.written.remove(&key);
                state.last_event.entry(key).or_default().push(seq, None);
            }
            Event::Init => {}
            // The list holds every write that finished before it began;
            // one that finished during it may or may not be in it, and a
            // stale read is harmless where a hidden newer version is not.
            Event::InitDone => {
                state.written.clear();
                let listed: std::collections::HashSet<ObjectKey> =
                    self.reader.state().iter().map(|o| key_of(o.as_ref())).collect();
                state.last_event.retain(|k, _| listed.contains(k));
                self.listed.send_replace(true);
            }
        }
    }

    /// Waits until the first list has been applied.
    pub async fn ready(&self) {
        // The sender lives as long as the cache, so this cannot fail.
        let _ = self.listed.subscribe().wait_for(|listed| *listed).await;
    }

    /// Before sending a write whose result goes to [`Self::wrote`].
    pub fn ticket(&self) -> Ticket {
        Ticket(self.state().seq)
    }

    /// The API server answered a write with `object`.
    pub fn wrote(&self, ticket: Ticket, object: K) {
        let key = key_of(&object);
        let mut state = self.state();
        // An event that came while the write was on its way may be newer
        // than its answer: then the answer must not hide it.
        let superseded = state
            .last_event
            .get(&key)
            .is_some_and(|last| !last.allow(ticket, version(&object)));
        if superseded {
            return;
        }
        let mut object = object;
        object.meta_mut().managed_fields = None;
        state.written.insert(
            key,
            Written {
                object: Arc::new(object),
                at: Instant::now(),
            },
        );
    }

    /// The newest version known of the object at `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        let mut state = self.state();
        if let Some(w) = state.written.get(key) {
            if w.at.elapsed() < WRITTEN_TTL {
                return Some(w.object.clone());
            }
            state.written.remove(key);
        }
        drop(state);
        self.reader.get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    /// Every object, each in its newest known version (one this process
    /// just created included).
    pub fn all(&self) -> Vec<Arc<K>> {
        let cached = self.reader.state();
        let state = self.state();
        let fresh = |w: &&Written<K>| w.at.elapsed() < WRITTEN_TTL;
        let mut shown: HashMap<ObjectKey, Arc<K>> =
            cached.into_iter().map(|o| (key_of(o.as_ref()), o)).collect();
        for (key, w) in state.written.iter().filter(|(_, w)| fresh(w)) {
            shown.insert(key.clone(), w.object.clone());
        }
        shown.into_values().collect()
    }

    /// Waits (at most [`CATCH_UP`]) until the object at `key` is no longer
    /// at resourceVersion `stale`: a write that met a conflict is retried
    /// against what the watch shows next, not against a fresh GET.
    pub async fn caught_up(&self, key: &ObjectKey, stale: Option<&str>) {
        let deadline = Instant::now() + CATCH_UP;
        while Instant::now() < deadline {
            let now = self.get(key);
            if now.as_deref().and_then(version) != stale {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, rv: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("crawl".into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            data: Some([("v".to_owned(), value.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    fn value(cache: &WatchCache<ConfigMap>, name: &str) -> Option<String> {
        cache
            .get(&ObjectKey::new("crawl", name))
            .and_then(|c| c.data.as_ref()?.get("v").cloned())
    }

    fn listed(objects: &[ConfigMap]) -> WatchCache<ConfigMap> {
        let cache = WatchCache::default();
        cache.apply(Event::Init);
        for o in objects {
            cache.apply(Event::InitApply(o.clone()));
        }
        cache.apply(Event::InitDone);
        cache
    }

    #[test]
    fn a_write_is_read_back_until_the_watch_delivers_it_and_then_what_follows() {
        let cache = listed(&[cm("a", "1", "old")]);
        let ticket = cache.ticket();
        cache.wrote(ticket, cm("a", "2", "ours"));
        assert_eq!(value(&cache, "a").as_deref(), Some("ours"));
        // The watch delivers our write, then someone else's.
        cache.apply(Event::Apply(cm("a", "2", "ours")));
        cache.apply(Event::Apply(cm("a", "3", "theirs")));
        assert_eq!(value(&cache, "a").as_deref(), Some("theirs"));
    }

    #[test]
    fn a_write_answered_after_the_watch_moved_on_never_hides_the_newer_version() {
        let cache = listed(&[cm("a", "1", "old")]);
        let ticket = cache.ticket();
        // While the write was under way the watch delivered it and a newer one.
        cache.apply(Event::Apply(cm("a", "2", "ours")));
        cache.apply(Event::Apply(cm("a", "3", "theirs")));
        cache.wrote(ticket, cm("a", "2", "ours"));
        assert_eq!(value(&cache, "a").as_deref(), Some("theirs"));
    }

    #[test]
    fn an_older_event_arriving_while_a_write_is_under_way_does_not_hide_it() {
        let cache = listed(&[]);
        let ticket = cache.ticket();
        // The watch delivers the object's creation while a patch of it is
        // answered: the answer is newer.
        cache.apply(Event::Apply(cm("a", "1", "created")));
        cache.wrote(ticket, cm("a", "2", "patched"));
        assert_eq!(value(&cache, "a").as_deref(), Some("patched"));
        cache.apply(Event::Apply(cm("a", "2", "patched")));
        assert_eq!(value(&cache, "a").as_deref(), Some("patched"));
        // More events meanwhile than are remembered: not shown.
        let ticket = cache.ticket();
        for v in 3..=7 {
            cache.apply(Event::Apply(cm("a", &v.to_string(), "theirs")));
        }
        cache.wrote(ticket, cm("a", "8", "ours"));
        assert_eq!(value(&cache, "a").as_deref(), Some("theirs"));
    }

    #[test]
    fn an_older_event_in_flight_does_not_undo_a_write() {
        let cache = listed(&[cm("a", "1", "old")]);
        let ticket = cache.ticket();
        cache.wrote(ticket, cm("a", "3", "ours"));
        // An event from before the write arrives late.
        cache.apply(Event::Apply(cm("a", "2", "earlier")));
        assert_eq!(value(&cache, "a").as_deref(), Some("ours"));
        cache.apply(Event::Apply(cm("a", "3", "ours")));
        assert_eq!(value(&cache, "a").as_deref(), Some("ours"));
    }

    #[test]
    fn a_deletion_or_a_relist_drops_what_was_written() {
        let cache = listed(&[cm("a", "1", "old"), cm("b", "1", "old")]);
        cache.wrote(cache.ticket(), cm("a", "2", "ours"));
        cache.wrote(cache.ticket(), cm("b", "2", "ours"));
        // A write is sent; the deletion arrives before its answer.
        let ticket = cache.ticket();
        cache.apply(Event::Delete(cm("a", "2", "ours")));
        assert_eq!(value(&cache, "a"), None);
        cache.wrote(ticket, cm("a", "3", "late"));
        assert_eq!(value(&cache, "a"), None, "no ghost of a deleted object");
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(cm("b", "5", "relisted")));
        cache.apply(Event::InitDone);
        assert_eq!(value(&cache, "b").as_deref(), Some("relisted"));
        assert_eq!(cache.all().len(), 1);
    }

    #[test]
    fn all_shows_each_object_in_its_newest_known_version() {
        let cache = listed(&[cm("a", "1", "old"), cm("b", "1", "old")]);
        cache.wrote(cache.ticket(), cm("b", "2", "ours"));
        let mut values: Vec<String> = cache
            .all()
            .iter()
            .filter_map(|c| c.data.as_ref()?.get("v").cloned())
            .collect();
        values.sort();
        assert_eq!(values, ["old", "ours"]);
        // One it created shows before the watch brings it.
        cache.wrote(cache.ticket(), cm("c", "3", "created"));
        assert_eq!(cache.all().len(), 3);
        assert_eq!(value(&cache, "c").as_deref(), Some("created"));
    }

    #[tokio::test]
    async fn every_reader_waiting_for_the_first_list_is_released() {
        let cache = Arc::new(WatchCache::<ConfigMap>::default());
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.ready().await })
            })
            .collect();
        tokio::task::yield_now().await;
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(cm("a", "1", "old")));
        cache.apply(Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("released")
                .expect("joined");
        }
    }

    #[tokio::test]
    async fn a_conflicted_writer_waits_for_the_watch_not_forever() {
        let cache = Arc::new(listed(&[cm("a", "1", "old")]));
        let key = ObjectKey::new("crawl", "a");
        let feeder = {
            let cache = cache.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                cache.apply(Event::Apply(cm("a", "2", "new")));
            })
        };
        let started = Instant::now();
        cache.caught_up(&key, Some("1")).await;
        assert!(started.elapsed() < CATCH_UP, "returned once the watch moved on");
        assert_eq!(value(&cache, "a").as_deref(), Some("new"));
        feeder.await.expect("feeder");
        // Nothing new comes: it gives up after CATCH_UP.
        let started = Instant::now();
        cache.caught_up(&key, Some("2")).await;
        assert!(started.elapsed() >= CATCH_UP);
    }
}
