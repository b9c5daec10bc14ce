//! The system's clocks, read at the edge for the domain, which is handed
//! the time ([`Now`]) rather than reading it.

use std::time::Instant;

use crate::domain::now::Now;

/// Reads the wall clock and the monotonic clock.
pub fn now() -> Now {
    Now {
        wall: jiff::Timestamp::now(),
        mono: Instant::now(),
    }
}
