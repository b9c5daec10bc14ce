//! What one replica's book learns that every replica's book must know: rests
//! (a proxy resting for a target, or everywhere) and tallies (targets that
//! blocked a proxy, its errors). A replica queues its own in an [`Outbox`]
//! until the leader acknowledges them; the leader merges them and passes
//! them on; every book applies them with set semantics (the later end, the
//! union, the larger count), so a change applied twice, late or out of
//! order changes nothing more.
//!
//! Rests travel as the time remaining: monotonic clocks of different
//! processes cannot be compared, and a rest lengthened by the time on the
//! wire errs on the safe side.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::MAX_BLOCKED_TARGETS;
use super::journal::ProxyTally;
use crate::resource::ObjectKey;

/// Rests shorter than this stay with the replica that made them (the
/// gateway's pacing between two requests of one client).
pub const MIN_SHARED_REST: Duration = Duration::from_secs(1);

/// One change every replica's book applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetChange {
    /// `proxy` rests for `target` for `remaining` more.
    TargetRest {
        target: String,
        proxy: ObjectKey,
        remaining: Duration,
    },
    /// `proxy` rests for every target for `remaining` more.
    ProxyRest { proxy: ObjectKey, remaining: Duration },
    /// Targets (digests) that blocked the proxy, and its errors so far.
    Tally(ProxyTally),
}

#[derive(Debug)]
struct Pending<T> {
    value: T,
    /// The outbox sequence number of its latest change.
    seq: u64,
}

/// A replica's fleet changes not yet acknowledged by the leader, coalesced:
/// one rest per (target, proxy) and per proxy (the latest end), one tally
/// per proxy (blocked targets united, errors the largest). Each change
/// that adds something takes the next sequence number; an acknowledgement
/// of `seq` drops what was sent as of it, keeping anything changed since.
#[derive(Debug, Default)]
pub struct Outbox {
    last_seq: u64,
    target_rests: HashMap<(String, ObjectKey), Pending<Instant>>,
    proxy_rests: HashMap<ObjectKey, Pending<Instant>>,
    tallies: HashMap<ObjectKey, Pending<(BTreeSet<u64>, u32)>>,
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `change` (as of `now`). Returns whether it added anything: a
    /// rest ending no later than one queued, or a tally with nothing new,
    /// does not.
    pub fn push(&mut self, change: FleetChange, now: Instant) -> bool {
        let seq = self.last_seq + 1;
        let added = match change {
            FleetChange::TargetRest {
                target,
                proxy,
                remaining,
            } => later_end(&mut self.target_rests, (target, proxy), now + remaining, seq),
            FleetChange::ProxyRest { proxy, remaining } => {
                later_end(&mut self.proxy_rests, proxy, now + remaining, seq)
            }
            FleetChange::Tally(tally) => {
                let pending = self.tallies.entry(tally.proxy).or_insert(Pending {
                    value: (BTreeSet::new(), 0),
                    seq: 0,
                });
                let (blocked, errors) = &mut pending.value;
                let mut added = tally.errors > *errors;
                *errors = (*errors).max(tally.errors);
                for target in tally.blocked_targets {
                    if blocked.len() >= MAX_BLOCKED_TARGETS {
                        break;
                    }
                    added |= blocked.insert(target);
                }
                if added {
                    pending.seq = seq;
                }
                added
            }
        };
        if added {
            self.last_seq = seq;
        }
        added
    }

    /// Everything not acknowledged, oldest change first, with its sequence
    /// number; rests over by `now` are left out.
    pub fn unacked(&self, now: Instant) -> Vec<(u64, FleetChange)> {
        let remaining = |until: Instant| until.checked_duration_since(now).filter(|d| !d.is_zero());
        let mut out: Vec<(u64, FleetChange)> = Vec::new();
        for ((target, proxy), p) in &self.target_rests {
            if let Some(remaining) = remaining(p.value) {
                out.push((
                    p.seq,
                    FleetChange::TargetRest {
                        target: target.clone(),
                        proxy: proxy.clone(),
                        remaining,
                    },
                ));
            }
        }
        for (proxy, p) in &self.proxy_rests {
            if let Some(remaining) = remaining(p.value) {
                out.push((
                    p.seq,
                    FleetChange::ProxyRest {
                        proxy: proxy.clone(),
                        remaining,
                    },
                ));
            }
        }
        for (proxy, p) in &self.tallies {
            let (blocked, errors) = &p.value;
            out.push((
                p.seq,
                FleetChange::Tally(ProxyTally {
                    proxy: proxy.clone(),
                    blocked_targets: blocked.iter().copied().collect(),
                    errors: *errors,
                }),
            ));
        }
        out.sort_by_key(|(seq, _)| *seq);
        out
    }

