//! The allocator's decisions, one situation per test.

use super::*;

const TTL: Duration = Duration::from_secs(9);

fn tag(i: u8) -> MemberTag {
    MemberTag::of(&format!("operator-{i}"), &[i; 8])
}

fn proxy(i: usize) -> ObjectKey {
    ObjectKey::new("crawl", format!("p{i}"))
}

fn claim(key: &ObjectKey, slots: u32, in_use: u32) -> Claim {
    Claim {
        key: key.clone(),
        slots,
        in_use,
    }
}

fn slots(allocation: &Allocation) -> &BTreeMap<ObjectKey, u32> {
    match &allocation.slots {
        Allotted::Slots(slots) => slots,
        Allotted::Unlimited => panic!("unlimited"),
    }
}

fn of(allocation: &Allocation, key: &ObjectKey) -> u32 {
    slots(allocation).get(key).copied().unwrap_or(0)
}

/// A report newer than every one before (a member's `seq` only grows).
fn report(applied: u64, claims: Vec<Claim>) -> Report {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Report {
        seq: SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        applied,
        claims,
    }
}

/// A member that applies `allocation` and reports its slots (no lease in use).
fn applies(allocator: &mut Allocator, member: &MemberTag, allocation: &Allocation) {
    let claims = slots(allocation).iter().map(|(k, n)| claim(k, *n, 0)).collect();
    assert!(allocator.report(member, &report(allocation.version, claims)));
}

/// An allocator with `members` that have reported holding nothing.
fn fleet(capacity: u32, members: u8, proxies: usize) -> Allocator {
    let mut allocator = Allocator::new(capacity, TTL);
    for i in 0..members {
        assert!(allocator.report(&tag(i), &report(0, vec![])));
    }
    allocator.set_proxies((0..proxies).map(proxy));
    allocator
}

#[test]
fn three_members_split_each_proxy_evenly_with_the_remainder_by_rank() {
    for capacity in [1u32, 2, 3, 7] {
        let mut allocator = fleet(capacity, 3, 300);
        let given: Vec<Allocation> = (0..3)
            .map(|i| allocator.allocation_for(&tag(i)).unwrap())
            .collect();
        for p in 0..300 {
            let key = proxy(p);
            let parts: Vec<u32> = given.iter().map(|a| of(a, &key)).collect();
            assert_eq!(
                parts.iter().sum::<u32>(),
                capacity,
                "{key} of {capacity}: {parts:?}"
            );
            let (lo, hi) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{key} of {capacity}: {parts:?}");
        }
        // The remainder spreads: each member gets its extra slot on about a third.
        let totals: Vec<u32> = given.iter().map(|a| slots(a).values().sum()).collect();
        let even = capacity * 100;
        for total in &totals {
            assert!(total.abs_diff(even) <= 40, "capacity {capacity}: {totals:?}");
        }
        assert!(allocator.over_capacity().is_empty());
    }
}

#[test]
fn a_join_moves_slots_only_after_their_holder_reports_the_lowered_value() {
    let key = proxy(0);
    let mut allocator = fleet(2, 1, 1);
    let (a, b) = (tag(0), tag(1));
    let first = allocator.allocation_for(&a).unwrap();
    assert_eq!(of(&first, &key), 2, "alone: the whole capacity");
    applies(&mut allocator, &a, &first);

    assert!(allocator.join(&b));
    let for_b = allocator.allocation_for(&b).unwrap();
    assert_eq!(of(&for_b, &key), 0, "a holds both slots");
    let lowered = allocator.allocation_for(&a).unwrap();
    assert_eq!(of(&lowered, &key), 1, "a is lowered to its part at once");
    assert!(lowered.version > first.version);
    assert_eq!(
        of(&allocator.allocation_for(&b).unwrap(), &key),
        0,
        "sent is not applied: a may still use two"
    );
    // a's report of the lowered share, with one lease still in use each way.
    allocator.report(&a, &report(lowered.version, vec![claim(&key, 1, 2)]));
    assert_eq!(
        of(&allocator.allocation_for(&b).unwrap(), &key),
        0,
        "a's leases in use still count"
    );
    applies(&mut allocator, &a, &lowered);
    assert_eq!(of(&allocator.allocation_for(&b).unwrap(), &key), 1, "now b's");
    assert!(allocator.over_capacity().is_empty());
}

