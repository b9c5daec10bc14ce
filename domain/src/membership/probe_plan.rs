//! Which member probes which proxy, as the leader keeps it: the proxies
//! watched (with what their probes need, `T`), the live members, and the
//! orders that move a proxy from one member to another when either
//! changes. Pure: the leader's probe router applies the orders.

use std::collections::BTreeMap;

use crate::resource::ObjectKey;

use super::{MemberTag, probe_assignee};

/// An order for one member's prober.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOrder<T> {
    /// Start probing `key` (or update what is probed).
    Watch {
        member: MemberTag,
        key: ObjectKey,
        target: T,
    },
    /// Stop probing `key`.
    Unwatch { member: MemberTag, key: ObjectKey },
}

/// The leader's probe assignment.
#[derive(Clone, Debug)]
pub struct ProbePlan<T> {
    live: Vec<MemberTag>,
    watched: BTreeMap<ObjectKey, (T, Option<MemberTag>)>,
}

impl<T> Default for ProbePlan<T> {
    fn default() -> Self {
        Self {
            live: Vec::new(),
            watched: BTreeMap::new(),
        }
    }
}

impl<T: Clone> ProbePlan<T> {
    /// A proxy to probe, or what its probes need has changed: it goes to
    /// (or stays with) its assignee.
    pub fn watch(&mut self, key: ObjectKey, target: T) -> Vec<ProbeOrder<T>> {
        let assignee = probe_assignee(&key, &self.live).cloned();
        let before = self
            .watched
            .insert(key.clone(), (target.clone(), assignee.clone()))
            .and_then(|(_, member)| member);
        let mut orders = Vec::new();
        if let Some(member) = before.filter(|m| Some(m) != assignee.as_ref()) {
            orders.push(ProbeOrder::Unwatch {
                member,
                key: key.clone(),
            });
        }
        if let Some(member) = assignee {
            orders.push(ProbeOrder::Watch { member, key, target });
        }
        orders
    }

    /// A proxy no longer probed.
    pub fn unwatch(&mut self, key: &ObjectKey) -> Vec<ProbeOrder<T>> {
        match self.watched.remove(key) {
            Some((_, Some(member))) => vec![ProbeOrder::Unwatch {
                member,
                key: key.clone(),
            }],
            _ => Vec::new(),
        }
    }

    /// The live members changed: only the proxies whose assignee changed
    /// move, each stopped on its old member before it starts on its new
    /// one. A member that died gets no orders (nothing reaches it).
    pub fn set_members(&mut self, live: Vec<MemberTag>) -> Vec<ProbeOrder<T>> {
        let mut live = live;
        live.sort();
        live.dedup();
        self.live = live;
        let mut stops = Vec::new();
        let mut starts = Vec::new();
        for (key, (target, member)) in &mut self.watched {
            let assignee = probe_assignee(key, &self.live).cloned();
            if *member == assignee {
                continue;
            }
            if let Some(old) = member.take().filter(|m| self.live.contains(m)) {
                stops.push(ProbeOrder::Unwatch {
                    member: old,
                    key: key.clone(),
                });
            }
            if let Some(new) = &assignee {
                starts.push(ProbeOrder::Watch {
                    member: new.clone(),
                    key: key.clone(),
                    target: target.clone(),
                });
            }
            *member = assignee;
        }
        stops.extend(starts);
        stops
    }

    /// Every Watch a member must hold, for a member that starts over (a new
    /// incarnation, or a new leader's first answer).
    pub fn assignment_of(&self, member: &MemberTag) -> Vec<ProbeOrder<T>> {
        self.watched
            .iter()
            .filter(|(_, (_, m))| m.as_ref() == Some(member))
            .map(|(key, (target, _))| ProbeOrder::Watch {
                member: member.clone(),
                key: key.clone(),
                target: target.clone(),
            })
            .collect()
    }

