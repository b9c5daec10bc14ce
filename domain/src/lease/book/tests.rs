//! Selection against a brute-force reference, and the walk bound of a hot
//! target.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::lease::{AcquireError, Claim, LeaseSettings, Outcome};

fn settings(capacity: u32) -> LeaseSettings {
    LeaseSettings {
        capacity,
        ..LeaseSettings::default()
    }
}

fn availability(i: usize, ready: bool, latency_ms: u64) -> Availability {
    Availability {
        key: ObjectKey::new("ns", format!("p{i}")),
        ready,
        phase: "Ready".into(),
        healthy: Some(ready),
        url: Some(format!("http://p{i}:3128")),
        attributes: BTreeMap::from([("geo".to_owned(), ["eu", "us"][i % 2].to_owned())]),
        latency: Some(Duration::from_millis(latency_ms)),
        credentials: None,
        realm: None,
        retiring: false,
    }
}

fn ask(target: &str, geo: Option<&str>) -> AcquireRequest {
    AcquireRequest {
        target: target.into(),
        selector: geo
            .map(|g| BTreeMap::from([("geo".to_owned(), g.to_owned())]))
            .unwrap_or_default(),
        ..AcquireRequest::default()
    }
}

/// The rule, by looking at every proxy.
fn reference(book: &LeaseBook, req: &AcquireRequest, now: Instant) -> Option<ProxyId> {
    let target = book.targets.get(&req.target);
    book.proxies
        .iter()
        .filter(|(id, e)| e.indexed.is_some() && book.matches(**id, &req.selector))
        .filter(|(id, _)| !target.is_some_and(|t| t.resting(**id, now)))
        .map(|(id, e)| {
            let last = target.and_then(|t| t.last_leased(*id));
            (e.active, last, latency_key(e.availability.latency), *id)
        })
        .min()
        .map(|rank| rank.3)
}

#[derive(Clone, Debug)]
enum Op {
    Acquire { target: u8, geo: Option<bool> },
    Release(u8),
    Cancel(u8),
    Report(u8, u8),
    Health { proxy: u8, ready: bool, latency: u8 },
    Wait(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, proptest::option::of(any::<bool>())).prop_map(|(target, geo)| Op::Acquire { target, geo }),
        3 => any::<u8>().prop_map(Op::Release),
        1 => any::<u8>().prop_map(Op::Cancel),
        2 => (any::<u8>(), 0u8..3).prop_map(|(l, o)| Op::Report(l, o)),
        1 => (any::<u8>(), any::<bool>(), any::<u8>()).prop_map(|(proxy, ready, latency)| Op::Health { proxy, ready, latency }),
        2 => (0u8..40).prop_map(Op::Wait),
    ]
}

