//! The lease book's rules and invariants.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::resource::ObjectKey;

fn settings(capacity: u32) -> LeaseSettings {
    LeaseSettings {
        cooldown: Duration::from_secs(30),
        blocked_cooldown: Duration::from_secs(600),
        error_cooldown: Duration::from_secs(60),
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        capacity,
        report_grace: Duration::from_secs(600),
    }
}

fn proxy(name: &str, ready: bool, latency_ms: u64, attrs: &[(&str, &str)]) -> Availability {
    Availability {
        key: ObjectKey::new("ns", name),
        ready,
        phase: if ready { "Ready" } else { "Unhealthy" }.into(),
        healthy: Some(ready),
        url: Some(format!("http://{name}:3128")),
        attributes: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        latency: Some(Duration::from_millis(latency_ms)),
        credentials: None,
        realm: None,
        retiring: false,
    }
}

fn req(target: &str) -> AcquireRequest {
    AcquireRequest {
        target: target.into(),
        ..Default::default()
    }
}

fn name(grant: &Grant) -> &str {
    &grant.proxy.name
}

#[test]
fn tie_breaks_fewest_leases_then_longest_unused_for_target_then_latency() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(proxy("slow", true, 90, &[]), t0);
    book.upsert(proxy("fast", true, 10, &[]), t0);
    book.upsert(proxy("mid", true, 50, &[]), t0);

    // Equal load, never leased for the target: lowest latency.
    let a = book.acquire(&req("t"), t0).unwrap();
    assert_eq!(name(&a), "fast");
    // Fewest active leases beats latency.
    let b = book.acquire(&req("t"), t0).unwrap();
    assert_eq!(name(&b), "mid");
    let c = book.acquire(&req("t"), t0).unwrap();
    assert_eq!(name(&c), "slow");
    // All at one lease, all leased for "t": the one leased longest ago for "t".
    let d = book.acquire(&req("t"), t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(name(&d), "fast");
    // For another target nothing was leased yet: back to latency among the least loaded.
    book.release(&d.id, t0 + Duration::from_secs(2));
    let e = book.acquire(&req("other"), t0 + Duration::from_secs(2)).unwrap();
    assert_eq!(name(&e), "fast");
}

#[test]
fn capacity_readiness_and_selectors_decide_eligibility() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.upsert(proxy("eu", true, 10, &[("geo", "eu")]), t0);
    book.upsert(proxy("us", true, 10, &[("geo", "us")]), t0);
    book.upsert(proxy("down", false, 1, &[("geo", "eu")]), t0);
    let mut eu = req("t");
    eu.selector = BTreeMap::from([("geo".to_owned(), "eu".to_owned())]);
    assert_eq!(name(&book.acquire(&eu, t0).unwrap()), "eu");
    assert_eq!(
        book.acquire(&eu, t0),
        Err(AcquireError::NoCapacity { target: "t".into() }),
        "eu is at capacity and the other eu proxy is not ready"
    );
    assert_eq!(name(&book.acquire(&req("t"), t0).unwrap()), "us");
    assert_eq!(
        book.acquire(&req("t"), t0),
        Err(AcquireError::NoCapacity { target: "t".into() })
    );
    // A proxy becoming ready joins at once.
    book.upsert(proxy("down", true, 1, &[("geo", "eu")]), t0);
    assert_eq!(name(&book.acquire(&eu, t0).unwrap()), "down");
}

#[test]
fn release_is_idempotent_and_rests_the_proxy_for_that_target_only() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let lease = book.acquire(&req("a.example"), t0).unwrap();
    assert!(book.release(&lease.id, t0));
    assert!(!book.release(&lease.id, t0), "second release is a no-op");
    assert_eq!(book.leases_on(&ObjectKey::new("ns", "p")), 0);
    assert!(
        book.acquire(&req("a.example"), t0 + Duration::from_secs(29))
            .is_err(),
        "cooling for a.example"
    );
    let other = book
        .acquire(&req("b.example"), t0 + Duration::from_secs(1))
        .unwrap();
    book.release(&other.id, t0 + Duration::from_secs(1));
    assert!(
        book.acquire(&req("a.example"), t0 + Duration::from_secs(31))
            .is_ok(),
        "cooldown over"
    );
}

#[test]
fn reports_blocked_rests_for_the_target_longer_and_error_rests_everywhere() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let lease = book.acquire(&req("shop"), t0).unwrap();
    book.report(&lease.id, Outcome::Blocked, Some("captcha".into()), t0)
        .unwrap();
    book.release(&lease.id, t0);
    let later = t0 + Duration::from_secs(120);
    assert!(
        book.acquire(&req("shop"), later).is_err(),
        "blocked: 10 minutes for that target"
    );
    let news = book.acquire(&req("news"), later).unwrap();
    book.report(&news.id, Outcome::Error, None, later).unwrap();
    assert!(
        book.acquire(&req("other"), later + Duration::from_secs(59))
            .is_err(),
        "error: rests for every target"
    );
    assert!(
        book.acquire(&req("other"), later + Duration::from_secs(61))
            .is_ok()
    );
    assert!(book.acquire(&req("shop"), t0 + Duration::from_secs(601)).is_ok());
    assert_eq!(
        book.report("nope", Outcome::Ok, None, t0),
        Err(UnknownLease("nope".into()))
    );
    // A report just after the release still counts; long after, the lease is unknown.
    book.release(&news.id, later);
    assert!(
        book.report(&news.id, Outcome::Ok, None, later + Duration::from_secs(1))
            .is_ok()
    );
    book.sweep(later + Duration::from_secs(601));
    assert!(
        book.report(&news.id, Outcome::Ok, None, later + Duration::from_secs(601))
            .is_err()
    );
}

