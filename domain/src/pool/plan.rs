//! One step of a pool's control loop, as a pure function: from the pool's
//! settings and its members as they are, which members to create, which to
//! retire (no new leases, drained) and which to delete.
//!
//! The order of a rotation keeps crawlers whole: a replacement is made
//! first (within `maxSurge`), an old proxy is retired only while enough
//! Ready members remain (`replicas - maxUnavailable`), and a retired proxy
//! is deleted only when its last lease ended or the drain timeout passed.
//!
//! Every reason keeps moving: when a successor lets one due member retire,
//! the reasons take turns (the one after the reason served last, each
//! reason's oldest member first), so a stream of blocks cannot keep a
//! member past its `maxAge` for longer than one replacement.

use std::time::Duration;

use jiff::Timestamp;

/// Why a member leaves the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetireReason {
    /// Targets reported it blocked (`rotation.afterBlockedTargets`).
    Blocked,
    /// Leases reported errors on it (`rotation.afterErrors`).
    Errors,
    /// Not Ready for [`UNREADY_DEADLINE`]: failed, or never came up, or
    /// unhealthy that long. It serves nobody and would hold its slot forever.
    Unready,
    /// Made from an older template.
    Template,
    /// Older than `rotation.maxAge`.
    Age,
    /// The pool shrank.
    ScaleDown,
}

impl RetireReason {
    /// Every reason, most urgent first.
    pub const ALL: [RetireReason; 6] = [
        Self::Blocked,
        Self::Errors,
        Self::Unready,
        Self::Template,
        Self::Age,
        Self::ScaleDown,
    ];

    /// The spelling in annotations, metrics and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            RetireReason::Blocked => "blocked",
            RetireReason::Errors => "errors",
            RetireReason::Unready => "unready",
            RetireReason::Template => "template",
            RetireReason::Age => "age",
            RetireReason::ScaleDown => "scale-down",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// How long a member may stay not Ready before it is replaced (as a
/// Deployment's default progress deadline).
pub const UNREADY_DEADLINE: Duration = Duration::from_secs(600);

/// A member that is being retired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retiring {
    pub since: Timestamp,
    pub reason: RetireReason,
}

/// One Proxy of the pool as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub created: Timestamp,
    /// The hash of the template it was made from.
    pub template_hash: String,
    /// Phase `Ready`: serving and healthy.
    pub ready: bool,
    /// Not Ready since then (its creation, if it never was).
    pub unready_since: Option<Timestamp>,
    pub retiring: Option<Retiring>,
    /// Active leases on it.
    pub leases: u32,
    /// Retiring as far as the lease store knows, and without a lease: a
    /// crawler can neither hold nor get one on it.
    pub drained: bool,
    /// Distinct targets that reported it blocked.
    pub blocked_targets: u32,
    /// `error` reports on its leases.
    pub errors: u32,
}

/// The pool's settings, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub replicas: u32,
    pub max_surge: u32,
    pub max_unavailable: u32,
    pub drain_timeout: Duration,
    pub max_age: Option<Duration>,
    pub after_blocked_targets: Option<u32>,
    pub after_errors: Option<u32>,
    /// The current template's hash.
    pub template_hash: String,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolPlan {
    /// New members to make.
    pub create: u32,
    /// Members to stop leasing and drain.
    pub retire: Vec<(String, RetireReason)>,
    /// Members to delete (drained, or out of time).
    pub delete: Vec<String>,
    /// Members being replaced: retiring, or due and waiting for a successor.
    pub rotating: u32,
    /// The reason of the last Ready member retired because a successor was
    /// Ready (its turn was taken); `None` when none was. The next plan
    /// starts with the reason after it.
    pub served: Option<RetireReason>,
}