/// Applies `ops`, checking every acquire against [`reference`].
fn run(capacity: u32, proxies: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut now = Instant::now();
    let mut book = LeaseBook::new(
        LeaseSettings {
            cooldown: Duration::from_secs(30),
            blocked_cooldown: Duration::from_secs(90),
            error_cooldown: Duration::from_secs(45),
            ..settings(capacity)
        },
        crate::now::Now::read(),
    );
    for i in 0..proxies {
        book.upsert(availability(i, true, (i as u64 * 7) % 5), now);
    }
    let mut leases: Vec<String> = Vec::new();
    for op in ops {
        match op {
            Op::Acquire { target, geo } => {
                let req = ask(&format!("t{target}"), geo.map(|eu| if eu { "eu" } else { "us" }));
                book.release_cooled(now);
                if let Some(t) = book.targets.get_mut(&req.target) {
                    t.settle(now);
                }
                let expected = reference(&book, &req, now);
                match book.acquire(&req, now) {
                    Ok(grant) => {
                        prop_assert_eq!(Some(book.ids[&grant.proxy]), expected);
                        leases.push(grant.id);
                    }
                    Err(AcquireError::NoCapacity { .. }) => prop_assert_eq!(expected, None),
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            }
            Op::Release(i) if !leases.is_empty() => {
                let id = leases.swap_remove(i as usize % leases.len());
                book.release(&id, now);
            }
            Op::Cancel(i) if !leases.is_empty() => {
                let id = leases.swap_remove(i as usize % leases.len());
                book.cancel(&id, now);
            }
            Op::Report(i, outcome) if !leases.is_empty() => {
                let id = &leases[i as usize % leases.len()];
                let outcome = [Outcome::Ok, Outcome::Blocked, Outcome::Error][outcome as usize];
                let _ = book.report(id, outcome, None, now);
            }
            Op::Health {
                proxy,
                ready,
                latency,
            } => {
                book.upsert(
                    availability(proxy as usize % proxies, ready, u64::from(latency % 8)),
                    now,
                );
            }
            Op::Wait(seconds) => {
                now += Duration::from_secs(u64::from(seconds));
                book.sweep(now);
                leases.retain(|id| book.leases.contains_key(id));
            }
            _ => {}
        }
    }
    Ok(())
}

proptest! {
    /// Whatever happened before, an acquire grants the proxy the rule names
    /// (or none when the rule names none). Hot-target walks, rest queues and
    /// idle lists are only ways of finding it faster.
    #[test]
    fn selection_matches_the_rule(capacity in 1u32..3, ops in proptest::collection::vec(op(), 1..200)) {
        run(capacity, 12, ops)?;
    }

    /// The same with a fleet large enough for targets to turn hot
    /// (a starting point for the walk, returns noted before it).
    #[test]
    fn hot_selection_matches_the_rule(capacity in 1u32..3, ops in proptest::collection::vec(op(), 100..400)) {
        run(capacity, 3 * HOT_WALK, ops)?;
    }
}

#[test]
fn a_hot_target_never_walks_past_its_resting_proxies() {
    const PROXIES: usize = 10_000;
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    for i in 0..PROXIES {
        book.upsert(availability(i, true, (i % 200) as u64), t0);
    }
    // One never-used proxy that is not ready: it must not make every walk long.
    book.upsert(availability(PROXIES, false, 0), t0);
    let hot = ask("hot.example", None);
    let mut longest = 0;
    let mut now = t0;
    // Every proxy leased once and released: all rest 30 s for the target.
    for _ in 0..PROXIES {
        now += Duration::from_micros(10);
        let grant = book.acquire(&hot, now).expect("a proxy not used yet");
        longest = longest.max(book.last_walk);
        book.release(&grant.id, now);
    }
    assert!(longest <= HOT_WALK + 2, "warming up walked {longest}");
    for _ in 0..1_000 {
        assert!(matches!(
            book.acquire(&hot, now),
            Err(AcquireError::NoCapacity { .. })
        ));
        assert!(book.last_walk <= 2, "a refusal walked {}", book.last_walk);
    }
    // The not-ready one becomes ready: it is found at once.
    book.upsert(availability(PROXIES, true, 0), now);
    let grant = book.acquire(&hot, now).unwrap();
    assert_eq!(grant.proxy.name, format!("p{PROXIES}"));
    assert!(book.last_walk <= 2, "walked {}", book.last_walk);
    // Rests end in the order they began: the proxy leased longest ago comes first.
    now += Duration::from_secs(31);
    let grant = book.acquire(&hot, now).unwrap();
    assert_eq!(grant.proxy.name, "p0");
    assert!(book.last_walk <= 2, "walked {}", book.last_walk);
}

#[test]
fn a_session_lands_on_the_proxy_ranking_highest_for_it_in_any_book() {
    let t0 = Instant::now();
    let fleet: Vec<Availability> = (0..6).map(|i| availability(i, true, i as u64)).collect();
    // Two books that learnt the same fleet in opposite orders, with other latencies.
    let (mut one, mut other) = (
        LeaseBook::new(settings(2), crate::now::Now::read()),
        LeaseBook::new(settings(2), crate::now::Now::read()),
    );
    for a in &fleet {
        one.upsert(a.clone(), t0);
    }
    for a in fleet.iter().rev() {
        other.upsert(
            Availability {
                latency: Some(Duration::from_millis(50)),
                ..a.clone()
            },
            t0,
        );
    }
    let ranked = |session: u64| -> Vec<String> {
        let mut names: Vec<&ObjectKey> = fleet.iter().map(|a| &a.key).collect();
        names.sort_by_key(|k| std::cmp::Reverse(rendezvous::rank(session, rendezvous::proxy_digest(k))));
        names.iter().map(|k| k.name.clone()).collect()
    };
    let session = |id: &str| AcquireRequest {
        session: Some(rendezvous::session_digest("spider", id)),
        ..ask("t", None)
    };
    let mut landed = std::collections::BTreeSet::new();
    for i in 0..12 {
        let id = format!("s{i}");
        let digest = rendezvous::session_digest("spider", &id);
        let (a, b) = (
            one.acquire(&session(&id), t0).unwrap(),
            other.acquire(&session(&id), t0).unwrap(),
        );
        assert_eq!(a.proxy.name, ranked(digest)[0], "{id}: its first-ranked proxy");
        assert_eq!(a.proxy, b.proxy, "{id}: the same proxy in both books");
        one.release(&a.id, t0);
        other.release(&b.id, t0);
        landed.insert(a.proxy.name);
    }
    assert!(landed.len() >= 3, "sessions spread over the fleet: {landed:?}");

    let digest = rendezvous::session_digest("spider", "s0");
    let order = ranked(digest);
    let by_name = |name: &str| AcquireRequest {
        prefer: Some(ObjectKey::new("ns", name)),
        ..ask("t", None)
    };
    // Its first proxy full (capacity 2): the second, not the least busy.
    let holds = [
        one.acquire(&by_name(&order[0]), t0).unwrap(),
        one.acquire(&by_name(&order[0]), t0).unwrap(),
    ];
    assert_eq!(one.acquire(&session("s0"), t0).unwrap().proxy.name, order[1]);
    for held in holds {
        one.release(&held.id, t0);
    }
    // Its own proxy, while eligible, before any rank.
    let own = AcquireRequest {
        prefer: Some(ObjectKey::new("ns", order[4].as_str())),
        ..session("s0")
    };
    assert_eq!(one.acquire(&own, t0).unwrap().proxy.name, order[4]);
    // Blocked for the target: the next in rank for it, for good.
    let first = one.acquire(&session("s0"), t0).unwrap();
    assert_eq!(first.proxy.name, order[0]);
    one.report(&first.id, Outcome::Blocked, None, t0).unwrap();
    one.release(&first.id, t0);
    let later = t0 + Duration::from_secs(7200);
    assert_eq!(one.acquire(&session("s0"), later).unwrap().proxy.name, order[1]);
}

#[test]
fn a_preferred_proxy_is_granted_only_while_eligible() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    for i in 0..4 {
        book.upsert(availability(i, true, i as u64), t0);
    }
    let prefer = |name: &str, geo: Option<&str>| AcquireRequest {
        prefer: Some(ObjectKey::new("ns", name)),
        ..ask("t", geo)
    };
    // Not the best (p0 is faster), but eligible: granted.
    let sticky = book.acquire(&prefer("p3", None), t0).unwrap();
    assert_eq!(sticky.proxy.name, "p3");
    // Full (capacity 1): the best other proxy instead.
    assert_eq!(book.acquire(&prefer("p3", None), t0).unwrap().proxy.name, "p0");
    book.release(&sticky.id, t0);
    // Resting for the target after its own release: still the session's.
    let again = book.acquire(&prefer("p3", None), t0).unwrap();
    assert_eq!(again.proxy.name, "p3");
    // Blocked for the target: never again for it.
    book.report(&again.id, Outcome::Blocked, None, t0).unwrap();
    book.release(&again.id, t0);
    assert_ne!(book.acquire(&prefer("p3", None), t0).unwrap().proxy.name, "p3");
    // Not matching the selector (p3 is "us"): never granted against it.
    let eu = book.acquire(&prefer("p3", Some("eu")), t0).unwrap();
    assert_eq!(eu.proxy.name, "p2");
    // Not ready (after every rest is over): the best other one.
    let later = t0 + Duration::from_secs(3600);
    book.sweep(later);
    let later = later + Duration::from_secs(3600); // the expired leases' rests too
    book.upsert(availability(3, false, 3), later);
    assert_ne!(book.acquire(&prefer("p3", None), later).unwrap().proxy.name, "p3");
    // Unknown: the best one.
    assert!(book.acquire(&prefer("nope", None), later).is_ok());
}

