//! A stalled link: a partition between one client and the API server,
//! while other clients keep working.

use std::time::Duration;

use fake_apiserver::FakeApiServer;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn leases(url: String) -> Api<Lease> {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    Api::namespaced(client, "ns")
}

/// The next event that is not a bookmark.
async fn change(
    events: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<Lease>>> + Unpin),
) -> Option<kube::Result<WatchEvent<Lease>>> {
    loop {
        match events.next().await {
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            other => return other,
        }
    }
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
}

#[actix_rt::test]
async fn a_stalled_link_holds_requests_open_until_it_heals() {
    let fake = FakeApiServer::start().unwrap();
    let link = fake.link().unwrap();
    assert_ne!(link.addr, fake.addr);
    let direct = leases(fake.url());
    let cut = leases(link.url());

    // Both paths reach the same objects.
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 3}}),
    )
    .unwrap();
    let made = cut.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(holder(&direct.get("leader").await.unwrap()).as_deref(), Some("a"));
    let mut events = direct.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let mut linked_events = cut.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    assert!(matches!(
        change(&mut linked_events).await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    assert!(matches!(
        change(&mut events).await,
        Some(Ok(WatchEvent::Added(_)))
    ));

    // Cut: no answer (not an error) on the link; the direct path still works.
    link.stall();
    let held = Duration::from_millis(800);
    assert!(
        tokio::time::timeout(held, cut.get("leader")).await.is_err(),
        "a stalled read gets no answer"
    );
    let mut renew = made.clone();
    renew.spec.as_mut().unwrap().holder_identity = Some("a-renewed".into());
    let late = tokio::spawn(async move { cut.replace("leader", &PostParams::default(), &renew).await });
    tokio::time::sleep(held).await;
    assert!(!late.is_finished(), "a stalled write gets no answer");
    assert_eq!(
        holder(&direct.get("leader").await.unwrap()).as_deref(),
        Some("a"),
        "nor does it land while held"
    );

    // Meanwhile another client takes over through the direct path.
    let mut taken = made;
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    direct
        .replace("leader", &PostParams::default(), &taken)
        .await
        .unwrap();
    assert!(matches!(
        change(&mut events).await,
        Some(Ok(WatchEvent::Modified(_)))
    ));
    assert!(
        tokio::time::timeout(held, change(&mut linked_events))
            .await
            .is_err(),
        "watch events are held on a stalled link"
    );

    // Healed: the held write arrives late and meets the 409 of a stale version.
    link.resume();
    let answer = tokio::time::timeout(Duration::from_secs(10), late)
        .await
        .expect("answered after the heal")
        .unwrap();
    match answer {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
        other => panic!("expected a conflict, got {other:?}"),
    }
    match tokio::time::timeout(Duration::from_secs(10), change(&mut linked_events)).await {
        Ok(Some(Ok(WatchEvent::Modified(l)))) => assert_eq!(holder(&l).as_deref(), Some("b")),
        other => panic!("the held watch event after the heal: {other:?}"),
    }
    let through_link = leases(link.url());
    assert_eq!(
        holder(&through_link.get("leader").await.unwrap()).as_deref(),
        Some("b")
    );
}