impl Settings {
    /// Why `member` should be replaced, if it should.
    pub fn due(&self, member: &Member, now: Timestamp) -> Option<RetireReason> {
        if self
            .after_blocked_targets
            .is_some_and(|n| member.blocked_targets >= n)
        {
            return Some(RetireReason::Blocked);
        }
        if self.after_errors.is_some_and(|n| member.errors >= n) {
            return Some(RetireReason::Errors);
        }
        if member
            .unready_since
            .is_some_and(|since| now.duration_since(since).unsigned_abs() >= UNREADY_DEADLINE)
        {
            return Some(RetireReason::Unready);
        }
        if member.template_hash != self.template_hash {
            return Some(RetireReason::Template);
        }
        let age = now.duration_since(member.created).unsigned_abs();
        if self.max_age.is_some_and(|max| age >= max) {
            return Some(RetireReason::Age);
        }
        None
    }
}

/// Plans one step for `members` under `settings` at `now`; `deleting`
/// members are on their way out but still hold their instances; `served`
/// is the reason whose turn was taken last (the previous plan's
/// [`PoolPlan::served`], `None` after a start).
pub fn plan(
    settings: &Settings,
    members: &[Member],
    deleting: usize,
    served: Option<RetireReason>,
    now: Timestamp,
) -> PoolPlan {
    let mut plan = PoolPlan::default();
    let (retiring, mut active): (Vec<&Member>, Vec<&Member>) =
        members.iter().partition(|m| m.retiring.is_some());

    // Drained or out of time: gone.
    for m in &retiring {
        let since = m.retiring.map_or(now, |r| r.since);
        let draining_for = now.duration_since(since).unsigned_abs();
        // The retiring annotation alone is not enough: until the lease store
        // has heard of it, a crawler may still be granted the member.
        if m.drained || draining_for >= settings.drain_timeout {
            plan.delete.push(m.name.clone());
        }
    }

    // The reasons take turns, each its oldest first.
    let due: Vec<(&Member, RetireReason)> = active
        .iter()
        .filter_map(|m| settings.due(m, now).map(|r| (*m, r)))
        .collect();
    let due = taking_turns(due, served);

    let desired = settings.replicas as usize;
    let mut ready = active.iter().filter(|m| m.ready).count();
    let mut retire = |m: &Member, reason: RetireReason, active: &mut Vec<&Member>, ready: &mut usize| {
        active.retain(|a| a.name != m.name);
        if m.ready {
            *ready -= 1;
        }
        plan.retire.push((m.name.clone(), reason));
    };

    // Shrinking: members beyond `replicas` that are not due go, those not
    // Ready first, then the oldest (due ones are handled below).
    let mut keeping: Vec<&Member> = active
        .iter()
        .filter(|m| !due.iter().any(|(d, _)| d.name == m.name))
        .copied()
        .collect();
    if keeping.len() > desired {
        keeping.sort_by_key(|m| (m.ready, m.created, m.name.clone()));
        let excess = keeping.len() - desired;
        for m in keeping.into_iter().take(excess) {
            retire(m, RetireReason::ScaleDown, &mut active, &mut ready);
        }
    }

    // Replacing: a due member that is not Ready serves nobody and goes at
    // once; a Ready one only while enough Ready members stay.
    let floor = desired.saturating_sub(settings.max_unavailable as usize);
    let mut waiting = 0;
    for (m, reason) in due {
        if !m.ready {
            retire(m, reason, &mut active, &mut ready);
        } else if ready > floor {
            retire(m, reason, &mut active, &mut ready);
            plan.served = Some(reason);
        } else {
            waiting += 1;
        }
    }

    // Successors and growth, within the surge. A retiring member still has
    // its instance until it is gone (deleted, and its instance torn down):
    // it counts, so `maxSurge: 0` never runs more instances than
    // `replicas` (quotas, addresses, money).
    let keeping = active.len() - waiting;
    let needed = desired.saturating_sub(keeping);
    let holding = retiring.len() + plan.retire.len() + deleting;
    let room = (desired + settings.max_surge as usize).saturating_sub(active.len() + holding);
    plan.create = needed.min(room) as u32;
    let replacing = |r: &Option<Retiring>| r.is_some_and(|r| r.reason != RetireReason::ScaleDown);
    plan.rotating = (retiring.iter().filter(|m| replacing(&m.retiring)).count()
        + plan
            .retire
            .iter()
            .filter(|(_, r)| *r != RetireReason::ScaleDown)
            .count()
        + waiting) as u32;
    plan
}