/// Grants until refused, each for a target never asked for before (so no
/// rest stands in the way).
fn grants_until_refused(book: &mut LeaseBook, now: Instant) -> Vec<Grant> {
    let mut grants = Vec::new();
    loop {
        let fresh = format!("share-t{}", book.targets.len());
        match book.acquire(&ask(&fresh, None), now) {
            Ok(grant) => grants.push(grant),
            Err(AcquireError::NoCapacity { .. }) => break,
            Err(e) => panic!("unexpected {e}"),
        }
        if grants.len() >= 10 {
            break;
        }
    }
    grants
}

#[test]
fn in_share_mode_a_proxy_carries_only_the_slots_granted_to_the_book() {
    let t0 = Instant::now();
    let p0 = ObjectKey::new("ns", "p0");
    // (why, capacity, granted: None = whole, leases granted)
    let rows = [
        ("whole capacity (no share mode)", 2, None, 2),
        (
            "share mode, nothing granted: known but never leased",
            2,
            Some(0),
            0,
        ),
        ("granted one of two", 2, Some(1), 1),
        ("granted both", 2, Some(2), 2),
        ("granted more than the capacity: the capacity", 2, Some(3), 2),
        ("unlimited here, nothing granted yet: nothing", 0, Some(0), 0),
        ("unlimited here, granted 2 by the leader: 2", 0, Some(2), 2),
        ("unlimited, whole (the leader's `unlimited`)", 0, None, 10),
    ];
    for (why, capacity, granted, expected) in rows {
        let mut book = LeaseBook::new(settings(capacity), crate::now::Now::read());
        book.upsert(availability(0, true, 1), t0);
        if let Some(n) = granted {
            book.set_slots(&p0, n, t0);
        }
        let grants = grants_until_refused(&mut book, t0);
        assert_eq!(grants.len(), expected, "{why}");
        assert_eq!(book.proxies().len(), 1, "{why}: listed all the same");
        let fleet_slots = if granted.is_none() && capacity == 0 {
            0
        } else {
            expected as u64
        };
        assert_eq!(
            book.slots(),
            fleet_slots,
            "{why}: the fleet's slots in this book (0: unlimited)"
        );
        assert_eq!(
            book.would_serve(&ask("other", None), &p0, t0),
            expected > 0,
            "{why}: a lease taken back frees a slot here only if it has one"
        );
    }
}