#[test]
fn ttl_is_capped_and_expiry_frees_capacity() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let mut r = req("t");
    r.ttl = Some(Duration::from_secs(86_400));
    let lease = book.acquire(&r, t0).unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(600));
    assert_eq!(book.sweep(t0 + Duration::from_secs(599)), 0);
    assert_eq!(book.sweep(t0 + Duration::from_secs(600)), 1);
    assert_eq!(book.active_leases(), 0);
    assert!(book.acquire(&req("other"), t0 + Duration::from_secs(600)).is_ok());
    r.ttl = Some(Duration::ZERO);
    assert_eq!(book.acquire(&r, t0), Err(AcquireError::ZeroTtl));
    assert_eq!(book.acquire(&req(""), t0), Err(AcquireError::EmptyTarget));
}

#[test]
fn removing_a_proxy_ends_its_leases() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[("geo", "eu")]), t0);
    let lease = book.acquire(&req("t"), t0).unwrap();
    book.remove(&ObjectKey::new("ns", "p"), t0);
    assert_eq!(book.active_leases(), 0);
    assert!(book.proxies().is_empty());
    let mut eu = req("t");
    eu.selector.insert("geo".into(), "eu".into());
    assert!(book.acquire(&eu, t0).is_err());
    assert!(!book.release(&lease.id, t0));
}

#[derive(Clone, Debug)]
enum Op {
    Upsert {
        proxy: u8,
        ready: bool,
        latency: u8,
        geo: u8,
    },
    Remove(u8),
    Acquire {
        target: u8,
        geo: Option<u8>,
        ttl: u8,
    },
    Release(u8),
    Report(u8, u8),
    Renew(u8, Option<u8>),
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12, any::<bool>(), any::<u8>(), 0u8..3).prop_map(|(proxy, ready, latency, geo)| Op::Upsert {
            proxy,
            ready,
            latency,
            geo
        }),
        (0u8..12).prop_map(Op::Remove),
        (0u8..4, proptest::option::of(0u8..3), 0u8..120).prop_map(|(target, geo, ttl)| Op::Acquire {
            target,
            geo,
            ttl
        }),
        any::<u8>().prop_map(Op::Release),
        (any::<u8>(), 0u8..3).prop_map(|(l, o)| Op::Report(l, o)),
        (any::<u8>(), proptest::option::of(1u8..120)).prop_map(|(l, t)| Op::Renew(l, t)),
        (0u8..90).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Whatever happens: no proxy above capacity, no lease granted on an
    /// ineligible proxy, expiry and release free capacity, release idempotent,
    /// renewals move expiry — also with tables so small that the book must
    /// forget targets and ended leases all the time (a rest is never forgotten).
    #[test]
    fn invariants_hold_under_any_sequence(
        capacity in 0u32..3,
        limits in (1usize..6, 1usize..4, 0usize..4),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let s = settings(capacity);
        let limits = LeaseLimits { max_leases: 64, max_targets: limits.0, max_ended: limits.1, recent_reports: limits.2 };
        let mut book = LeaseBook::with_limits(s, limits, crate::now::Now::read());
        let mut ready: BTreeMap<u8, (bool, u8)> = BTreeMap::new();
        let mut granted: Vec<(String, u8, u8, Instant)> = Vec::new(); // id, proxy, target, expires
        let mut released: Vec<String> = Vec::new();
        let mut cooling: BTreeMap<(u8, u8), Instant> = BTreeMap::new(); // (proxy, target) -> until
        for op in ops {
            match op {
                Op::Upsert { proxy: p, ready: r, latency, geo } => {
                    let geo_s = geo.to_string();
                    book.upsert(proxy(&p.to_string(), r, latency as u64, &[("geo", geo_s.as_str())]), now);
                    ready.insert(p, (r, geo));
                }
                Op::Remove(p) => {
                    book.remove(&ObjectKey::new("ns", p.to_string()), now);
                    ready.remove(&p);
                    granted.retain(|g| g.1 != p);
                    // A proxy created again later is a new proxy: no history.
                    cooling.retain(|(cp, _), _| *cp != p);
                }
                Op::Acquire { target, geo, ttl } => {
                    let mut r = req(&format!("t{target}"));
                    if let Some(g) = geo { r.selector.insert("geo".into(), g.to_string()); }
                    r.ttl = Some(Duration::from_secs(ttl as u64 + 1));
                    book.sweep(now);
                    granted.retain(|g| g.3 > now);
                    if let Ok(grant) = book.acquire(&r, now) {
                        let p: u8 = grant.proxy.name.parse().unwrap();
                        let (is_ready, pgeo) = ready[&p];
                        prop_assert!(is_ready, "leased a proxy that is not ready");
                        if let Some(g) = geo { prop_assert_eq!(pgeo, g, "selector ignored"); }
                        prop_assert!(cooling.get(&(p, target)).is_none_or(|until| *until <= now), "leased while cooling for the target");
                        granted.push((grant.id, p, target, now + grant.ttl));
                    }
                }
                Op::Release(i) => {
                    if !granted.is_empty() {
                        let (id, p, t, _) = granted.remove(i as usize % granted.len());
                        prop_assert!(book.release(&id, now));
                        prop_assert!(!book.release(&id, now), "release is idempotent");
                        let until = cooling.get(&(p, t)).copied().unwrap_or(now).max(now + s.cooldown);
                        cooling.insert((p, t), until);
                        released.push(id);
                    } else if let Some(id) = released.last() {
                        prop_assert!(!book.release(id, now));
                    }
                }
                Op::Report(i, outcome) => {
                    if !granted.is_empty() {
                        let (id, p, t, _) = &granted[i as usize % granted.len()];
                        let outcome = [Outcome::Ok, Outcome::Blocked, Outcome::Error][outcome as usize];
                        prop_assert!(book.report(id, outcome, None, now).is_ok());
                        if outcome == Outcome::Blocked {
                            let until = cooling.get(&(*p, *t)).copied().unwrap_or(now).max(now + s.blocked_cooldown);
                            cooling.insert((*p, *t), until);
                        }
                    }
                }
                Op::Renew(i, ttl) => {
                    if !granted.is_empty() {
                        let i = i as usize % granted.len();
                        let ttl = ttl.map(|t| Duration::from_secs(t as u64));
                        let applied = book.renew(&granted[i].0, ttl, now).unwrap();
                        prop_assert!(applied <= s.max_ttl);
                        granted[i].3 = now + applied;
                    }
                }
                Op::Advance(secs) => {
                    now += Duration::from_secs(secs as u64);
                    book.sweep(now);
                    // Expired leases end at the sweep, which rests their proxy like a release.
                    for (id, p, t, _) in granted.iter().filter(|g| g.3 <= now) {
                        prop_assert!(!book.release(id, now), "expired leases are gone");
                        let until = cooling.get(&(*p, *t)).copied().unwrap_or(now).max(now + s.cooldown);
                        cooling.insert((*p, *t), until);
                    }
                    granted.retain(|g| g.3 > now);
                }
            }
            if capacity > 0 {
                for view in book.proxies() {
                    prop_assert!(view.active_leases <= capacity, "{} over capacity", view.availability.key);
                }
            }
            prop_assert_eq!(book.active_leases(), granted.len());
            let size = book.footprint();
            prop_assert!(size.ended <= limits.max_ended);
            prop_assert!(size.recent_reports <= limits.recent_reports);
            prop_assert!(size.targets <= limits.max_targets, "{:?}", size);
        }
    }
}

