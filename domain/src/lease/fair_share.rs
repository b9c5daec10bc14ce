//! Fair shares of a scarce fleet between crawler identities
//! (docs/concepts.md, "Fair shares"). Pure: the lease store hands in who
//! holds how many leases and who is waiting; these functions say whether an
//! identity may take one more lease, in which order waiters are served, and
//! whose lease to take back for a waiter.
//!
//! An identity's share is the fleet's lease slots split by weight among the
//! identities *asking* — holding leases or waiting for one — rounded up to
//! whole leases. Shares only bind while someone below theirs is waiting:
//! an identity alone may use the whole fleet.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

/// Weights by identity (`fairShare.weights`); an identity not named weighs 1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FairShare {
    pub weights: BTreeMap<String, u32>,
}

impl FairShare {
    pub fn weight(&self, owner: &str) -> u64 {
        u64::from(self.weights.get(owner).copied().unwrap_or(1).max(1))
    }

    /// Weights as configured: each at least 1, each identity named.
    pub fn new(weights: BTreeMap<String, u32>) -> Result<Self, FairShareError> {
        for (owner, weight) in &weights {
            if owner.is_empty() {
                return Err(FairShareError::Unnamed);
            }
            if *weight == 0 {
                return Err(FairShareError::Zero(owner.clone()));
            }
        }
        Ok(Self { weights })
    }

    /// `team-a=2,team-b=3` (the `--fair-share-weights` flag); empty: all equal.
    pub fn parse(text: &str) -> Result<Self, FairShareError> {
        let mut weights = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (owner, weight) = pair
                .split_once('=')
                .ok_or_else(|| FairShareError::Malformed(pair.to_owned()))?;
            let weight = weight
                .trim()
                .parse()
                .map_err(|_| FairShareError::Malformed(pair.to_owned()))?;
            weights.insert(owner.trim().to_owned(), weight);
        }
        Self::new(weights)
    }
}

/// Fair-share weights that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FairShareError {
    #[error("fair-share weight of {0:?} must be at least 1")]
    Zero(String),
    #[error("a fair-share weight names no identity")]
    Unnamed,
    #[error("fair-share weight {0:?} is not IDENTITY=WEIGHT (a whole number)")]
    Malformed(String),
}

/// What the policy looks at.
#[derive(Clone, Copy, Debug)]
pub struct Demand<'a> {
    /// Leases the serving fleet can carry at once; 0: unlimited (shares never bind).
    pub slots: u64,
    /// Leases held, by identity (identities holding none may be absent).
    pub held: &'a BTreeMap<String, u32>,
    /// Identities waiting for a lease.
    pub waiting: &'a BTreeSet<String>,
    pub weights: &'a FairShare,
}

/// Whether an identity may take one more lease now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Below its share, or no identity below its own is waiting.
    Take,
    /// At or over its share while `waiting` (below its own) waits.
    OverShare { held: u32, share: u64, waiting: String },
}

impl Demand<'_> {
    fn held_by(&self, owner: &str) -> u64 {
        u64::from(self.held.get(owner).copied().unwrap_or(0))
    }

    /// Total weight of the identities asking, `owner` counted as asking.
    fn asking_weight(&self, owner: &str) -> u64 {
        let asking: BTreeSet<&str> = self
            .held
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, _)| k.as_str())
            .chain(self.waiting.iter().map(String::as_str))
            .chain([owner])
            .collect();
        asking.iter().map(|o| self.weights.weight(o)).sum()
    }

    /// Whether `who` holds fewer leases than its share (with `asker` asking).
    /// `held < slots·w/W`, compared in integers.
    fn below_share(&self, who: &str, held: u64, total_weight: u64) -> bool {
        u128::from(held) * u128::from(total_weight)
            < u128::from(self.slots) * u128::from(self.weights.weight(who))
    }

    /// `owner`'s share in whole leases (rounded up).
    fn share(&self, owner: &str, total_weight: u64) -> u64 {
        (self.slots * self.weights.weight(owner)).div_ceil(total_weight.max(1))
    }
}

/// Whether `owner` may take one more lease.
pub fn decide(owner: &str, demand: &Demand) -> Turn {
    if demand.slots == 0 {
        return Turn::Take;
    }
    let total = demand.asking_weight(owner);
    let held = demand.held_by(owner);
    if demand.below_share(owner, held, total) {
        return Turn::Take;
    }
    let deprived = demand
        .waiting
        .iter()
        .filter(|w| w.as_str() != owner)
        .find(|w| demand.below_share(w, demand.held_by(w), total));
    match deprived {
        None => Turn::Take,
        Some(waiting) => Turn::OverShare {
            held: u32::try_from(held).unwrap_or(u32::MAX),
            share: demand.share(owner, total),
            waiting: waiting.clone(),
        },
    }
}

