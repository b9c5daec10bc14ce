//! What each live member should hold of each proxy, given what the members
//! use and want: the even parts ([`super::parts`]) moved toward use.
//!
//! - **Use keeps its slots**: a member keeps at least the leases it has in
//!   use on a proxy; the slots that takes beyond its part come out of the
//!   idle slots of the others (the most idle first).
//! - **Idle slots go where they are wanted**: a member that reported
//!   wanting `n` more slots (refused for want of a share lately, or with
//!   gateway requests waiting) is lent up to `n` idle slots of members that
//!   want none, one slot per proxy per round, over the proxies in digest
//!   order, so a want spreads over the fleet.
//! - When every member wants, nothing is lent: the even parts hold.
//!
//! The targets only say where slots should go. A raise still waits for
//! room under the allocator's bounds (a slot moves only after its holder
//! reported giving it up), so the capacity holds whatever these say.

use std::collections::{BTreeMap, HashMap};

use super::Parts;
use crate::rendezvous;
use crate::resource::ObjectKey;

/// One live member as lending sees it.
#[derive(Clone, Debug, Default)]
pub struct Use<'a> {
    /// Leases in use per proxy, as it last reported.
    pub in_use: Option<&'a BTreeMap<ObjectKey, u32>>,
    /// More slots it asked for.
    pub wanting: u32,
}

impl Use<'_> {
    fn of(&self, key: &ObjectKey) -> u32 {
        self.in_use.and_then(|u| u.get(key)).copied().unwrap_or(0)
    }
}

/// Each member's target per proxy (by digest): `parts` moved toward use
/// and wants (see the module's rules). `members` are the live ones, by
/// digest; a member missing there uses and wants nothing.
pub fn targets(
    capacity: u32,
    parts: &Parts,
    proxies: &BTreeMap<ObjectKey, u64>,
    members: &HashMap<u64, Use>,
) -> Parts {
    let mut targets = parts.clone();
    if capacity == 0 {
        return targets;
    }
    let none = Use::default();
    let use_of = |m: &u64| members.get(m).unwrap_or(&none);
    let mut digests: Vec<u64> = parts.keys().copied().collect();
    digests.sort_unstable();
    let mut order: Vec<(&ObjectKey, u64)> = proxies.iter().map(|(k, d)| (k, *d)).collect();
    order.sort_by_key(|(key, digest)| (*digest, (*key).clone()));
    let get = |t: &Parts, m: u64, key: &ObjectKey| t.get(&m).and_then(|p| p.get(key)).copied().unwrap_or(0);

    // Use keeps its slots.
    for (key, _) in &order {
        for m in &digests {
            let used = use_of(m).of(key);
            if used > get(&targets, *m, key) {
                set(&mut targets, *m, key, used);
            }
        }
        let mut total: u32 = digests.iter().map(|m| get(&targets, *m, key)).sum();
        while total > capacity {
            let idle = digests
                .iter()
                .map(|m| (get(&targets, *m, key).saturating_sub(use_of(m).of(key)), *m))
                .filter(|(idle, _)| *idle > 0)
                .max();
            let Some((_, donor)) = idle else { break };
            let n = get(&targets, donor, key);
            set(&mut targets, donor, key, n - 1);
            total -= 1;
        }
    }

    // Idle slots go where they are wanted.
    let mut wants: BTreeMap<u64, u32> = digests
        .iter()
        .filter(|m| use_of(m).wanting > 0)
        .map(|m| (*m, use_of(m).wanting))
        .collect();
    let givers: Vec<u64> = digests
        .iter()
        .copied()
        .filter(|m| !wants.contains_key(m))
        .collect();
    if wants.is_empty() || givers.is_empty() {
        return targets;
    }
    loop {
        let mut lent = false;
        for (key, proxy) in &order {
            let mut takers: Vec<u64> = wants.iter().filter(|(_, n)| **n > 0).map(|(m, _)| *m).collect();
            if takers.is_empty() {
                return targets;
            }
            takers.sort_by_key(|m| std::cmp::Reverse((rendezvous::rank(*proxy, *m), *m)));
            for taker in takers {
                let idle = givers
                    .iter()
                    .map(|m| (get(&targets, *m, key).saturating_sub(use_of(m).of(key)), *m))
                    .filter(|(idle, _)| *idle > 0)
                    .max();
                let Some((_, giver)) = idle else { break };
                let (from, to) = (get(&targets, giver, key), get(&targets, taker, key));
                set(&mut targets, giver, key, from - 1);
                set(&mut targets, taker, key, to + 1);
                if let Some(n) = wants.get_mut(&taker) {
                    *n -= 1;
                }
                lent = true;
            }
        }
        if !lent {
            return targets;
        }
    }
}