/// The book a restarted operator builds from what the old one journaled.
fn restarted(old: &mut LeaseBook, now: Instant, capacity: u32) -> LeaseBook {
    // Replay the journaled changes the way a journal would, through a snapshot.
    let snapshot = old.snapshot(now);
    let mut book = LeaseBook::new(settings(capacity), crate::now::Now::read());
    book.journal_changes();
    book.restore(snapshot, now);
    assert!(book.take_changes().is_empty(), "restoring journals nothing again");
    book
}

#[test]
fn a_restored_book_keeps_leases_capacity_and_rests() {
    let t0 = Instant::now();
    let mut old = LeaseBook::new(settings(1), crate::now::Now::read());
    old.journal_changes();
    for name in ["a", "b", "c"] {
        old.upsert(proxy(name, true, 10, &[]), t0);
    }
    let held = old.acquire(&req("t"), t0).unwrap();
    let released = old.acquire(&req("t"), t0).unwrap();
    let blocked = old.acquire(&req("u"), t0).unwrap();
    assert!(old.release(&released.id, t0));
    old.report(&blocked.id, Outcome::Error, None, t0).unwrap();
    let changes = old.take_changes();
    assert!(
        changes
            .iter()
            .filter(|c| matches!(c, LeaseChange::Granted(_)))
            .count()
            == 3
            && changes
                .iter()
                .any(|c| matches!(c, LeaseChange::Ended(e) if e.id == released.id))
            && changes
                .iter()
                .any(|c| matches!(c, LeaseChange::TargetRest { target, .. } if target == "t"))
            && changes.iter().any(|c| matches!(c, LeaseChange::ProxyRest { .. })),
        "{changes:?}"
    );

    let t1 = t0 + Duration::from_secs(5);
    let mut book = restarted(&mut old, t1, 1);
    assert!(book.proxies().is_empty(), "placeholders are not listed");
    for name in ["a", "b", "c"] {
        book.upsert(proxy(name, true, 10, &[]), t1);
    }
    assert_eq!(book.active_leases(), 2);
    assert_eq!(book.leases_on(&held.proxy), 1);
    // Capacity 1: the held proxy and the one resting everywhere are out;
    // the released one rests for "t" but serves "v".
    assert!(matches!(
        book.acquire(&req("t"), t1),
        Err(AcquireError::NoCapacity { .. })
    ));
    let other = book.acquire(&req("v"), t1).unwrap();
    assert_eq!(other.proxy, released.proxy);
    // Reports and releases of leases granted before the restart answer as before.
    book.report(&held.id, Outcome::Ok, None, t1).unwrap();
    book.report(&released.id, Outcome::Ok, None, t1).unwrap();
    assert!(book.release(&held.id, t1));
    assert!(!book.release(&held.id, t1), "released once");
}

