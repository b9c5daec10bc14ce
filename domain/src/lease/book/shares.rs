//! The book in share mode: each proxy leased only up to the slots the
//! leader granted this replica ([`Slots`]); what it holds, reported back as
//! [`Claim`]s.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::{LeaseBook, ProxyId, serves, serving_slots_of};
use crate::lease::allocator::Allotted;
use crate::lease::shares::{Claim, Slots};
use crate::resource::ObjectKey;

impl LeaseBook {
    /// Whether the book serves from granted shares rather than from every
    /// proxy's whole capacity.
    pub fn in_share_mode(&self) -> bool {
        self.shares.is_some()
    }

    /// Share mode on (every proxy starts with no slots: known, listed,
    /// ranked and rested, but never leased until granted some) or off
    /// (every proxy's whole capacity, as a book that is the only one).
    /// Leases held are kept either way.
    pub fn set_share_mode(&mut self, on: bool, now: Instant) {
        if on == self.in_share_mode() {
            return;
        }
        self.shares = on.then(HashMap::new);
        let ids: Vec<ProxyId> = self.proxies.keys().copied().collect();
        for id in ids {
            let slots = if on { Slots::Granted(0) } else { Slots::Whole };
            self.apply_slots(id, slots, now);
        }
    }

    /// `key` may carry `slots` of this book's leases from now on (a proxy
    /// not known yet gets them when it shows up). Lowering below the leases
    /// held keeps them running but grants none on it until they end.
    /// Granting puts the book in share mode.
    pub fn set_slots(&mut self, key: &ObjectKey, slots: u32, now: Instant) {
        self.set_share_mode(true, now);
        if let Some(shares) = self.shares.as_mut() {
            if slots == 0 {
                shares.remove(key);
            } else {
                shares.insert(key.clone(), slots);
            }
        }
        if let Some(id) = self.ids.get(key).copied() {
            self.apply_slots(id, Slots::Granted(slots), now);
        }
    }

    /// The whole allocation at once: every proxy not named has no slots.
    /// Puts the book in share mode.
    pub fn set_all_slots(&mut self, slots: &BTreeMap<ObjectKey, u32>, now: Instant) {
        self.set_share_mode(true, now);
        self.shares = Some(
            slots
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| (k.clone(), *n))
                .collect(),
        );
        let ids: Vec<(ProxyId, Slots)> = self
            .proxies
            .iter()
            .map(|(id, e)| (*id, self.slots_for(&e.availability.key)))
            .collect();
        for (id, slots) in ids {
            self.apply_slots(id, slots, now);
        }
    }

    /// Applies the leader's allocation: slots per proxy, or unlimited (the
    /// whole capacity, unlimited then).
    pub fn apply_allotted(&mut self, allotted: &Allotted, now: Instant) {
        match allotted {
            Allotted::Slots(slots) => self.set_all_slots(slots, now),
            Allotted::Unlimited => self.set_share_mode(false, now),
        }
    }

    /// The slots this book may use on `key`.
    pub fn slots_of(&self, key: &ObjectKey) -> Slots {
        self.slots_for(key)
    }

    /// What this book holds per proxy, for the leader: every proxy it has
    /// slots on or leases on, by key. Without share mode, a proxy's slots
    /// are the whole capacity (0: unlimited).
    pub fn claims(&self) -> Vec<Claim> {
        let mut claims: Vec<Claim> = self
            .proxies
            .values()
            .filter_map(|e| {
                let slots = match e.slots {
                    Slots::Whole => self.settings.capacity,
                    Slots::Granted(n) => n,
                };
                (slots > 0 || e.active > 0).then(|| Claim {
                    key: e.availability.key.clone(),
                    slots,
                    in_use: e.active,
                })
            })
            .collect();
        // Slots granted on proxies this book does not know yet count too.
        if let Some(shares) = &self.shares {
            claims.extend(
                shares
                    .iter()
                    .filter(|(key, _)| !self.ids.contains_key(*key))
                    .map(|(key, n)| Claim {
                        key: key.clone(),
                        slots: *n,
                        in_use: 0,
                    }),
            );
        }
        claims.sort();
        claims
    }

    /// The slots `key` has in this book's mode.
    pub(super) fn slots_for(&self, key: &ObjectKey) -> Slots {
        match &self.shares {
            None => Slots::Whole,
            Some(shares) => Slots::Granted(shares.get(key).copied().unwrap_or(0)),
        }
    }

    /// Sets a known proxy's slots, keeping the fleet's count and the index right.
    fn apply_slots(&mut self, id: ProxyId, slots: Slots, now: Instant) {
        let capacity = self.settings.capacity;
        let placeholder = self.placeholders.contains(&id);
        let Some(entry) = self.proxies.get_mut(&id) else {
            return;
        };
        if entry.slots == slots {
            return;
        }
        if !placeholder && serves(&entry.availability) {
            self.serving_slots = (self.serving_slots + serving_slots_of(slots, capacity))
                .saturating_sub(serving_slots_of(entry.slots, capacity));
        }
        entry.slots = slots;
        self.reindex(id, now);
    }
}
