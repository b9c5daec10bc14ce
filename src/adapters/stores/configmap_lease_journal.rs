//! `ConfigMapLeaseJournal`, Kubernetes mode's adapter of the `LeaseJournal`
//! port: lease state checkpointed into ConfigMaps in
//! the operator's namespace, so a new leader starts from what the old one
//! knew.
//!
//! The state is split into [`SHARDS`] ConfigMaps by a stable hash of the
//! proxy, so a checkpoint of 10,000 leases stays far below the API server's
//! object size limit and a change rewrites one shard. Their names are a
//! [`JournalName`]: the leader's journal `egress-proxies-leases-00` … (the
//! default), or a member's own `egress-proxies-leases-<tag>-00` …, labelled
//! `crawl.example.com/lease-journal=<tag>` so that the leader finds them by
//! label when it adopts a dead member's journal ([`super::journal_adoption`]). A writer task writes the changed shards behind the lease
//! store, one round at a time and no more often than every
//! [`MIN_ROUND_INTERVAL`]. A change is answered only once the round holding
//! it is written ([`Durable::Later`]), so a leader that dies forgets
//! nothing it answered.
//!
//! Every write names the shard's resourceVersion. When another client
//! changed the shard meanwhile (a `kubectl label`, a GitOps tool, an
//! admission controller, an earlier leader's late write), the write meets a
//! 409: the shard is read again and written again with this leader's leases
//! over it, keeping what others set ([`checkpoint_shard`]); an Event on the
//! ConfigMap and `egress_proxies_lease_checkpoint_conflicts_total` name the
//! writer. Only the holder of the tenure passed in ([`Writer::tenure`]: the
//! leader's, or a member's for its own journal) writes, and only while that
//! tenure lasts, so the leases it holds in memory are the truth. A new leader writes every shard
//! once as it starts: an earlier leader's write still in flight then meets
//! a 409 instead of landing over it (or lands first and is overwritten).
//! Every [`REFRESH_EVERY`] the shards are written again (no-op writes when
//! nobody touched them), so a foreign change to the leases does not stay.
//! Changes that cannot be written for `give_up_after` (the renew deadline)
//! make [`ConfigMapLeaseJournal::unwritable`] say so: the leader steps down
//! rather than hold the Lease while refusing every grant.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use tokio::sync::{Notify, watch};

use crate::adapters::leader::Tenure;
use crate::adapters::stores::checkpoint_shard::{self, ConflictCause, FIELD_MANAGER};
use crate::domain::backoff::{Attempts, ladders};
use crate::domain::lease::journal::{
    Durable, JournalError, JournalState, LeaseChange, LeaseJournal, LeaseSnapshot, key_string,
};
use crate::domain::membership::MemberTag;
use crate::domain::resource::ObjectKey;
use crate::telemetry::events::CheckpointConflict;

/// ConfigMaps the state is spread over.
pub const SHARDS: usize = 16;
/// Name prefix of the shards (`egress-proxies-leases-07`).
pub const NAME_PREFIX: &str = "egress-proxies-leases-";
/// The label naming the member whose journal a shard belongs to.
pub const JOURNAL_LABEL: &str = "crawl.example.com/lease-journal";
/// Rounds of writes are at least this far apart (bounds the API write rate).
pub const MIN_ROUND_INTERVAL: Duration = Duration::from_millis(100);
/// Every shard is written again this often (a no-op unless someone changed it).
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// The longest a shard write may take (less when the tenure ends sooner).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Re-reads after conflicts within one shard write before the round fails.
const CONFLICT_RETRIES: usize = 5;
/// The Event reason of a conflict.
pub const CONFLICT_REASON: &str = "LeaseCheckpointConflict";

/// The shard of a proxy among `shards`: FNV-1a of its key, stable across
/// versions and machines (a new leader must write an entry where the old
/// one did).
/// The most a shard's JSON may take: well under the API server's limit on
/// an object (1 MiB for a ConfigMap's data), room left for its metadata.
const SHARD_BYTES: usize = 768 * 1024;

