//! Member Leases against the in-process fake API server, with a lease
//! duration of 1 s (renew deadline 0.67 s, retry period 0.13 s): two
//! members see each other with their addresses; one that stops renewing
//! is judged dead no sooner than the lease duration after its last renew
//! (its own tenure over by then), a released one at once, a deleted one is
//! reported gone; the Lease of a member judged dead is removed only as it
//! was judged; a member that stops renewing is quiet (its probes go to
//! the others) from half the lease duration on; a lapsed member renews
//! no more; `keep` publishes tables
//! (and `egress_proxies_replicas{state}`) and releases the Lease when
//! stopped.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies::adapters::leader::{SystemClock, Timings};
use egress_proxies::adapters::replicas::ReplicaError;
use egress_proxies::adapters::replicas::members::{self, MemberIdentity, MemberTable, Membership, Roster};
use egress_proxies::telemetry::metrics::metrics;
use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use support::eventually;

const NAMESPACE: &str = "crawl";
const LEASE_DURATION: Duration = Duration::from_secs(1);

fn client(fake: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap()
}

fn timings() -> Timings {
    Timings::from_lease_duration(LEASE_DURATION)
}

fn identity(pod: &str, n: u8) -> MemberIdentity {
    MemberIdentity {
        pod: pod.to_owned(),
        incarnation: [n; 8],
        address: Some(format!("127.0.0.{n}:8091")),
    }
}

async fn join(fake: &FakeApiServer, me: &MemberIdentity) -> Membership {
    Membership::join(
        client(fake),
        NAMESPACE,
        me.clone(),
        timings(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap()
}

fn roster(fake: &FakeApiServer, me: &MemberIdentity) -> Roster {
    Roster::new(client(fake), NAMESPACE, me, timings(), Arc::new(SystemClock))
}

/// The value of one metric line, 0 when absent.
fn metric(line_start: &str) -> f64 {
    metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[actix_rt::test]
async fn two_members_see_each_other_with_their_addresses() {
    let fake = FakeApiServer::start().unwrap();
    let (a, b) = (identity("operator-a", 1), identity("operator-b", 2));
    let member_a = join(&fake, &a).await;
    let _member_b = join(&fake, &b).await;
    assert!(member_a.tenure().is_leading(), "a member acts once it joined");

    let lease: Lease = Api::namespaced(client(&fake), NAMESPACE)
        .get(&a.lease_name())
        .await
        .unwrap();
    let labels = lease.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["crawl.example.com/member"], "true");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "egress-proxies-operator");
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations["crawl.example.com/replica-address"], "127.0.0.1:8091");
    assert_eq!(annotations["crawl.example.com/pod"], "operator-a");
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("operator-a/0101010101010101")
    );

    for me in [&a, &b] {
        let table = roster(&fake, me).look().await.unwrap();
        let mut tags = table.live_tags();
        tags.sort();
        let mut expected = vec![a.tag(), b.tag()];
        expected.sort();
        assert_eq!(tags, expected);
        assert_eq!(table.address_of(&b.tag()), Some("127.0.0.2:8091"));
        assert_eq!(
            table
                .live
                .iter()
                .find(|m| m.tag == a.tag())
                .unwrap()
                .pod
                .as_deref(),
            Some("operator-a")
        );
        assert!(table.dead.is_empty() && table.gone.is_empty());
    }
}

#[actix_rt::test]
async fn a_member_that_stops_renewing_is_dead_after_the_lease_duration_and_not_before() {
    let fake = FakeApiServer::start().unwrap();
    let (a, b) = (identity("operator-a", 1), identity("operator-b", 2));
    let mut member_a = join(&fake, &a).await;
    let member_b = join(&fake, &b).await;
    // B's last renew: its join, done by now.
    let b_renewed = Instant::now();
    let mut watcher = roster(&fake, &a);
    let (mut first_quiet, mut first_dead) = (None, None);
    while first_dead.is_none() {
        assert!(
            b_renewed.elapsed() < Duration::from_secs(5),
            "B never judged dead"
        );
        member_a.renew().await.unwrap();
        let table = watcher.look().await.unwrap();
        assert!(table.is_live(&a.tag()), "A renews and stays live");
        assert!(!table.quiet.contains(&a.tag()), "A renews and is never quiet");
        if table.dead.contains(&b.tag()) {
            first_dead = Some(b_renewed.elapsed());
        } else {
            assert!(table.is_live(&b.tag()));
            if table.quiet.contains(&b.tag()) {
                first_quiet.get_or_insert(b_renewed.elapsed());
            }
        }
        tokio::time::sleep(timings().retry_period).await;
    }
    let dead_after = first_dead.unwrap();
    assert!(
        dead_after >= LEASE_DURATION,
        "judged dead {dead_after:?} after its last renew"
    );
    // Quiet (its probes go to the others) from half the lease duration on.
    let quiet_after = first_quiet.expect("B quiet before it was dead");
    assert!(
        quiet_after >= LEASE_DURATION / 2 && quiet_after < dead_after,
        "quiet {quiet_after:?} after its last renew, dead {dead_after:?}"
    );
    assert!(
        !member_b.tenure().is_leading(),
        "B stopped acting before the others called it dead"
    );
}

