//! The leader Lease kept on the keeper's thread, against the in-process
//! fake API server (lease duration 1 s: renew deadline 0.67 s, retry
//! period 0.13 s): a candidate leads and keeps leading while the thread
//! that started it is blocked for three lease durations (as a busy actor
//! system would hold it); a second candidate follows the holder and leads
//! once the first stops with a release; a stop that keeps the Lease leaves
//! it to expire; a Lease taken by another candidate ends the leadership
//! (the tenure with it); the member Lease's keeping runs there too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies::adapters::leader::{LeaderElector, SystemClock, Tenure, Timings};
use egress_proxies::adapters::lease_keeper::{Election, LeaseKeeper, Release, Standing};
use egress_proxies::adapters::replicas::members::{self, MemberIdentity, MemberTable, Membership, Roster};
use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

const NAMESPACE: &str = "crawl";
const LEASE: &str = "egress-proxies-operator-leader";
const LEASE_DURATION: Duration = Duration::from_secs(1);

fn config(fake: &FakeApiServer) -> kube::Config {
    kube::Config::new(fake.url().parse().unwrap())
}

fn candidate(keeper: &LeaseKeeper, fake: &FakeApiServer, identity: &str) -> (Election, Tenure) {
    let client = keeper.client(config(fake)).unwrap();
    let clock = Arc::new(SystemClock);
    let elector = LeaderElector::new(
        client,
        NAMESPACE,
        LEASE,
        identity,
        Timings::from_lease_duration(LEASE_DURATION),
        clock.clone(),
    );
    let tenure = Tenure::new(clock);
    (keeper.elect(elector, tenure.clone()), tenure)
}

async fn holder(fake: &FakeApiServer) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(kube::Client::try_from(config(fake)).unwrap(), NAMESPACE);
    api.get(LEASE).await.unwrap().spec?.holder_identity
}

async fn within<T>(what: &str, limit: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} within {limit:?}"))
}

#[actix_rt::test]
async fn renewals_go_on_while_the_starting_thread_is_blocked() {
    let fake = FakeApiServer::start().unwrap();
    let keeper = LeaseKeeper::start().unwrap();
    let (mut election, tenure) = candidate(&keeper, &fake, "operator-a");
    assert!(within("leading", Duration::from_secs(5), election.leading()).await);
    assert!(tenure.is_leading());

    // The caller's thread held for three lease durations: no renewal could
    // run here, and the tenure (0.67 s per renewal) would have lapsed.
    let blocked = Instant::now();
    std::thread::sleep(3 * LEASE_DURATION);
    assert!(
        tenure.is_leading(),
        "the tenure lasts while the starting thread is blocked ({:?})",
        blocked.elapsed()
    );
    assert_eq!(*election.standing().borrow(), Standing::Leading);
    assert_eq!(holder(&fake).await.as_deref(), Some("operator-a"));
    tenure.end();
    election.stop(Release::Release).await;
    assert_eq!(holder(&fake).await, None, "released on the stop");
}

#[actix_rt::test]
async fn a_follower_leads_once_the_holder_stops_with_a_release() {
    let fake = FakeApiServer::start().unwrap();
    let keeper = LeaseKeeper::start().unwrap();
    let (mut a, tenure_a) = candidate(&keeper, &fake, "operator-a");
    assert!(within("a leading", Duration::from_secs(5), a.leading()).await);
    let (mut b, tenure_b) = candidate(&keeper, &fake, "operator-b");
    let mut standing_b = b.standing();
    within(
        "b following a",
        Duration::from_secs(5),
        standing_b.wait_for(|s| *s == Standing::Following("operator-a".to_owned())),
    )
    .await
    .unwrap();
    assert!(!tenure_b.is_leading());

    tenure_a.end();
    let stopped = Instant::now();
    a.stop(Release::Release).await;
    assert!(!tenure_a.is_leading());
    // Released: b takes it at its next attempt, well before a lease duration.
    assert!(within("b leading", LEASE_DURATION, b.leading()).await);
    let took = stopped.elapsed();
    assert!(tenure_b.is_leading());
    assert_eq!(holder(&fake).await.as_deref(), Some("operator-b"));
    eprintln!("lease_keeper: the follower led {took:?} after the release");
    b.stop(Release::Release).await;
}

