//! What the book remembers per target, arranged so that picking a proxy for
//! a hot target never walks past the proxies resting for it.
//!
//! Every proxy the target has used (it has a "last leased" mark) is in
//! exactly one place: `rests` while it rests for the target, else
//! `held` while leased for it, else `idle`, ordered by when it was last
//! leased. Resting proxies return to `idle` (or `held`) when their rest
//! ends ([`TargetState::settle`]), lazily, in the order the rests end.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::{IndexKey, ProxyId};

#[derive(Debug, Default)]
pub(super) struct TargetState {
    /// When each proxy was last leased for the target.
    last_leased: HashMap<ProxyId, Instant>,
    /// Used before, neither resting nor leased for the target: oldest first.
    idle: BTreeSet<(Instant, ProxyId)>,
    /// Leases on each proxy for the target, held now.
    held: HashMap<ProxyId, u32>,
    /// Resting for the target until then.
    cooldown: HashMap<ProxyId, Instant>,
    /// `cooldown`, by when the rest ends.
    rests: BTreeSet<(Instant, ProxyId)>,
    /// Leases on this target held, or ended but still taking reports: the
    /// state must outlive them (a release or a late `blocked` rests here).
    pub refs: u32,
    /// Every proxy before this key in the availability index has been used
    /// for the target, but those in `returned` (kept for hot targets only;
    /// see `LeaseBook::select`).
    pub untouched_from: Option<IndexKey>,
    /// Never-used proxies that came back to the index before `untouched_from`.
    pub returned: BTreeSet<IndexKey>,
}

impl TargetState {
    /// Used for the target, or resting for it: not "never leased".
    pub fn touched(&self, proxy: ProxyId) -> bool {
        self.last_leased.contains_key(&proxy) || self.cooldown.contains_key(&proxy)
    }

    pub fn resting(&self, proxy: ProxyId, now: Instant) -> bool {
        self.cooldown.get(&proxy).is_some_and(|until| *until > now)
    }

    pub fn last_leased(&self, proxy: ProxyId) -> Option<Instant> {
        self.last_leased.get(&proxy).copied()
    }

    /// Used before and free to take again, oldest first.
    pub fn idle(&self) -> impl Iterator<Item = (Instant, ProxyId)> + '_ {
        self.idle.iter().copied()
    }

    /// Leased for the target now (with their last lease).
    pub fn held(&self) -> impl Iterator<Item = (Instant, ProxyId)> + '_ {
        self.held
            .keys()
            .filter(|p| !self.cooldown.contains_key(p))
            .filter_map(|p| Some((*self.last_leased.get(p)?, *p)))
    }

    /// Rests running, with when they end.
    pub fn rests(&self) -> impl Iterator<Item = (ProxyId, Instant)> + '_ {
        self.cooldown.iter().map(|(p, until)| (*p, *until))
    }

    /// When the earliest rest ends.
    pub fn next_rest_end(&self) -> Option<Instant> {
        self.rests.first().map(|(until, _)| *until)
    }

    /// When the earliest rest still running at `now` ends.
    pub fn next_rest_end_after(&self, now: Instant) -> Option<Instant> {
        self.rests
            .range((now, ProxyId::MAX)..)
            .map(|(until, _)| *until)
            .find(|until| *until > now)
    }

    /// When the latest rest ends.
    pub fn last_rest_end(&self) -> Option<Instant> {
        self.rests.last().map(|(until, _)| *until)
    }

    /// The newest "last leased" mark.
    pub fn newest_mark(&self) -> Option<Instant> {
        self.last_leased.values().max().copied()
    }

    /// Rests and "last leased" marks kept.
    pub fn marks(&self) -> usize {
        self.cooldown.len() + self.last_leased.len()
    }

    /// Nothing left worth keeping.
    pub fn is_idle(&self) -> bool {
        self.cooldown.is_empty() && self.last_leased.is_empty() && self.refs == 0
    }

    /// Puts `proxy` where its marks say it belongs.
    fn place(&mut self, proxy: ProxyId) {
        let Some(last) = self.last_leased.get(&proxy).copied() else {
            return;
        };
        if self.cooldown.contains_key(&proxy) || self.held.contains_key(&proxy) {
            self.idle.remove(&(last, proxy));
        } else {
            self.idle.insert((last, proxy));
        }
    }

    /// A lease on `proxy` for the target was granted at `now`.
    pub fn leased(&mut self, proxy: ProxyId, now: Instant) {
        if let Some(previous) = self.last_leased.insert(proxy, now) {
            self.idle.remove(&(previous, proxy));
        }
        *self.held.entry(proxy).or_default() += 1;
        self.place(proxy);
    }

    /// A lease on `proxy` for the target ended.
    pub fn unheld(&mut self, proxy: ProxyId) {
        if let Some(count) = self.held.get_mut(&proxy) {
            *count -= 1;
            if *count == 0 {
                self.held.remove(&proxy);
            }
        }
        self.place(proxy);
    }

    /// `proxy` rests for the target until at least `until`; returns when it ends.
    pub fn rest(&mut self, proxy: ProxyId, until: Instant) -> Instant {
        let until = match self.cooldown.get(&proxy) {
            Some(current) if *current >= until => return *current,
            Some(current) => {
                self.rests.remove(&(*current, proxy));
                until
            }
            None => until,
        };
        self.cooldown.insert(proxy, until);
        self.rests.insert((until, proxy));
        self.place(proxy);
        until
    }

    /// Ends the rests that are over by `now`.
    pub fn settle(&mut self, now: Instant) {
        while let Some(&(until, proxy)) = self.rests.first() {
            if until > now {
                break;
            }
            self.rests.pop_first();
            self.cooldown.remove(&proxy);
            if !self.last_leased.contains_key(&proxy) {
                // Never leased (a restored rest): untouched again.
                self.forget_walk_start();
            }
            self.place(proxy);
        }
    }

    /// Forgets "last leased" marks of idle proxies older than `cutoff`.
    pub fn forget_marks_before(&mut self, cutoff: Instant) {
        while let Some(&(last, proxy)) = self.idle.first() {
            if last >= cutoff {
                break;
            }
            self.idle.pop_first();
            self.last_leased.remove(&proxy);
            self.forget_walk_start();
        }
    }

    /// The next walk for a never-used proxy starts at the beginning.
    pub fn forget_walk_start(&mut self) {
        self.untouched_from = None;
        self.returned.clear();
    }

    /// Forgets everything about a proxy that is gone.
    pub fn forget_proxy(&mut self, proxy: ProxyId) {
        if let Some(last) = self.last_leased.remove(&proxy) {
            self.idle.remove(&(last, proxy));
        }
        if let Some(until) = self.cooldown.remove(&proxy) {
            self.rests.remove(&(until, proxy));
        }
        self.held.remove(&proxy);
    }
}