    /// Proxies assigned to each live member.
    pub fn counts(&self) -> BTreeMap<MemberTag, usize> {
        let mut counts: BTreeMap<MemberTag, usize> = self.live.iter().map(|m| (m.clone(), 0)).collect();
        for (_, member) in self.watched.values() {
            if let Some(member) = member {
                *counts.entry(member.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// Every proxy watched, with what its probes need.
    pub fn watched(&self) -> impl Iterator<Item = (&ObjectKey, &T)> {
        self.watched.iter().map(|(key, (target, _))| (key, target))
    }

    /// The member probing `key`, if any.
    pub fn assignee(&self, key: &ObjectKey) -> Option<&MemberTag> {
        self.watched.get(key).and_then(|(_, m)| m.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(i: u8) -> MemberTag {
        MemberTag::of(&format!("operator-{i}"), &[i; 8])
    }

    fn key(i: usize) -> ObjectKey {
        ObjectKey::new("crawl", format!("p{i}"))
    }

    fn watches_of(orders: &[ProbeOrder<u32>]) -> usize {
        orders
            .iter()
            .filter(|o| matches!(o, ProbeOrder::Watch { .. }))
            .count()
    }

    /// Each row: a change and the orders it must produce.
    #[test]
    fn the_orders_each_change_produces() {
        let (a, b, c) = (tag(0), tag(1), tag(2));
        let mut plan = ProbePlan::default();
        // No member yet: nothing to order, but the proxies are kept.
        for i in 0..300 {
            assert!(plan.watch(key(i), 1).is_empty());
        }
        // The first members: every proxy gets exactly one Watch.
        let orders = plan.set_members(vec![a.clone(), b.clone()]);
        assert_eq!((orders.len(), watches_of(&orders)), (300, 300));
        // An updated target goes to the same member, without an Unwatch.
        let orders = plan.watch(key(7), 2);
        let owner = plan.assignee(&key(7)).cloned().unwrap();
        assert_eq!(
            orders,
            vec![ProbeOrder::Watch {
                member: owner,
                key: key(7),
                target: 2
            }]
        );
        // A join moves only what the newcomer ranks first for, each moved
        // proxy stopped on its old member before it starts on the new one.
        let before: BTreeMap<ObjectKey, MemberTag> = (0..300)
            .map(|i| (key(i), plan.assignee(&key(i)).cloned().unwrap()))
            .collect();
        let orders = plan.set_members(vec![c.clone(), a.clone(), b.clone()]);
        let moved = watches_of(&orders);
        assert!(
            (60..=140).contains(&moved),
            "{moved} of 300 moved to the third member"
        );
        assert_eq!(orders.len(), 2 * moved, "an Unwatch for each Watch");
        let first_watch = orders
            .iter()
            .position(|o| matches!(o, ProbeOrder::Watch { .. }))
            .unwrap();
        assert!(
            orders[first_watch..]
                .iter()
                .all(|o| matches!(o, ProbeOrder::Watch { member, .. } if *member == c)),
            "stops first, then starts, all on the newcomer"
        );
        for (k, was) in &before {
            let now = plan.assignee(k).unwrap();
            assert!(now == was || *now == c, "{k} moved between the old members");
        }
        // A death: its proxies start elsewhere, and the dead member gets no
        // Unwatch (nothing reaches it).
        let orders = plan.set_members(vec![a.clone(), c.clone()]);
        assert!(
            orders
                .iter()
                .all(|o| matches!(o, ProbeOrder::Watch { member, .. } if *member != b))
        );
        assert_eq!(plan.counts().values().sum::<usize>(), 300);
        assert!(!plan.counts().contains_key(&b));
        // An unwatch stops the proxy on its member; twice is nothing.
        let owner = plan.assignee(&key(3)).cloned().unwrap();
        assert_eq!(
            plan.unwatch(&key(3)),
            vec![ProbeOrder::Unwatch {
                member: owner,
                key: key(3)
            }]
        );
        assert!(plan.unwatch(&key(3)).is_empty());
        // Every member gone: proxies wait unassigned, and return with one.
        assert!(plan.set_members(vec![]).is_empty());
        assert_eq!(plan.assignee(&key(1)), None);
        assert_eq!(watches_of(&plan.set_members(vec![b.clone()])), 299);
        assert_eq!(plan.assignment_of(&b).len(), 299);
        assert!(plan.assignment_of(&a).is_empty());
    }
}