#[test]
fn a_proxy_without_slots_still_ranks_and_rests() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(2), crate::now::Now::read());
    book.set_share_mode(true, t0);
    for i in 0..2 {
        book.upsert(availability(i, true, i as u64), t0);
    }
    let (p0, p1) = (ObjectKey::new("ns", "p0"), ObjectKey::new("ns", "p1"));
    book.set_slots(&p1, 2, t0);
    // A session ranking p0 first lands on p1: p0 has no slots here.
    let session = AcquireRequest {
        prefer: Some(p0.clone()),
        ..ask("t", None)
    };
    assert_eq!(book.acquire(&session, t0).unwrap().proxy, p1);
    // p0 granted later: leased, and a release rests it for the target as ever.
    book.set_slots(&p0, 1, t0);
    let lease = book.acquire(&session, t0).unwrap();
    assert_eq!(lease.proxy, p0);
    book.release(&lease.id, t0);
    assert!(!book.would_serve(&ask("t", None), &p0, t0), "resting for t");
    assert!(book.would_serve(&ask("u", None), &p0, t0));
}

#[test]
fn a_lowered_share_keeps_its_leases_but_grants_nothing_new_until_below() {
    let t0 = Instant::now();
    let p0 = ObjectKey::new("ns", "p0");
    let mut book = LeaseBook::new(settings(2), crate::now::Now::read());
    book.upsert(availability(0, true, 1), t0);
    book.set_slots(&p0, 2, t0);
    let held = grants_until_refused(&mut book, t0);
    assert_eq!(held.len(), 2);
    book.set_slots(&p0, 1, t0);
    assert_eq!(book.leases_on(&p0), 2, "lowering ends no lease");
    assert_eq!(
        book.claims(),
        vec![Claim {
            key: p0.clone(),
            slots: 1,
            in_use: 2
        }]
    );
    assert_eq!(
        book.claims()[0].counted(),
        2,
        "the leader counts the leases in use"
    );
    assert!(grants_until_refused(&mut book, t0).is_empty(), "over its share");
    book.release(&held[0].id, t0);
    assert!(grants_until_refused(&mut book, t0).is_empty(), "at its share");
    book.release(&held[1].id, t0);
    assert_eq!(grants_until_refused(&mut book, t0).len(), 1, "below it: one");
}