#[test]
fn a_death_frees_nothing_until_the_journal_is_adopted() {
    let key = proxy(0);
    let mut allocator = fleet(3, 3, 1);
    let (a, b, c) = (tag(0), tag(1), tag(2));
    for m in [&a, &b, &c] {
        let given = allocator.allocation_for(m).unwrap();
        assert_eq!(of(&given, &key), 1);
        applies(&mut allocator, m, &given);
    }
    allocator.died(&c);
    assert_eq!(
        of(&allocator.allocation_for(&a).unwrap(), &key),
        1,
        "c's slot still counts"
    );
    assert_eq!(of(&allocator.allocation_for(&b).unwrap(), &key), 1);
    assert_eq!(
        allocator.allocation_for(&c).unwrap().slots,
        Allotted::Slots(BTreeMap::new()),
        "a dead member is given nothing"
    );
    assert_eq!(allocator.bound(&c, &key), 1);
    allocator.adopted(&c);
    let (for_a, for_b) = (
        allocator.allocation_for(&a).unwrap(),
        allocator.allocation_for(&b).unwrap(),
    );
    assert_eq!(
        of(&for_a, &key) + of(&for_b, &key),
        3,
        "adopted: its slot is handed on"
    );
    assert!(!allocator.join(&c), "an adopted incarnation never counts again");
    assert!(!allocator.report(&c, &report(0, vec![])));
    assert_eq!(allocator.allocation_for(&c), None);
    assert!(allocator.over_capacity().is_empty());
}

#[test]
fn a_rebuilding_leader_raises_no_bound_until_every_member_reported_or_was_adopted() {
    let (a, b) = (tag(0), tag(1));
    // A proxy of capacity 3 whose larger part (2) is a's.
    let key = (0..)
        .map(proxy)
        .find(|key| target(3, key, a.digest(), &[a.digest(), b.digest()]) == 2)
        .unwrap();
    // (why, b reports, b dies, b adopted, a's slots)
    let rows = [
        ("b not heard from: a keeps what it holds", false, false, false, 1),
        (
            "b reported holding two: a's one is all there is",
            true,
            false,
            false,
            1,
        ),
        (
            "b died unheard: its API leases may be in use until adopted",
            false,
            true,
            false,
            1,
        ),
        ("b died and was adopted: a alone", false, true, true, 3),
        (
            "b died after reporting: its two still count",
            true,
            true,
            false,
            1,
        ),
    ];
    for (why, b_reports, b_dies, b_adopted, expected) in rows {
        let mut allocator = Allocator::rebuilding(3, TTL);
        allocator.set_proxies([key.clone()]);
        assert!(allocator.join(&a) && allocator.join(&b));
        allocator.report(&a, &report(7, vec![claim(&key, 1, 1)]));
        if b_reports {
            allocator.report(&b, &report(4, vec![claim(&key, 2, 0)]));
        }
        if b_dies {
            allocator.died(&b);
        }
        if b_adopted {
            allocator.adopted(&b);
        }
        let given = allocator.allocation_for(&a).unwrap();
        assert_eq!(of(&given, &key), expected, "{why}");
        assert!(
            given.version > 7,
            "{why}: versions continue above the applied one"
        );
        assert_eq!(given.ttl, TTL, "{why}: what a member keeps is renewed meanwhile");
        assert!(allocator.over_capacity().is_empty(), "{why}");
    }
    // Once over, it stays over.
    let mut allocator = Allocator::rebuilding(3, TTL);
    allocator.set_proxies([key.clone()]);
    allocator.report(&a, &report(0, vec![]));
    assert!(!allocator.is_rebuilding());
    allocator.join(&b);
    assert!(
        !allocator.is_rebuilding(),
        "a member joining later is new: nothing to wait for"
    );
}

