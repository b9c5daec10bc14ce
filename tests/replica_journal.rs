//! Per-member lease journals against the in-process fake API server: a
//! member writes its own labelled shards `egress-proxies-leases-<tag>-NN`
//! (the leader's default names unchanged), only while the tenure it was
//! given lasts; the leader adopts a journal by reading every shard by
//! label (the legacy one by name) and deletes the shards only at the
//! versions it read — a shard written after the read is kept and read
//! again.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies::adapters::leader::{SystemClock, Tenure};
use egress_proxies::adapters::stores::configmap_lease_journal::{
    ConfigMapLeaseJournal, JournalName, SHARDS, Writer,
};
use egress_proxies::adapters::stores::journal_adoption::{Deletion, JournalAdoption, journal_tags};
use egress_proxies::domain::lease::journal::{
    Durable, JournalError, LeaseChange, LeaseJournal, LeaseRecord, LeaseSnapshot,
};
use egress_proxies::domain::membership::MemberTag;
use egress_proxies::domain::resource::ObjectKey;
use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};

const NAMESPACE: &str = "crawl";

fn client(fake: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap()
}

fn tenure_for(how_long: Duration) -> Tenure {
    let tenure = Tenure::new(Arc::new(SystemClock));
    tenure.extend(Instant::now() + how_long);
    tenure
}

fn writer(identity: &str, tenure: Tenure) -> Writer {
    Writer {
        identity: identity.to_owned(),
        tenure: Some(tenure),
        give_up_after: Duration::from_secs(2),
    }
}

fn lease(id: &str, proxy: &str) -> LeaseRecord {
    LeaseRecord {
        id: id.to_owned(),
        proxy: ObjectKey::new(NAMESPACE, proxy),
        target: "example.com".to_owned(),
        expires: jiff::Timestamp::now() + jiff::SignedDuration::from_secs(600),
        ttl_ms: 600_000,
        client: None,
        owner: Some("crawler".to_owned()),
    }
}

/// Records `changes` and waits until they are written.
async fn record(journal: &mut ConfigMapLeaseJournal, changes: &[LeaseChange]) -> Result<(), JournalError> {
    match journal.record(changes)? {
        Durable::Now => Ok(()),
        Durable::Later(written) => tokio::time::timeout(Duration::from_secs(10), written)
            .await
            .expect("the journal answered within 10 s"),
    }
}

async fn names(api: &Api<ConfigMap>) -> BTreeSet<String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect()
}

fn ids(snapshot: &LeaseSnapshot) -> BTreeSet<String> {
    snapshot.leases.iter().map(|l| l.id.clone()).collect()
}

fn tag(text: &str) -> MemberTag {
    MemberTag::parse(text).unwrap()
}

/// A member journal with the leases `ids` (one proxy each), written.
async fn member_journal(fake: &FakeApiServer, member: &MemberTag, ids: &[&str]) -> ConfigMapLeaseJournal {
    let mut journal = ConfigMapLeaseJournal::open_named(
        client(fake),
        NAMESPACE,
        JournalName::member(member),
        writer(&format!("pod-{member}"), tenure_for(Duration::from_secs(60))),
    )
    .await
    .unwrap();
    let changes: Vec<LeaseChange> = ids
        .iter()
        .map(|id| LeaseChange::Granted(lease(id, &format!("p-{id}"))))
        .collect();
    record(&mut journal, &changes).await.unwrap();
    journal
}

#[actix_rt::test]
async fn a_member_writes_its_own_labelled_shards_and_the_default_names_stay_todays() {
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), NAMESPACE);
    let member = tag("0a1b2c3d");
    let _journal = member_journal(&fake, &member, &["l1", "l2", "l3"]).await;
    let expected: BTreeSet<String> = (0..SHARDS)
        .map(|i| format!("egress-proxies-leases-0a1b2c3d-{i:02}"))
        .collect();
    assert_eq!(names(&api).await, expected, "the first round writes every shard");
    let labelled = api
        .list(&ListParams::default().labels("crawl.example.com/lease-journal=0a1b2c3d"))
        .await
        .unwrap();
    assert_eq!(
        labelled.items.len(),
        SHARDS,
        "every shard carries the tag's label"
    );

    let mut leader = ConfigMapLeaseJournal::open(
        client(&fake),
        NAMESPACE,
        writer("leader", tenure_for(Duration::from_secs(60))),
    )
    .await
    .unwrap();
    assert_eq!(
        leader.load(jiff::Timestamp::now()).unwrap(),
        LeaseSnapshot::default()
    );
    record(&mut leader, &[LeaseChange::Granted(lease("l9", "p9"))])
        .await
        .unwrap();
    let all = names(&api).await;
    for i in 0..SHARDS {
        assert!(all.contains(&format!("egress-proxies-leases-{i:02}")), "{all:?}");
    }
    let legacy = api.get("egress-proxies-leases-00").await.unwrap();
    assert!(
        !legacy
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("crawl.example.com/lease-journal"),
        "the leader's shards carry no member label"
    );

    // A member journal opened again reads what it wrote, and only that.
    let mut again = ConfigMapLeaseJournal::open_named(
        client(&fake),
        NAMESPACE,
        JournalName::member(&member),
        writer("pod-again", tenure_for(Duration::from_secs(60))),
    )
    .await
    .unwrap();
    let loaded = again.load(jiff::Timestamp::now()).unwrap();
    assert_eq!(
        ids(&loaded),
        BTreeSet::from(["l1".into(), "l2".into(), "l3".into()])
    );
}