#[test]
fn claims_name_every_proxy_with_slots_or_leases_known_or_not() {
    let t0 = Instant::now();
    let (p0, p1, p2, later) = (
        ObjectKey::new("ns", "p0"),
        ObjectKey::new("ns", "p1"),
        ObjectKey::new("ns", "p2"),
        ObjectKey::new("ns", "not-seen-yet"),
    );
    let mut book = LeaseBook::new(settings(3), crate::now::Now::read());
    for i in 0..3 {
        book.upsert(availability(i, true, i as u64), t0);
    }
    book.set_all_slots(
        &BTreeMap::from([(p0.clone(), 2), (p1.clone(), 0), (later.clone(), 1)]),
        t0,
    );
    assert_eq!(book.slots(), 2, "only the slots on known serving proxies");
    let lease = book.acquire(&ask("t", None), t0).unwrap();
    assert_eq!(lease.proxy, p0);
    let claim = |key: &ObjectKey, slots, in_use| Claim {
        key: key.clone(),
        slots,
        in_use,
    };
    assert_eq!(book.claims(), vec![claim(&later, 1, 0), claim(&p0, 2, 1)]);
    // The proxy granted before it was known gets its slot when it shows up.
    book.upsert(
        Availability {
            key: later.clone(),
            ..availability(9, true, 0)
        },
        t0,
    );
    assert_eq!(book.slots(), 3);
    // A new allocation replaces the whole: p0 lowered to none, p2 granted.
    book.set_all_slots(&BTreeMap::from([(p2.clone(), 1)]), t0);
    assert_eq!(book.claims(), vec![claim(&p0, 0, 1), claim(&p2, 1, 0)]);
    assert_eq!(book.slots(), 1);
    // Out of share mode: the whole capacity again, leases kept.
    book.set_share_mode(false, t0);
    assert_eq!(book.slots(), 4 * 3);
    assert_eq!(book.leases_on(&p0), 1);
    // A rebuilt book keeps its shares.
    book.set_all_slots(&BTreeMap::from([(p1.clone(), 1)]), t0);
    let rebuilt = book.rebuilt(t0);
    assert_eq!(rebuilt.claims(), book.claims());
    assert_eq!(rebuilt.slots(), 1);
}

#[test]
fn a_pool_full_by_its_shares_counts_a_denial() {
    let t0 = Instant::now();
    let pool = |i: usize| Availability {
        attributes: BTreeMap::from([(crate::resource::POOL_LABEL.to_owned(), "pool-a".to_owned())]),
        ..availability(i, true, 1)
    };
    let mut book = LeaseBook::new(settings(2), crate::now::Now::read());
    book.set_share_mode(true, t0);
    book.upsert(pool(0), t0);
    let req = AcquireRequest {
        selector: BTreeMap::from([(crate::resource::POOL_LABEL.to_owned(), "pool-a".to_owned())]),
        ..ask("t", None)
    };
    assert!(book.acquire(&req, t0).is_err());
    assert_eq!(
        book.take_pool_denials("pool-a"),
        1,
        "no slots here: the pool is full for this replica"
    );
}