/// Which of two waiters is served first: the identity with fewer leases
/// per unit of weight (the furthest below its share), then the one that
/// came first (`seq`).
pub fn turn_order(a: (&str, u64), b: (&str, u64), demand: &Demand) -> Ordering {
    let load = |owner: &str| u128::from(demand.held_by(owner));
    let (wa, wb) = (demand.weights.weight(a.0), demand.weights.weight(b.0));
    // held_a / w_a against held_b / w_b, cross-multiplied.
    (load(a.0) * u128::from(wb))
        .cmp(&(load(b.0) * u128::from(wa)))
        .then(a.1.cmp(&b.1))
}

/// Identities a lease may be taken back from so that `waiter` (below its
/// share) is served, most over its share first. A lease moves only when it
/// leaves things fairer: the holder keeps more per weight than the waiter
/// would have with it, so two identities never take a lease back and forth.
pub fn reclaim_from(waiter: &str, demand: &Demand) -> Vec<String> {
    if demand.slots == 0 {
        return Vec::new();
    }
    let total = demand.asking_weight(waiter);
    let waiter_held = demand.held_by(waiter);
    if !demand.below_share(waiter, waiter_held, total) {
        return Vec::new();
    }
    let w_waiter = u128::from(demand.weights.weight(waiter));
    let mut hogs: Vec<(&String, u64)> = demand
        .held
        .iter()
        .filter(|(owner, _)| owner.as_str() != waiter)
        .map(|(owner, n)| (owner, u64::from(*n)))
        .filter(|(owner, held)| {
            let w_hog = u128::from(demand.weights.weight(owner));
            let over = !demand.below_share(owner, held.saturating_sub(1), total);
            // held_hog / w_hog > (held_waiter + 1) / w_waiter
            let fairer = u128::from(*held) * w_waiter > u128::from(waiter_held + 1) * w_hog;
            over && fairer
        })
        .collect();
    hogs.sort_by(|a, b| {
        let (wa, wb) = (
            u128::from(demand.weights.weight(a.0)),
            u128::from(demand.weights.weight(b.0)),
        );
        (u128::from(b.1) * wa)
            .cmp(&(u128::from(a.1) * wb))
            .then(a.0.cmp(b.0))
    });
    hogs.into_iter().map(|(owner, _)| owner.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn weights(pairs: &[(&str, u32)]) -> FairShare {
        FairShare {
            weights: pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
        }
    }

    /// (why, who asks, slots, holdings, waiting, weights, expected).
    type DecideRow = (
        &'static str,
        &'static str,
        u64,
        &'static [(&'static str, u32)],
        &'static [&'static str],
        &'static [(&'static str, u32)],
        Turn,
    );

    /// (why, the waiter, slots, holdings, weights, hogs in order).
    type ReclaimRow = (
        &'static str,
        &'static str,
        u64,
        &'static [(&'static str, u32)],
        &'static [(&'static str, u32)],
        &'static [&'static str],
    );

    fn over(held: u32, share: u64, waiting: &str) -> Turn {
        Turn::OverShare {
            held,
            share,
            waiting: waiting.into(),
        }
    }

    /// One row per situation: who asks, the fleet, holdings, waiters, weights.
    #[test]
    fn who_may_take_one_more_lease() {
        #[rustfmt::skip]
        let rows: &[DecideRow] = &[
            ("alone: the whole fleet", "a", 3, &[("a", 2)], &[], &[], Turn::Take),
            ("alone, fleet full: the book refuses, not the policy", "a", 3, &[("a", 3)], &[], &[], Turn::Take),
            ("unlimited capacity: shares never bind", "a", 0, &[("a", 9)], &["b"], &[], Turn::Take),
            ("hog while another waits with nothing", "a", 3, &[("a", 3)], &["b"], &[], over(3, 2, "b")),
            ("at its rounded-up share while another waits", "a", 3, &[("a", 2)], &["b"], &[], over(2, 2, "b")),
            ("below its share while another waits", "a", 3, &[("a", 1)], &["b"], &[], Turn::Take),
            ("the waiter is at its share: nobody deprived", "a", 4, &[("a", 2), ("b", 2)], &["b"], &[], Turn::Take),
            ("its own wait does not count against it", "a", 3, &[("a", 3)], &["a"], &[], Turn::Take),
            ("three asking, 6 slots: share 2", "a", 6, &[("a", 2), ("b", 1)], &["c"], &[], over(2, 2, "c")),
            ("weight 2 of 3: share 4 of 6", "a", 6, &[("a", 3)], &["b"], &[("a", 2)], Turn::Take),
            ("weight 2 of 3 at its share", "a", 6, &[("a", 4)], &["b"], &[("a", 2)], over(4, 4, "b")),
            ("the waiter weighs 2: it is deprived at 3 of 6", "a", 6, &[("a", 3), ("b", 3)], &["b"], &[("b", 2)], over(3, 2, "b")),
            ("identities holding nothing do not ask", "a", 3, &[("a", 1), ("idle", 0)], &["b"], &[], Turn::Take),
        ];
        for (why, owner, slots, holdings, waiting, weighted, expected) in rows {
            let (held, waiting, weights) = (held(holdings), set(waiting), weights(weighted));
            let demand = Demand {
                slots: *slots,
                held: &held,
                waiting: &waiting,
                weights: &weights,
            };
            assert_eq!(&decide(owner, &demand), expected, "{why}");
        }
    }

    #[test]
    fn weights_parse_from_the_flag_and_refuse_zero() {
        let parsed = FairShare::parse("team-a=2, team-b = 3,").unwrap();
        assert_eq!(
            (
                parsed.weight("team-a"),
                parsed.weight("team-b"),
                parsed.weight("x")
            ),
            (2, 3, 1)
        );
        assert_eq!(FairShare::parse("").unwrap(), FairShare::default());
        assert_eq!(FairShare::parse("a=0"), Err(FairShareError::Zero("a".into())));
        assert!(matches!(FairShare::parse("a"), Err(FairShareError::Malformed(_))));
        assert!(matches!(
            FairShare::parse("a=x"),
            Err(FairShareError::Malformed(_))
        ));
        assert_eq!(FairShare::parse("=2"), Err(FairShareError::Unnamed));
    }

    #[test]
    fn waiters_are_served_furthest_below_their_share_first_then_in_arrival_order() {
        let (held, waiting) = (held(&[("a", 2), ("b", 1), ("c", 1)]), set(&["a", "b", "c"]));
        let w = weights(&[("c", 2)]);
        let demand = Demand {
            slots: 4,
            held: &held,
            waiting: &waiting,
            weights: &w,
        };
        // Arrival order: a (1), b (2), c (3), b again (4).
        let mut queue = vec![("a", 1), ("b", 2), ("c", 3), ("b", 4)];
        queue.sort_by(|x, y| turn_order(*x, *y, &demand));
        // c holds 1 per 2 weight, b 1 per 1 (FIFO within b), a 2 per 1.
        assert_eq!(queue, [("c", 3), ("b", 2), ("b", 4), ("a", 1)]);
    }

    #[test]
    fn a_lease_is_taken_back_only_when_that_is_fairer() {
        #[rustfmt::skip]
        let rows: &[ReclaimRow] = &[
            ("a hog of 3 for a waiter with none", "b", 3, &[("a", 3)], &[], &["a"]),
            ("2 against 1 of 3: moving one only swaps them", "b", 3, &[("a", 2), ("b", 1)], &[], &[]),
            ("the waiter at its share takes nothing back", "b", 4, &[("a", 2), ("b", 2)], &[], &[]),
            ("the biggest hog first", "c", 6, &[("a", 4), ("b", 2)], &[], &["a"]),
            ("two hogs, most over per weight first", "c", 12, &[("a", 7), ("b", 5)], &[("a", 2)], &["b", "a"]),
            ("a weight-2 hog keeps its larger share", "b", 6, &[("a", 4), ("b", 2)], &[("a", 2)], &[]),
            ("unlimited capacity", "b", 0, &[("a", 9)], &[], &[]),
        ];
        for (why, waiter, slots, holdings, weighted, expected) in rows {
            let (held, waiting, weights) = (held(holdings), set(&[waiter]), weights(weighted));
            let demand = Demand {
                slots: *slots,
                held: &held,
                waiting: &waiting,
                weights: &weights,
            };
            assert_eq!(reclaim_from(waiter, &demand), *expected, "{why}");
        }
    }
}
