//! The share desk on its own: members' syncs answered with their shares,
//! their outboxes merged and passed on, claims taken once and asked for
//! again when missing, leases in use summed for pools.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::adapters::replicas::members::Member;
use crate::adapters::replicas::wire::{AvailabilityBody, Claim as WireClaim, OutboxItem};

fn tag(i: u8) -> MemberTag {
    MemberTag::of(&format!("replica-{i}"), &[i; 8])
}

fn table(live: &[&MemberTag]) -> MemberTable {
    MemberTable {
        live: live
            .iter()
            .map(|tag| Member {
                tag: (*tag).clone(),
                address: Some(format!("{tag}:8091")),
                pod: None,
            })
            .collect(),
        ..MemberTable::default()
    }
}

fn available(name: &str) -> FleetItem {
    FleetItem::Available(Box::new(AvailabilityBody {
        proxy: format!("crawl/{name}"),
        ready: true,
        phase: "Ready".into(),
        ..AvailabilityBody::default()
    }))
}

/// Who sent how many verdicts, as the desk's sink heard them.
type Heard = Arc<Mutex<Vec<(MemberTag, usize)>>>;

fn desk(capacity: u32) -> (ShareDesk, Heard) {
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    let desk = ShareDesk::new(
        Term {
            holder: "replica-0/leader".into(),
            transitions: 0,
        },
        DeskSettings {
            capacity,
            ttl: Duration::from_secs(9),
            rebuilding: false,
        },
        vec![available("p0"), available("p1"), available("p2")],
        Arc::new(move |from, verdicts| sink.lock().unwrap().push((from, verdicts.len()))),
    );
    (desk, heard)
}

fn request(tag: &MemberTag, seq: u64, applied: u64, claims: Vec<WireClaim>) -> SyncRequest {
    SyncRequest {
        tag: tag.to_string(),
        seq,
        applied,
        claims,
        ..SyncRequest::default()
    }
}

fn slots(response: &SyncResponse) -> u32 {
    response.allocation.slots.iter().map(|s| s.slots).sum()
}

#[tokio::test]
async fn members_get_the_whole_capacity_between_them_and_no_more() {
    let (desk, _) = desk(2);
    let (a, b, c) = (tag(1), tag(2), tag(3));
    desk.set_members(&table(&[&a, &b, &c]));
    let mut total = 0;
    for (i, member) in [&a, &b, &c].into_iter().enumerate() {
        let answer = desk.sync(request(member, 1, 0, vec![])).await.unwrap();
        assert_eq!(answer.term.holder, "replica-0/leader");
        assert!(answer.allocation.version > 0 && answer.allocation.ttl_ms == 9_000);
        assert!(answer.feed.reset, "a first sync starts from the whole fleet");
        assert_eq!(answer.feed.items.len(), 3, "member {i}: {:?}", answer.feed.items);
        let given = slots(&answer);
        assert_eq!(given, 2, "each member's even part of 3 proxies × 2");
        total += given;
    }
    assert_eq!(total, 6);
    assert!(desk.over_capacity().is_empty());
    // Not a member the cluster lists: no share at all.
    let stranger = desk.sync(request(&tag(9), 1, 0, vec![])).await.unwrap();
    assert_eq!((stranger.allocation.version, stranger.allocation.ttl_ms), (0, 0));
}

#[tokio::test]
async fn an_outbox_is_merged_once_and_passed_on_to_the_others() {
    let (desk, heard) = desk(1);
    let (a, b) = (tag(1), tag(2));
    desk.set_members(&table(&[&a, &b]));
    let first_b = desk.sync(request(&b, 1, 0, vec![])).await.unwrap();
    let blocked = OutboxItem {
        seq: 1,
        change: FleetItem::Blocked {
            proxy: "crawl/p0".into(),
            target_digest: 42,
        },
    };
    let mut from_a = request(&a, 1, 0, vec![]);
    from_a.outbox = vec![blocked.clone()];
    from_a.verdicts = vec![wire::ProbeVerdict {
        proxy: "crawl/p1".into(),
        uid: "u".into(),
        last_transition_ms: 1_900_000_000_000,
        ..Default::default()
    }];
    let answer = desk.sync(from_a.clone()).await.unwrap();
    assert_eq!(answer.acked, 1, "acknowledged");
    assert_eq!(
        heard.lock().unwrap().as_slice(),
        &[(a.clone(), 1)],
        "verdicts go to the router"
    );
    // b, holding for news since its first answer, hears of the block.
    let mut from_b = request(&b, 2, first_b.allocation.version, vec![]);
    from_b.term = Some(first_b.term.clone());
    from_b.feed_since = first_b.feed.to;
    from_b.hold_ms = 2_000;
    let news = desk.sync(from_b.clone()).await.unwrap();
    assert_eq!(news.feed.items, vec![blocked.change.clone()]);
    // The same outbox again (its answer was lost) changes nothing more.
    let again = desk.sync(from_a).await.unwrap();
    assert_eq!(again.acked, 1);
    from_b.feed_since = news.feed.to;
    from_b.hold_ms = 0;
    let quiet = desk.sync(from_b).await.unwrap();
    assert!(quiet.feed.items.is_empty(), "{:?}", quiet.feed.items);
}

