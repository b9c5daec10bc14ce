//! The time, as the domain is given it. Nothing in the domain reads a
//! clock: the running system reads both clocks at its edge and passes the
//! reading in, so every decision is a function of its inputs and tests set
//! the time they need.

use std::time::Instant;

use jiff::Timestamp;

/// One reading of the two clocks.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Wall-clock time: written into statuses and records, compared with
    /// times other processes wrote.
    pub wall: Timestamp,
    /// Monotonic time: measures waits kept in memory (a delete in flight,
    /// a held first status, a lease's expiry).
    pub mono: Instant,
}

#[cfg(test)]
impl Now {
    /// The clocks as they read now, for tests that need only some time.
    pub(crate) fn read() -> Now {
        Now {
            wall: Timestamp::now(),
            mono: Instant::now(),
        }
    }
}
