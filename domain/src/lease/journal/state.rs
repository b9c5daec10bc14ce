//! Journaled lease state folded into maps: what a journal stores when it
//! keeps the state itself (a checkpoint shard, a compacted log) rather than
//! the changes. Applying a change is idempotent, so replaying a log that
//! overlaps what was folded already gives the same state.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{EndedRecord, JournalError, LeaseChange, LeaseRecord, LeaseSnapshot, ProxyTally};
use crate::resource::ObjectKey;

/// Held leases, ended leases still taking reports, and rests, as stored
/// (times in Unix milliseconds, proxies as `namespace/name`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalState {
    /// Lease id → lease.
    #[serde(default)]
    leases: BTreeMap<String, StoredLease>,
    /// Ended lease id → (proxy, target, until ms).
    #[serde(default)]
    ended: BTreeMap<String, StoredEnded>,
    /// `namespace/name` → target → until (ms).
    #[serde(default)]
    target_rests: BTreeMap<String, BTreeMap<String, i64>>,
    /// `namespace/name` → until (ms).
    #[serde(default)]
    proxy_rests: BTreeMap<String, i64>,
    /// `namespace/name` → blocked targets and errors, kept until the proxy goes.
    #[serde(default)]
    tallies: BTreeMap<String, StoredTally>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredTally {
    /// Target digests.
    #[serde(default)]
    blocked_targets: BTreeSet<u64>,
    #[serde(default)]
    errors: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredLease {
    proxy: String,
    target: String,
    expires_ms: i64,
    ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client: Option<String>,
    /// Absent in states written before leases had owners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredEnded {
    proxy: String,
    target: String,
    until_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

/// A proxy as journals write it: `namespace/name`.
pub fn key_string(key: &ObjectKey) -> String {
    format!("{}/{}", key.namespace, key.name)
}

/// The proxy written by [`key_string`].
pub fn parse_key(text: &str) -> Result<ObjectKey, JournalError> {
    text.split_once('/')
        .map(|(ns, name)| ObjectKey::new(ns, name))
        .ok_or_else(|| JournalError::Corrupt {
            what: "proxy key",
            value: text.to_owned(),
        })
}

/// The time written as Unix milliseconds.
pub fn parse_ms(ms: i64) -> Result<Timestamp, JournalError> {
    Timestamp::from_millisecond(ms).map_err(|_| JournalError::Corrupt {
        what: "time",
        value: ms.to_string(),
    })
}

impl JournalState {
    /// Folds one change in.
    pub fn apply(&mut self, change: &LeaseChange) {
        match change {
            LeaseChange::Granted(l) => {
                self.leases.insert(
                    l.id.clone(),
                    StoredLease {
                        proxy: key_string(&l.proxy),
                        target: l.target.clone(),
                        expires_ms: l.expires.as_millisecond(),
                        ttl_ms: l.ttl_ms,
                        client: l.client.clone(),
                        owner: l.owner.clone(),
                    },
                );
            }
            LeaseChange::Extended { id, expires } => {
                if let Some(lease) = self.leases.get_mut(id) {
                    lease.expires_ms = expires.as_millisecond();
                }
            }
            LeaseChange::Ended(e) => {
                self.leases.remove(&e.id);
                self.ended.insert(
                    e.id.clone(),
                    StoredEnded {
                        proxy: key_string(&e.proxy),
                        target: e.target.clone(),
                        until_ms: e.until.as_millisecond(),
                        owner: e.owner.clone(),
                    },
                );
            }
            LeaseChange::TargetRest { target, proxy, until } => {
                let slot = self
                    .target_rests
                    .entry(key_string(proxy))
                    .or_default()
                    .entry(target.clone())
                    .or_insert(i64::MIN);
                *slot = (*slot).max(until.as_millisecond());
            }
            LeaseChange::ProxyRest { proxy, until } => {
                let slot = self.proxy_rests.entry(key_string(proxy)).or_insert(i64::MIN);
                *slot = (*slot).max(until.as_millisecond());
            }
            LeaseChange::BlockedBy { proxy, target } => {
                self.tallies
                    .entry(key_string(proxy))
                    .or_default()
                    .blocked_targets
                    .insert(*target);
            }
            LeaseChange::Errors { proxy, count } => {
                let tally = self.tallies.entry(key_string(proxy)).or_default();
                tally.errors = tally.errors.max(*count);
            }
            LeaseChange::ProxyRemoved(proxy) => {
                let proxy = key_string(proxy);
                self.leases.retain(|_, l| l.proxy != proxy);
                self.ended.retain(|_, e| e.proxy != proxy);
                self.target_rests.remove(&proxy);
                self.proxy_rests.remove(&proxy);
                self.tallies.remove(&proxy);
            }
        }
    }

    /// Whether a lease with this id is held.
    pub fn holds(&self, lease: &str) -> bool {
        self.leases.contains_key(lease)
    }

    /// Drops what ended by `now` (Unix ms); true when anything went.
    pub fn prune(&mut self, now: i64) -> bool {
        let before = self.len();
        self.leases.retain(|_, l| l.expires_ms > now);
        self.ended.retain(|_, e| e.until_ms > now);
        for rests in self.target_rests.values_mut() {
            rests.retain(|_, until| *until > now);
        }
        self.target_rests.retain(|_, rests| !rests.is_empty());
        self.proxy_rests.retain(|_, until| *until > now);
        self.len() != before
    }

    /// Ended leases kept (for reports and releases that come late).
    pub fn ended_len(&self) -> usize {
        self.ended.len()
    }

    /// Keeps at most `keep` ended leases, dropping those whose grace ends
    /// first; returns how many went. Only late reports and releases on them
    /// are lost: their rests are kept apart ([`LeaseChange::TargetRest`]).
    pub fn shed_ended(&mut self, keep: usize) -> usize {
        let excess = self.ended.len().saturating_sub(keep);
        if excess == 0 {
            return 0;
        }
        let mut by_end: Vec<(i64, String)> = self
            .ended
            .iter()
            .map(|(id, e)| (e.until_ms, id.clone()))
            .collect();
        by_end.select_nth_unstable(excess - 1);
        for (_, id) in by_end.into_iter().take(excess) {
            self.ended.remove(&id);
        }
        excess
    }

    /// Entries of every kind.
    pub fn len(&self) -> usize {
        self.leases.len()
            + self.ended.len()
            + self.target_rests.values().map(BTreeMap::len).sum::<usize>()
            + self.proxy_rests.len()
            + self.tallies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds everything held to `out`.
    pub fn into_snapshot(self, out: &mut LeaseSnapshot) -> Result<(), JournalError> {
        for (id, l) in self.leases {
            out.leases.push(LeaseRecord {
                id,
                proxy: parse_key(&l.proxy)?,
                target: l.target,
                expires: parse_ms(l.expires_ms)?,
                ttl_ms: l.ttl_ms,
                client: l.client,
                owner: l.owner,
            });
        }
        for (id, e) in self.ended {
            out.ended.push(EndedRecord {
                id,
                proxy: parse_key(&e.proxy)?,
                target: e.target,
                until: parse_ms(e.until_ms)?,
                owner: e.owner,
            });
        }
        for (proxy, rests) in self.target_rests {
            let key = parse_key(&proxy)?;
            for (target, until) in rests {
                out.target_rests.push((target, key.clone(), parse_ms(until)?));
            }
        }
        for (proxy, until) in self.proxy_rests {
            out.proxy_rests.push((parse_key(&proxy)?, parse_ms(until)?));
        }
        for (proxy, tally) in self.tallies {
            out.tallies.push(ProxyTally {
                proxy: parse_key(&proxy)?,
                blocked_targets: tally.blocked_targets.into_iter().collect(),
                errors: tally.errors,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_applies_changes_and_prunes_what_ended() {
        let t = |s: i64| Timestamp::from_second(2_000_000_000 + s).unwrap();
        let key = ObjectKey::new("crawl", "p1");
        let mut state = JournalState::default();
        state.apply(&LeaseChange::Granted(LeaseRecord {
            id: "l1".into(),
            proxy: key.clone(),
            target: "example.org".into(),
            expires: t(60),
            ttl_ms: 60_000,
            client: None,
            owner: Some("team-a".into()),
        }));
        state.apply(&LeaseChange::TargetRest {
            target: "example.org".into(),
            proxy: key.clone(),
            until: t(30),
        });
        state.apply(&LeaseChange::TargetRest {
            target: "example.org".into(),
            proxy: key.clone(),
            until: t(10),
        });
        state.apply(&LeaseChange::Extended {
            id: "l1".into(),
            expires: t(90),
        });
        let json = serde_json::to_string(&state).unwrap();
        let back: JournalState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state, "{json}");
        let mut snapshot = LeaseSnapshot::default();
        back.into_snapshot(&mut snapshot).unwrap();
        assert_eq!(snapshot.leases[0].expires, t(90));
        assert_eq!(
            snapshot.target_rests,
            [("example.org".to_owned(), key.clone(), t(30))]
        );

        for (i, until) in [(1, 50), (2, 20), (3, 40)] {
            state.apply(&LeaseChange::Ended(EndedRecord {
                id: format!("e{i}"),
                proxy: key.clone(),
                target: "example.org".into(),
                until: t(until),
                owner: None,
            }));
        }
        assert_eq!(state.shed_ended(3), 0, "within what may be kept");
        assert_eq!(state.shed_ended(1), 2, "the two whose grace ends first go");
        assert!(state.ended.contains_key("e1"), "{:?}", state.ended);
        assert!(state.prune(t(51).as_millisecond()));
        assert_eq!(state.ended_len(), 0);
        assert!(state.target_rests.is_empty() && state.leases.len() == 1);
        state.apply(&LeaseChange::ProxyRemoved(key));
        assert_eq!(state.len(), 0);
    }
}
