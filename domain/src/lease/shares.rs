//! A book's share of each proxy's capacity. A replica that serves from a
//! share (every replica serves, the leader hands out capacity) may lease a
//! proxy only up to the slots the leader granted it; a book that is the
//! only one (standalone, or the leader-only path) has the whole capacity.

use crate::resource::ObjectKey;

/// How many leases a book may hold on one proxy at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Slots {
    /// The proxy's whole capacity ([`super::LeaseSettings::capacity`]).
    #[default]
    Whole,
    /// The slots the leader granted this book (never more than the capacity).
    Granted(u32),
}

impl Slots {
    /// The most leases the book may hold on a proxy of `capacity` (0:
    /// unlimited); `None`: unlimited. The leader's word wins: slots granted
    /// cap a book whose own capacity says unlimited too (a replica started
    /// with another `--max-leases-per-proxy` than the leader's); with
    /// capacity 0 the leader grants [`crate::lease::Allotted::Unlimited`],
    /// which the book takes as its whole capacity
    /// ([`crate::lease::LeaseBook::apply_allotted`]).
    pub fn cap(self, capacity: u32) -> Option<u32> {
        match (capacity, self) {
            (0, Slots::Whole) => None,
            (c, Slots::Whole) => Some(c),
            (0, Slots::Granted(n)) => Some(n),
            (c, Slots::Granted(n)) => Some(n.min(c)),
        }
    }

    /// Whether a proxy carrying `active` leases has room for one more.
    pub fn has_room(self, capacity: u32, active: u32) -> bool {
        self.cap(capacity).is_none_or(|cap| active < cap)
    }
}

/// What a book holds of one proxy, as a member reports it to the leader.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    pub key: ObjectKey,
    /// Slots granted to the book.
    pub slots: u32,
    /// Leases held on it now (more than `slots` after a share was lowered,
    /// until they end).
    pub in_use: u32,
}

impl Claim {
    /// What the leader counts against the proxy's capacity: a lowered
    /// share still counts the leases in use until they end.
    pub fn counted(&self) -> u32 {
        self.slots.max(self.in_use)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_caps_a_proxy_below_its_capacity_and_the_whole_of_zero_is_unlimited() {
        // (why, slots, capacity, cap)
        let rows = [
            ("whole: the capacity", Slots::Whole, 2, Some(2)),
            ("granted none", Slots::Granted(0), 2, Some(0)),
            ("granted one of two", Slots::Granted(1), 2, Some(1)),
            ("granted all", Slots::Granted(2), 2, Some(2)),
            (
                "granted more than the capacity: the capacity",
                Slots::Granted(5),
                2,
                Some(2),
            ),
            ("unlimited, whole", Slots::Whole, 0, None),
            (
                "unlimited here, granted some by the leader: the grant",
                Slots::Granted(3),
                0,
                Some(3),
            ),
        ];
        for (why, slots, capacity, cap) in rows {
            assert_eq!(slots.cap(capacity), cap, "{why}");
        }
        assert!(Slots::Granted(2).has_room(3, 1));
        assert!(!Slots::Granted(2).has_room(3, 2));
        assert!(!Slots::Granted(0).has_room(3, 0));
        assert!(Slots::Whole.has_room(0, 100));
    }

    #[test]
    fn a_claim_counts_the_larger_of_its_slots_and_its_leases_in_use() {
        let claim = |slots, in_use| Claim {
            key: ObjectKey::new("ns", "p"),
            slots,
            in_use,
        };
        assert_eq!(claim(2, 1).counted(), 2, "room not used still counts");
        assert_eq!(claim(1, 2).counted(), 2, "a lowered share counts leases in use");
        assert_eq!(claim(0, 0).counted(), 0);
    }
}
