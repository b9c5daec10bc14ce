//! The lease store on its own: gateway and API leases from one book,
//! waiting in turn, fair shares taking leases back.

use std::time::{Duration, Instant};

use super::*;
use crate::adapters::gateway::Upstream;
use crate::domain::lease::{Caller, GATEWAY_CLIENT, Outcome};

/// A Ready proxy `ns/<name>` as the ProxyActor reports it.
pub(super) fn ready(name: &str) -> Availability {
    Availability {
        key: ObjectKey::new("ns", name),
        ready: true,
        phase: "Ready".into(),
        healthy: Some(true),
        url: Some(format!("http://{name}:3128")),
        attributes: Default::default(),
        latency: Some(Duration::from_millis(5)),
        credentials: None,
        realm: None,
        retiring: false,
    }
}

fn ask(client: &str) -> AcquireRequest {
    AcquireRequest {
        target: "example.com".into(),
        client: Some(client.into()),
        ..Default::default()
    }
}

/// The gateway and the lease API lease from one book: a gateway lease
/// fills the proxy for an API client and the other way round.
#[tokio::test]
async fn gateway_and_api_leases_share_one_book() {
    let settings = LeaseSettings {
        capacity: 1,
        cooldown: Duration::ZERO,
        ..Default::default()
    };
    let store = LeaseStore::new(settings);
    store.upsert(ready("p"));

    let gateway = store
        .acquire_for_gateway(&ask(GATEWAY_CLIENT))
        .expect("a gateway lease");
    let api = store.acquire_durably(ask("crawler")).await;
    assert!(matches!(api, Err(AcquireError::NoCapacity { .. })), "{api:?}");

    store.release_for_gateway(&gateway.lease_id, None);
    let api = store.acquire_durably(ask("crawler")).await.expect("freed");
    let refused = store.acquire_for_gateway(&ask(GATEWAY_CLIENT));
    assert!(
        matches!(refused, Err(AcquireError::NoCapacity { .. })),
        "{refused:?}"
    );

    let by = |who: &str| Caller::Identity(who.into());
    let refused = store.release_durably(&gateway.lease_id, &by("default")).await;
    assert!(refused.is_err(), "a gateway lease is the gateway's: {refused:?}");
    assert!(
        store.release_durably(&api.id, &by("anyone")).await.unwrap(),
        "an API lease without an owner: anyone's"
    );
    let stats = store.stats();
    assert_eq!(
        (stats.granted, stats.denied, stats.released, stats.active),
        (2, 2, 2, 0)
    );
}

fn owned(owner: &str) -> AcquireRequest {
    AcquireRequest {
        owner: Some(owner.into()),
        ..ask(GATEWAY_CLIENT)
    }
}

fn one_proxy_store() -> LeaseStore {
    let settings = LeaseSettings {
        capacity: 1,
        cooldown: Duration::ZERO,
        ..Default::default()
    };
    let store = LeaseStore::new(settings);
    store.upsert(ready("p"));
    store
}

