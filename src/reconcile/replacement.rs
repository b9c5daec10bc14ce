//! The replacement backoff: an instance that stops (or vanishes) is
//! replaced — cattle, not pets — but one that keeps stopping is replaced
//! with growing delays, like a crash loop. Without it a proxy whose
//! instances die at start would create and delete VMs as fast as the
//! provider allows (image copies, API quota, money).

use std::time::Duration;

use jiff::Timestamp;

/// How quickly lost instances are replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplacementBackoff {
    /// Delay before the second replacement in a row; doubled for each after it.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// An instance up this long resets the count: its loss is a new story.
    pub stable_after: Duration,
}

impl Default for ReplacementBackoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            stable_after: Duration::from_secs(600),
        }
    }
}

impl ReplacementBackoff {
    /// The wait before creating the `count`-th replacement in a row: none
    /// for the first, then `base`, doubling up to `max`.
    pub fn delay(&self, count: u32) -> Duration {
        match count {
            0 | 1 => Duration::ZERO,
            n => {
                let factor = 1u32.checked_shl(n - 2).unwrap_or(u32::MAX);
                self.base.saturating_mul(factor).min(self.max)
            }
        }
    }

    /// Whether an instance up since `since` has stayed up long enough to
    /// forget the losses before it.
    pub fn is_stable(&self, since: Timestamp, now: Timestamp) -> bool {
        now.duration_since(since).as_secs_f64() >= self.stable_after.as_secs_f64()
    }
}

/// The kind of loss, a bounded metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The provider reports the instance stopped, crashed or exited.
    Stopped,
    /// The recorded instance no longer exists.
    Vanished,
}

impl Loss {
    pub fn as_str(self) -> &'static str {
        match self {
            Loss::Stopped => "stopped",
            Loss::Vanished => "vanished",
        }
    }

    /// The Event reason.
    pub fn event_reason(self) -> &'static str {
        match self {
            Loss::Stopped => "InstanceStopped",
            Loss::Vanished => "InstanceVanished",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_replacement_is_immediate_then_delays_double_to_the_cap() {
        let b = ReplacementBackoff::default();
        let secs: Vec<u64> = (1..=9).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, [0, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.delay(u32::MAX), b.max, "no overflow however long the loop");
        assert_eq!(b.delay(0), Duration::ZERO);
    }

    #[test]
    fn stability_is_measured_from_when_the_instance_came_up() {
        let b = ReplacementBackoff::default();
        let up = Timestamp::from_second(1_000_000).unwrap();
        assert!(!b.is_stable(up, up + Duration::from_secs(599)));
        assert!(b.is_stable(up, up + Duration::from_secs(600)));
        assert!(
            !b.is_stable(up, up - Duration::from_secs(5)),
            "clock skew is not stability"
        );
    }
}