#[test]
fn a_rebuilt_book_holds_the_same_leases_rests_proxies_and_reports() {
    let t0 = Instant::now();
    let mut old = LeaseBook::new(settings(1), crate::now::Now::read());
    for name in ["a", "b", "c", "d"] {
        old.upsert(proxy(name, true, 10, &[("geo", "eu")]), t0);
    }
    let held = old.acquire(&req("t"), t0).unwrap();
    let released = old.acquire(&req("t"), t0).unwrap();
    let errored = old.acquire(&req("u"), t0).unwrap();
    assert!(old.release(&released.id, t0));
    old.report(&held.id, Outcome::Blocked, Some("captcha".into()), t0)
        .unwrap();
    old.report(&errored.id, Outcome::Error, None, t0).unwrap();

    let t1 = t0 + Duration::from_secs(1);
    let mut book = old.rebuilt(t1);
    assert_eq!(book.snapshot(t1), old.snapshot(t1));
    assert_eq!(
        book.proxies(),
        old.proxies(),
        "proxies listed as before, nothing waits for availability"
    );
    assert_eq!(book.active_leases(), 2);
    assert_eq!(book.report_counts(&held.id), old.report_counts(&held.id));
    assert_eq!(book.recent_reports().count(), old.recent_reports().count());
    // The rebuilt book decides as the old one would: "t" rests on `released`
    // and `held` is full, the error rests `errored` everywhere: only "d" is left.
    let next = book.acquire(&req("t"), t1).unwrap();
    assert_eq!(next.proxy.name, "d");
    assert!(matches!(
        book.acquire(&req("t"), t1),
        Err(AcquireError::NoCapacity { .. })
    ));
    assert!(
        book.release(&held.id, t1),
        "leases granted before are released as before"
    );
}

#[test]
fn restored_placeholders_of_deleted_proxies_are_dropped_once_idle() {
    let t0 = Instant::now();
    let mut old = LeaseBook::new(settings(1), crate::now::Now::read());
    old.upsert(proxy("gone", true, 10, &[]), t0);
    let lease = old
        .acquire(
            &AcquireRequest {
                ttl: Some(Duration::from_secs(10)),
                ..req("t")
            },
            t0,
        )
        .unwrap();
    let mut book = restarted(&mut old, t0, 1);
    // Its proxy never reports again (deleted while the operator was down).
    book.sweep(t0 + Duration::from_secs(11));
    assert_eq!(book.active_leases(), 0, "the lease expired");
    // Resting for "t" (30 s) and reportable (600 s): still remembered.
    book.report(&lease.id, Outcome::Ok, None, t0 + Duration::from_secs(12))
        .unwrap();
    book.sweep(t0 + Duration::from_secs(700));
    assert!(book.snapshot(t0 + Duration::from_secs(700)) == LeaseSnapshot::default());
    assert!(
        book.report(&lease.id, Outcome::Ok, None, t0 + Duration::from_secs(700))
            .is_err()
    );
}

fn limits(max_leases: usize, max_targets: usize, max_ended: usize) -> LeaseLimits {
    LeaseLimits {
        max_leases,
        max_targets,
        max_ended,
        recent_reports: 4,
    }
}

#[test]
fn renew_extends_from_now_with_the_original_ttl_capped_and_keeps_expiry_consistent() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let mut r = req("t");
    r.ttl = Some(Duration::from_secs(100));
    let lease = book.acquire(&r, t0).unwrap();
    let t50 = t0 + Duration::from_secs(50);
    assert_eq!(
        book.renew(&lease.id, None, t50),
        Ok(Duration::from_secs(100)),
        "original TTL"
    );
    assert_eq!(
        book.sweep(t0 + Duration::from_secs(149)),
        0,
        "now ends at 150 s, not 100 s"
    );
    assert_eq!(
        book.renew(&lease.id, Some(Duration::from_secs(86_400)), t50),
        Ok(Duration::from_secs(600)),
        "capped at the maximum TTL"
    );
    // A shorter TTL moves the expiry earlier: from now, as asked.
    assert_eq!(
        book.renew(&lease.id, Some(Duration::from_secs(5)), t50),
        Ok(Duration::from_secs(5))
    );
    assert_eq!(book.sweep(t50 + Duration::from_secs(4)), 0);
    assert_eq!(
        book.sweep(t50 + Duration::from_secs(5)),
        1,
        "the old expiry entries are gone"
    );
    assert_eq!(
        book.sweep(t0 + Duration::from_secs(700)),
        0,
        "nothing left behind in the index"
    );
    let t60 = t0 + Duration::from_secs(60);
    assert_eq!(
        book.renew(&lease.id, None, t60),
        Err(RenewError::Unknown(UnknownLease(lease.id.clone()))),
        "an ended lease is not renewed"
    );
    assert!(matches!(
        book.renew("nope", None, t60),
        Err(RenewError::Unknown(_))
    ));
    let other = book.acquire(&req("u"), t60).unwrap();
    assert_eq!(
        book.renew(&other.id, Some(Duration::ZERO), t60),
        Err(RenewError::ZeroTtl)
    );
    // Expired but not yet swept: over.
    assert!(
        book.renew(&other.id, None, t60 + Duration::from_secs(60))
            .is_err()
    );
}