#[test]
fn a_late_or_lost_allocation_and_a_stale_report_never_lower_a_bound_below_what_was_sent() {
    let key = proxy(0);
    let (a, b) = (tag(0), tag(1));
    let mut allocator = fleet(4, 1, 1);
    let v1 = allocator.allocation_for(&a).unwrap();
    assert_eq!(of(&v1, &key), 4);
    // v1 is lost: a reports applied 0, holding nothing. It may still get v1.
    allocator.report(&a, &report(0, vec![]));
    assert_eq!(
        allocator.bound(&a, &key),
        4,
        "an allocation sent and not reported past"
    );
    applies(&mut allocator, &a, &v1);
    allocator.join(&b);
    let v2 = allocator.allocation_for(&a).unwrap();
    assert_eq!(of(&v2, &key), 2);
    // a still uses three of the four: they count until they end.
    let (older, newer) = (
        report(v2.version, vec![claim(&key, 2, 3)]),
        report(v2.version, vec![claim(&key, 2, 1)]),
    );
    allocator.report(&a, &older);
    assert_eq!(allocator.bound(&a, &key), 3);
    allocator.report(&a, &newer);
    assert_eq!(
        allocator.bound(&a, &key),
        2,
        "v2's slots count until a later version is applied"
    );
    // The older report arrives again (a retry): ignored, the ended leases no longer count.
    assert!(!allocator.report(&a, &older));
    assert_eq!(allocator.bound(&a, &key), 2);
    // One of v1's time, delayed: ignored.
    assert!(!allocator.report(
        &a,
        &Report {
            seq: 0,
            applied: v1.version,
            claims: vec![claim(&key, 4, 0)]
        }
    ));
    assert_eq!(allocator.bound(&a, &key), 2);
    let for_b = allocator.allocation_for(&b).unwrap();
    assert_eq!(of(&for_b, &key), 2);
    // The same allocation again keeps its version (a member ignores it).
    assert_eq!(allocator.allocation_for(&b).unwrap().version, for_b.version);
    assert!(allocator.over_capacity().is_empty());
}

#[test]
fn a_proxy_no_longer_ready_is_lowered_to_nothing_and_its_slots_count_until_reported() {
    let (p0, p1) = (proxy(0), proxy(1));
    let a = tag(0);
    let mut allocator = fleet(2, 1, 2);
    let given = allocator.allocation_for(&a).unwrap();
    applies(&mut allocator, &a, &given);
    allocator.set_proxies([p1.clone()]);
    let lowered = allocator.allocation_for(&a).unwrap();
    assert_eq!((of(&lowered, &p0), of(&lowered, &p1)), (0, 2));
    assert_eq!(allocator.bound(&a, &p0), 2);
    applies(&mut allocator, &a, &lowered);
    assert_eq!(allocator.bound(&a, &p0), 0);
    let listed = allocator.members();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].slots, listed[0].bound), (2, 2));
}

#[test]
fn unlimited_capacity_gives_every_live_member_an_unlimited_share() {
    let mut allocator = fleet(0, 2, 3);
    for i in 0..2 {
        let given = allocator.allocation_for(&tag(i)).unwrap();
        assert_eq!(given.slots, Allotted::Unlimited);
        assert_eq!(given.ttl, TTL);
    }
    allocator.died(&tag(1));
    assert_eq!(
        allocator.allocation_for(&tag(1)).unwrap().slots,
        Allotted::Slots(BTreeMap::new())
    );
    assert!(allocator.over_capacity().is_empty());
}

#[test]
fn the_even_part_goes_to_the_highest_ranked_members_first() {
    let live: Vec<u64> = (0..3).map(|i| tag(i).digest()).collect();
    for p in 0..50 {
        let key = proxy(p);
        // (capacity, parts sorted high to low)
        for (capacity, expected) in [(1, [1, 0, 0]), (2, [1, 1, 0]), (3, [1, 1, 1]), (5, [2, 2, 1])] {
            let mut parts: Vec<u32> = live.iter().map(|m| target(capacity, &key, *m, &live)).collect();
            parts.sort_unstable_by(|x, y| y.cmp(x));
            assert_eq!(parts, expected, "{key} of {capacity}");
        }
        assert_eq!(target(3, &key, 42, &live), 0, "not live: nothing");
    }
}

