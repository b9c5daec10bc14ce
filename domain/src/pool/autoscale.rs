//! Sizing a pool by lease demand, as pure functions: the size at which the
//! pool's lease capacity would be used at `targetUtilization`, grown at
//! once when acquires were denied, and shrunk only to the largest size
//! recommended over the last scale-down delay (as Kubernetes' horizontal
//! autoscaler stabilises scale-down), so a lull between crawls does not
//! tear down warm proxies.

use std::collections::VecDeque;
use std::time::Duration;

use jiff::Timestamp;

/// How long demand has to stay low before the pool shrinks, unless the
/// operator is told otherwise (`--pool-scale-down-delay`).
pub const SCALE_DOWN_DELAY: Duration = Duration::from_secs(120);

/// The autoscaler's bounds and aim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
    /// Percent of capacity in use aimed for, 1–100.
    pub target_utilization: u32,
}

/// The pool's demand since the last decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Active leases on the pool's members.
    pub leases: u32,
    /// Acquires for the pool refused because every Ready member was full.
    pub denied: u32,
    /// Leases one proxy may hold at once (`--max-leases-per-proxy`; 0: unlimited).
    pub per_proxy: u32,
}

/// The size demand asks for now, within the bounds.
pub fn recommended_replicas(bounds: Bounds, current: u32, demand: Demand) -> u32 {
    let target = u64::from(bounds.target_utilization.clamp(1, 100));
    let mut wanted = if demand.per_proxy == 0 {
        // Unlimited capacity: only denials say more is needed.
        current
    } else {
        // Leases over what the members carry at the target utilization.
        let leases = u64::from(demand.leases) * 100;
        u32::try_from(leases.div_ceil(u64::from(demand.per_proxy) * target)).unwrap_or(u32::MAX)
    };
    if demand.denied > 0 {
        // Demand went unmet: grow as if in use beyond the target.
        let beyond = u32::try_from((u64::from(current) * 100).div_ceil(target)).unwrap_or(u32::MAX);
        wanted = wanted.max(beyond).max(current.saturating_add(1));
    }
    wanted.clamp(bounds.min, bounds.max.max(bounds.min))
}

/// The recommendations of the last scale-down delay: the pool shrinks only
/// to the largest of them, and only once it has watched a whole delay
/// (after a start, it knows nothing of the demand before).
#[derive(Clone, Debug)]
pub struct ScaleDownWindow {
    delay: Duration,
    watching_since: Timestamp,
    recent: VecDeque<(Timestamp, u32)>,
}

impl ScaleDownWindow {
    pub fn new(delay: Duration, now: Timestamp) -> Self {
        Self {
            delay,
            watching_since: now,
            recent: VecDeque::new(),
        }
    }

    /// Records `recommended` at `now`; the size the pool may shrink to,
    /// or `None` while the window is not yet whole.
    pub fn record(&mut self, recommended: u32, now: Timestamp) -> Option<u32> {
        let within = |at: Timestamp| now.duration_since(at).unsigned_abs() < self.delay;
        while self.recent.front().is_some_and(|(at, _)| !within(*at)) {
            self.recent.pop_front();
        }
        // Only a new peak or a lower value after it matters: drop every
        // earlier value not above this one (the deque stays short).
        while self.recent.back().is_some_and(|(_, r)| *r <= recommended) {
            self.recent.pop_back();
        }
        self.recent.push_back((now, recommended));
        let whole = !within(self.watching_since);
        whole.then(|| self.recent.front().map_or(recommended, |(_, r)| *r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        min: 2,
        max: 10,
        target_utilization: 50,
    };

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn demand(leases: u32, denied: u32) -> Demand {
        Demand {
            leases,
            denied,
            per_proxy: 4,
        }
    }

    #[test]
    fn the_size_carries_the_leases_at_the_target_utilization() {
        // 4 per proxy at 50 %: 2 leases each.
        assert_eq!(recommended_replicas(BOUNDS, 2, demand(9, 0)), 5);
        assert_eq!(recommended_replicas(BOUNDS, 5, demand(10, 0)), 5);
        // One lease per proxy at 70 %: 7 leases want 10 members, not 7.
        let one = Demand {
            leases: 7,
            denied: 0,
            per_proxy: 1,
        };
        let seventy = Bounds {
            target_utilization: 70,
            max: 20,
            ..BOUNDS
        };
        assert_eq!(recommended_replicas(seventy, 7, one), 10);
    }

    #[test]
    fn bounds_hold() {
        assert_eq!(recommended_replicas(BOUNDS, 5, demand(0, 0)), 2);
        assert_eq!(recommended_replicas(BOUNDS, 5, demand(400, 0)), 10);
    }

    #[test]
    fn denials_grow_the_pool_even_when_leases_look_low() {
        // Leases ended meanwhile, but acquires were refused: at least one more.
        assert_eq!(recommended_replicas(BOUNDS, 4, demand(2, 3)), 8);
        let unlimited = Demand {
            leases: 50,
            denied: 1,
            per_proxy: 0,
        };
        assert_eq!(recommended_replicas(BOUNDS, 3, unlimited), 6);
        let quiet = Demand {
            denied: 0,
            ..unlimited
        };
        assert_eq!(recommended_replicas(BOUNDS, 3, quiet), 3);
    }

    #[test]
    fn shrinking_waits_for_demand_to_stay_low_for_the_whole_delay() {
        let mut window = ScaleDownWindow::new(Duration::from_secs(120), at(0));
        assert_eq!(window.record(8, at(0)), None, "nothing known before the start");
        assert_eq!(window.record(2, at(60)), None, "not watched a whole delay yet");
        // Whole from 120 s: the peak of the last 120 s still counts.
        assert_eq!(
            window.record(2, at(121)),
            Some(2),
            "the 8 of 0 s is older than 120 s"
        );
        // A one-second lull does not shrink a busy pool.
        assert_eq!(window.record(6, at(200)), Some(6));
        assert_eq!(window.record(2, at(201)), Some(6));
        assert_eq!(window.record(3, at(300)), Some(6));
        assert_eq!(window.record(2, at(321)), Some(3), "the 6 of 200 s has aged out");
        assert_eq!(window.record(2, at(421)), Some(2));
    }
}
