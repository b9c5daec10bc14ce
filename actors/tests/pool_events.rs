//! The Kubernetes store's Events on a ProxyPool (a member starts retiring),
//! over real HTTP to the fake API server, behind the leader's fence as in
//! Kubernetes mode: an `events.k8s.io/v1` Event regarding the pool — kind,
//! name, namespace and incarnation — relating the member, with the reason
//! and note the PoolActor gives; one per member; none from a leader whose
//! tenure ran out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies::adapters::leader::{SystemClock, Tenure};
use egress_proxies::adapters::stores::FencedPools;
use egress_proxies::adapters::stores::kubernetes::KubeStore;
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource_store::PoolStore;
use fake_apiserver::FakeApiServer;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn note(member: &str, reason: &str) -> String {
    format!("member crawl/{member} retiring ({reason}): no new leases; deleted once drained")
}

#[actix_rt::test]
async fn each_retiring_member_is_an_event_on_its_pool() {
    egress_proxies::tls::ensure_crypto_provider();
    let fake = FakeApiServer::start().unwrap();
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let (store, _events) = KubeStore::new(
        client.clone(),
        None,
        "egress-proxies-operator",
        Some("pool-events-test".into()),
    );
    let tenure = Tenure::new(Arc::new(SystemClock));
    tenure.extend(Instant::now() + Duration::from_secs(60));
    let pools = FencedPools::new(Arc::new(store), tenure.clone());
    let pool = ObjectKey::new("crawl", "eu");
    let retire = async |member: &str, reason: &str| {
        let key = ObjectKey::new("crawl", member);
        let uid = format!("uid-{member}");
        pools
            .publish_pool_event(
                &pool,
                "uid-eu-1",
                (&key, &uid),
                "MemberRetiring",
                &note(member, reason),
            )
            .await;
    };
    // Two members retire: two Events. (Were the member not the related
    // object, the recorder would fold the second into a series of the
    // first, under the first one's note.)
    retire("eu-bcdfg", "blocked").await;
    retire("eu-hjklm", "age").await;
    // A leader whose tenure ended publishes nothing.
    tenure.end();
    retire("eu-npqrs", "errors").await;

    let events: Api<DynamicObject> = Api::namespaced_with(
        client,
        "crawl",
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events"),
    );
    let listed: Vec<Value> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| e.data)
        .collect();
    let mut seen: Vec<Value> = listed
        .iter()
        .map(|e| {
            let (regarding, related) = (&e["regarding"], &e["related"]);
            json!([
                e["type"],
                e["reason"],
                e["note"],
                regarding["apiVersion"],
                regarding["kind"],
                regarding["namespace"],
                regarding["name"],
                regarding["uid"],
                related["kind"],
                related["name"],
                related["uid"]
            ])
        })
        .collect();
    seen.sort_by_key(|e| e[9].as_str().map(str::to_owned));
    let expected = |member: &str, reason: &str| {
        json!([
            "Normal",
            "MemberRetiring",
            note(member, reason),
            "crawl.example.com/v1alpha1",
            "ProxyPool",
            "crawl",
            "eu",
            "uid-eu-1",
            "Proxy",
            member,
            format!("uid-{member}")
        ])
    };
    assert_eq!(
        seen,
        [expected("eu-bcdfg", "blocked"), expected("eu-hjklm", "age")],
        "{listed:#?}"
    );
}