#[test]
fn reports_keep_counts_per_lease_and_a_bounded_tail_of_details() {
    let t0 = Instant::now();
    let mut book = LeaseBook::with_limits(settings(0), limits(10, 10, 10), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let lease = book.acquire(&req("t"), t0).unwrap();
    for i in 0..3000 {
        let outcome = [Outcome::Ok, Outcome::Ok, Outcome::Error][i % 3];
        book.report(&lease.id, outcome, Some(format!("{i}:{}", "d".repeat(1000))), t0)
            .unwrap();
    }
    assert_eq!(
        book.report_counts(&lease.id),
        Some(ReportCounts {
            ok: 2000,
            blocked: 0,
            error: 1000
        })
    );
    let size = book.footprint();
    assert_eq!(size.recent_reports, 4);
    assert!(size.detail_bytes <= 4 * 1005, "{size:?}");
    let newest = book.recent_reports().next().unwrap();
    assert!(newest.detail.as_deref().unwrap().starts_with("2999:"));
}

#[test]
fn held_leases_are_bounded() {
    let t0 = Instant::now();
    let mut book = LeaseBook::with_limits(settings(0), limits(2, 10, 10), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let a = book.acquire(&req("a"), t0).unwrap();
    book.acquire(&req("b"), t0).unwrap();
    match book.acquire(&req("c"), t0 + Duration::from_secs(10)) {
        Err(AcquireError::Full(full)) => {
            assert_eq!((full.table, full.limit), ("leases", 2));
            assert_eq!(full.retry_after, Duration::from_secs(50), "the first expiry");
        }
        other => panic!("{other:?}"),
    }
    book.release(&a.id, t0);
    assert!(book.acquire(&req("c"), t0).is_ok());
}

#[test]
fn targets_are_forgotten_only_when_idle_and_a_full_table_of_rests_refuses() {
    let t0 = Instant::now();
    let mut book = LeaseBook::with_limits(settings(0), limits(100, 10, 100), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    // Ten targets, each released: each rests for 30 s and takes reports for 600 s.
    for i in 0..10 {
        let l = book.acquire(&req(&format!("t{i}")), t0).unwrap();
        book.release(&l.id, t0);
    }
    let full = match book.acquire(&req("new"), t0) {
        Err(AcquireError::Full(full)) => full,
        other => panic!("{other:?}"),
    };
    assert_eq!((full.table, full.limit), ("targets", 10));
    assert_eq!(full.retry_after, Duration::from_secs(30), "the first rest ends");
    // Rests over, but the ended leases still take reports (a late `blocked`
    // must rest the proxy for its target): still nothing to forget.
    let t31 = t0 + Duration::from_secs(31);
    book.sweep(t31);
    assert!(matches!(
        book.acquire(&req("new"), t31),
        Err(AcquireError::Full(_))
    ));
    assert!(book.acquire(&req("t3"), t31).is_ok(), "known targets are served");
    // Report grace over: idle targets make room, oldest first.
    let t601 = t0 + Duration::from_secs(601);
    book.sweep(t601);
    assert!(book.acquire(&req("new"), t601).is_ok());
    assert!(book.footprint().targets <= 10);
}

#[test]
fn a_blocked_rest_survives_target_eviction() {
    let t0 = Instant::now();
    let mut s = settings(0);
    s.report_grace = Duration::from_secs(1);
    let mut book = LeaseBook::with_limits(s, limits(100, 2, 100), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let shop = book.acquire(&req("shop"), t0).unwrap();
    book.report(&shop.id, Outcome::Blocked, None, t0).unwrap();
    book.release(&shop.id, t0);
    let mut now = t0;
    // Many other targets come and go (each idle again after its 30 s rest);
    // "shop" keeps its 600 s rest.
    for i in 0..18 {
        now += Duration::from_secs(31);
        book.sweep(now);
        let l = book.acquire(&req(&format!("other-{i}")), now).unwrap();
        book.release(&l.id, now);
        assert!(book.acquire(&req("shop"), now).is_err(), "rest forgotten at {i}");
        assert!(book.footprint().targets <= 2);
    }
}

#[test]
fn ended_leases_are_bounded_oldest_forgotten_first() {
    let t0 = Instant::now();
    let mut book = LeaseBook::with_limits(settings(0), limits(100, 100, 3), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    let ids: Vec<String> = (0..5)
        .map(|i| {
            let l = book.acquire(&req(&format!("t{i}")), t0).unwrap();
            book.release(&l.id, t0);
            l.id
        })
        .collect();
    assert_eq!(book.footprint().ended, 3);
    assert!(book.report(&ids[0], Outcome::Ok, None, t0).is_err(), "forgotten");
    assert!(book.report(&ids[4], Outcome::Ok, None, t0).is_ok());
}

#[test]
fn a_retiring_proxy_takes_no_leases_and_its_leases_are_not_renewed() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(proxy("old", true, 10, &[]), t0);
    let held = book.acquire(&req("t"), t0).unwrap();
    book.renew(&held.id, None, t0).unwrap();

    let mut retiring = proxy("old", true, 10, &[]);
    retiring.retiring = true;
    book.upsert(retiring, t0);
    assert!(matches!(
        book.acquire(&req("t"), t0),
        Err(AcquireError::NoCapacity { .. })
    ));
    assert_eq!(
        book.renew(&held.id, None, t0),
        Err(RenewError::Retiring(ObjectKey::new("ns", "old")))
    );
    // Still held until released or expired: the crawler finishes and moves on.
    assert_eq!(book.leases_on(&ObjectKey::new("ns", "old")), 1);
    assert!(book.release(&held.id, t0));
    assert_eq!(book.leases_on(&ObjectKey::new("ns", "old")), 0);

    // Its successor takes the leases.
    book.upsert(proxy("new", true, 10, &[]), t0);
    assert_eq!(name(&book.acquire(&req("t"), t0).unwrap()), "new");
}

#[test]
fn blocking_targets_are_counted_once_each_and_errors_every_time() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    for target in ["a.example", "b.example"] {
        let grant = book.acquire(&req(target), t0).unwrap();
        // Reported twice for one target: counted once.
        book.report(&grant.id, Outcome::Blocked, None, t0).unwrap();
        book.report(&grant.id, Outcome::Blocked, None, t0).unwrap();
        book.release(&grant.id, t0);
    }
    let grant = book.acquire(&req("c.example"), t0).unwrap();
    book.report(&grant.id, Outcome::Error, None, t0).unwrap();
    book.report(&grant.id, Outcome::Error, None, t0).unwrap();
    let view = &book.proxies()[0];
    assert_eq!((view.blocked_targets, view.errors), (2, 2));
}

#[test]
fn blocking_targets_counted_per_proxy_are_bounded() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.upsert(proxy("p", true, 10, &[]), t0);
    for i in 0..MAX_BLOCKED_TARGETS + 50 {
        let target = format!("t{i}.example");
        let grant = book.acquire(&req(&target), t0).unwrap();
        book.report(&grant.id, Outcome::Blocked, None, t0).unwrap();
        book.release(&grant.id, t0);
    }
    assert_eq!(book.proxies()[0].blocked_targets as usize, MAX_BLOCKED_TARGETS);
}

#[test]
fn acquires_refused_for_a_pool_are_counted_for_its_autoscaler() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    let pool = crate::resource::POOL_LABEL;
    book.upsert(proxy("eu-abcde", true, 10, &[(pool, "eu")]), t0);
    let for_pool = |target: &str| AcquireRequest {
        target: target.into(),
        selector: BTreeMap::from([(pool.to_owned(), "eu".to_owned())]),
        ..Default::default()
    };
    book.acquire(&for_pool("a"), t0).unwrap();
    for target in ["b", "c"] {
        assert!(book.acquire(&for_pool(target), t0).is_err());
    }
    // Refusals without a pool count for none.
    assert!(book.acquire(&req("d"), t0).is_err());
    assert_eq!(book.take_pool_denials("eu"), 2);
    assert_eq!(book.take_pool_denials("eu"), 0, "taken");
    assert_eq!(book.take_pool_denials("us"), 0);
}

#[test]
fn a_pool_learns_its_members_figures_and_its_refused_acquires() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    let pool = crate::resource::POOL_LABEL;
    book.upsert(proxy("eu-aaaaa", true, 10, &[(pool, "eu")]), t0);
    book.upsert(proxy("us-bbbbb", true, 10, &[(pool, "us")]), t0);
    let for_eu = |target: &str| AcquireRequest {
        target: target.into(),
        selector: BTreeMap::from([(pool.to_owned(), "eu".to_owned())]),
        ..Default::default()
    };
    let held = book.acquire(&for_eu("a.example"), t0).unwrap();
    book.report(&held.id, Outcome::Blocked, None, t0).unwrap();
    assert!(book.acquire(&for_eu("b.example"), t0).is_err(), "full");

    let (member, unknown) = (ObjectKey::new("ns", "eu-aaaaa"), ObjectKey::new("ns", "eu-zzzzz"));
    let figures = book.pool_figures("eu", &[member.clone(), unknown.clone()]);
    assert_eq!(figures.denied, 1);
    assert_eq!(
        figures.members.len(),
        1,
        "a member the book never heard of has no figures"
    );
    assert_eq!(
        figures.members[&member],
        crate::pool::LeaseFigures {
            known: true,
            retiring: false,
            leases: 1,
            blocked_targets: 1,
            errors: 0
        }
    );
    assert_eq!(book.pool_figures("eu", &[]).denied, 0, "denials are taken");

    // Restored after a restart: its leases count, but it is not known
    // until its availability arrives, and so not drained either.
    let mut restarted = restarted(&mut book, t0, 1);
    let figures = restarted
        .pool_figures("eu", std::slice::from_ref(&member))
        .members[&member];
    assert_eq!((figures.known, figures.leases), (false, 1));
    assert!(!figures.drained());
    let mut retiring = proxy("eu-aaaaa", true, 10, &[(pool, "eu")]);
    retiring.retiring = true;
    restarted.upsert(retiring, t0);
    let figures = restarted
        .pool_figures("eu", std::slice::from_ref(&member))
        .members[&member];
    assert!(
        figures.known && figures.retiring && !figures.drained(),
        "still leased"
    );
}