#[test]
fn the_book_tells_the_fleet_its_rests_and_tallies_but_not_its_pacing() {
    use crate::lease::fleet::FleetChange;
    use crate::lease::journal::ProxyTally;
    let t0 = Instant::now();
    let p0 = ObjectKey::new("ns", "p0");
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.upsert(availability(0, true, 1), t0);
    let lease = book.acquire(&ask("t", None), t0).unwrap();
    book.release(&lease.id, t0);
    assert!(book.take_fleet_changes().is_empty(), "only once asked for");
    book.share_fleet_changes();
    let rest = |target: &str, secs: u64| FleetChange::TargetRest {
        target: target.into(),
        proxy: p0.clone(),
        remaining: Duration::from_secs(secs),
    };
    let tally = |blocked: &[u64], errors: u32| {
        FleetChange::Tally(ProxyTally {
            proxy: p0.clone(),
            blocked_targets: blocked.to_vec(),
            errors,
        })
    };
    // (why, what the book does, what the fleet is told)
    type Act = Box<dyn Fn(&mut LeaseBook, Instant)>;
    let lease_for = |target: &'static str| {
        move |book: &mut LeaseBook, now: Instant| book.acquire(&ask(target, None), now).unwrap().id
    };
    let rows: Vec<(&str, Act, Vec<FleetChange>)> = vec![
        (
            "a release: the cooldown",
            Box::new(move |b, now| {
                let id = lease_for("u")(b, now);
                b.release(&id, now);
            }),
            vec![rest("u", 30)],
        ),
        (
            "the gateway's pacing under a second: local",
            Box::new(move |b, now| {
                let id = lease_for("v")(b, now);
                b.release_with_rest(&id, Duration::from_millis(300), now);
            }),
            vec![],
        ),
        (
            "a grant taken back: no rest",
            Box::new(move |b, now| {
                let id = lease_for("w")(b, now);
                b.cancel(&id, now);
            }),
            vec![],
        ),
        (
            "blocked: the target's digest and the long rest",
            Box::new(move |b, now| {
                let id = lease_for("x")(b, now);
                b.report(&id, Outcome::Blocked, None, now).unwrap();
                b.cancel(&id, now);
            }),
            vec![tally(&[target_digest("x")], 0), rest("x", 600)],
        ),
        (
            "an error: the count and a rest everywhere",
            Box::new(move |b, now| {
                let id = lease_for("y")(b, now);
                b.report(&id, Outcome::Error, None, now).unwrap();
                b.cancel(&id, now);
            }),
            vec![
                tally(&[], 1),
                FleetChange::ProxyRest {
                    proxy: p0.clone(),
                    remaining: Duration::from_secs(60),
                },
            ],
        ),
    ];
    let mut now = t0;
    for (why, act, told) in rows {
        now += Duration::from_secs(3600); // every rest before is over
        act(&mut book, now);
        assert_eq!(book.take_fleet_changes(), told, "{why}");
    }
    // Restoring a journal tells nothing (the replica that made it did).
    let snapshot = book.snapshot(now);
    let mut restored = LeaseBook::new(settings(1), crate::now::Now::read());
    restored.share_fleet_changes();
    restored.restore(snapshot, now);
    assert!(restored.take_fleet_changes().is_empty());
}

