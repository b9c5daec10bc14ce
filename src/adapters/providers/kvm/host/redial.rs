//! How long a KVM host's link waits before it dials again: at once after
//! the first loss, then doubling up to half a minute while dials keep
//! failing ([`ladders::KVM_REDIAL`]) — and from the start again once a link
//! has stayed up for [`HEALTHY_AFTER`], so a host that drops once a day is
//! not redialed as slowly as one that never comes up.

use std::time::{Duration, Instant};

use crate::domain::backoff::{Attempts, ladders};

/// A link up this long counts as healthy: the next loss redials at once.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// The longest wait between dials.
pub const MAX_WAIT: Duration = ladders::KVM_REDIAL.cap;

#[derive(Clone, Debug, Default)]
pub struct Redial {
    /// Losses since the link was last healthy.
    losses: Attempts,
    /// When the current link came up.
    up_since: Option<Instant>,
}

impl Redial {
    /// The link is up.
    pub fn connected(&mut self, now: Instant) {
        self.up_since = Some(now);
    }

    /// The link is lost (or a dial failed): how long to wait before the next dial.
    pub fn lost(&mut self, now: Instant) -> Duration {
        if self
            .up_since
            .take()
            .is_some_and(|since| now.duration_since(since) >= HEALTHY_AFTER)
        {
            self.losses.reset();
        }
        self.losses.next_step(&ladders::KVM_REDIAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_while_dials_fail_and_reset_after_a_healthy_link() {
        let t0 = Instant::now();
        let mut redial = Redial::default();
        let waits: Vec<u64> = (0..8).map(|_| redial.lost(t0).as_secs()).collect();
        assert_eq!(waits, [0, 1, 2, 4, 8, 16, 30, 30]);

        // Up briefly, lost again: still backing off.
        redial.connected(t0);
        assert_eq!(redial.lost(t0 + Duration::from_secs(5)), MAX_WAIT);

        // Up for a healthy while: the next loss redials at once.
        redial.connected(t0);
        assert_eq!(redial.lost(t0 + HEALTHY_AFTER), Duration::ZERO);
        assert_eq!(redial.lost(t0 + HEALTHY_AFTER), Duration::from_secs(1));
    }
}