#[test]
fn a_refusal_with_room_left_in_the_pool_is_no_demand() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(2), crate::now::Now::read());
    let pool = crate::resource::POOL_LABEL;
    book.upsert(proxy("eu-aaaaa", true, 10, &[(pool, "eu")]), t0);
    let for_eu = AcquireRequest {
        target: "a.example".into(),
        selector: BTreeMap::from([(pool.to_owned(), "eu".to_owned())]),
        ..Default::default()
    };
    let held = book.acquire(&for_eu, t0).unwrap();
    book.report(&held.id, Outcome::Blocked, None, t0).unwrap();
    book.release(&held.id, t0);
    // The member rests for a.example: refused, though it has room.
    assert!(book.acquire(&for_eu, t0).is_err());
    assert_eq!(book.pool_figures("eu", &[]).denied, 0);
}

#[test]
fn blocked_and_error_tallies_outlive_a_restart_through_the_journal() {
    let t0 = Instant::now();
    // Far enough apart that no rest from one round holds the next.
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut old = LeaseBook::new(settings(0), crate::now::Now::read());
    old.journal_changes();
    old.upsert(proxy("p", true, 10, &[]), t0);
    for (round, target) in ["a.example", "b.example", "a.example"].into_iter().enumerate() {
        let now = at(700 * round as u64);
        let grant = old.acquire(&req(target), now).unwrap();
        old.report(&grant.id, Outcome::Blocked, None, now).unwrap();
        old.report(&grant.id, Outcome::Error, None, now).unwrap();
        old.release(&grant.id, now);
    }
    // What a journal folds from the changes, and hands back at start.
    let mut journal = crate::lease::journal::JournalState::default();
    let changes = old.take_changes();
    let blocked = changes
        .iter()
        .filter(|c| matches!(c, crate::lease::LeaseChange::BlockedBy { .. }))
        .count();
    assert_eq!(blocked, 2, "a target is journaled once");
    for change in &changes {
        journal.apply(change);
    }
    let mut snapshot = LeaseSnapshot::default();
    journal.into_snapshot(&mut snapshot).unwrap();
    assert_eq!(snapshot.tallies.len(), 1);

    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.journal_changes();
    book.restore(snapshot, at(1400));
    assert!(book.take_changes().is_empty());
    // Swept before the proxy reports again: the tally waits for it.
    book.sweep(at(1460));
    book.upsert(proxy("p", true, 10, &[]), at(1461));
    let view = &book.proxies()[0];
    assert_eq!((view.blocked_targets, view.errors), (2, 3));
    // An old target blocking again counts for nothing new.
    let grant = book.acquire(&req("b.example"), at(1462)).unwrap();
    book.report(&grant.id, Outcome::Blocked, None, at(1462)).unwrap();
    assert_eq!(book.proxies()[0].blocked_targets, 2);
}