/// A shard's JSON as it is written: what ended by `now` dropped first (not
/// only at the minute's prune: a churn of short leases would fill a shard
/// in between), then, if it still does not fit [`SHARD_BYTES`], the ended
/// leases whose grace ends first (late reports on them are refused; their
/// rests are kept), logged. A shard never grows past what the API server
/// takes, whatever the churn.
fn fitted(shard: &mut JournalState, now: i64, name: &str) -> String {
    shard.prune(now);
    let mut json = serde_json::to_string(shard).unwrap_or_else(|_| "{}".into());
    while json.len() > SHARD_BYTES && shard.ended_len() > 0 {
        let per_entry = json.len() / shard.len().max(1);
        let over = (json.len() - SHARD_BYTES) / per_entry.max(1) + 1;
        let keep = shard.ended_len().saturating_sub(over + over / 50);
        let shed = shard.shed_ended(keep);
        tracing::warn!(
            checkpoint = name,
            shed,
            "a lease checkpoint shard reached its size budget: the ended leases whose grace ends first are dropped (late reports or releases on them are answered as unknown)"
        );
        json = serde_json::to_string(shard).unwrap_or_else(|_| "{}".into());
    }
    json
}

fn shard_of(key: &ObjectKey, shards: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key_string(key).bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % shards.max(1) as u64) as usize
}

/// Which ConfigMaps a journal is: `<prefix>NN` for NN below `shards`, each
/// carrying `labels`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalName {
    pub prefix: String,
    pub shards: usize,
    pub labels: BTreeMap<String, String>,
}

impl Default for JournalName {
    /// The leader's journal, as every version before per-member journals
    /// wrote it: `egress-proxies-leases-00` … `-15`, no label of its own.
    fn default() -> Self {
        Self {
            prefix: NAME_PREFIX.to_owned(),
            shards: SHARDS,
            labels: BTreeMap::new(),
        }
    }
}

impl JournalName {
    /// A member's own journal: `egress-proxies-leases-<tag>-NN`, labelled
    /// `crawl.example.com/lease-journal=<tag>`.
    pub fn member(tag: &MemberTag) -> Self {
        Self {
            prefix: format!("{NAME_PREFIX}{tag}-"),
            shards: SHARDS,
            labels: BTreeMap::from([(JOURNAL_LABEL.to_owned(), tag.to_string())]),
        }
    }

    /// The name of shard `index`.
    pub fn shard(&self, index: usize) -> String {
        format!("{}{index:02}", self.prefix)
    }