#[test]
fn another_replicas_changes_apply_as_sets_unjournaled_and_not_passed_on() {
    use crate::lease::fleet::FleetChange;
    use crate::lease::journal::ProxyTally;
    let t0 = Instant::now();
    let (p0, p1) = (ObjectKey::new("ns", "p0"), ObjectKey::new("ns", "p1"));
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.journal_changes();
    book.share_fleet_changes();
    for i in 0..2 {
        book.upsert(availability(i, true, i as u64), t0);
    }
    let rest = |secs: u64| FleetChange::TargetRest {
        target: "t".into(),
        proxy: p0.clone(),
        remaining: Duration::from_secs(secs),
    };
    // (why, change, p0 serves "t" at +20 s, at +40 s)
    let rows = [
        ("a rest for the target", rest(30), false, true),
        ("the same again: nothing more", rest(30), false, true),
        ("ending sooner: the later end stays", rest(5), false, true),
        ("ending later: the later end", rest(50), false, false),
    ];
    for (why, change, at_20, at_40) in rows {
        book.apply_remote(&change, t0);
        let serves = |s| book.would_serve(&ask("t", None), &p0, t0 + Duration::from_secs(s));
        assert_eq!((serves(20), serves(40)), (at_20, at_40), "{why}");
        assert!(
            book.would_serve(&ask("other", None), &p0, t0),
            "{why}: only for the target"
        );
    }
    book.apply_remote(
        &FleetChange::ProxyRest {
            proxy: p1.clone(),
            remaining: Duration::from_secs(60),
        },
        t0,
    );
    assert_eq!(
        book.acquire(&ask("t", None), t0).map(|g| g.proxy),
        Err(AcquireError::NoCapacity { target: "t".into() }),
        "p0 rests for t, p1 everywhere"
    );
    let tally = |blocked: &[u64], errors: u32| {
        FleetChange::Tally(ProxyTally {
            proxy: p1.clone(),
            blocked_targets: blocked.to_vec(),
            errors,
        })
    };
    for change in [tally(&[1, 2], 3), tally(&[1], 3), tally(&[2, 3], 1)] {
        book.apply_remote(&change, t0);
    }
    let figures = book.pool_figures("none", std::slice::from_ref(&p1)).members[&p1];
    assert_eq!(
        (figures.blocked_targets, figures.errors),
        (3, 3),
        "united, the larger count"
    );
    // A proxy this replica does not know yet: kept, not listed.
    book.apply_remote(&rest(30), t0);
    book.apply_remote(
        &FleetChange::ProxyRest {
            proxy: ObjectKey::new("ns", "later"),
            remaining: Duration::from_secs(60),
        },
        t0,
    );
    assert_eq!(book.proxies().len(), 2);
    assert!(
        book.take_changes().is_empty(),
        "the replica that made them journals them"
    );
    assert!(book.take_fleet_changes().is_empty(), "not passed on again");
}

/// Hands out the same bytes every time, or fails.
struct FixedRandom(Option<u8>);

impl crate::credentials::RandomSource for FixedRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), crate::credentials::CredentialsError> {
        let byte = self
            .0
            .ok_or_else(|| crate::credentials::CredentialsError::Random("no entropy".into()))?;
        buf.fill(byte);
        Ok(())
    }
}

#[test]
fn lease_ids_name_the_member_and_draw_from_the_source_given() {
    use crate::lease::lease_id::tag_of;
    use crate::membership::MemberTag;
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(availability(0, true, 1), t0);
    let plain = book.acquire(&ask("t", None), t0).unwrap();
    assert_eq!(tag_of(&plain.id), None, "a book that is the only one: no member");
    let tag = MemberTag::of("operator-1", &[9; 8]);
    book.set_member(tag.clone());
    book.set_random(std::sync::Arc::new(FixedRandom(Some(0x5a))));
    let tagged = book.acquire(&ask("t", None), t0).unwrap();
    assert_eq!(tag_of(&tagged.id), Some(tag.clone()));
    assert_eq!(
        tagged.id,
        crate::lease::lease_id::make(Some(&tag), [0x5a; 16]),
        "from the source"
    );
    assert_eq!(
        book.rebuilt(t0).member(),
        Some(&tag),
        "a rebuilt book keeps its member"
    );
    book.set_random(std::sync::Arc::new(FixedRandom(None)));
    assert!(matches!(
        book.acquire(&ask("t", None), t0),
        Err(AcquireError::Unavailable(_))
    ));
}