#[test]
fn every_member_gets_an_even_part_of_the_whole_fleet() {
    // (members, proxies, capacity)
    for (members, proxies, capacity) in [
        (3u8, 3usize, 2u32),
        (3, 1, 3),
        (3, 2, 2),
        (2, 5, 1),
        (3, 6, 2),
        (3, 100, 1),
        (4, 7, 3),
    ] {
        let live: Vec<u64> = (0..members).map(|i| tag(i).digest()).collect();
        let fleet: BTreeMap<ObjectKey, u64> = (0..proxies)
            .map(|p| {
                let key = proxy(p);
                let digest = crate::rendezvous::proxy_digest(&key);
                (key, digest)
            })
            .collect();
        let parts = parts(capacity, &fleet, &live);
        for key in fleet.keys() {
            let sum: u32 = parts.values().map(|p| p.get(key).copied().unwrap_or(0)).sum();
            assert_eq!(
                sum, capacity,
                "{key}: its whole capacity, no more ({members}, {proxies}, {capacity})"
            );
        }
        let totals: Vec<u32> = live.iter().map(|m| parts[m].values().sum()).collect();
        let (least, most) = (totals.iter().min().unwrap(), totals.iter().max().unwrap());
        assert!(
            most - least <= 1,
            "totals within one: {totals:?} ({members}, {proxies}, {capacity})"
        );
        if proxies as u32 * capacity >= u32::from(members) {
            assert!(
                *least > 0,
                "nobody without a slot: {totals:?} ({members}, {proxies}, {capacity})"
            );
        }
    }
}

#[test]
fn an_idle_slot_moves_to_a_member_that_wants_it_once_its_holder_gave_it_up() {
    let (a, b) = (tag(0), tag(1));
    let mut allocator = fleet(1, 2, 2);
    let first_a = allocator.allocation_for(&a).unwrap();
    let first_b = allocator.allocation_for(&b).unwrap();
    applies(&mut allocator, &a, &first_a);
    applies(&mut allocator, &b, &first_b);
    assert!(
        slots(&first_a).len() == 1 && slots(&first_b).len() == 1,
        "one proxy each: {first_a:?} {first_b:?}"
    );

    // a wants one more: b's idle slot is taken from b first…
    assert!(allocator.want(&a, 1));
    assert!(!allocator.want(&a, 1), "the same want again changes nothing");
    let still_a = allocator.allocation_for(&a).unwrap();
    assert_eq!(slots(&still_a).len(), 1, "no raise before b gave its slot up");
    let lowered_b = allocator.allocation_for(&b).unwrap();
    assert!(slots(&lowered_b).is_empty(), "b lowered: {lowered_b:?}");
    // …and given to a once b reported it applied the lowering.
    applies(&mut allocator, &b, &lowered_b);
    let raised_a = allocator.allocation_for(&a).unwrap();
    assert_eq!(
        of(&raised_a, &proxy(0)) + of(&raised_a, &proxy(1)),
        2,
        "{raised_a:?}"
    );
    assert!(allocator.over_capacity().is_empty());

    // The want over and a's leases ended: the even parts again.
    applies(&mut allocator, &a, &raised_a);
    assert!(allocator.want(&a, 0));
    let back_a = allocator.allocation_for(&a).unwrap();
    assert_eq!(slots(&back_a).len(), 1, "a back to its part: {back_a:?}");
}

#[test]
fn a_member_keeps_the_slots_it_has_leases_on() {
    let (a, b) = (tag(0), tag(1));
    let mut allocator = fleet(1, 2, 2);
    for member in [&a, &b] {
        let allocation = allocator.allocation_for(member).unwrap();
        applies(&mut allocator, member, &allocation);
    }
    assert!(allocator.want(&a, 2));
    for member in [&b, &a, &b, &a] {
        let allocation = allocator.allocation_for(member).unwrap();
        applies(&mut allocator, member, &allocation);
    }
    let lent = allocator.allocation_for(&a).unwrap();
    assert_eq!(slots(&lent).len(), 2, "both lent to a: {lent:?}");
    // a leases both, then wants nothing: it keeps them while in use.
    let claims = slots(&lent).iter().map(|(k, n)| claim(k, *n, 1)).collect();
    assert!(allocator.report(&a, &report(lent.version, claims)));
    assert!(allocator.want(&a, 0));
    let kept = allocator.allocation_for(&a).unwrap();
    assert_eq!(slots(&kept).len(), 2, "in use: kept ({kept:?})");
    assert!(slots(&allocator.allocation_for(&b).unwrap()).is_empty());
    assert!(allocator.over_capacity().is_empty());
}