#[test]
fn a_tally_whose_proxy_never_returns_is_forgotten_after_the_grace() {
    let t0 = Instant::now();
    let mut old = LeaseBook::new(settings(0), crate::now::Now::read());
    old.upsert(proxy("gone", true, 10, &[]), t0);
    let grant = old.acquire(&req("t"), t0).unwrap();
    old.report(&grant.id, Outcome::Error, None, t0).unwrap();
    old.release(&grant.id, t0);
    let snapshot = old.snapshot(t0);
    assert_eq!(snapshot.tallies.len(), 1);
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.journal_changes();
    book.restore(snapshot, t0);
    // Its rests and its reportable lease are over long before the grace.
    book.sweep(t0 + crate::lease::book::TALLY_GRACE - Duration::from_secs(1));
    assert_eq!(
        book.snapshot(t0 + Duration::from_secs(599)).tallies.len(),
        1,
        "still waiting"
    );
    assert!(book.take_changes().is_empty());
    let after = t0 + crate::lease::book::TALLY_GRACE + Duration::from_secs(1);
    book.sweep(after);
    assert!(book.snapshot(after).tallies.is_empty());
    assert_eq!(
        book.take_changes(),
        [crate::lease::LeaseChange::ProxyRemoved(ObjectKey::new(
            "ns", "gone"
        ))],
        "the journal is told to forget it"
    );
}

#[test]
fn the_gateway_s_leases_end_with_the_process_that_held_them() {
    let t0 = Instant::now();
    let mut old = LeaseBook::new(settings(1), crate::now::Now::read());
    old.upsert(proxy("a", true, 10, &[]), t0);
    old.upsert(proxy("b", true, 20, &[]), t0);
    let by = |client: &str| AcquireRequest {
        client: Some(client.into()),
        ..req("t")
    };
    let api = old.acquire(&by("spider"), t0).unwrap();
    let gateway = old.acquire(&by("gateway/spider"), t0).unwrap();
    let book = restarted(&mut old, t0, 1);
    assert_eq!(book.active_leases(), 1, "only the API's lease is restored");
    assert!(book.snapshot(t0).leases.iter().all(|l| l.id != gateway.id));
    assert!(book.snapshot(t0).leases.iter().any(|l| l.id == api.id));
}

#[test]
fn the_gateway_s_leases_are_not_journaled_but_their_rests_are() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(0), crate::now::Now::read());
    book.journal_changes();
    book.upsert(proxy("a", true, 10, &[]), t0);
    book.take_changes();
    let ask = AcquireRequest {
        client: Some("gateway/spider".into()),
        ..req("t")
    };
    let lease = book.acquire(&ask, t0).unwrap();
    book.renew(&lease.id, None, t0).unwrap();
    assert!(
        book.take_changes().is_empty(),
        "a grant and a renewal cost no row"
    );
    book.report(&lease.id, Outcome::Blocked, None, t0).unwrap();
    assert!(book.release(&lease.id, t0));
    let changes = book.take_changes();
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, LeaseChange::TargetRest { .. })),
        "the block's rest outlives the process: {changes:?}"
    );
    assert!(
        !changes
            .iter()
            .any(|c| matches!(c, LeaseChange::Granted(_) | LeaseChange::Ended(_))),
        "{changes:?}"
    );
}

#[test]
fn a_rest_already_over_is_not_journaled() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(
        LeaseSettings {
            cooldown: Duration::ZERO,
            ..settings(0)
        },
        crate::now::Now::read(),
    );
    book.journal_changes();
    book.upsert(proxy("a", true, 10, &[]), t0);
    let lease = book.acquire(&req("t"), t0).unwrap();
    book.take_changes();
    assert!(book.release(&lease.id, t0));
    let changes = book.take_changes();
    assert!(
        matches!(changes.as_slice(), [LeaseChange::Ended(_)]),
        "only the end, no rest that is already over: {changes:?}"
    );
}

