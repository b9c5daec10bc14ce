//! The bytes of unfinished request heads a listener holds for connections
//! that have not authenticated: each may hold a small allowance of its own
//! ([`UnauthenticatedLimits::free_head`]); beyond it, it draws from one
//! budget all of the listener's connections share, and gives back when its
//! head completes or the connection ends. A connection that finds the
//! budget spent is answered `431` and closed, so a flood of slow, large
//! heads holds at most the budget plus the allowance per connection.
//!
//! [`UnauthenticatedLimits::free_head`]: crate::domain::config::UnauthenticatedLimits::free_head

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A head grows by this much at a time beyond its free allowance.
pub const DRAW_STEP: usize = 4 * 1024;

/// The shared budget of one listener.
#[derive(Debug)]
pub struct HeadBudget {
    left: AtomicUsize,
}

impl HeadBudget {
    pub fn new(bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            left: AtomicUsize::new(bytes),
        })
    }

    /// Takes `bytes` if that many are left.
    pub fn try_take(&self, bytes: usize) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(bytes)
            })
            .is_ok()
    }

    pub fn give_back(&self, bytes: usize) {
        self.left.fetch_add(bytes, Ordering::AcqRel);
    }

    pub fn left(&self) -> usize {
        self.left.load(Ordering::Acquire)
    }
}

/// What an unfinished head `held` bytes long may do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// Read up to this many more bytes.
    Room(usize),
    /// Draw this many bytes from the budget first.
    Draw(usize),
    /// The head is longer than any head followed: refuse it.
    TooLarge,
}

/// One connection's allowance for its unfinished head; what it drew is
/// given back when it is dropped.
#[derive(Debug)]
pub struct HeadAllowance {
    free: usize,
    drawn: usize,
    budget: Arc<HeadBudget>,
}

impl HeadAllowance {
    pub fn new(free: usize, budget: Arc<HeadBudget>) -> Self {
        Self {
            free,
            drawn: 0,
            budget,
        }
    }

    /// The bytes an unfinished head may hold now.
    pub fn allowed(&self) -> usize {
        self.free + self.drawn
    }

    /// What a head `held` bytes long may do when no head may be longer
    /// than `max_head` (pure: decides, takes nothing).
    pub fn next(&self, held: usize, max_head: usize) -> Growth {
        let allowed = self.allowed().min(max_head);
        if held < allowed {
            Growth::Room(allowed - held)
        } else if allowed >= max_head {
            Growth::TooLarge
        } else {
            Growth::Draw(DRAW_STEP.min(max_head - allowed))
        }
    }

    /// Draws `bytes` from the budget; false when it has not that many left.
    pub fn draw(&mut self, bytes: usize) -> bool {
        let taken = self.budget.try_take(bytes);
        if taken {
            self.drawn += bytes;
        }
        taken
    }

    /// The head completed (or was given up): what it drew goes back.
    pub fn settle(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.drawn));
    }
}

impl Drop for HeadAllowance {
    fn drop(&mut self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_reads_its_free_allowance_then_draws_in_steps_up_to_the_largest_head() {
        let budget = HeadBudget::new(10 * 1024);
        let mut allowance = HeadAllowance::new(4096, budget.clone());
        for (held, growth) in [
            (0, Growth::Room(4096)),
            (1000, Growth::Room(3096)),
            (4096, Growth::Draw(DRAW_STEP)),
        ] {
            assert_eq!(allowance.next(held, 64 * 1024), growth, "{held}");
        }
        assert!(allowance.draw(DRAW_STEP));
        assert_eq!(allowance.next(4096, 64 * 1024), Growth::Room(DRAW_STEP));
        assert_eq!(budget.left(), 10 * 1024 - DRAW_STEP);
        // Near the largest head, the last draw is only what is missing.
        assert_eq!(allowance.next(8192, 9000), Growth::Draw(808));
        assert_eq!(allowance.next(8192, 8192), Growth::TooLarge);
        assert_eq!(
            allowance.next(5000, 4096),
            Growth::TooLarge,
            "the free allowance over the largest head"
        );
    }

    #[test]
    fn the_budget_is_shared_and_given_back_when_a_head_settles_or_its_connection_ends() {
        let budget = HeadBudget::new(3 * DRAW_STEP);
        let mut first = HeadAllowance::new(4096, budget.clone());
        let mut second = HeadAllowance::new(4096, budget.clone());
        assert!(first.draw(DRAW_STEP) && first.draw(DRAW_STEP));
        assert!(second.draw(DRAW_STEP));
        assert!(!second.draw(DRAW_STEP), "spent");
        assert_eq!(second.allowed(), 4096 + DRAW_STEP, "a refused draw takes nothing");
        first.settle();
        assert_eq!((first.allowed(), budget.left()), (4096, 2 * DRAW_STEP));
        assert!(second.draw(DRAW_STEP));
        drop(second);
        assert_eq!(budget.left(), 3 * DRAW_STEP, "everything back");
    }
}
