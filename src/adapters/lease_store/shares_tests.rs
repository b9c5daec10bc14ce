//! The lease store serving from a share: it grants within its slots and
//! only while the share and the membership last, tells the leader what it
//! learns, and takes the leader's word about the fleet.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tests::ready;
use super::*;
use crate::adapters::gateway::Upstream;
use crate::adapters::leader::SystemClock;
use crate::adapters::replicas::wire::{AvailabilityBody, FleetItem};
use crate::domain::lease::{Caller, GATEWAY_CLIENT, Outcome};
use crate::domain::membership::MemberTag;

fn ask(client: &str, target: &str) -> AcquireRequest {
    AcquireRequest {
        target: target.into(),
        client: Some(client.into()),
        ..Default::default()
    }
}

fn member() -> Tenure {
    let tenure = Tenure::new(Arc::new(SystemClock));
    tenure.extend(Instant::now() + Duration::from_secs(60));
    tenure
}

/// A store in share mode with proxies `a` and `b`, capacity 2 each.
fn sharing(member: Tenure) -> LeaseStore {
    let settings = LeaseSettings {
        capacity: 2,
        cooldown: Duration::ZERO,
        ..Default::default()
    };
    let store = LeaseStore::new(settings).with_shares(member, &MemberTag::of("replica-0", &[0; 8]));
    store.upsert(ready("a"));
    store.upsert(ready("b"));
    store
}

fn allot(store: &LeaseStore, version: u64, slots: &[(&str, u32)], valid_for: Duration) {
    store.apply_share(ShareUpdate {
        allotment: Some((
            version,
            Allotment::Slots(
                slots
                    .iter()
                    .map(|(name, n)| (ObjectKey::new("ns", *name), *n))
                    .collect::<BTreeMap<_, _>>(),
            ),
        )),
        valid_until: Instant::now() + valid_for,
        acked: 0,
        reset: false,
        feed: Vec::new(),
    });
}

fn unavailable(result: &Result<Upstream, AcquireError>) -> bool {
    matches!(result, Err(AcquireError::Unavailable(_)))
}

#[tokio::test]
async fn grants_only_within_the_slots_and_while_the_share_lasts() {
    let store = sharing(member());
    let before = store.acquire_for_gateway(&ask(GATEWAY_CLIENT, "x.test"));
    assert!(unavailable(&before), "no share yet: {before:?}");

    allot(&store, 1, &[("a", 1)], Duration::from_secs(30));
    let first = store
        .acquire_for_gateway(&ask(GATEWAY_CLIENT, "x.test"))
        .expect("one slot on a");
    assert_eq!(first.proxy, ObjectKey::new("ns", "a"));
    let second = store.acquire_for_gateway(&ask(GATEWAY_CLIENT, "y.test"));
    assert!(
        matches!(second, Err(AcquireError::NoCapacity { .. })),
        "b has no slot here, a's one is in use: {second:?}"
    );
    let report = store.share_report();
    assert_eq!(report.applied, 1);
    let claim_a = report
        .claims
        .iter()
        .find(|c| c.key.name == "a")
        .expect("a claimed");
    assert_eq!((claim_a.slots, claim_a.in_use), (1, 1));

    // An older allocation arriving late changes nothing.
    allot(&store, 1, &[("a", 2), ("b", 2)], Duration::from_secs(30));
    assert!(store.acquire_for_gateway(&ask(GATEWAY_CLIENT, "y.test")).is_err());

    // A lowered share keeps the lease in use; the claim still counts it.
    allot(&store, 2, &[], Duration::from_secs(30));
    let claim_a = store
        .share_report()
        .claims
        .into_iter()
        .find(|c| c.key.name == "a");
    assert_eq!(claim_a.map(|c| (c.slots, c.in_use)), Some((0, 1)));
    store.release_for_gateway(&first.lease_id, None);

    // The share runs out (the leader is silent): nothing is granted, with
    // a reason that says so.
    let store = sharing(member());
    allot(&store, 1, &[("a", 2), ("b", 2)], Duration::from_millis(50));
    assert!(store.acquire_for_gateway(&ask(GATEWAY_CLIENT, "z.test")).is_ok());
    tokio::time::sleep(Duration::from_millis(80)).await;
    let late = store.acquire_for_gateway(&ask(GATEWAY_CLIENT, "w.test"));
    assert!(unavailable(&late), "{late:?}");
    let api = store.acquire_durably(ask("crawler", "w.test")).await;
    assert!(
        matches!(&api, Err(AcquireError::Unavailable(why)) if why.contains("no capacity share")),
        "{api:?}"
    );
}