#[test]
fn a_leader_adopts_a_dead_replicas_journal_and_journals_it_as_its_own() {
    use crate::lease::journal::LeaseChange;
    let t0 = Instant::now();
    let opened = crate::now::Now::read();
    let (p0, p1) = (ObjectKey::new("ns", "p0"), ObjectKey::new("ns", "p1"));
    let fleet = |book: &mut LeaseBook| {
        for i in 0..2 {
            book.upsert(availability(i, true, i as u64), t0);
        }
    };
    let on = |proxy: &ObjectKey, target: &str| AcquireRequest {
        prefer: Some(proxy.clone()),
        ..ask(target, None)
    };
    // The dead replica: two API leases, a tunnel, an ended lease, a block and an error.
    let mut dead = LeaseBook::new(settings(0), opened);
    fleet(&mut dead);
    let held = [
        dead.acquire(&on(&p0, "a"), t0).unwrap(),
        dead.acquire(&on(&p1, "a"), t0).unwrap(),
    ];
    let tunnel = dead
        .acquire(
            &AcquireRequest {
                client: Some("gateway".into()),
                ..on(&p0, "g")
            },
            t0,
        )
        .unwrap();
    let ended = dead.acquire(&on(&p1, "e"), t0).unwrap();
    dead.report(&ended.id, Outcome::Blocked, None, t0).unwrap();
    dead.report(&ended.id, Outcome::Error, None, t0).unwrap();
    dead.release(&ended.id, t0);
    // The leader: a lease of its own, its own block on p1, a longer rest for "e".
    let mut leader = LeaseBook::new(settings(0), opened);
    fleet(&mut leader);
    let own = leader.acquire(&on(&p1, "e"), t0).unwrap();
    leader.report(&own.id, Outcome::Blocked, None, t0).unwrap();
    leader.release_with_rest(&own.id, Duration::from_secs(7200), t0);
    leader.journal_changes();
    leader.share_fleet_changes();

    let now = t0 + Duration::from_secs(1);
    leader.adopt(dead.snapshot(now), now);
    assert_eq!(leader.active_leases(), 2, "both API leases, not the tunnel");
    assert_eq!((leader.leases_on(&p0), leader.leases_on(&p1)), (1, 1));
    assert!(leader.report_counts(&tunnel.id).is_none());
    let changes = leader.take_changes();
    for lease in &held {
        assert!(
            changes
                .iter()
                .any(|c| matches!(c, LeaseChange::Granted(r) if r.id == lease.id)),
            "{} journaled here: {changes:?}",
            lease.id
        );
    }
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, LeaseChange::Ended(r) if r.id == ended.id))
    );
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, LeaseChange::Errors { count: 1, .. }))
    );
    assert!(changes.iter().any(|c| matches!(c, LeaseChange::ProxyRest { .. })));
    assert!(
        !leader.take_fleet_changes().is_empty(),
        "the rests and tallies go out again"
    );
    // The blocks united: the leader's target and the dead replica's are the same ("e").
    let figures = leader.pool_figures("none", std::slice::from_ref(&p1)).members[&p1];
    assert_eq!(
        (figures.blocked_targets, figures.errors, figures.leases),
        (1, 1, 1)
    );
    // The leader's longer rest for "e" stays; the adopted ones act here.
    let later = now + Duration::from_secs(3600);
    assert!(
        !leader.would_serve(&ask("e", None), &p1, later),
        "the longer rest stays"
    );
    assert!(
        !leader.would_serve(&ask("x", None), &p1, now),
        "the error's rest everywhere"
    );
    // The adopted leases are the leader's to end and report on.
    assert!(
        leader.report(&ended.id, Outcome::Ok, None, now).is_ok(),
        "an ended one in its grace"
    );
    assert!(leader.release(&held[0].id, now));
    leader.take_changes();
    // Adopting again adds nothing (the released one stays released).
    leader.adopt(dead.snapshot(now), now);
    assert_eq!(leader.active_leases(), 1);
    assert!(
        !leader
            .take_changes()
            .iter()
            .any(|c| matches!(c, LeaseChange::Granted(_) | LeaseChange::Ended(_))),
        "nothing new to journal"
    );
}