#[actix_rt::test]
async fn a_journal_writes_nothing_once_the_tenure_it_was_given_ends() {
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), NAMESPACE);
    let member = tag("00c0ffee");
    let tenure = tenure_for(Duration::from_secs(60));
    let mut journal = ConfigMapLeaseJournal::open_named(
        client(&fake),
        NAMESPACE,
        JournalName::member(&member),
        writer("pod-a", tenure.clone()),
    )
    .await
    .unwrap();
    record(&mut journal, &[LeaseChange::Granted(lease("before", "p1"))])
        .await
        .unwrap();
    tenure.end();
    let after = record(&mut journal, &[LeaseChange::Granted(lease("after", "p2"))]).await;
    assert!(matches!(after, Err(JournalError::NotLeading)), "{after:?}");
    let adopted = JournalAdoption::new(client(&fake), NAMESPACE, JournalName::member(&member))
        .read()
        .await
        .unwrap();
    assert_eq!(ids(&adopted.snapshot), BTreeSet::from(["before".into()]));
    assert_eq!(names(&api).await.len(), SHARDS);
}

#[actix_rt::test]
async fn adoption_reads_every_shard_by_label_and_deletes_only_that_journal() {
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), NAMESPACE);
    let dead = tag("deadbeef");
    let live = tag("0000aaaa");
    let _dead_journal = member_journal(&fake, &dead, &["d1", "d2", "d3", "d4", "d5"]).await;
    let _live_journal = member_journal(&fake, &live, &["a1"]).await;
    assert_eq!(
        journal_tags(client(&fake), NAMESPACE).await.unwrap(),
        BTreeSet::from([dead.clone(), live.clone()])
    );

    let adoption = JournalAdoption::new(client(&fake), NAMESPACE, JournalName::member(&dead));
    let read = adoption.read().await.unwrap();
    assert_eq!(read.shards.len(), SHARDS);
    assert_eq!(
        ids(&read.snapshot),
        ["d1", "d2", "d3", "d4", "d5"].map(String::from).into(),
        "every shard's leases in one snapshot, none of the live member's"
    );
    assert_eq!(adoption.delete(&read).await.unwrap(), Deletion::Done);
    let left = names(&api).await;
    assert!(
        left.iter()
            .all(|n| n.starts_with("egress-proxies-leases-0000aaaa-")),
        "{left:?}"
    );
    assert_eq!(left.len(), SHARDS, "the live member's journal is untouched");
    assert!(adoption.read().await.unwrap().is_gone());
    assert_eq!(
        journal_tags(client(&fake), NAMESPACE).await.unwrap(),
        BTreeSet::from([live])
    );
    // Deleting again (another adopter, a retry) finds nothing and is done.
    assert_eq!(adoption.delete(&read).await.unwrap(), Deletion::Done);
}

#[actix_rt::test]
async fn a_shard_written_after_the_read_is_kept_and_read_again() {
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), NAMESPACE);
    let dead = tag("facade01");
    let mut journal = member_journal(&fake, &dead, &["d1", "d2"]).await;
    let adoption = JournalAdoption::new(client(&fake), NAMESPACE, JournalName::member(&dead));
    let read = adoption.read().await.unwrap();
    assert_eq!(ids(&read.snapshot), ["d1", "d2"].map(String::from).into());

    // A late write lands between the read and the delete.
    record(&mut journal, &[LeaseChange::Granted(lease("late", "p-late"))])
        .await
        .unwrap();
    drop(journal);
    let Deletion::ChangedSince(again) = adoption.delete(&read).await.unwrap() else {
        panic!("a shard changed after the read was deleted unread");
    };
    assert!(
        ids(&again.snapshot).contains("late"),
        "{:?}",
        ids(&again.snapshot)
    );
    assert_eq!(
        again.shards.len(),
        1,
        "only the changed shard is left: {:?}",
        again.shards
    );
    assert_eq!(adoption.delete(&again).await.unwrap(), Deletion::Done);
    assert!(names(&api).await.is_empty());
}

#[actix_rt::test]
async fn the_legacy_leader_journal_is_adopted_by_name() {
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), NAMESPACE);
    let tenure = tenure_for(Duration::from_secs(60));
    let mut leader =
        ConfigMapLeaseJournal::open(client(&fake), NAMESPACE, writer("old-leader", tenure.clone()))
            .await
            .unwrap();
    record(
        &mut leader,
        &[
            LeaseChange::Granted(lease("old1", "p1")),
            LeaseChange::Granted(lease("old2", "p2")),
        ],
    )
    .await
    .unwrap();
    tenure.end();
    // A ConfigMap of someone else's is not a shard and stays.
    let other = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("egress-proxies-leases-notes".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &other).await.unwrap();

    let adoption = JournalAdoption::new(client(&fake), NAMESPACE, JournalName::default());
    let read = adoption.read().await.unwrap();
    assert_eq!(read.shards.len(), SHARDS);
    assert_eq!(ids(&read.snapshot), ["old1", "old2"].map(String::from).into());
    assert_eq!(adoption.delete(&read).await.unwrap(), Deletion::Done);
    assert_eq!(
        names(&api).await,
        BTreeSet::from(["egress-proxies-leases-notes".to_owned()])
    );
}
