//! What the leader sends its members, as a numbered log: each answer to a
//! member carries the items after the last one the member says it applied,
//! so an answer lost on the way is sent again, and a member too far behind
//! (or new) is told to start over from a full state. Bounded: the oldest
//! items go first, and whoever still needed them starts over.

use std::collections::VecDeque;

/// A bounded, numbered log. Numbers start at 1; 0 means "nothing applied".
#[derive(Clone, Debug)]
pub struct Feed<T> {
    /// The number of `items[0]`.
    first: u64,
    items: VecDeque<T>,
    capacity: usize,
}

/// What a member that applied up to `seen` is to get.
#[derive(Debug, PartialEq, Eq)]
pub enum Since<'a, T> {
    /// The items after `seen`, the last of which is numbered `to`.
    Items { items: Vec<&'a T>, to: u64 },
    /// `seen` is gone from the log (or from another log): start over from
    /// the full state, which is current up to `to`.
    Reset { to: u64 },
}

impl<T> Feed<T> {
    pub fn new(capacity: usize) -> Self {
        Self {
            first: 1,
            items: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Appends `item`; returns its number.
    pub fn push(&mut self, item: T) -> u64 {
        if self.items.len() == self.capacity {
            self.items.pop_front();
            self.first += 1;
        }
        self.items.push_back(item);
        self.last()
    }

    /// The number of the newest item (0 when none was ever pushed).
    pub fn last(&self) -> u64 {
        self.first + self.items.len() as u64 - 1
    }

    /// Whether a member that applied up to `seen` has anything to get.
    pub fn has_news(&self, seen: u64) -> bool {
        seen != self.last()
    }

    /// What a member that applied up to `seen` is to get. A `seen` ahead
    /// of the log comes from another leader's log: start over.
    pub fn since(&self, seen: u64) -> Since<'_, T> {
        let to = self.last();
        if seen > to || seen + 1 < self.first {
            return Since::Reset { to };
        }
        let skip = (seen + 1 - self.first) as usize;
        Since::Items {
            items: self.items.iter().skip(skip).collect(),
            to,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The items and the last number, or the number to start over from.
    type Got = Result<(Vec<u32>, u64), u64>;

    fn items(since: Since<'_, u32>) -> Got {
        match since {
            Since::Items { items, to } => Ok((items.into_iter().copied().collect(), to)),
            Since::Reset { to } => Err(to),
        }
    }

    #[test]
    fn a_member_gets_what_it_has_not_applied_or_starts_over() {
        let mut feed = Feed::new(3);
        assert_eq!(items(feed.since(0)), Ok((vec![], 0)), "empty and new");
        assert!(!feed.has_news(0));
        for v in [10, 11] {
            feed.push(v);
        }
        // Row: seen → what it gets.
        let rows: [(u64, Got); 4] = [
            (0, Ok((vec![10, 11], 2))),
            (1, Ok((vec![11], 2))),
            (2, Ok((vec![], 2))),
            (7, Err(2)), // from another leader's log
        ];
        for (seen, want) in rows {
            assert_eq!(items(feed.since(seen)), want, "seen {seen}");
        }
        // Past capacity the oldest go, and who needed them starts over.
        for v in [12, 13] {
            feed.push(v);
        }
        assert_eq!(feed.last(), 4);
        assert_eq!(items(feed.since(0)), Err(4));
        assert_eq!(items(feed.since(1)), Ok((vec![11, 12, 13], 4)));
        assert_eq!(items(feed.since(3)), Ok((vec![13], 4)));
        assert!(feed.has_news(3) && !feed.has_news(4));
    }
}
