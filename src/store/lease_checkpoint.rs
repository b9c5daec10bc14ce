//! The Kubernetes lease journal: lease state checkpointed into ConfigMaps in
//! the operator's namespace, so a new leader starts from what the old one
//! knew.
//!
//! The state is split into [`SHARDS`] ConfigMaps by a stable hash of the
//! proxy (`egress-proxies-leases-00` …), so a checkpoint of 10,000 leases
//! stays far below the API server's object size limit and a change rewrites
//! one shard. A writer task writes the changed shards behind the lease
//! store, one round at a time and no more often than every
//! [`MIN_ROUND_INTERVAL`]. A change is answered only once the round holding
//! it is written ([`Durable::Later`]), so a leader that dies forgets
//! nothing it answered. Every write names the shard's resourceVersion: a replica whose
//! shard another replica wrote in the meantime has been deposed, and its
//! pending grants fail instead of landing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio::sync::{Notify, watch};

use crate::leader::Tenure;
use crate::lease::journal::{
    Durable, JournalError, JournalState, LeaseChange, LeaseJournal, LeaseSnapshot, key_string,
};
use crate::store::ObjectKey;

/// ConfigMaps the state is spread over.
pub const SHARDS: usize = 16;
/// Name prefix of the shards (`egress-proxies-leases-07`).
pub const NAME_PREFIX: &str = "egress-proxies-leases-";
/// The data key holding a shard's JSON.
const DATA_KEY: &str = "leases.json";
/// Rounds of writes are at least this far apart (bounds the API write rate).
pub const MIN_ROUND_INTERVAL: Duration = Duration::from_millis(100);
/// A failed round is retried after this long.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest a shard write may take (less when the tenure ends sooner).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The shard of a proxy: FNV-1a of its key, stable across versions and
/// machines (a new leader must write an entry where the old one did).
fn shard_of(key: &ObjectKey) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key_string(key).bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % SHARDS as u64) as usize
}

fn shard_name(index: usize) -> String {
    format!("{NAME_PREFIX}{index:02}")
}

/// What the writer task and the journal share.
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    /// The newest generation written, or why writing stopped.
    written: watch::Sender<Written>,
}

#[derive(Clone, Debug, PartialEq)]
enum Written {
    Upto(u64),
    /// Another replica wrote this shard: nothing more will be written.
    Deposed(String),
    /// This replica's leadership ended: nothing more will be written.
    Ended,
}

struct State {
    shards: Vec<JournalState>,
    /// The resourceVersion each shard was last read or written at.
    versions: Vec<Option<String>>,
    dirty: BTreeSet<usize>,
    generation: u64,
}

/// Lease state in ConfigMaps, written behind by a background task.
pub struct CheckpointJournal {
    shared: Arc<Shared>,
    loaded: Option<LeaseSnapshot>,
}