/// `due` in the order members are replaced: reason by reason in the order
/// of [`RetireReason::ALL`] (most urgent first), starting with the one after
/// `served`, one member of each reason in its turn, each reason's oldest
/// first. A reason with members waiting is never passed over twice in a row.
fn taking_turns(
    mut due: Vec<(&Member, RetireReason)>,
    served: Option<RetireReason>,
) -> Vec<(&Member, RetireReason)> {
    due.sort_by_key(|(m, r)| (*r, m.created, m.name.clone()));
    let mut queues: Vec<std::collections::VecDeque<(&Member, RetireReason)>> =
        RetireReason::ALL.iter().map(|_| Default::default()).collect();
    for (m, r) in due {
        let at = RetireReason::ALL.iter().position(|x| *x == r).unwrap_or_default();
        queues[at].push_back((m, r));
    }
    let start = served
        .and_then(|s| RetireReason::ALL.iter().position(|x| *x == s))
        .map_or(0, |at| at + 1);
    let mut order = Vec::new();
    let mut turn = start;
    let reasons = queues.len();
    while queues.iter().any(|q| !q.is_empty()) {
        if let Some(next) = queues[turn % reasons].pop_front() {
            order.push(next);
        }
        turn += 1;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "t1";

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn member(name: &str, created: i64, ready: bool) -> Member {
        Member {
            name: name.into(),
            created: at(created),
            template_hash: HASH.into(),
            ready,
            unready_since: (!ready).then(|| at(created)),
            retiring: None,
            leases: 0,
            drained: false,
            blocked_targets: 0,
            errors: 0,
        }
    }

    fn settings(replicas: u32) -> Settings {
        Settings {
            replicas,
            max_surge: 1,
            max_unavailable: 0,
            drain_timeout: Duration::from_secs(600),
            max_age: None,
            after_blocked_targets: Some(5),
            after_errors: None,
            template_hash: HASH.into(),
        }
    }

    fn names(retire: &[(String, RetireReason)]) -> Vec<&str> {
        retire.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn an_empty_pool_is_filled_and_a_full_one_left_alone() {
        let p = plan(&settings(3), &[], 0, None, at(0));
        assert_eq!((p.create, p.retire.len(), p.delete.len()), (3, 0, 0));
        let full: Vec<Member> = ["a", "b", "c"].iter().map(|n| member(n, 0, true)).collect();
        assert_eq!(plan(&settings(3), &full, 0, None, at(10)), PoolPlan::default());
    }

    #[test]
    fn scaling_down_retires_members_not_ready_first_then_the_oldest() {
        let members = vec![
            member("old", 0, true),
            member("sick", 5, false),
            member("new", 9, true),
        ];
        let p = plan(&settings(1), &members, 0, None, at(10));
        assert_eq!(names(&p.retire), ["sick", "old"]);
        assert!(p.retire.iter().all(|(_, r)| *r == RetireReason::ScaleDown));
        assert_eq!((p.create, p.rotating), (0, 0));
    }

    #[test]
    fn a_blocked_member_is_retired_only_after_its_successor_is_ready() {
        let mut members = vec![member("a", 0, true), member("b", 0, true)];
        members[0].blocked_targets = 5;
        // Step 1: a successor, nobody retired (maxUnavailable 0).
        let p = plan(&settings(2), &members, 0, None, at(10));
        assert_eq!((p.create, p.retire.len(), p.rotating), (1, 0, 1));
        // Step 2: the successor exists but is not Ready yet: wait.
        members.push(member("c", 10, false));
        let p = plan(&settings(2), &members, 0, None, at(11));
        assert_eq!((p.create, p.retire.len()), (0, 0));
        // Step 3: Ready: now the blocked one retires.
        members[2].ready = true;
        let p = plan(&settings(2), &members, 0, None, at(12));
        assert_eq!(p.retire, vec![("a".to_owned(), RetireReason::Blocked)]);
        assert_eq!(p.create, 0);
    }

    #[test]
    fn a_retiring_member_is_deleted_when_drained_or_out_of_time() {
        let mut members = vec![member("a", 0, true), member("b", 0, true), member("c", 0, true)];
        members[0].retiring = Some(Retiring {
            since: at(100),
            reason: RetireReason::Age,
        });
        members[0].leases = 2;
        members[1].retiring = members[0].retiring;
        let s = settings(1);
        let p = plan(&s, &members, 0, None, at(200));
        assert!(
            p.delete.is_empty(),
            "b has no lease, but the lease store has not taken it out yet"
        );
        members[1].drained = true;
        let p = plan(&s, &members, 0, None, at(200));
        assert_eq!(p.delete, vec!["b".to_owned()], "drained: b; a still has leases");
        let p = plan(&s, &members, 0, None, at(100 + 600));
        assert_eq!(
            p.delete,
            vec!["a".to_owned(), "b".to_owned()],
            "the drain timeout passed"
        );
        assert_eq!(p.rotating, 2);
    }

    #[test]
    fn a_template_change_rolls_one_at_a_time_with_surge_one() {
        let mut s = settings(3);
        s.template_hash = "t2".into();
        let mut members: Vec<Member> = ["a", "b", "c"].iter().map(|n| member(n, 0, true)).collect();
        let mut made = 0;
        // Each step: the planner's actions are applied, new members turn Ready.
        for now in 10..30 {
            let p = plan(&s, &members, 0, None, at(now));
            assert!(
                members.len() <= 3 + 1,
                "surge respected: {} members",
                members.len()
            );
            let ready = members.iter().filter(|m| m.retiring.is_none() && m.ready).count();
            assert!(ready >= 3, "maxUnavailable 0: {ready} ready");
            members.retain(|m| !p.delete.contains(&m.name));
            for (name, reason) in &p.retire {
                assert_eq!(*reason, RetireReason::Template);
                let m = members.iter_mut().find(|m| &m.name == name).unwrap();
                m.retiring = Some(Retiring {
                    since: at(now),
                    reason: *reason,
                });
            }
            for m in members.iter_mut() {
                m.ready = true;
                // The lease store learns of a retirement by the next step.
                m.drained = m.retiring.is_some() && m.leases == 0;
            }
            for _ in 0..p.create {
                made += 1;
                let mut m = member(&format!("n{made}"), now, false);
                m.template_hash = "t2".into();
                members.push(m);
            }
        }
        assert!(members.iter().all(|m| m.template_hash == "t2"), "{members:?}");
        assert_eq!(members.len(), 3);
        assert_eq!(made, 3);
    }

    #[test]
    fn max_unavailable_lets_rotation_proceed_without_surge() {
        let mut s = settings(2);
        s.max_surge = 0;
        s.max_unavailable = 1;
        s.max_age = Some(Duration::from_secs(60));
        let mut members = vec![member("a", 0, true), member("b", 0, true)];
        let p = plan(&s, &members, 0, None, at(61));
        assert_eq!(names(&p.retire), ["a"], "one may be missing");
        assert_eq!(p.create, 0, "no instance beyond replicas while it drains");
        members[0].retiring = Some(Retiring {
            since: at(61),
            reason: RetireReason::Age,
        });
        members[0].leases = 1;
        let p = plan(&s, &members, 0, None, at(62));
        assert_eq!(
            (p.create, p.retire.len(), p.delete.len()),
            (0, 0, 0),
            "still draining"
        );
        members[0].leases = 0;
        members[0].drained = true;
        let p = plan(&s, &members, 0, None, at(63));
        assert_eq!(p.delete, ["a"]);
        assert_eq!(p.create, 0, "its instance is still being torn down");
        members.remove(0);
        let p = plan(&s, &members, 1, None, at(64));
        assert_eq!(p.create, 0, "a member being deleted still counts");
        let p = plan(&s, &members, 0, None, at(65));
        assert_eq!(p.create, 1, "its successor once it is gone");
    }

    #[test]
    fn a_member_not_ready_past_the_deadline_is_replaced() {
        let members = vec![member("a", 0, false), member("b", 0, true)];
        let p = plan(&settings(2), &members, 0, None, at(599));
        assert!(p.retire.is_empty(), "still within the deadline");
        let p = plan(&settings(2), &members, 0, None, at(600));
        assert_eq!(p.retire, vec![("a".to_owned(), RetireReason::Unready)]);
        assert_eq!(p.create, 1);
    }

    #[test]
    fn a_due_member_that_is_not_ready_goes_at_once() {
        let mut members = vec![member("a", 0, false), member("b", 0, true)];
        members[0].blocked_targets = 9;
        let p = plan(&settings(2), &members, 0, None, at(10));
        assert_eq!(names(&p.retire), ["a"]);
        assert_eq!(p.create, 1, "within the surge of one");
    }

    #[test]
    fn reasons_round_trip() {
        for r in RetireReason::ALL {
            assert_eq!(RetireReason::parse(r.as_str()), Some(r));
        }
        assert!(
            RetireReason::ALL.windows(2).all(|w| w[0] < w[1]),
            "most urgent first, each once"
        );
    }

    #[test]
    fn an_aged_member_takes_its_turn_after_a_blocked_one() {
        let mut s = settings(3);
        s.after_blocked_targets = Some(1);
        s.max_age = Some(Duration::from_secs(30));
        let mut members = vec![
            member("old", 0, true),
            member("b1", 20, true),
            member("b2", 25, true),
            member("next", 40, true),
        ];
        members[1].blocked_targets = 1;
        members[2].blocked_targets = 1;
        // A successor is Ready: one may retire. Blocks first after a start...
        let p = plan(&s, &members, 0, None, at(45));
        assert_eq!(p.retire, [("b1".to_owned(), RetireReason::Blocked)]);
        assert_eq!(p.served, Some(RetireReason::Blocked));
        // ...then the aged member, though another block waits.
        let p = plan(&s, &members, 0, p.served, at(46));
        assert_eq!(p.retire, [("old".to_owned(), RetireReason::Age)]);
        assert_eq!(p.served, Some(RetireReason::Age));
        let p = plan(&s, &members, 0, p.served, at(47));
        assert_eq!(
            p.retire,
            [("b1".to_owned(), RetireReason::Blocked)],
            "then blocks again"
        );
    }

    #[test]
    fn turns_cycle_through_the_reasons_waiting_and_skip_the_others() {
        let mut members = [
            member("e", 0, true),
            member("b", 1, true),
            member("a1", 2, true),
            member("a2", 3, true),
        ];
        members[0].errors = 9;
        members[1].blocked_targets = 9;
        let reasons = [
            RetireReason::Errors,
            RetireReason::Blocked,
            RetireReason::Age,
            RetireReason::Age,
        ];
        let due: Vec<(&Member, RetireReason)> = members.iter().zip(reasons).collect();
        let order = |served| {
            taking_turns(due.clone(), served)
                .iter()
                .map(|(m, _)| m.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(order(None), ["b", "e", "a1", "a2"]);
        assert_eq!(order(Some(RetireReason::Blocked)), ["e", "a1", "b", "a2"]);
        assert_eq!(order(Some(RetireReason::Age)), ["b", "e", "a1", "a2"]);
    }

    mod under_a_stream_of_blocks {
        use proptest::prelude::*;

        use super::*;

        /// One simulated pool: every turn (a second) plans, applies the
        /// plan, and lets members become Ready `ready_after` turns after
        /// their creation; a retired member drains by the next turn. A
        /// member made on a banned address (`banned` in 256) is blocked as
        /// soon as it serves. Returns, per member that came due for age,
        /// how long after `maxAge` it retired, and the number of turns one
        /// replacement takes at most.
        fn simulate(replicas: u32, ready_after: i64, banned: u8, seed: u64, fair: bool) -> (Vec<i64>, i64) {
            const MAX_AGE: i64 = 30;
            const TURNS: i64 = 400;
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut s = settings(replicas);
            s.after_blocked_targets = Some(1);
            s.max_age = Some(Duration::from_secs(MAX_AGE as u64));
            let mut members: Vec<Member> = Vec::new();
            let mut ready_at = std::collections::HashMap::new();
            let mut doomed = std::collections::HashSet::new();
            let mut late = Vec::new();
            let mut served = None;
            let mut made = 0;
            for now in 0..TURNS {
                let p = plan(&s, &members, 0, if fair { served } else { None }, at(now));
                served = p.served.or(served);
                members.retain(|m| !p.delete.contains(&m.name));
                for (name, reason) in &p.retire {
                    let m = members.iter_mut().find(|m| &m.name == name).unwrap();
                    m.retiring = Some(Retiring {
                        since: at(now),
                        reason: *reason,
                    });
                    let due_at = m.created.as_second() - 1_700_000_000 + MAX_AGE;
                    if due_at <= now {
                        late.push(now - due_at);
                    }
                }
                for _ in 0..p.create {
                    made += 1;
                    let name = format!("m{made}");
                    ready_at.insert(name.clone(), now + ready_after);
                    // The first members leave from good addresses and age.
                    if made > replicas && rng.u8(..) < banned {
                        doomed.insert(name.clone());
                    }
                    members.push(member(&name, now, false));
                }
                for m in members.iter_mut() {
                    if ready_at.get(&m.name).is_some_and(|r| *r <= now + 1) {
                        m.ready = true;
                        m.unready_since = None;
                    }
                    if m.ready && doomed.contains(&m.name) {
                        m.blocked_targets = 1;
                    }
                    m.drained = m.retiring.is_some();
                }
            }
            // Members still serving that came due for age long ago count too.
            for m in members.iter().filter(|m| m.retiring.is_none()) {
                let due_at = m.created.as_second() - 1_700_000_000 + MAX_AGE;
                if due_at <= TURNS {
                    late.push(TURNS - due_at);
                }
            }
            // Created, Ready, the old one retired, drained and deleted.
            (late, ready_after + 3)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// However many members are made on banned addresses, a member
            /// due for age waits for at most one blocked one per aged member
            /// ahead of it: those made together at the start all come due
            /// at once.
            #[test]
            fn no_member_outlives_max_age_by_more_than_its_turns(
                replicas in 1u32..=4,
                ready_after in 1i64..=3,
                banned in 64u8..=255,
                seed in any::<u64>(),
            ) {
                let (late, replacement) = simulate(replicas, ready_after, banned, seed, true);
                let bound = 2 * (i64::from(replicas) + 1) * replacement;
                prop_assert!(late.iter().all(|l| *l <= bound), "late {late:?}, bound {bound}");
            }
        }

        #[test]
        fn without_turns_blocks_starve_ages() {
            // The old order (most urgent first, always): a steady stream of
            // blocked members keeps an aged one far past its maxAge.
            let (late, replacement) = simulate(3, 2, 255, 7, false);
            assert!(late.iter().any(|l| *l > 2 * 4 * replacement), "{late:?}");
        }
    }
}
