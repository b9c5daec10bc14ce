//! Sizing a pool by lease demand, as a pure function: the size at which
//! the pool's lease capacity would be used at `targetUtilization`, grown at
//! once when acquires were denied, shrunk only after demand stayed low for a
//! while (so a lull between crawls does not tear down warm proxies).

use std::time::Duration;

use jiff::Timestamp;

/// How long the autoscaler waits after its last change before it shrinks the
/// pool: demand has to stay low that long.
pub const SCALE_DOWN_DELAY: Duration = Duration::from_secs(120);

/// The autoscaler's bounds and aim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
    /// Percent of capacity in use aimed for, 1–100.
    pub target_utilization: u32,
    /// How long after its last change the autoscaler may shrink the pool
    /// ([`SCALE_DOWN_DELAY`] unless the operator is told otherwise).
    pub scale_down_delay: Duration,
}

/// The pool's demand since the last decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Active leases on the pool's members.
    pub leases: u32,
    /// Acquires for the pool refused for lack of capacity.
    pub denied: u32,
    /// Leases one proxy may hold at once (`--max-leases-per-proxy`; 0: unlimited).
    pub per_proxy: u32,
}

/// The size to set, or `None` to keep `current`.
pub fn desired_replicas(
    bounds: Bounds,
    current: u32,
    demand: Demand,
    last_change: Option<Timestamp>,
    now: Timestamp,
) -> Option<u32> {
    let target = bounds.target_utilization.clamp(1, 100);
    // Leases one proxy should carry at the target utilization.
    let aim = (demand.per_proxy.max(1) * target).div_ceil(100).max(1);
    let mut wanted = if demand.per_proxy == 0 {
        // Unlimited capacity: only denials say more is needed.
        current
    } else {
        demand.leases.div_ceil(aim)
    };
    if demand.denied > 0 {
        // Demand went unmet: grow as if in use beyond the target.
        wanted = wanted.max((current * 100).div_ceil(target)).max(current + 1);
    }
    let wanted = wanted.clamp(bounds.min, bounds.max.max(bounds.min));
    let recently_changed =
        last_change.is_some_and(|at| now.duration_since(at).unsigned_abs() < bounds.scale_down_delay);
    match wanted {
        w if w == current => None,
        w if w < current && recently_changed => None,
        w => Some(w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        min: 2,
        max: 10,
        target_utilization: 50,
        scale_down_delay: SCALE_DOWN_DELAY,
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
        assert_eq!(desired_replicas(BOUNDS, 2, demand(9, 0), None, at(0)), Some(5));
        assert_eq!(desired_replicas(BOUNDS, 5, demand(10, 0), None, at(0)), None);
    }

    #[test]
    fn bounds_hold() {
        assert_eq!(desired_replicas(BOUNDS, 5, demand(0, 0), None, at(0)), Some(2));
        assert_eq!(desired_replicas(BOUNDS, 5, demand(400, 0), None, at(0)), Some(10));
    }

    #[test]
    fn denials_grow_the_pool_even_when_leases_look_low() {
        // Leases ended meanwhile, but acquires were refused: at least one more.
        assert_eq!(desired_replicas(BOUNDS, 4, demand(2, 3), None, at(0)), Some(8));
        let unlimited = Demand {
            leases: 50,
            denied: 1,
            per_proxy: 0,
        };
        assert_eq!(desired_replicas(BOUNDS, 3, unlimited, None, at(0)), Some(6));
        let quiet = Demand {
            denied: 0,
            ..unlimited
        };
        assert_eq!(desired_replicas(BOUNDS, 3, quiet, None, at(0)), None);
    }

    #[test]
    fn shrinking_waits_for_demand_to_stay_low() {
        let changed = Some(at(0));
        assert_eq!(desired_replicas(BOUNDS, 8, demand(0, 0), changed, at(60)), None);
        assert_eq!(
            desired_replicas(BOUNDS, 8, demand(0, 0), changed, at(120)),
            Some(2)
        );
        // Growing never waits.
        assert_eq!(
            desired_replicas(BOUNDS, 2, demand(20, 0), changed, at(1)),
            Some(10)
        );
    }
}