#[test]
fn only_a_lease_s_owner_acts_on_it_held_ended_and_after_a_restart() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(1), crate::now::Now::read());
    book.journal_changes();
    for name in ["a", "b", "c", "d"] {
        book.upsert(proxy(name, true, 10, &[]), t0);
    }
    let owned_by = |owner: &str, client: Option<&str>| AcquireRequest {
        owner: Some(owner.into()),
        client: client.map(Into::into),
        ..req("t")
    };
    let (a, b) = (Caller::Identity("a".into()), Caller::Identity("b".into()));
    let api = book.acquire(&owned_by("a", Some("spider")), t0).unwrap();
    let gateway = book.acquire(&owned_by("a", Some("gateway/a")), t0).unwrap();
    let check = |id: &str, who: &Caller, act: Act, at: Instant| book.check_owner(id, who, act, at);
    assert!(check(&api.id, &a, Act::Release, t0).is_ok());
    assert_eq!(
        check(&api.id, &b, Act::Report, t0),
        Err(NotOwner::OtherIdentity(api.id.clone()))
    );
    assert!(check(&api.id, &Caller::Gateway, Act::Release, t0).is_err());
    assert_eq!(
        check(&gateway.id, &a, Act::Release, t0),
        Err(NotOwner::GatewayLease(gateway.id.clone())),
        "only the gateway ends what it holds"
    );
    assert!(check(&gateway.id, &a, Act::Renew, t0).is_err());
    assert!(
        check(&gateway.id, &a, Act::Report, t0).is_ok(),
        "the identity it serves reports a block seen in its tunnel"
    );
    assert!(check(&gateway.id, &b, Act::Report, t0).is_err());
    assert!(check(&gateway.id, &Caller::Gateway, Act::Release, t0).is_ok());
    assert!(
        check("no-such-lease", &b, Act::Release, t0).is_ok(),
        "answered as before"
    );
    // Ended, in the report grace: still its owner's only.
    assert!(book.release(&api.id, t0));
    assert!(book.release(&gateway.id, t0));
    let check = |id: &str, who: &Caller, act: Act, at: Instant| book.check_owner(id, who, act, at);
    assert!(check(&api.id, &b, Act::Report, t0).is_err());
    assert!(check(&api.id, &a, Act::Report, t0).is_ok());
    assert!(check(&gateway.id, &a, Act::Report, t0).is_ok());
    assert!(check(&gateway.id, &b, Act::Report, t0).is_err());
    let after_grace = t0 + Duration::from_secs(601);
    assert!(
        check(&api.id, &b, Act::Report, after_grace).is_ok(),
        "unknown by then"
    );
    // The owner is journaled and restored, held and ended.
    let held = book
        .acquire(
            &AcquireRequest {
                target: "v".into(),
                ..owned_by("a", None)
            },
            t0,
        )
        .unwrap();
    let mut restored = restarted(&mut book, t0, 1);
    for name in ["a", "b", "c", "d"] {
        restored.upsert(proxy(name, true, 10, &[]), t0);
    }
    assert!(restored.check_owner(&held.id, &b, Act::Report, t0).is_err());
    assert!(restored.check_owner(&held.id, &a, Act::Report, t0).is_ok());
    assert!(restored.check_owner(&api.id, &b, Act::Report, t0).is_err());
    assert!(
        restored.check_owner(&gateway.id, &b, Act::Report, t0).is_ok(),
        "a gateway lease ends with its process: unknown after a restart"
    );
    // A lease without an owner (written before owners existed): anyone.
    let ownerless = restored.acquire(&req("u"), t0).unwrap();
    assert!(restored.check_owner(&ownerless.id, &b, Act::Report, t0).is_ok());
}

/// What fair shares count: leases by owner (ended ones no longer), and
/// the slots of the proxies serving (not those not ready or retiring, nor
/// one removed); a waiting request's refusal is not its pool's denial
/// until counted.
#[test]
fn holdings_count_by_owner_and_slots_by_serving_proxies() {
    let t0 = Instant::now();
    let mut book = LeaseBook::new(settings(2), crate::now::Now::read());
    book.upsert(proxy("a", true, 1, &[]), t0);
    book.upsert(proxy("b", true, 1, &[]), t0);
    book.upsert(proxy("down", false, 1, &[]), t0);
    let mut retiring = proxy("old", true, 1, &[]);
    retiring.retiring = true;
    book.upsert(retiring, t0);
    assert_eq!(book.slots(), 4, "two serving proxies of capacity 2");
    book.upsert(proxy("a", true, 5, &[]), t0);
    assert_eq!(book.slots(), 4, "an update is not a new proxy");
    book.upsert(proxy("down", true, 1, &[]), t0);
    assert_eq!(book.slots(), 6, "turned Ready");
    book.remove(&ObjectKey::new("ns", "down"), t0);
    assert_eq!(book.slots(), 4);

    let by = |owner: Option<&str>| AcquireRequest {
        owner: owner.map(str::to_owned),
        ..req("t")
    };
    let first = book.acquire(&by(Some("team-a")), t0).unwrap();
    book.acquire(&by(Some("team-a")), t0).unwrap();
    book.acquire(&by(None), t0).unwrap();
    let held: Vec<(&str, u32)> = book.holdings().iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(held, [("", 1), ("team-a", 2)]);
    assert_eq!(book.owner_of(&first.id), Some("team-a"));
    book.release(&first.id, t0);
    assert_eq!(book.holdings().get("team-a"), Some(&1));
    assert_eq!(book.owner_of(&first.id), None);

    let pooled = AcquireRequest {
        selector: BTreeMap::from([(crate::resource::POOL_LABEL.to_owned(), "p".to_owned())]),
        ..req("t")
    };
    assert!(book.try_acquire(&pooled, t0).is_err());
    assert_eq!(
        book.take_pool_denials("p"),
        0,
        "a waiting request's try is not a denial"
    );
    book.count_denial(&pooled);
    assert_eq!(book.take_pool_denials("p"), 1);
}