fn set(targets: &mut Parts, member: u64, key: &ObjectKey, n: u32) {
    let part = targets.entry(member).or_default();
    if n == 0 {
        part.remove(key);
    } else {
        part.insert(key.clone(), n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::allocator::parts;

    fn proxy(i: usize) -> ObjectKey {
        ObjectKey::new("crawl", format!("p{i}"))
    }

    fn fleet(n: usize) -> BTreeMap<ObjectKey, u64> {
        (0..n)
            .map(|i| (proxy(i), rendezvous::proxy_digest(&proxy(i))))
            .collect()
    }

    fn sum_of(t: &Parts, m: u64) -> u32 {
        t.get(&m).map_or(0, |p| p.values().sum())
    }

    fn of(t: &Parts, m: u64, key: &ObjectKey) -> u32 {
        t.get(&m).and_then(|p| p.get(key)).copied().unwrap_or(0)
    }

    /// Each row: capacity, proxies, the members' leases in use (on every
    /// proxy) and wants; then each member's total target, and whether
    /// every proxy stays within its capacity.
    #[test]
    fn slots_follow_use_and_wants() {
        struct Row {
            what: &'static str,
            capacity: u32,
            proxies: usize,
            /// (leases in use on each proxy, wanting) per member.
            members: [(u32, u32); 2],
            totals: [u32; 2],
        }
        let rows = [
            Row {
                what: "nobody uses or wants: the even parts",
                capacity: 2,
                proxies: 3,
                members: [(0, 0), (0, 0)],
                totals: [3, 3],
            },
            Row {
                what: "one wants: the other's idle slots are lent, up to the want",
                capacity: 2,
                proxies: 3,
                members: [(0, 2), (0, 0)],
                totals: [5, 1],
            },
            Row {
                what: "a want larger than the idle slots takes them all",
                capacity: 2,
                proxies: 3,
                members: [(0, 100), (0, 0)],
                totals: [6, 0],
            },
            Row {
                what: "the giver's leases in use are never lent",
                capacity: 2,
                proxies: 3,
                members: [(0, 100), (1, 0)],
                totals: [3, 3],
            },
            Row {
                what: "both want: the even parts hold",
                capacity: 2,
                proxies: 3,
                members: [(0, 5), (0, 5)],
                totals: [3, 3],
            },
            Row {
                what: "use beyond the part keeps its slots, taken from the idle",
                capacity: 2,
                proxies: 3,
                members: [(2, 0), (0, 0)],
                totals: [6, 0],
            },
            Row {
                what: "capacity 1: each proxy's one slot to the member that wants it",
                capacity: 1,
                proxies: 4,
                members: [(0, 4), (0, 0)],
                totals: [4, 0],
            },
        ];
        for row in rows {
            let proxies = fleet(row.proxies);
            let digests = [11u64, 22];
            let parts = parts(row.capacity, &proxies, &digests);
            let in_use: Vec<BTreeMap<ObjectKey, u32>> = row
                .members
                .iter()
                .map(|(n, _)| {
                    proxies
                        .keys()
                        .map(|k| (k.clone(), *n))
                        .filter(|(_, n)| *n > 0)
                        .collect()
                })
                .collect();
            let members: HashMap<u64, Use> = digests
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    (
                        *d,
                        Use {
                            in_use: Some(&in_use[i]),
                            wanting: row.members[i].1,
                        },
                    )
                })
                .collect();
            let targets = targets(row.capacity, &parts, &proxies, &members);
            let totals = [sum_of(&targets, digests[0]), sum_of(&targets, digests[1])];
            assert_eq!(totals, row.totals, "{}", row.what);
            for key in proxies.keys() {
                let total: u32 = digests.iter().map(|d| of(&targets, *d, key)).sum();
                assert!(total <= row.capacity, "{}: {key} over capacity", row.what);
                for (i, d) in digests.iter().enumerate() {
                    assert!(
                        of(&targets, *d, key) >= row.members[i].0.min(row.capacity),
                        "{}: member {i} keeps what it uses",
                        row.what
                    );
                }
            }
        }
    }

    #[test]
    fn a_want_spreads_over_the_proxies() {
        let proxies = fleet(4);
        let digests = [11u64, 22];
        let parts = parts(2, &proxies, &digests);
        let empty = BTreeMap::new();
        let members: HashMap<u64, Use> = [
            (
                11,
                Use {
                    in_use: Some(&empty),
                    wanting: 4,
                },
            ),
            (22, Use::default()),
        ]
        .into_iter()
        .collect();
        let targets = targets(2, &parts, &proxies, &members);
        for key in proxies.keys() {
            assert_eq!(
                of(&targets, 11, key),
                2,
                "one more of {key}: spread, not piled on one"
            );
            assert_eq!(of(&targets, 22, key), 0);
        }
    }

    #[test]
    fn unlimited_capacity_lends_nothing() {
        let proxies = fleet(2);
        let parts = parts(0, &proxies, &[1, 2]);
        let members: HashMap<u64, Use> = [(
            1,
            Use {
                in_use: None,
                wanting: 9,
            },
        )]
        .into_iter()
        .collect();
        assert_eq!(targets(0, &parts, &proxies, &members), parts);
    }
}
