//! The fleet as the leader passes it on: every proxy's availability and
//! probe target, and the rests, blocks and error tallies the members
//! learnt. Members' changes merge with set semantics (the later rest end,
//! the union of blocked targets, the larger error count), so a change
//! merged twice, or late, or from two members at once, changes nothing
//! more; only a change that changes something is passed on. Pure: the
//! leader's desk holds one.

use std::collections::{BTreeMap, BTreeSet};

use super::wire::{AvailabilityBody, FleetItem, ProbeWatch};

/// Blocked targets kept per proxy (as the lease book keeps them).
const MAX_BLOCKED: usize = 1024;

#[derive(Clone, Debug, Default)]
pub struct FleetState {
    available: BTreeMap<String, AvailabilityBody>,
    probes: BTreeMap<String, ProbeWatch>,
    target_rests: BTreeMap<(String, String), i64>,
    proxy_rests: BTreeMap<String, i64>,
    blocked: BTreeMap<String, BTreeSet<u64>>,
    errors: BTreeMap<String, u32>,
}

impl FleetState {
    /// Merges `item`; returns what to pass on (the item, or nothing when it
    /// changed nothing). A rest already over at `now_ms` changes nothing.
    pub fn merge(&mut self, item: FleetItem, now_ms: i64) -> Option<FleetItem> {
        let changed = match &item {
            FleetItem::TargetRest {
                proxy,
                target,
                until_ms,
            } => {
                *until_ms > now_ms
                    && raise(
                        self.target_rests
                            .entry((proxy.clone(), target.clone()))
                            .or_default(),
                        *until_ms,
                    )
            }
            FleetItem::ProxyRest { proxy, until_ms } => {
                *until_ms > now_ms && raise(self.proxy_rests.entry(proxy.clone()).or_default(), *until_ms)
            }
            FleetItem::Blocked { proxy, target_digest } => {
                let blocked = self.blocked.entry(proxy.clone()).or_default();
                blocked.len() < MAX_BLOCKED && blocked.insert(*target_digest)
            }
            FleetItem::Errors { proxy, count } => {
                raise(self.errors.entry(proxy.clone()).or_default(), *count)
            }
            FleetItem::Tally {
                proxy,
                blocked_targets,
                errors,
            } => {
                let blocked = self.blocked.entry(proxy.clone()).or_default();
                let mut changed = false;
                for target in blocked_targets {
                    changed |= blocked.len() < MAX_BLOCKED && blocked.insert(*target);
                }
                changed | raise(self.errors.entry(proxy.clone()).or_default(), *errors)
            }
            FleetItem::Available(body) => replace(&mut self.available, &body.proxy, body),
            FleetItem::Removed { proxy } => self.remove(proxy),
            FleetItem::Probe(watch) => replace(&mut self.probes, &watch.proxy, watch),
            FleetItem::ProbeStopped { proxy } => self.probes.remove(proxy).is_some(),
        };
        changed.then_some(item)
    }

    /// Forgets everything about `proxy`; whether anything was known.
    fn remove(&mut self, proxy: &str) -> bool {
        let mut known = self.available.remove(proxy).is_some();
        known |= self.probes.remove(proxy).is_some();
        known |= self.proxy_rests.remove(proxy).is_some();
        known |= self.blocked.remove(proxy).is_some();
        known |= self.errors.remove(proxy).is_some();
        let before = self.target_rests.len();
        self.target_rests.retain(|(p, _), _| p != proxy);
        known | (self.target_rests.len() != before)
    }

    /// Drops rests over at `now_ms` (a member that starts over needs no
    /// rest that has ended).
    pub fn prune(&mut self, now_ms: i64) {
        self.target_rests.retain(|_, until| *until > now_ms);
        self.proxy_rests.retain(|_, until| *until > now_ms);
    }

    /// The whole state as items, for a member that starts over.
    pub fn items(&self) -> Vec<FleetItem> {
        let mut items: Vec<FleetItem> = self
            .available
            .values()
            .map(|a| FleetItem::Available(Box::new(a.clone())))
            .collect();
        items.extend(
            self.probes
                .values()
                .map(|p| FleetItem::Probe(Box::new(p.clone()))),
        );
        items.extend(
            self.target_rests
                .iter()
                .map(|((proxy, target), until)| FleetItem::TargetRest {
                    proxy: proxy.clone(),
                    target: target.clone(),
                    until_ms: *until,
                }),
        );
        items.extend(
            self.proxy_rests
                .iter()
                .map(|(proxy, until)| FleetItem::ProxyRest {
                    proxy: proxy.clone(),
                    until_ms: *until,
                }),
        );
        let tallied: BTreeSet<&String> = self.blocked.keys().chain(self.errors.keys()).collect();
        items.extend(tallied.into_iter().map(|proxy| {
            FleetItem::Tally {
                proxy: proxy.clone(),
                blocked_targets: self
                    .blocked
                    .get(proxy)
                    .map(|b| b.iter().copied().collect())
                    .unwrap_or_default(),
                errors: self.errors.get(proxy).copied().unwrap_or(0),
            }
        }));
        items
    }

    /// The proxies that may be leased now: ready and not retiring.
    pub fn leasable(&self) -> impl Iterator<Item = &str> {
        self.available
            .values()
            .filter(|a| a.ready && !a.retiring)
            .map(|a| a.proxy.as_str())
    }