/// A waiting request gets the proxy the moment it is released, ahead
/// of an API acquire; a wait that ends unserved is one denial however
/// long it waited.
#[tokio::test]
async fn a_waiter_is_served_at_the_release_and_an_unserved_wait_is_one_denial() {
    let store = one_proxy_store();
    let held = store.acquire_for_gateway(&owned("a")).unwrap();

    let waiting =
        tokio::spawn(store.acquire_for_gateway_within(owned("b"), Instant::now() + Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    store.release_for_gateway(&held.lease_id, None);
    let api = store.acquire_durably(ask("crawler")).await;
    assert!(
        matches!(api, Err(AcquireError::NoCapacity { .. })),
        "the waiter's first: {api:?}"
    );
    let granted = waiting.await.unwrap().expect("served");
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );

    let denied_before = store.stats().denied;
    let refused = store
        .acquire_for_gateway_within(owned("c"), Instant::now() + Duration::from_millis(1200))
        .await;
    assert!(
        matches!(refused, Err(AcquireError::NoCapacity { .. })),
        "{refused:?}"
    );
    let stats = store.stats();
    assert_eq!(stats.denied - denied_before, 1, "one wait, one denial");
    store.release_for_gateway(&granted.lease_id, None);
}

/// A waiter whose only proxy rests for its target (a gateway pacing
/// rest) is served when the rest ends, without a lease ending.
#[tokio::test]
async fn a_waiter_is_served_when_a_rest_for_its_target_ends() {
    let store = one_proxy_store();
    let held = store.acquire_for_gateway(&owned("a")).unwrap();
    let waiting =
        tokio::spawn(store.acquire_for_gateway_within(owned("b"), Instant::now() + Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    store.release_for_gateway(&held.lease_id, Some(Duration::from_millis(300)));
    waiting.await.unwrap().expect("served");
    let after = released.elapsed();
    assert!(
        after >= Duration::from_millis(300) && after < Duration::from_millis(420),
        "served {after:?} after the release, the rest being 300 ms"
    );
}

/// A hog's tunnel taken back for a waiter goes to it whatever rest the
/// hog's release would leave (here the lease cooldown, 30 s).
#[tokio::test]
async fn a_lease_taken_back_goes_to_the_waiter_without_a_rest() {
    let store = LeaseStore::new(LeaseSettings {
        capacity: 1,
        cooldown: Duration::from_secs(30),
        ..Default::default()
    });
    for name in ["p1", "p2", "p3"] {
        store.upsert(ready(name));
    }
    let hog: Vec<Upstream> = (0..3)
        .map(|_| store.acquire_for_gateway(&owned("a")).unwrap())
        .collect();
    let waiting =
        tokio::spawn(store.acquire_for_gateway_within(owned("b"), Instant::now() + Duration::from_secs(5)));
    let revoked = tokio::time::timeout(Duration::from_secs(2), hog[2].revoked.clone().revoked()).await;
    assert!(revoked.is_ok(), "the latest of the hog's leases is taken back");
    assert!(!hog[0].revoked.is_revoked() && !hog[1].revoked.is_revoked());
    // Its tunnel closes: released as a sticky session's would be, with the cooldown.
    store.release_for_gateway(&hog[2].lease_id, None);
    let granted = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("served at once")
        .unwrap()
        .expect("a lease");
    assert_eq!(granted.proxy, hog[2].proxy);
}

/// A waiter that gives up leaves the queue: the proxy freed later is
/// not granted to it.
#[tokio::test]
async fn a_waiter_that_gave_up_leaves_no_lease_behind() {
    let store = one_proxy_store();
    let held = store.acquire_for_gateway(&owned("a")).unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        store.acquire_for_gateway_within(owned("b"), Instant::now() + Duration::from_secs(10)),
    )
    .await;
    assert!(gave_up.is_err());
    store.release_for_gateway(&held.lease_id, None);
    let stats = store.stats();
    assert_eq!(stats.active, 0, "nothing granted to the one that left");
}

/// A gateway report is in the book when it returns: the next acquire
/// already avoids the proxy it rested.
#[tokio::test]
async fn a_gateway_report_counts_before_the_next_acquire() {
    let settings = LeaseSettings {
        capacity: 0,
        cooldown: Duration::ZERO,
        ..Default::default()
    };
    let store = LeaseStore::new(settings);
    for name in ["a", "b"] {
        store.upsert(ready(name));
    }
    let first = store.acquire_for_gateway(&ask(GATEWAY_CLIENT)).unwrap();
    store
        .report_for_gateway(&first.lease_id, Outcome::Error, "gateway: refused".into())
        .unwrap();
    store.release_for_gateway(&first.lease_id, None);
    for _ in 0..10 {
        let next = store.acquire_for_gateway(&ask(GATEWAY_CLIENT)).unwrap();
        assert_ne!(next.proxy, first.proxy, "the proxy reported failing rests");
        store.release_for_gateway(&next.lease_id, None);
    }
    assert!(matches!(
        store.renew_for_gateway("no-such-lease"),
        Err(RenewRefused::Renew(RenewError::Unknown(_)))
    ));
}
