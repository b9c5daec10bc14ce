use std::time::Duration;

use super::ladders::{self, ALL};
use super::{Attempts, Backoff, Jitter};

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

const fn s(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

const ZERO: Duration = Duration::ZERO;

/// Each ladder's steps (the waits before jitter) for attempts 0, 1, 2, …
/// until the cap, which the next attempt keeps: today's values, unchanged.
#[test]
fn every_ladder_waits_as_its_table_says() {
    #[rustfmt::skip]
    let table: [(&str, &[Duration]); 15] = [
        ("PROXY_POLL",             &[ms(500), s(1), s(2), s(4), s(8), s(15)]),
        ("PROXY_ERROR",            &[s(1), s(2), s(4), s(8), s(16), s(32), s(64), s(128), s(256), s(300)]),
        ("PROXY_QUOTA",            &[s(120), s(240), s(480), s(600)]),
        ("DELETION_REFUSED",       &[s(30), s(60), s(120), s(240), s(480), s(600)]),
        ("REPLACEMENT",            &[ZERO, s(10), s(20), s(40), s(80), s(160), s(300)]),
        ("KUBE_API_REFUSED",       &[ms(500), s(1), s(2), s(4), s(8)]),
        ("WATCH_UNREACHABLE",      &[ms(500), s(1), s(2)]),
        ("WATCH_REFUSED",          &[ms(800), ms(1600), ms(3200), ms(6400), ms(12_800), ms(25_600), s(30)]),
        ("KVM_REDIAL",             &[ZERO, s(1), s(2), s(4), s(8), s(16), s(30)]),
        ("ACTOR_RESTART",          &[ZERO, ZERO, ZERO, ms(200), ms(400), ms(800), ms(1600), ms(3200),
                                     ms(6400), ms(12_800), ms(25_600), s(30)]),
        ("REGISTRY_RELIST",        &[s(5)]),
        ("LEASE_CHECKPOINT_WRITE", &[ms(500)]),
        ("ACCEPT_EXHAUSTED",       &[ms(100)]),
        ("ACCEPT_ERROR",           &[ms(5)]),
        ("LIBVIRT_EVENT_LOOP",     &[ms(100)]),
    ];
    assert_eq!(
        table.map(|(name, _)| name),
        ALL.map(|(name, _)| name),
        "one row per ladder"
    );
    for ((name, steps), (_, ladder)) in table.into_iter().zip(ALL) {
        let seen: Vec<Duration> = (0..steps.len() as u32).map(|n| ladder.step(n)).collect();
        assert_eq!(seen, steps, "{name}");
        let cap = *steps.last().unwrap_or(&Duration::ZERO);
        assert_eq!(cap, ladder.cap, "{name}: the table ends at the cap");
        for attempt in [steps.len() as u32, steps.len() as u32 + 1, 64, u32::MAX] {
            assert_eq!(
                ladder.step(attempt),
                cap,
                "{name}: attempt {attempt} stays at the cap"
            );
        }
    }
}

/// The jitter of each ladder: the lowest and highest wait around a step,
/// and a sample outside [0, 1) clamped into it.
#[test]
fn jitter_spreads_each_ladder_within_its_bounds() {
    // (ladder, attempt, lowest, highest (excluded, unless no jitter))
    let table = [
        (ladders::PROXY_POLL, 0, ms(500), s(1)),
        (ladders::PROXY_ERROR, 20, s(300), s(600)),
        (ladders::PROXY_QUOTA, 1, s(240), s(480)),
        (ladders::KUBE_API_REFUSED, 0, ms(250), ms(500)),
        (ladders::KUBE_API_REFUSED, 9, s(4), s(8)),
        (ladders::WATCH_UNREACHABLE, 2, ms(1600), ms(2400)),
        (ladders::WATCH_REFUSED, 0, ms(640), ms(960)),
        (ladders::DELETION_REFUSED, 1, s(60), s(60)),
        (ladders::KVM_REDIAL, 0, Duration::ZERO, Duration::ZERO),
        (ladders::ACTOR_RESTART, 3, ms(200), ms(200)),
    ];
    for (ladder, attempt, lowest, highest) in table {
        assert_eq!(ladder.delay(attempt, 0.0), lowest, "{ladder:?}");
        assert_eq!(ladder.delay(attempt, -1.0), lowest, "clamped: {ladder:?}");
        let top = ladder.delay(attempt, 0.999_999);
        if ladder.jitter == Jitter::NONE {
            assert_eq!(top, highest, "{ladder:?}");
        } else {
            assert!(
                top < highest && top > highest.mul_f64(0.999),
                "{ladder:?}: {top:?}"
            );
            assert_eq!(ladder.delay(attempt, 2.0), highest, "clamped: {ladder:?}");
        }
    }
    // The middle of the spread, exactly.
    assert_eq!(ladders::WATCH_REFUSED.delay(1, 0.5), ms(1600));
    assert_eq!(ladders::KUBE_API_REFUSED.delay(1, 0.5), ms(750));
    assert_eq!(ladders::PROXY_POLL.delay(1, 0.5), ms(1500));
}

#[test]
fn a_fixed_interval_is_the_ladder_without_growth() {
    let every = Backoff::fixed(ms(250));
    assert_eq!(every.factor, 1);
    assert_eq!(every.jitter, Jitter::NONE);
    for attempt in [0, 1, 7, u32::MAX] {
        assert_eq!(every.delay(attempt, 0.7), ms(250));
    }
}

#[test]
fn attempts_climb_the_ladder_and_start_again_after_a_reset() {
    let mut attempts = Attempts::default();
    let ladder = ladders::KVM_REDIAL;
    let waits: Vec<Duration> = (0..4).map(|_| attempts.next_step(&ladder)).collect();
    assert_eq!(waits, [Duration::ZERO, s(1), s(2), s(4)]);
    assert_eq!(attempts.count(), 4);
    attempts.reset();
    assert_eq!(attempts.next_delay(&ladders::WATCH_REFUSED, 0.5), ms(800));
    assert_eq!(attempts.next_delay(&ladders::WATCH_REFUSED, 0.0), ms(1280));
}