    /// Every proxy known (available or probed).
    pub fn proxies(&self) -> BTreeSet<&str> {
        self.available
            .keys()
            .chain(self.probes.keys())
            .map(String::as_str)
            .collect()
    }
}

/// Sets `map[key]` to `value`; whether that changed it.
fn replace<T: PartialEq + Clone>(map: &mut BTreeMap<String, T>, key: &str, value: &T) -> bool {
    if map.get(key) == Some(value) {
        return false;
    }
    map.insert(key.to_owned(), value.clone());
    true
}

/// Raises `value` to `to`; whether it rose.
fn raise<T: PartialOrd + Copy>(value: &mut T, to: T) -> bool {
    let rose = to > *value;
    if rose {
        *value = to;
    }
    rose
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_900_000_000_000;

    fn available(proxy: &str, ready: bool) -> FleetItem {
        FleetItem::Available(Box::new(AvailabilityBody {
            proxy: proxy.into(),
            ready,
            phase: "Ready".into(),
            ..AvailabilityBody::default()
        }))
    }

    fn target_rest(until_ms: i64) -> FleetItem {
        FleetItem::TargetRest {
            proxy: "crawl/p1".into(),
            target: "example.com".into(),
            until_ms,
        }
    }

    /// Each row: the state's history, an item, and whether it is passed on.
    #[test]
    fn what_a_merge_passes_on() {
        let blocked = |digest| FleetItem::Blocked {
            proxy: "crawl/p1".into(),
            target_digest: digest,
        };
        let errors = |count| FleetItem::Errors {
            proxy: "crawl/p1".into(),
            count,
        };
        let rows: Vec<(&str, Vec<FleetItem>, FleetItem, bool)> = vec![
            ("a first rest", vec![], target_rest(NOW + 10_000), true),
            (
                "a later end",
                vec![target_rest(NOW + 10_000)],
                target_rest(NOW + 20_000),
                true,
            ),
            (
                "an earlier end",
                vec![target_rest(NOW + 20_000)],
                target_rest(NOW + 10_000),
                false,
            ),
            (
                "the same end twice",
                vec![target_rest(NOW + 10_000)],
                target_rest(NOW + 10_000),
                false,
            ),
            ("a rest already over", vec![], target_rest(NOW - 1), false),
            ("a new blocked target", vec![blocked(1)], blocked(2), true),
            ("a blocked target known", vec![blocked(1)], blocked(1), false),
            ("more errors", vec![errors(2)], errors(3), true),
            (
                "fewer errors (another member's count)",
                vec![errors(3)],
                errors(2),
                false,
            ),
            (
                "a tally adding nothing",
                vec![blocked(1), errors(3)],
                FleetItem::Tally {
                    proxy: "crawl/p1".into(),
                    blocked_targets: vec![1],
                    errors: 2,
                },
                false,
            ),
            (
                "a tally adding a target",
                vec![blocked(1), errors(3)],
                FleetItem::Tally {
                    proxy: "crawl/p1".into(),
                    blocked_targets: vec![1, 5],
                    errors: 2,
                },
                true,
            ),
            ("a new proxy", vec![], available("crawl/p1", true), true),
            (
                "the same availability",
                vec![available("crawl/p1", true)],
                available("crawl/p1", true),
                false,
            ),
            (
                "a changed availability",
                vec![available("crawl/p1", true)],
                available("crawl/p1", false),
                true,
            ),
            (
                "a removal of a known proxy",
                vec![target_rest(NOW + 10_000)],
                FleetItem::Removed {
                    proxy: "crawl/p1".into(),
                },
                true,
            ),
            (
                "a removal of an unknown proxy",
                vec![],
                FleetItem::Removed {
                    proxy: "crawl/p1".into(),
                },
                false,
            ),
        ];
        for (name, history, item, passed_on) in rows {
            let mut state = FleetState::default();
            for h in history {
                state.merge(h, NOW);
            }
            assert_eq!(state.merge(item.clone(), NOW).is_some(), passed_on, "{name}");
        }
    }

    #[test]
    fn a_member_that_starts_over_gets_the_whole_state_without_ended_rests() {
        let mut state = FleetState::default();
        for item in [
            available("crawl/p1", true),
            available("crawl/p2", false),
            target_rest(NOW + 10_000),
            FleetItem::ProxyRest {
                proxy: "crawl/p2".into(),
                until_ms: NOW + 5_000,
            },
            FleetItem::Blocked {
                proxy: "crawl/p1".into(),
                target_digest: 7,
            },
        ] {
            state.merge(item, NOW);
        }
        assert_eq!(state.leasable().collect::<Vec<_>>(), ["crawl/p1"]);
        let mut replayed = FleetState::default();
        for item in state.items() {
            assert!(
                replayed.merge(item, NOW).is_some(),
                "every item of a full state says something"
            );
        }
        assert_eq!(replayed.items(), state.items());
        state.prune(NOW + 6_000);
        assert_eq!(
            state.items().len(),
            4,
            "the proxy rest ended; the target rest did not"
        );
        state.merge(
            FleetItem::Removed {
                proxy: "crawl/p1".into(),
            },
            NOW,
        );
        assert_eq!(state.proxies().into_iter().collect::<Vec<_>>(), ["crawl/p2"]);
    }
}