impl CheckpointJournal {
    /// Reads the checkpoint in `namespace` and starts the writer (on the
    /// current Tokio runtime). Call once this replica leads.
    /// With `tenure` (leader election), nothing is written once it lapses,
    /// and no write is allowed to outlast it.
    pub async fn open(
        client: kube::Client,
        namespace: &str,
        tenure: Option<Tenure>,
    ) -> Result<Self, JournalError> {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let mut shards = Vec::with_capacity(SHARDS);
        let mut versions = Vec::with_capacity(SHARDS);
        for index in 0..SHARDS {
            let name = shard_name(index);
            let failed = |message: String| JournalError::Checkpoint {
                name: name.clone(),
                message,
            };
            match api.get_opt(&name).await.map_err(|e| failed(e.to_string()))? {
                Some(cm) => {
                    let text = cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get(DATA_KEY))
                        .map(String::as_str)
                        .unwrap_or("{}");
                    let shard: JournalState = serde_json::from_str(text)
                        .map_err(|e| failed(format!("unreadable checkpoint: {e}")))?;
                    shards.push(shard);
                    versions.push(cm.metadata.resource_version);
                }
                None => {
                    shards.push(JournalState::default());
                    versions.push(None);
                }
            }
        }
        let mut snapshot = LeaseSnapshot::default();
        for shard in &shards {
            shard.clone().into_snapshot(&mut snapshot)?;
        }
        let (written, _) = watch::channel(Written::Upto(0));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                shards,
                versions,
                dirty: BTreeSet::new(),
                generation: 0,
            }),
            wake: Notify::new(),
            written,
        });
        tokio::spawn(writer(shared.clone(), api, tenure));
        Ok(Self {
            shared,
            loaded: Some(snapshot),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LeaseJournal for CheckpointJournal {
    fn load(&mut self, now: Timestamp) -> Result<LeaseSnapshot, JournalError> {
        self.prune(now)?;
        Ok(self.loaded.take().unwrap_or_default())
    }

    fn record(&mut self, changes: &[LeaseChange]) -> Result<Durable, JournalError> {
        match &*self.shared.written.borrow() {
            Written::Deposed(name) => return Err(JournalError::Deposed { name: name.clone() }),
            Written::Ended => return Err(JournalError::NotLeading),
            Written::Upto(_) => {}
        }
        let generation = {
            let mut state = self.state();
            for change in changes {
                let index = match change {
                    LeaseChange::Granted(l) => shard_of(&l.proxy),
                    LeaseChange::Ended(e) => shard_of(&e.proxy),
                    LeaseChange::TargetRest { proxy, .. }
                    | LeaseChange::ProxyRest { proxy, .. }
                    | LeaseChange::BlockedBy { proxy, .. }
                    | LeaseChange::Errors { proxy, .. }
                    | LeaseChange::ProxyRemoved(proxy) => shard_of(proxy),
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
        Ok(Durable::Later(Box::pin(async move {
            let outcome = written
                .wait_for(|w| match w {
                    Written::Upto(done) => *done >= generation,
                    Written::Deposed(_) | Written::Ended => true,
                })
                .await
                .map(|w| w.clone());
            match outcome {
                Ok(Written::Upto(_)) => Ok(()),
                Ok(Written::Deposed(name)) => Err(JournalError::Deposed { name }),
                Ok(Written::Ended) => Err(JournalError::NotLeading),
                Err(_) => Err(JournalError::Checkpoint {
                    name: NAME_PREFIX.trim_end_matches('-').to_owned(),
                    message: "the checkpoint writer stopped".into(),
                }),
            }
        })))
    }

    fn prune(&mut self, now: Timestamp) -> Result<(), JournalError> {
        let now = now.as_millisecond();
        let mut state = self.state();
        for index in 0..SHARDS {
            if state.shards[index].prune(now) {
                state.dirty.insert(index);
            }
        }
        drop(state);
        self.shared.wake.notify_one();
        Ok(())
    }
}

/// Writes dirty shards, a round at a time, until deposed or no longer leading.
async fn writer(shared: Arc<Shared>, api: Api<ConfigMap>, tenure: Option<Tenure>) {
    loop {
        shared.wake.notified().await;
        loop {
            let (generation, round) = {
                let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                let dirty = std::mem::take(&mut state.dirty);
                let round: Vec<(usize, String, Option<String>)> = dirty
                    .into_iter()
                    .map(|i| {
                        let json = serde_json::to_string(&state.shards[i]).unwrap_or_else(|_| "{}".into());
                        (i, json, state.versions[i].clone())
                    })
                    .collect();
                (state.generation, round)
            };
            if round.is_empty() {
                break;
            }
            let mut failed = Vec::new();
            for (index, json, version) in round {
                // A write may not land after the tenure: the next leader
                // reads the checkpoint only once this one has stopped.
                let budget = match &tenure {
                    None => WRITE_TIMEOUT,
                    Some(t) => match t
                        .until()
                        .and_then(|u| u.checked_duration_since(std::time::Instant::now()))
                    {
                        Some(left) if t.is_leading() => left.min(WRITE_TIMEOUT),
                        _ => {
                            tracing::info!("leadership ended; the lease checkpoint is no longer written");
                            shared.written.send_replace(Written::Ended);
                            return;
                        }
                    },
                };
                let written = tokio::time::timeout(budget, write_shard(&api, index, json, version))
                    .await
                    .unwrap_or(Err(WriteError::TimedOut(budget)));
                match written {
                    Ok(version) => {
                        let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                        state.versions[index] = version;
                    }
                    Err(WriteError::Conflict) => {
                        let name = shard_name(index);
                        tracing::error!(checkpoint = %name, "lease checkpoint written by another replica; no longer writing");
                        shared.written.send_replace(Written::Deposed(name));
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(checkpoint = %shard_name(index), error = %e, "writing the lease checkpoint failed; retrying");
                        failed.push(index);
                    }
                }
            }
            if failed.is_empty() {
                shared.written.send_replace(Written::Upto(generation));
                tokio::time::sleep(MIN_ROUND_INTERVAL).await;
            } else {
                shared
                    .state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .dirty
                    .extend(failed);
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// The shard changed since this replica last read or wrote it.
    #[error("conflict")]
    Conflict,
    #[error(transparent)]
    Api(kube::Error),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Creates or replaces one shard, guarded by its resourceVersion.
async fn write_shard(
    api: &Api<ConfigMap>,
    index: usize,
    json: String,
    version: Option<String>,
) -> Result<Option<String>, WriteError> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(shard_name(index)),
            resource_version: version.clone(),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "egress-proxies-operator".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(DATA_KEY.to_owned(), json)])),
        ..ConfigMap::default()
    };
    let result = match version {
        Some(_) => api.replace(&shard_name(index), &PostParams::default(), &cm).await,
        None => api.create(&PostParams::default(), &cm).await,
    };
    match result {
        Ok(written) => Ok(written.metadata.resource_version),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(WriteError::Conflict),
        Err(e) => Err(WriteError::Api(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_spread() {
        // Fixed values: a new version must find entries where an old one wrote them.
        assert_eq!(
            shard_of(&ObjectKey::new("crawl", "p1")),
            shard_of(&ObjectKey::new("crawl", "p1"))
        );
        let mut counts = [0usize; SHARDS];
        for i in 0..10_000 {
            counts[shard_of(&ObjectKey::new("crawl", format!("p{i}")))] += 1;
        }
        assert!(counts.iter().all(|c| (400..=850).contains(c)), "{counts:?}");
    }
}