#[actix_rt::test]
async fn a_released_member_is_dead_at_once_and_a_deleted_one_gone() {
    let fake = FakeApiServer::start().unwrap();
    let (a, b, c) = (
        identity("operator-a", 1),
        identity("operator-b", 2),
        identity("operator-c", 3),
    );
    let _member_a = join(&fake, &a).await;
    let member_b = join(&fake, &b).await;
    let member_c = join(&fake, &c).await;
    let mut watcher = roster(&fake, &a);
    assert_eq!(watcher.look().await.unwrap().live.len(), 3);

    let tenure_b = member_b.tenure();
    member_b.release().await.unwrap();
    assert!(!tenure_b.is_leading(), "released: B acts no more");
    let table = watcher.look().await.unwrap();
    assert_eq!(table.dead, vec![b.tag()], "released is dead at the next look");
    assert!(table.is_live(&c.tag()));

    drop(member_c);
    Api::<Lease>::namespaced(client(&fake), NAMESPACE)
        .delete(&c.lease_name(), &DeleteParams::default())
        .await
        .unwrap();
    let table = watcher.look().await.unwrap();
    assert_eq!(table.gone, vec![c.tag()]);
    assert!(!table.is_live(&c.tag()));
    assert_eq!(watcher.look().await.unwrap().gone, vec![], "gone is said once");
}

#[actix_rt::test]
async fn only_a_lease_judged_dead_is_removed_and_only_as_it_was_judged() {
    let fake = FakeApiServer::start().unwrap();
    let (a, b, c) = (
        identity("operator-a", 1),
        identity("operator-b", 2),
        identity("operator-c", 3),
    );
    let _member_a = join(&fake, &a).await;
    let member_b = join(&fake, &b).await;
    let member_c = join(&fake, &c).await;
    let leases: Api<Lease> = Api::namespaced(client(&fake), NAMESPACE);
    let mut watcher = roster(&fake, &a);
    watcher.look().await.unwrap();
    assert!(
        !watcher.remove_dead(&c.tag()).await.unwrap(),
        "a live member's Lease stays"
    );
    assert!(leases.get_opt(&c.lease_name()).await.unwrap().is_some());

    member_b.release().await.unwrap();
    member_c.release().await.unwrap();
    let table = watcher.look().await.unwrap();
    assert_eq!(table.dead.len(), 2);
    // C's Lease changes after the look (someone wrote it): it is kept.
    let mut changed = leases.get(&c.lease_name()).await.unwrap();
    changed
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("touched".into(), "yes".into());
    leases
        .replace(&c.lease_name(), &Default::default(), &changed)
        .await
        .unwrap();
    assert!(
        !watcher.remove_dead(&c.tag()).await.unwrap(),
        "changed since it was judged"
    );
    assert!(leases.get_opt(&c.lease_name()).await.unwrap().is_some());
    assert!(watcher.remove_dead(&b.tag()).await.unwrap());
    assert!(leases.get_opt(&b.lease_name()).await.unwrap().is_none());
    assert_eq!(watcher.look().await.unwrap().gone, vec![b.tag()]);
}

#[actix_rt::test]
async fn a_lapsed_member_renews_no_more() {
    let fake = FakeApiServer::start().unwrap();
    let a = identity("operator-a", 1);
    let mut member = join(&fake, &a).await;
    member.renew().await.unwrap();
    // Past the renew deadline without a renew: the tenure is over.
    tokio::time::sleep(timings().renew_deadline + Duration::from_millis(50)).await;
    assert!(!member.tenure().is_leading());
    assert!(matches!(member.renew().await, Err(ReplicaError::Lapsed { .. })));
    assert!(
        matches!(member.renew().await, Err(ReplicaError::Lapsed { .. })),
        "a lapse is for good"
    );
    assert!(!member.tenure().is_leading());
}

#[actix_rt::test]
async fn keep_publishes_the_members_and_releases_the_lease_when_stopped() {
    let fake = FakeApiServer::start().unwrap();
    let (a, b) = (identity("operator-a", 1), identity("operator-b", 2));
    let member_a = join(&fake, &a).await;
    let _member_b = join(&fake, &b).await;
    let tenure = member_a.tenure();
    let (tables, mut seen) = tokio::sync::watch::channel(MemberTable::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let kept = tokio::spawn(members::keep(
        member_a,
        roster(&fake, &a),
        timings(),
        tables,
        stopped,
    ));
    seen.wait_for(|t| t.live.len() == 2).await.unwrap();
    assert_eq!(metric("egress_proxies_replicas{state=\"live\"}"), 2.0);
    assert_eq!(metric("egress_proxies_replicas{state=\"quiet\"}"), 0.0);
    assert_eq!(metric("egress_proxies_replicas{state=\"dead\"}"), 0.0);
    // Renewed past the first renew deadline.
    tokio::time::sleep(timings().renew_deadline * 2).await;
    assert!(tenure.is_leading(), "keep renews the member Lease");
    stop.send_replace(true);
    kept.await.unwrap().unwrap();
    assert!(!tenure.is_leading());
    let leases: Api<Lease> = Api::namespaced(client(&fake), NAMESPACE);
    let holder = eventually("A's member Lease released", Duration::from_secs(5), async || {
        let lease = leases.get(&a.lease_name()).await.ok()?;
        let holder = lease.spec?.holder_identity;
        holder.is_none().then_some(())
    })
    .await;
    assert_eq!(holder, ());
    let table = roster(&fake, &b).look().await.unwrap();
    assert_eq!(table.dead, vec![a.tag()]);
}