    /// The label selector finding every shard (`None`: the journal has no
    /// label of its own, its shards are found by name).
    pub fn selector(&self) -> Option<String> {
        (!self.labels.is_empty()).then(|| {
            self.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// Whether `name` is one of this journal's shards.
    pub fn owns(&self, name: &str) -> bool {
        name.strip_prefix(&self.prefix)
            .and_then(|n| (n.len() == 2).then(|| n.parse::<usize>().ok())?)
            .is_some_and(|index| index < self.shards)
    }
}

/// Who writes the checkpoint, and for how long.
pub struct Writer {
    /// This replica's identity, named in every shard it writes.
    pub identity: String,
    /// The tenure that fences the journal (the leader's; a member's for
    /// its own journal): nothing is written once it lapses, and no write
    /// is allowed to outlast it. `None` without leader election.
    pub tenure: Option<Tenure>,
    /// Changes unwritten this long make [`ConfigMapLeaseJournal::unwritable`]
    /// say why (the renew deadline).
    pub give_up_after: Duration,
}

/// What the writer task and the journal share.
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    /// The newest generation written, or why writing stopped.
    written: watch::Sender<Written>,
    /// Set once changes stayed unwritten for `give_up_after`.
    unwritable: watch::Sender<Option<String>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Written {
    Upto(u64),
    /// This replica's leadership ended: nothing more will be written.
    Ended,
}

struct State {
    shards: Vec<JournalState>,
    /// Each shard as last read or written (None: not there).
    objects: Vec<Option<ConfigMap>>,
    dirty: BTreeSet<usize>,
    generation: u64,
}

/// Lease state in ConfigMaps, written behind by a background task.
pub struct ConfigMapLeaseJournal {
    shared: Arc<Shared>,
    loaded: Option<LeaseSnapshot>,
    name: JournalName,
}

impl ConfigMapLeaseJournal {
    /// Reads the leader's checkpoint ([`JournalName::default`]) in
    /// `namespace` and starts the writer (on the current Tokio runtime).
    /// Call once this replica leads.
    pub async fn open(client: kube::Client, namespace: &str, writer: Writer) -> Result<Self, JournalError> {
        Self::open_named(client, namespace, JournalName::default(), writer).await
    }

    /// Reads the journal `journal` in `namespace` and starts its writer,
    /// fenced by `writer.tenure` (a member's tenure for its own journal).
    pub async fn open_named(
        client: kube::Client,
        namespace: &str,
        journal: JournalName,
        writer: Writer,
    ) -> Result<Self, JournalError> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let count = journal.shards.max(1);
        let mut shards = Vec::with_capacity(count);
        let mut objects = Vec::with_capacity(count);
        for index in 0..count {
            let name = journal.shard(index);
            let failed = |message: String| JournalError::Checkpoint {
                name: name.clone(),
                message,
            };
            let found = api.get_opt(&name).await.map_err(|e| failed(e.to_string()))?;
            let shard = match &found {
                Some(cm) => serde_json::from_str(checkpoint_shard::leases_json(cm))
                    .map_err(|e| failed(format!("unreadable checkpoint: {e}")))?,
                None => JournalState::default(),
            };
            shards.push(shard);
            objects.push(found);
        }
        let mut snapshot = LeaseSnapshot::default();
        for shard in &shards {
            shard.clone().into_snapshot(&mut snapshot)?;
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                shards,
                objects,
                // The first round claims every shard (see the module's docs).
                dirty: (0..count).collect(),
                generation: 0,
            }),
            wake: Notify::new(),
            written: watch::channel(Written::Upto(0)).0,
            unwritable: watch::channel(None).0,
        });
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: Some(writer.identity.clone()),
            },
        );
        let task = WriterTask {
            shared: shared.clone(),
            api,
            recorder,
            namespace: namespace.to_owned(),
            writer,
            journal: journal.clone(),
        };
        tokio::spawn(task.run());
        shared.wake.notify_one();
        Ok(Self {
            shared,
            loaded: Some(snapshot),
            name: journal,
        })
    }

    /// Which ConfigMaps this journal writes.
    pub fn name(&self) -> &JournalName {
        &self.name
    }

    /// Becomes `Some(why)` once changes have stayed unwritten for the
    /// writer's `give_up_after`.
    pub fn unwritable(&self) -> watch::Receiver<Option<String>> {
        self.shared.unwritable.subscribe()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LeaseJournal for ConfigMapLeaseJournal {
    fn load(&mut self, now: Timestamp) -> Result<LeaseSnapshot, JournalError> {
        self.prune(now)?;
        Ok(self.loaded.take().unwrap_or_default())
    }

    fn record(&mut self, changes: &[LeaseChange]) -> Result<Durable, JournalError> {
        if *self.shared.written.borrow() == Written::Ended {
            return Err(JournalError::NotLeading);
        }
        let count = self.name.shards;
        let generation = {
            let mut state = self.state();
            for change in changes {
                let index = match change {
                    LeaseChange::Granted(l) => shard_of(&l.proxy, count),
                    LeaseChange::Ended(e) => shard_of(&e.proxy, count),
                    LeaseChange::TargetRest { proxy, .. }
                    | LeaseChange::ProxyRest { proxy, .. }
                    | LeaseChange::BlockedBy { proxy, .. }
                    | LeaseChange::Errors { proxy, .. }
                    | LeaseChange::ProxyRemoved(proxy) => shard_of(proxy, count),
                    // Renewals name only the lease: find its shard.
                    LeaseChange::Extended { id, .. } => match state.shards.iter().position(|s| s.holds(id)) {
                        Some(index) => index,
                        None => continue,
                    },
                };
                state.shards[index].apply(change);
                state.dirty.insert(index);
            }
            state.generation += 1;
            state.generation
        };
        self.shared.wake.notify_one();
        let mut written = self.shared.written.subscribe();
        let prefix = self.name.prefix.trim_end_matches('-').to_owned();
        Ok(Durable::Later(Box::pin(async move {
            let outcome = written
                .wait_for(|w| match w {
                    Written::Upto(done) => *done >= generation,
                    Written::Ended => true,
                })
                .await
                .map(|w| w.clone());
            match outcome {
                Ok(Written::Upto(_)) => Ok(()),
                Ok(Written::Ended) => Err(JournalError::NotLeading),
                Err(_) => Err(JournalError::Checkpoint {
                    name: prefix,
                    message: "the checkpoint writer stopped".into(),
                }),
            }
        })))
    }

    fn prune(&mut self, now: Timestamp) -> Result<(), JournalError> {
        let now = now.as_millisecond();
        let mut state = self.state();
        for index in 0..state.shards.len() {
            if state.shards[index].prune(now) {
                state.dirty.insert(index);
            }
        }
        drop(state);
        self.shared.wake.notify_one();
        Ok(())
    }
}

/// The task writing dirty shards, a round at a time, until leadership ends.
struct WriterTask {
    shared: Arc<Shared>,
    api: Api<ConfigMap>,
    recorder: Recorder,
    namespace: String,
    writer: Writer,
    journal: JournalName,
}

impl WriterTask {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(self) {
        // Since when changes have waited for a round that keeps failing.
        let mut failing_since: Option<Instant> = None;
        // Failed rounds in a row, retried as `ladders::LEASE_CHECKPOINT_WRITE` says.
        let mut failed_rounds = Attempts::default();
        let start = tokio::time::Instant::now() + REFRESH_EVERY;
        let mut refresh = tokio::time::interval_at(start, REFRESH_EVERY);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.shared.wake.notified() => {}
                _ = refresh.tick() => {
                    let mut state = self.state();
                    let every = 0..state.shards.len();
                    state.dirty.extend(every);
                }
            }
            loop {
                let (generation, round) = {
                    let mut state = self.state();
                    let dirty = std::mem::take(&mut state.dirty);
                    let now = Timestamp::now().as_millisecond();
                    let round: Vec<(usize, String)> = dirty
                        .into_iter()
                        .map(|i| (i, fitted(&mut state.shards[i], now, &self.journal.shard(i))))
                        .collect();
                    (state.generation, round)
                };
                if round.is_empty() {
                    break;
                }
                let mut failed = Vec::new();
                for (index, json) in round {
                    let Some(budget) = self.budget() else {
                        tracing::info!("leadership ended; the lease checkpoint is no longer written");
                        self.shared.written.send_replace(Written::Ended);
                        return;
                    };
                    let written = tokio::time::timeout(budget, self.write_shard(index, &json))
                        .await
                        .unwrap_or(Err(WriteError::TimedOut(budget)));
                    match written {
                        Ok(cm) => self.state().objects[index] = Some(cm),
                        Err(e) => {
                            tracing::warn!(checkpoint = %self.journal.shard(index), error = %e, "writing the lease checkpoint failed; retrying");
                            failed.push(index);
                        }
                    }
                }
                if failed.is_empty() {
                    failing_since = None;
                    failed_rounds.reset();
                    self.shared.written.send_replace(Written::Upto(generation));
                    tokio::time::sleep(MIN_ROUND_INTERVAL).await;
                } else {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.writer.give_up_after
                        && self.shared.unwritable.borrow().is_none()
                    {
                        let why = format!(
                            "the lease checkpoint could not be written for {:?}",
                            self.writer.give_up_after
                        );
                        tracing::error!("{why}");
                        self.shared.unwritable.send_replace(Some(why));
                    }
                    self.state().dirty.extend(failed);
                    tokio::time::sleep(failed_rounds.next_step(&ladders::LEASE_CHECKPOINT_WRITE)).await;
                }
            }
        }
    }

    /// How long the next write may take; None once the tenure is over.
    fn budget(&self) -> Option<Duration> {
        let most = WRITE_TIMEOUT.min(self.writer.give_up_after.max(MIN_ROUND_INTERVAL));
        let Some(tenure) = &self.writer.tenure else {
            return Some(most);
        };
        // A write may not land after the tenure: the next leader reads the
        // checkpoint only once this one has stopped.
        let left = tenure.until()?.checked_duration_since(Instant::now())?;
        tenure.is_leading().then(|| left.min(most))
    }

    /// Writes one shard over the version last read or written; on a
    /// conflict reads it again, names who changed it, and writes over that.
    async fn write_shard(&self, index: usize, json: &str) -> Result<ConfigMap, WriteError> {
        let name = self.journal.shard(index);
        let me = self.writer.identity.as_str();
        let mut base = self.state().objects[index].clone();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        for _ in 0..CONFLICT_RETRIES {
            let cm = checkpoint_shard::desired(&name, base.as_ref(), json, me, &self.journal.labels);
            let result = match cm.metadata.resource_version {
                Some(_) => self.api.replace(&name, &params, &cm).await,
                None => self.api.create(&params, &cm).await,
            };
            match result {
                Ok(written) => return Ok(written),
                // 409: changed (or created) meanwhile; 404: deleted meanwhile.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    let current = self.api.get_opt(&name).await.map_err(WriteError::Api)?;
                    self.report_conflict(&name, base.as_ref(), current.as_ref());
                    base = current;
                }
                Err(e) => return Err(WriteError::Api(e)),
            }
        }
        Err(WriteError::KeptChanging(CONFLICT_RETRIES))
    }

    /// Logs, counts and publishes (an Event on the ConfigMap) who changed a shard.
    fn report_conflict(&self, name: &str, before: Option<&ConfigMap>, now: Option<&ConfigMap>) {
        let cause = checkpoint_shard::who_changed(now, &self.writer.identity);
        let replaced = before.map(checkpoint_shard::leases_json) != now.map(checkpoint_shard::leases_json);
        CheckpointConflict {
            shard: name,
            reason: cause.reason(),
            writer: &cause.writer(),
            leases_changed: replaced,
        }
        .emit();
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: CONFLICT_REASON.to_owned(),
            note: Some(checkpoint_shard::conflict_note(name, &cause, replaced)),
            action: "WriteLeaseCheckpoint".to_owned(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("ConfigMap".to_owned()),
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            uid: now.and_then(|c| c.metadata.uid.clone()),
            ..ObjectReference::default()
        };
        let recorder = self.recorder.clone();
        // Off the write path: a slow Event must not delay the grants waiting on this round.
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "publishing the checkpoint conflict Event failed");
            }
        });
        if matches!(cause, ConflictCause::Deleted) {
            tracing::warn!(
                checkpoint = name,
                "a lease checkpoint shard was deleted; writing it again"
            );
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("the shard was changed by others {0} times in a row")]
    KeptChanging(usize),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lease::journal::EndedRecord;

    #[test]
    fn a_shard_sheds_what_ended_then_the_oldest_grace_to_fit_its_budget() {
        let now = Timestamp::now();
        let key = ObjectKey::new("crawl", "p0");
        let mut shard = JournalState::default();
        let ended = |i: usize, until: Timestamp| {
            LeaseChange::Ended(EndedRecord {
                id: format!("{:036}", i),
                proxy: key.clone(),
                target: format!("site-{i}.example"),
                until,
                owner: Some("crawler".into()),
            })
        };
        // Leases released with no grace left: gone at the next write.
        for i in 0..1_000 {
            shard.apply(&ended(i, now));
        }
        let json = fitted(&mut shard, now.as_millisecond() + 1, "egress-proxies-leases-00");
        assert_eq!(shard.ended_len(), 0, "{} bytes", json.len());
        // A churn whose graces outlast the write: the oldest graces go.
        for i in 0..20_000 {
            let until = now + jiff::SignedDuration::from_millis(60_000 + i as i64);
            shard.apply(&ended(i, until));
        }
        let json = fitted(&mut shard, now.as_millisecond(), "egress-proxies-leases-00");
        assert!(json.len() <= SHARD_BYTES, "{} bytes", json.len());
        assert!(
            json.len() > SHARD_BYTES * 8 / 10,
            "only what did not fit went: {} bytes left, {} ended leases",
            json.len(),
            shard.ended_len()
        );
        assert!(
            json.contains(&format!("{:036}", 19_999)),
            "the latest grace is kept"
        );
        assert!(!json.contains(&format!("{:036}", 0)), "the first to end went");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        // Fixed values: a new version must find entries where an old one wrote them.
        assert_eq!(
            shard_of(&ObjectKey::new("crawl", "p1"), SHARDS),
            shard_of(&ObjectKey::new("crawl", "p1"), SHARDS)
        );
        let mut counts = [0usize; SHARDS];
        for i in 0..10_000 {
            counts[shard_of(&ObjectKey::new("crawl", format!("p{i}")), SHARDS)] += 1;
        }
        assert!(counts.iter().all(|c| (400..=850).contains(c)), "{counts:?}");
    }

    #[test]
    fn journal_names_keep_the_leaders_and_tag_a_members() {
        let leader = JournalName::default();
        assert_eq!(leader.shard(0), "egress-proxies-leases-00");
        assert_eq!(leader.shard(15), "egress-proxies-leases-15");
        assert_eq!(leader.selector(), None);
        let tag = MemberTag::parse("0a1b2c3d").unwrap();
        let member = JournalName::member(&tag);
        assert_eq!(member.shard(7), "egress-proxies-leases-0a1b2c3d-07");
        assert_eq!(
            member.selector().as_deref(),
            Some("crawl.example.com/lease-journal=0a1b2c3d")
        );
        assert!(member.owns("egress-proxies-leases-0a1b2c3d-15"));
        assert!(!member.owns("egress-proxies-leases-0a1b2c3d-16"));
        assert!(!member.owns("egress-proxies-leases-0a1b2c3d-7"));
        assert!(leader.owns("egress-proxies-leases-03"));
        assert!(
            !leader.owns("egress-proxies-leases-0a1b2c3d-03"),
            "a member's shard is not the leader's"
        );
    }
}