#[actix_rt::test]
async fn a_stop_that_keeps_the_lease_leaves_it_to_expire() {
    let fake = FakeApiServer::start().unwrap();
    let keeper = LeaseKeeper::start().unwrap();
    let (mut a, tenure_a) = candidate(&keeper, &fake, "operator-a");
    assert!(within("a leading", Duration::from_secs(5), a.leading()).await);
    tenure_a.end();
    a.stop(Release::Keep).await;
    assert_eq!(
        holder(&fake).await.as_deref(),
        Some("operator-a"),
        "not released: the record still names a"
    );
    // Another candidate takes it once it expired on its own clock.
    let (mut b, _tenure_b) = candidate(&keeper, &fake, "operator-b");
    let started = Instant::now();
    assert!(within("b leading", 5 * LEASE_DURATION, b.leading()).await);
    assert!(
        started.elapsed() >= LEASE_DURATION,
        "b waited for the lease duration ({:?})",
        started.elapsed()
    );
    b.stop(Release::Release).await;
}

#[actix_rt::test]
async fn a_lease_taken_by_another_ends_the_leadership() {
    let fake = FakeApiServer::start().unwrap();
    let keeper = LeaseKeeper::start().unwrap();
    let (mut a, tenure_a) = candidate(&keeper, &fake, "operator-a");
    assert!(within("a leading", Duration::from_secs(5), a.leading()).await);

    // Another client writes itself in as the holder.
    let api: Api<Lease> = Api::namespaced(kube::Client::try_from(config(&fake)).unwrap(), NAMESPACE);
    // (A renewal may land between its read and its write: read again.)
    loop {
        let mut lease = api.get(LEASE).await.unwrap();
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".to_owned());
        }
        match api.replace(LEASE, &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("taking the Lease: {e}"),
        }
    }

    let why = within("a's leadership lost", 5 * LEASE_DURATION, a.lost()).await;
    assert_eq!(why, "another candidate holds the Lease");
    assert!(!tenure_a.is_leading());
    assert!(matches!(*a.standing().borrow(), Standing::Lost(_)));
    // A lost Lease is not released, even when asked: it is another's.
    a.stop(Release::Release).await;
    assert_eq!(holder(&fake).await.as_deref(), Some("intruder"));
}

#[actix_rt::test]
async fn a_member_lease_kept_there_lasts_while_the_starting_thread_is_blocked() {
    let fake = FakeApiServer::start().unwrap();
    let keeper = LeaseKeeper::start().unwrap();
    let client = keeper.client(config(&fake)).unwrap();
    let timings = Timings::from_lease_duration(LEASE_DURATION);
    let me = MemberIdentity {
        pod: "operator-a".to_owned(),
        incarnation: [1; 8],
        address: Some("127.0.0.1:8091".to_owned()),
    };
    let joining = {
        let (client, me) = (client.clone(), me.clone());
        async move { Membership::join(client, NAMESPACE, me, timings, Arc::new(SystemClock)).await }
    };
    let membership = keeper.run(joining).await.unwrap().unwrap();
    let tenure = membership.tenure();
    let roster = Roster::new(client, NAMESPACE, &me, timings, Arc::new(SystemClock));
    let (tables_tx, mut tables) = tokio::sync::watch::channel(MemberTable::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let keeping = keeper.spawn(members::keep(membership, roster, timings, tables_tx, stopped));

    std::thread::sleep(3 * LEASE_DURATION);
    assert!(
        tenure.is_leading(),
        "the membership lasts while the starting thread is blocked"
    );
    assert!(!keeping.is_finished(), "still kept");
    assert!(tables.borrow_and_update().is_live(&me.tag()));

    stop.send_replace(true);
    within("the keeping stopped", Duration::from_secs(5), keeping)
        .await
        .unwrap()
        .unwrap();
}