#[tokio::test]
async fn claims_are_taken_once_and_asked_for_when_missing() {
    let (desk, _) = desk(1);
    let a = tag(1);
    desk.set_members(&table(&[&a]));
    let claims = vec![WireClaim {
        proxy: "crawl/p0".into(),
        slots: 1,
        in_use: 1,
    }];
    let mut full = request(&a, 1, 0, claims);
    full.claims_digest = 7;
    desk.sync(full).await.unwrap();
    let keys = [ObjectKey::new("crawl", "p0"), ObjectKey::new("crawl", "p1")];
    let in_use = desk.in_use(&keys);
    assert_eq!(
        (in_use[&keys[0]], in_use[&keys[1]]),
        (1, 0),
        "pools count every member's leases"
    );
    // Left out and unchanged: taken as said again.
    let mut omitted = request(&a, 2, 0, vec![]);
    omitted.claims_digest = 7;
    omitted.claims_omitted = true;
    assert!(!desk.sync(omitted.clone()).await.unwrap().claims_wanted);
    // Left out but not what the desk has (a new leader): asked for.
    omitted.claims_digest = 8;
    omitted.seq = 3;
    assert!(desk.sync(omitted).await.unwrap().claims_wanted);
}

/// Wire claims of an allocation's slots (no lease in use).
fn claims_of(response: &SyncResponse) -> Vec<WireClaim> {
    response
        .allocation
        .slots
        .iter()
        .map(|s| WireClaim {
            proxy: s.proxy.clone(),
            slots: s.slots,
            in_use: 0,
        })
        .collect()
}

#[tokio::test]
async fn a_want_wakes_the_holder_of_idle_slots_and_then_the_wanting_member() {
    let (desk, _) = desk(1);
    let desk = Arc::new(desk);
    let (a, b) = (tag(1), tag(2));
    desk.set_members(&table(&[&a, &b]));
    let first_a = desk.sync(request(&a, 1, 0, vec![])).await.unwrap();
    let first_b = desk.sync(request(&b, 1, 0, vec![])).await.unwrap();
    assert_eq!(
        slots(&first_a) + slots(&first_b),
        3,
        "three proxies of capacity 1"
    );
    let held_b = {
        let desk = desk.clone();
        let b = b.clone();
        let request = SyncRequest {
            hold_ms: 10_000,
            term: Some(first_b.term.clone()),
            feed_since: first_b.feed.to,
            ..request(&b, 2, first_b.allocation.version, claims_of(&first_b))
        };
        tokio::spawn(async move { desk.sync(request).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let began = tokio::time::Instant::now();
    let wanting = SyncRequest {
        wanting: 4,
        ..request(&a, 2, first_a.allocation.version, claims_of(&first_a))
    };
    let answer_a = desk.sync(wanting).await.unwrap();
    let lowered_b = held_b.await.unwrap();
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "b's held sync answered at once: {:?}",
        began.elapsed()
    );
    assert_eq!(slots(&lowered_b), 0, "b's idle slots go to a: {lowered_b:?}");
    assert_eq!(
        answer_a.allocation.version, first_a.allocation.version,
        "no raise before b gave them up: {answer_a:?}"
    );
    // a holds its next sync; b reports the lowering: a is raised at once.
    let held_a = {
        let desk = desk.clone();
        let request = SyncRequest {
            hold_ms: 10_000,
            wanting: 4,
            term: Some(first_a.term.clone()),
            feed_since: first_a.feed.to,
            ..request(&a, 3, first_a.allocation.version, claims_of(&first_a))
        };
        tokio::spawn(async move { desk.sync(request).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let began = tokio::time::Instant::now();
    desk.sync(request(&b, 3, lowered_b.allocation.version, vec![]))
        .await
        .unwrap();
    let raised_a = held_a.await.unwrap();
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "a's held sync answered at once: {:?}",
        began.elapsed()
    );
    assert_eq!(slots(&raised_a), 3, "a holds every slot: {raised_a:?}");
    assert!(desk.over_capacity().is_empty());
}