#[tokio::test]
async fn a_lapsed_membership_grants_nothing_and_cuts_the_tunnels() {
    let tenure = member();
    let store = sharing(tenure.clone());
    allot(&store, 1, &[("a", 2), ("b", 2)], Duration::from_secs(30));
    let tunnel = store
        .acquire_for_gateway(&ask(GATEWAY_CLIENT, "x.test"))
        .expect("granted");
    let revoked = tunnel.revoked.clone();
    assert!(!revoked.is_revoked());
    tenure.end();
    let refused = store.acquire_for_gateway(&ask(GATEWAY_CLIENT, "y.test"));
    assert!(
        matches!(&refused, Err(AcquireError::Unavailable(why)) if why.contains("membership lapsed")),
        "{refused:?}"
    );
    store.tick();
    tokio::time::timeout(Duration::from_secs(1), revoked.revoked())
        .await
        .expect("the tunnel is cut once the share lapsed");
}

#[tokio::test]
async fn what_it_learns_goes_to_the_leader_until_acknowledged() {
    let store = sharing(member());
    allot(&store, 1, &[("a", 2), ("b", 2)], Duration::from_secs(30));
    let news = store.share_news().expect("share mode");
    let lease = store
        .acquire_durably(ask("crawler", "blocked.test"))
        .await
        .expect("granted");
    let noticed = news.notified();
    store
        .report_durably(
            &lease.id,
            Outcome::Blocked,
            None,
            &Caller::Identity("crawler".into()),
        )
        .await
        .expect("reported");
    tokio::time::timeout(Duration::from_secs(1), noticed)
        .await
        .expect("the link is woken at once");
    let outbox = store.share_report().outbox;
    let kinds: Vec<&str> = outbox
        .iter()
        .map(|(_, item)| match item {
            FleetItem::Blocked { .. } => "blocked",
            FleetItem::TargetRest { .. } => "target rest",
            _ => "other",
        })
        .collect();
    assert!(
        kinds.contains(&"blocked") && kinds.contains(&"target rest"),
        "{kinds:?}"
    );
    let last = outbox.last().map(|(seq, _)| *seq).expect("numbered");
    store.apply_share(ShareUpdate {
        allotment: None,
        valid_until: Instant::now() + Duration::from_secs(30),
        acked: last,
        reset: false,
        feed: Vec::new(),
    });
    assert!(store.share_report().outbox.is_empty(), "acknowledged changes go");
}

#[tokio::test]
async fn the_leaders_feed_rests_proxies_and_a_reset_forgets_what_it_does_not_name() {
    let store = sharing(member());
    allot(&store, 1, &[("a", 2), ("b", 2)], Duration::from_secs(30));
    let in_a_minute = jiff::Timestamp::now().as_millisecond() + 60_000;
    store.apply_share(ShareUpdate {
        allotment: None,
        valid_until: Instant::now() + Duration::from_secs(30),
        acked: 0,
        reset: false,
        feed: vec![FleetItem::ProxyRest {
            proxy: "ns/a".into(),
            until_ms: in_a_minute,
        }],
    });
    for _ in 0..3 {
        let grant = store
            .acquire_for_gateway(&ask(GATEWAY_CLIENT, "x.test"))
            .expect("b serves");
        assert_eq!(grant.proxy.name, "b", "a rests fleet-wide");
        store.release_for_gateway(&grant.lease_id, None);
    }
    assert!(
        store.share_report().outbox.is_empty(),
        "the leader's word is not passed back to it"
    );
    store.apply_share(ShareUpdate {
        allotment: None,
        valid_until: Instant::now() + Duration::from_secs(30),
        acked: 0,
        reset: true,
        feed: vec![FleetItem::Available(Box::new(AvailabilityBody::from(&ready(
            "a",
        ))))],
    });
    let names: Vec<String> = store
        .proxies()
        .into_iter()
        .map(|p| p.availability.key.name)
        .collect();
    assert_eq!(names, ["a"], "b is not in the fleet the leader starts over with");
}