    /// The leader merged everything up to `seq`: dropped, but what changed
    /// since (a later sequence number) stays.
    pub fn ack(&mut self, seq: u64) {
        self.target_rests.retain(|_, p| p.seq > seq);
        self.proxy_rests.retain(|_, p| p.seq > seq);
        self.tallies.retain(|_, p| p.seq > seq);
    }

    /// Drops rests over by `now` (nothing left to tell about them).
    pub fn prune(&mut self, now: Instant) {
        self.target_rests.retain(|_, p| p.value > now);
        self.proxy_rests.retain(|_, p| p.value > now);
    }

    /// Changes waiting (coalesced).
    pub fn len(&self) -> usize {
        self.target_rests.len() + self.proxy_rests.len() + self.tallies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sequence number of the latest change queued.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }
}

/// Keeps the later end of a rest; whether `until` was later.
fn later_end<K: std::hash::Hash + Eq>(
    rests: &mut HashMap<K, Pending<Instant>>,
    key: K,
    until: Instant,
    seq: u64,
) -> bool {
    match rests.get_mut(&key) {
        Some(p) if p.value >= until => false,
        Some(p) => {
            p.value = until;
            p.seq = seq;
            true
        }
        None => {
            rests.insert(key, Pending { value: until, seq });
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("crawl", name)
    }

    fn rest(target: &str, proxy: &str, secs: u64) -> FleetChange {
        FleetChange::TargetRest {
            target: target.into(),
            proxy: key(proxy),
            remaining: Duration::from_secs(secs),
        }
    }

    fn tally(proxy: &str, blocked: &[u64], errors: u32) -> FleetChange {
        FleetChange::Tally(ProxyTally {
            proxy: key(proxy),
            blocked_targets: blocked.to_vec(),
            errors,
        })
    }

    #[test]
    fn changes_coalesce_per_target_and_proxy_keeping_the_latest_end_and_the_largest_tally() {
        let t0 = Instant::now();
        let mut outbox = Outbox::new();
        // (why, change, added)
        let rows = [
            ("a rest", rest("a.example", "p0", 30), true),
            ("the same rest ending sooner", rest("a.example", "p0", 10), false),
            ("the same rest ending later", rest("a.example", "p0", 600), true),
            ("another target", rest("b.example", "p0", 30), true),
            (
                "a proxy's rest everywhere",
                FleetChange::ProxyRest {
                    proxy: key("p0"),
                    remaining: Duration::from_secs(60),
                },
                true,
            ),
            ("a block", tally("p0", &[7], 0), true),
            ("the same block again", tally("p0", &[7], 0), false),
            ("another block and errors", tally("p0", &[8], 2), true),
            ("fewer errors", tally("p0", &[], 1), false),
        ];
        for (why, change, added) in rows {
            assert_eq!(outbox.push(change, t0), added, "{why}");
        }
        assert_eq!(outbox.len(), 4);
        let later = t0 + Duration::from_secs(20);
        let unacked = outbox.unacked(later);
        let changes: Vec<&FleetChange> = unacked.iter().map(|(_, c)| c).collect();
        assert!(changes.contains(&&rest("a.example", "p0", 580)), "{changes:?}");
        assert!(
            changes.contains(&&rest("b.example", "p0", 10)),
            "the time remaining"
        );
        assert!(changes.contains(&&tally("p0", &[7, 8], 2)));
        let seqs: Vec<u64> = unacked.iter().map(|(s, _)| *s).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first: {seqs:?}");
        assert_eq!(outbox.last_seq(), *seqs.last().unwrap());
        // Rests over are left out, then dropped.
        let much_later = t0 + Duration::from_secs(100);
        assert_eq!(outbox.unacked(much_later).len(), 2, "the long rest and the tally");
        outbox.prune(much_later);
        assert_eq!(outbox.len(), 2);
    }

    #[test]
    fn an_ack_drops_what_was_sent_and_keeps_what_changed_since() {
        let t0 = Instant::now();
        let mut outbox = Outbox::new();
        outbox.push(rest("a.example", "p0", 30), t0);
        outbox.push(tally("p0", &[1], 0), t0);
        let sent = outbox.last_seq();
        // A later end of the same rest after the send: it must go again.
        outbox.push(rest("a.example", "p0", 60), t0);
        outbox.push(rest("c.example", "p1", 60), t0);
        outbox.ack(sent);
        let left: Vec<FleetChange> = outbox.unacked(t0).into_iter().map(|(_, c)| c).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.contains(&rest("a.example", "p0", 60)));
        assert!(left.contains(&rest("c.example", "p1", 60)));
        outbox.ack(outbox.last_seq());
        assert!(outbox.is_empty());
        // Acknowledged again (a retried answer): nothing breaks.
        outbox.ack(sent);
        assert!(outbox.is_empty());
    }
}
