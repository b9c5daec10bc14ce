//! The transitions docs/reconcile.md describes, one row each: a Proxy, what
//! observe saw, what the actor remembers — and the plan `decide` makes.
//! No actors, no store, no provider: the decisions alone.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::health::Verdict;
use crate::provider_contract::{Op, Ownership, spec_hash};
use crate::resource::{Placement, RETIRING_ANNOTATION};
use crate::resource_store::CloudInitError;

const UID: &str = "u1";
const ID: &str = "i-1";

fn wall() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

fn installation() -> InstallationId {
    static ID: std::sync::OnceLock<InstallationId> = std::sync::OnceLock::new();
    ID.get_or_init(InstallationId::generate).clone()
}

/// The rules of an installation with the default replacement backoff, admitting every endpoint.
fn rules(installation: &InstallationId) -> Rules<'_> {
    Rules {
        installation,
        replacement: ReplacementBackoff::default(),
        external_endpoints: None,
    }
}

fn hash() -> SpecHash {
    spec_hash("sim", &Placement::default(), 3128, None)
}

/// A Proxy as JSON, edited row by row.
struct P(Value);

impl P {
    /// A Managed Proxy with the finalizer and the spec hash of [`desired`].
    fn managed() -> P {
        P(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "crawl", "uid": UID, "generation": 1,
                "finalizers": [FINALIZER], "annotations": {SPEC_HASH_ANNOTATION: hash().as_str()}},
            "spec": {"mode": "Managed", "provider": "sim", "port": 3128}
        }))
    }

    fn external() -> P {
        P(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "crawl", "uid": UID, "generation": 1},
            "spec": {"mode": "External", "endpoint": {"host": "10.0.0.1", "port": 3128}}
        }))
    }

    fn finalizers(mut self, f: Value) -> P {
        self.0["metadata"]["finalizers"] = f;
        self
    }

    fn annotate(mut self, name: &str, value: &str) -> P {
        self.0["metadata"]["annotations"][name] = json!(value);
        self
    }

    fn deleting(mut self) -> P {
        self.0["metadata"]["deletionTimestamp"] = json!("2023-11-14T22:00:00Z");
        self
    }

    fn spec(mut self, field: &str, value: Value) -> P {
        self.0["spec"][field] = value;
        self
    }

    fn status(mut self, status: Value) -> P {
        self.0["status"] = status;
        self
    }

    /// Serving instance `ID`, healthy.
    fn serving(self) -> P {
        self.status(json!({"phase": "Ready", "providerID": ID, "ip": "10.1.0.1",
            "endpoint": "10.1.0.1:3128", "health": {"healthy": true, "latencyMs": 5}}))
    }

    /// Instance `ID` lost `count` times in a row; its successor may come at
    /// `retry_in` seconds from now (negative: the wait is over).
    fn lost(self, count: u32, retry_in: i64, deleting: bool) -> P {
        let retry_at = wall()
            .checked_add(jiff::SignedDuration::from_secs(retry_in))
            .unwrap();
        self.status(json!({"phase": "Provisioning", "providerID": ID, "replacement": {
            "count": count, "reason": "instance stopped: exit 1", "lostAt": wall().to_string(),
            "retryAt": retry_at.to_string(), "deleting": deleting}}))
    }

    fn build(self) -> Proxy {
        serde_json::from_value(self.0).unwrap()
    }
}

fn ours() -> Ownership {
    Ownership {
        uid: Some(UID.into()),
        namespace: Some("crawl".into()),
        installation: Some(installation().to_string()),
        released: false,
    }
}

fn instance(state: InstanceState, ip: Option<&str>) -> Instance {
    Instance {
        id: ProviderId(ID.into()),
        state,
        ip: ip.map(|ip| ip.parse().unwrap()),
        port: None,
        outgoing_address: None,
        owner: ours(),
        created_at: None,
        reason: None,
    }
}

fn running() -> Instance {
    instance(InstanceState::Running, Some("10.1.0.1"))
}

fn theirs() -> Instance {
    Instance {
        owner: Ownership {
            installation: Some("other".into()),
            ..ours()
        },
        ..running()
    }
}

fn failed(class: ErrorClass) -> ProviderError {
    ProviderError::new(class, Op::Get, "sim", Some(ID), "as scripted")
}

fn found(i: Instance) -> Recorded {
    Recorded::Seen(ProviderId(ID.into()), Ok(i))
}

fn lookup_failed(class: ErrorClass) -> Recorded {
    Recorded::Seen(ProviderId(ID.into()), Err(failed(class)))
}

fn desired() -> Desired {
    Desired {
        provider: "sim".into(),
        cloud_init: None,
        hash: hash(),
        credentials: ProxyCredentials::new("proxy", "secret").unwrap(),
        salt: crate::credentials::Salt([7; 12]),
        realm: Some("egress-proxies-of-sim".into()),
    }
}

/// A Managed Proxy whose recorded instance `get` answered with `answer`
/// (`None`: none recorded).
fn managed(answer: Option<Result<Instance, ProviderError>>) -> Seen {
    Seen::Managed(ManagedSeen::Resolved {
        desired: Box::new(desired()),
        recorded: answer.map(|a| (ProviderId(ID.into()), a)),
    })
}

fn endpoint(refused: bool) -> Seen {
    Seen::External {
        leftover: Recorded::None,
        endpoint: Some(Ok(EndpointSeen {
            host: "10.0.0.1".into(),
            port: 3128,
            credentials: None,
            refused: refused.then(|| EndpointRefused {
                host: "10.0.0.1".into(),
                port: 3128,
                address: "127.0.0.1".parse().unwrap(),
                network: "127.0.0.0/8".parse().unwrap(),
            }),
        })),
    }
}

fn verdict(healthy: bool) -> Verdict {
    Verdict {
        uid: UID.into(),
        healthy,
        latency: healthy.then(|| Duration::from_millis(12)),
        reason: (!healthy).then(|| "connection refused".into()),
        consecutive_failures: u32::from(!healthy) * 3,
        last_transition: wall(),
        flipped: true,
    }
}

/// What the plan comes to, in words.
#[derive(Debug, PartialEq)]
struct Summary {
    actions: Vec<String>,
    notices: Vec<String>,
    phase: Option<Phase>,
    outcome: String,
    serves: bool,
    held: bool,
}

fn summary(plan: &Plan) -> Summary {
    Summary {
        actions: plan
            .actions
            .iter()
            .map(|a| match a {
                Action::AddFinalizer => "add finalizer".to_owned(),
                Action::RemoveFinalizer => "remove finalizer".to_owned(),
                Action::SetSpecHash(_) => "set spec hash".to_owned(),
                Action::Create { .. } => "create".to_owned(),
                Action::Delete { id, .. } => format!("delete {id}"),
                Action::Release { id, .. } => format!("release {id}"),
            })
            .collect(),
        notices: plan
            .notices
            .iter()
            .map(|n| match n {
                Notice::Event { reason, .. } => format!("event {reason}"),
                Notice::Warn { .. } => "warn".to_owned(),
                Notice::Lost { loss, count, .. } => format!("lost {} #{count}", loss.as_str()),
                Notice::Replaced { .. } => "replaced".to_owned(),
            })
            .collect(),
        phase: plan.status.status().phase,
        outcome: outcome(&plan.outcome),
        serves: plan.serve.is_some(),
        held: plan.held_since.is_some(),
    }
}

fn outcome(outcome: &Result<Next, ReconcileError>) -> String {
    match outcome {
        Ok(Next::After(wait)) => format!("After({}s)", wait.as_secs()),
        Ok(next) => format!("{next:?}"),
        Err(e) => format!("Err({})", e.metric_label()),
    }
}

/// One transition: the situation and the plan it must give.
struct Row {
    name: &'static str,
    proxy: Proxy,
    seen: Seen,
    memory: ProxyMemory,
    actions: &'static [&'static str],
    notices: &'static [&'static str],
    phase: Phase,
    outcome: &'static str,
    serves: bool,
    /// The status message says this (empty: not checked).
    says: &'static str,
}

fn row(name: &'static str, proxy: P, seen: Seen) -> Row {
    Row {
        name,
        proxy: proxy.build(),
        seen,
        memory: ProxyMemory::default(),
        actions: &[],
        notices: &[],
        phase: Phase::Pending,
        outcome: "Idle",
        serves: false,
        says: "",
    }
}

impl Row {
    fn memory(mut self, memory: ProxyMemory) -> Row {
        self.memory = memory;
        self
    }

    fn acts(mut self, actions: &'static [&'static str]) -> Row {
        self.actions = actions;
        self
    }

    fn tells(mut self, notices: &'static [&'static str]) -> Row {
        self.notices = notices;
        self
    }

    fn gives(mut self, phase: Phase, outcome: &'static str) -> Row {
        self.phase = phase;
        self.outcome = outcome;
        self
    }

    fn serving(mut self) -> Row {
        self.serves = true;
        self
    }

    fn says(mut self, message: &'static str) -> Row {
        self.says = message;
        self
    }
}

fn delete_requested(at: Instant) -> ProxyMemory {
    ProxyMemory {
        delete_requested: Some((ProviderId(ID.into()), at)),
        ..ProxyMemory::default()
    }
}

fn table(now: Now) -> Vec<Row> {
    use Phase::*;
    let long_ago = now.mono.checked_sub(Duration::from_secs(61)).unwrap_or(now.mono);
    vec![
        // --- A Managed proxy ---
        row(
            "a new Managed proxy gets the finalizer, its spec hash and an instance",
            P::managed()
                .finalizers(json!(null))
                .annotate(SPEC_HASH_ANNOTATION, ""),
            managed(None),
        )
        .acts(&["add finalizer", "set spec hash", "create"])
        .gives(Pending, "Poll"),
        row(
            "a provider that is not configured fails the proxy until something changes",
            P::managed(),
            Seen::Managed(ManagedSeen::NoProvider {
                name: "sim".into(),
                configured: vec!["local".into()],
            }),
        )
        .gives(Failed, "Idle")
        .says("provider \"sim\" is not configured (configured: local)"),
        row(
            "the finalizer is added even when the provider is missing",
            P::managed().finalizers(json!([])),
            Seen::Managed(ManagedSeen::NoProvider {
                name: "sim".into(),
                configured: vec![],
            }),
        )
        .acts(&["add finalizer"])
        .gives(Failed, "Idle"),
        row(
            "a cloud-init that cannot be resolved is retried, the finalizer added first",
            P::managed().finalizers(json!([])),
            Seen::Managed(ManagedSeen::Unresolved(ReconcileError::CloudInit(
                CloudInitError::Backend {
                    namespace: "crawl".into(),
                    name: "ci".into(),
                    reason: "not found".into(),
                },
            ))),
        )
        .acts(&["add finalizer"])
        .gives(Pending, "Err(cloud_init)"),
        row(
            "a recorded instance of another installation is neither used nor deleted",
            P::managed().serving(),
            managed(Some(Ok(theirs()))),
        )
        .tells(&["event InstanceConflict"])
        .gives(Ready, "Err(instance_conflict)"),
        row(
            "a conflict the status already tells raises no second Event",
            P::managed().status(json!({"phase": "Ready", "providerID": ID,
                "message": ReconcileError::InstanceConflict { id: ProviderId(ID.into()),
                    why: "it belongs to installation other".to_owned() }.to_string()})),
            managed(Some(Ok(theirs()))),
        )
        .gives(Ready, "Err(instance_conflict)"),
        row(
            "a changed spec deletes the old instance first",
            P::managed().serving().annotate(SPEC_HASH_ANNOTATION, "old"),
            managed(Some(Ok(running()))),
        )
        .acts(&["delete i-1"])
        .gives(Provisioning, "Poll")
        .says("spec changed"),
        row(
            "while the old instance is being deleted, polls only look",
            P::managed().serving().annotate(SPEC_HASH_ANNOTATION, "old"),
            managed(Some(Ok(running()))),
        )
        .memory(delete_requested(now.mono))
        .gives(Provisioning, "Poll"),
        row(
            "a delete unfinished after a minute is requested again",
            P::managed().serving().annotate(SPEC_HASH_ANNOTATION, "old"),
            managed(Some(Ok(running()))),
        )
        .memory(delete_requested(long_ago))
        .acts(&["delete i-1"])
        .gives(Provisioning, "Poll"),
        row(
            "the old instance gone, the new spec's hash is written and its instance created",
            P::managed().serving().annotate(SPEC_HASH_ANNOTATION, "old"),
            managed(Some(Err(failed(ErrorClass::NotFound)))),
        )
        .acts(&["set spec hash", "create"])
        .tells(&["replaced"])
        .gives(Provisioning, "Poll"),
        row(
            "a running instance with an address serves and is resynced",
            P::managed().status(json!({"phase": "Provisioning", "providerID": ID})),
            managed(Some(Ok(running()))),
        )
        .gives(Running, "Resync")
        .serving(),
        row(
            "a known healthy verdict makes a running instance Ready",
            P::managed().status(json!({"phase": "Provisioning", "providerID": ID})),
            managed(Some(Ok(running()))),
        )
        .memory(ProxyMemory {
            health: Some(verdict(true)),
            ..ProxyMemory::default()
        })
        .gives(Ready, "Resync")
        .serving(),
        row(
            "a known unhealthy verdict makes it Unhealthy",
            P::managed().serving(),
            managed(Some(Ok(running()))),
        )
        .memory(ProxyMemory {
            health: Some(verdict(false)),
            ..ProxyMemory::default()
        })
        .gives(Unhealthy, "Resync")
        .serving()
        .says("health check failing"),
        row(
            "a Ready proxy stays Ready on a resync",
            P::managed().serving(),
            managed(Some(Ok(running()))),
        )
        .gives(Ready, "Resync")
        .serving(),
        row(
            "a running instance without an address is still starting",
            P::managed().status(json!({"phase": "Provisioning", "providerID": ID})),
            managed(Some(Ok(instance(InstanceState::Running, None)))),
        )
        .gives(Provisioning, "Poll")
        .says("instance is starting"),
        row(
            "a provisioning instance is polled, with the provider's reason",
            P::managed().status(json!({"phase": "Provisioning", "providerID": ID})),
            managed(Some(Ok(Instance {
                reason: Some("downloading the image".into()),
                ..instance(InstanceState::Provisioning, None)
            }))),
        )
        .gives(Provisioning, "Poll")
        .says("instance is starting: downloading the image"),
        row(
            "a stopped instance is lost: counted, told, deleted, replaced at once",
            P::managed().serving(),
            managed(Some(Ok(Instance {
                reason: Some("exit 1".into()),
                ..instance(InstanceState::Stopped, None)
            }))),
        )
        .acts(&["delete i-1"])
        .tells(&["lost stopped #1", "event InstanceStopped"])
        .gives(Provisioning, "Poll")
        .says("instance stopped: exit 1; deleting it; replacement 1 now"),
        row(
            "a second loss in a row backs off",
            P::managed().lost(1, -5, false),
            managed(Some(Ok(instance(InstanceState::Stopped, None)))),
        )
        .acts(&["delete i-1"])
        .tells(&["lost stopped #2", "event InstanceStopped"])
        .gives(BackOff, "Poll")
        .says("replacement 2 at"),
        row(
            "a lost instance that stayed up long enough counts from one again",
            P::managed().lost(4, -700, false),
            managed(Some(Ok(instance(InstanceState::Stopped, None)))),
        )
        .acts(&["delete i-1"])
        .tells(&["lost stopped #1", "event InstanceStopped"])
        .gives(Provisioning, "Poll"),
        row(
            "the lost instance is deleted before its successor is created",
            P::managed().lost(1, -5, true),
            managed(Some(Ok(instance(InstanceState::Stopped, None)))),
        )
        .acts(&["delete i-1"])
        .gives(Provisioning, "Poll")
        .says("deleting it"),
        row(
            "the lost instance gone and the wait over, the successor is created",
            P::managed().lost(1, -5, true),
            managed(Some(Err(failed(ErrorClass::NotFound)))),
        )
        .acts(&["create"])
        .gives(Provisioning, "Poll"),
        row(
            "the lost instance gone during the backoff, the rest of the wait is waited",
            P::managed().lost(2, 10, true),
            managed(Some(Err(failed(ErrorClass::NotFound)))),
        )
        .gives(BackOff, "After(10s)")
        .says("backing off"),
        row(
            "a recorded instance that vanished is lost and replaced at once",
            P::managed().serving(),
            managed(Some(Err(failed(ErrorClass::NotFound)))),
        )
        .acts(&["create"])
        .tells(&["lost vanished #1", "event InstanceVanished"])
        .gives(Provisioning, "Poll"),
        row(
            "an instance that stayed up ten minutes clears the replacement count",
            P::managed().lost(3, -700, false),
            managed(Some(Ok(running()))),
        )
        .gives(Running, "Resync")
        .serving(),
        row(
            "a failed lookup is retried by its class and leaves the phase",
            P::managed().serving(),
            managed(Some(Err(failed(ErrorClass::Transient)))),
        )
        .gives(Ready, "Err(provider_transient)"),
        row(
            "a quota error is retried by its class",
            P::managed().serving(),
            managed(Some(Err(failed(ErrorClass::QuotaExceeded)))),
        )
        .gives(Ready, "Err(provider_quota_exceeded)"),
        // --- Deletion ---
        row(
            "a deleted object without the finalizer has nothing of ours to clean up",
            P::managed().finalizers(json!(null)).deleting().serving(),
            Seen::Deleting(Recorded::None),
        )
        .gives(Ready, "Idle"),
        row(
            "a deleted object without an instance loses its finalizer",
            P::managed().deleting(),
            Seen::Deleting(Recorded::None),
        )
        .acts(&["remove finalizer"])
        .gives(Terminating, "Gone"),
        row(
            "a deleted object's instance is deleted and polled",
            P::managed().deleting().serving(),
            Seen::Deleting(found(running())),
        )
        .acts(&["delete i-1"])
        .gives(Terminating, "Poll"),
        row(
            "a deletion in flight is only looked at",
            P::managed().deleting().serving(),
            Seen::Deleting(found(running())),
        )
        .memory(delete_requested(now.mono))
        .gives(Terminating, "Poll"),
        row(
            "the instance gone, the finalizer goes",
            P::managed().deleting().serving(),
            Seen::Deleting(lookup_failed(ErrorClass::NotFound)),
        )
        .acts(&["remove finalizer"])
        .gives(Terminating, "Gone"),
        row(
            "an instance that is not this Proxy's is not deleted",
            P::managed().deleting().serving(),
            Seen::Deleting(found(theirs())),
        )
        .tells(&["event InstanceConflict"])
        .gives(Terminating, "Err(instance_conflict)"),
        row(
            "an id that cannot be looked up at all is told and released, not deleted",
            P::managed().deleting().serving(),
            Seen::Deleting(lookup_failed(ErrorClass::Permanent)),
        )
        .acts(&["remove finalizer"])
        .tells(&["event InstanceUnverifiable"])
        .gives(Terminating, "Gone"),
        row(
            "a deletion whose provider left the configuration names the way out",
            P::managed().deleting().serving(),
            Seen::Deleting(Recorded::Unreachable(ProviderId(ID.into()))),
        )
        .gives(Terminating, "Err(provider_missing)"),
        row(
            "a failed lookup while deleting is retried",
            P::managed().deleting().serving(),
            Seen::Deleting(lookup_failed(ErrorClass::Transient)),
        )
        .gives(Terminating, "Err(provider_transient)"),
        row(
            "skip-cleanup releases this Proxy's instance and leaves it running",
            P::managed()
                .deleting()
                .serving()
                .annotate(SKIP_CLEANUP_ANNOTATION, "true"),
            Seen::Deleting(found(running())),
        )
        .acts(&["release i-1", "remove finalizer"])
        .gives(Terminating, "Gone"),
        row(
            "skip-cleanup leaves another's instance untouched",
            P::managed()
                .deleting()
                .serving()
                .annotate(SKIP_CLEANUP_ANNOTATION, "true"),
            Seen::Deleting(found(theirs())),
        )
        .acts(&["remove finalizer"])
        .tells(&["warn"])
        .gives(Terminating, "Gone"),
        row(
            "skip-cleanup frees a Proxy whose provider left the configuration",
            P::managed()
                .deleting()
                .serving()
                .annotate(SKIP_CLEANUP_ANNOTATION, "true"),
            Seen::Deleting(Recorded::Unreachable(ProviderId(ID.into()))),
        )
        .acts(&["remove finalizer"])
        .tells(&["warn"])
        .gives(Terminating, "Gone"),
        row(
            "skip-cleanup with the instance gone just lets go",
            P::managed()
                .deleting()
                .serving()
                .annotate(SKIP_CLEANUP_ANNOTATION, "true"),
            Seen::Deleting(lookup_failed(ErrorClass::NotFound)),
        )
        .acts(&["remove finalizer"])
        .gives(Terminating, "Gone"),
        // --- An External proxy ---
        row(
            "an External endpoint is served, and left to the health engine",
            P::external(),
            endpoint(false),
        )
        .gives(Running, "Idle")
        .serving(),
        row(
            "an External endpoint with a known verdict is Ready at once",
            P::external(),
            endpoint(false),
        )
        .memory(ProxyMemory {
            health: Some(verdict(true)),
            ..ProxyMemory::default()
        })
        .gives(Ready, "Idle")
        .serving(),
        row(
            "a switch from Managed deletes the managed instance first",
            P::external().finalizers(json!([FINALIZER])).serving(),
            Seen::External {
                leftover: found(running()),
                endpoint: None,
            },
        )
        .acts(&["delete i-1"])
        .gives(Terminating, "Poll")
        .says("switched to External"),
        row(
            "the managed instance gone, the finalizer goes and the endpoint serves",
            P::external().finalizers(json!([FINALIZER])).lost(2, 30, false),
            endpoint(false),
        )
        .acts(&["remove finalizer"])
        .gives(Running, "Idle")
        .serving(),
        row(
            "an endpoint admission refuses fails the proxy",
            P::external(),
            endpoint(true),
        )
        .gives(Failed, "Idle")
        .says("--allow-external-endpoint-networks"),
        row(
            "unreadable endpoint credentials are retried",
            P::external().spec(
                "endpoint",
                json!({"host": "10.0.0.1", "port": 3128,
                "credentialsSecretRef": {"name": "creds", "usernameKey": "u", "passwordKey": "p"}}),
            ),
            Seen::External {
                leftover: Recorded::None,
                endpoint: Some(Err(ReconcileError::ExternalCredentials(
                    CloudInitError::Backend {
                        namespace: "crawl".into(),
                        name: "creds".into(),
                        reason: "not found".into(),
                    },
                ))),
            },
        )
        .gives(Pending, "Err(external_credentials)"),
        row(
            "a health check that cannot run leaves the endpoint unprobed",
            P::external().spec("healthCheck", json!({"url": "not a url"})),
            endpoint(false),
        )
        .gives(Running, "Idle")
        .says("not probed"),
        row(
            "an External proxy without an endpoint waits for one",
            P::external().spec("endpoint", json!(null)),
            Seen::External {
                leftover: Recorded::None,
                endpoint: None,
            },
        )
        .gives(Pending, "Idle"),
    ]
}

#[test]
fn every_documented_transition_plans_what_docs_reconcile_md_says() {
    let now = Now {
        wall: wall(),
        mono: Instant::now(),
    };
    let ours = installation();
    let rules = rules(&ours);
    let rows = table(now);
    let mut failures = Vec::new();
    for row in rows {
        let plan = decide(&row.proxy, row.seen, &row.memory, &rules, now);
        let got = summary(&plan);
        let want = Summary {
            actions: row.actions.iter().map(|s| s.to_string()).collect(),
            notices: row.notices.iter().map(|s| s.to_string()).collect(),
            phase: Some(row.phase),
            outcome: row.outcome.to_owned(),
            serves: row.serves,
            held: false,
        };
        let message = plan.status.status().message.clone().unwrap_or_default();
        if got != want || !message.contains(row.says) {
            failures.push(format!(
                "{}:\n  want {want:?}\n  got  {got:?}\n  message {message:?}",
                row.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_covers_every_path() {
    let rows = table(Now {
        wall: wall(),
        mono: Instant::now(),
    });
    println!("{} rows", rows.len());
    let count = |f: fn(&Seen) -> bool| rows.iter().filter(|r| f(&r.seen)).count();
    assert!(count(|s| matches!(s, Seen::Managed(_))) >= 20);
    assert!(count(|s| matches!(s, Seen::Deleting(_))) >= 10);
    assert!(count(|s| matches!(s, Seen::External { .. })) >= 6);
}

#[test]
fn a_created_instance_carries_the_proxy_its_installation_and_credentials() {
    let now = Now {
        wall: wall(),
        mono: Instant::now(),
    };
    let ours = installation();
    let rules = rules(&ours);
    let proxy = P::managed()
        .spec("placement", json!({"zone": "z1"}))
        .annotate(RETIRING_ANNOTATION, "x")
        .build();
    let mut seen = desired();
    seen.cloud_init = Some(CloudInitBytes(
        b"#cloud-config\n# {{ proxy_htpasswd }}\n# realm {{ proxy_realm }}\n".to_vec(),
    ));
    let plan = decide(
        &proxy,
        Seen::Managed(ManagedSeen::Resolved {
            desired: Box::new(seen),
            recorded: None,
        }),
        &ProxyMemory::default(),
        &rules,
        now,
    );
    let Some(Action::Create { provider, request }) = plan.actions.last() else {
        panic!("{:?}", plan.actions);
    };
    assert_eq!(provider, "sim");
    assert_eq!(request.name, instance_name(UID));
    assert_eq!(request.uid, UID);
    assert_eq!(request.namespace, "crawl");
    assert_eq!(request.installation, installation());
    assert_eq!(request.port, 3128);
    let cloud_init = String::from_utf8(request.cloud_init.clone().unwrap().0).unwrap();
    assert!(
        cloud_init.contains("proxy:") && !cloud_init.contains("{{"),
        "{cloud_init}"
    );
    let realm = ProxyCredentials::new("proxy", "secret").unwrap().realm();
    assert!(cloud_init.contains(&format!("# realm {realm}\n")), "{cloud_init}");
    assert_eq!(
        request.credentials,
        Some(ProxyCredentials::new("proxy", "secret").unwrap())
    );
}

#[test]
fn a_serving_proxy_s_realm_is_the_one_its_instance_names_and_none_for_an_external_one() {
    let ours = installation();
    let rules = rules(&ours);
    let now = Now {
        wall: wall(),
        mono: Instant::now(),
    };
    let provisioning = P::managed()
        .status(json!({"phase": "Provisioning", "providerID": ID}))
        .build();
    let realm_of = |plan: Plan| plan.serve.map(|s| s.realm);
    let plan = decide(
        &provisioning,
        managed(Some(Ok(running()))),
        &ProxyMemory::default(),
        &rules,
        now,
    );
    assert_eq!(realm_of(plan), Some(Some("egress-proxies-of-sim".to_owned())));
    let mut unknown = desired();
    unknown.realm = None;
    let plan = decide(
        &provisioning,
        Seen::Managed(ManagedSeen::Resolved {
            desired: Box::new(unknown),
            recorded: Some((ProviderId(ID.into()), Ok(running()))),
        }),
        &ProxyMemory::default(),
        &rules,
        now,
    );
    assert_eq!(
        realm_of(plan),
        Some(None),
        "a realm the instance may not name is not claimed"
    );
    let plan = decide(
        &P::external().build(),
        endpoint(false),
        &ProxyMemory::default(),
        &rules,
        now,
    );
    assert_eq!(realm_of(plan), Some(None));
}

#[test]
fn a_first_status_is_held_for_the_first_verdict_until_due() {
    let ours = installation();
    let rules = rules(&ours);
    let start = Instant::now();
    let at = |secs: u64| Now {
        wall: wall(),
        mono: start + Duration::from_secs(secs),
    };
    let waiting = ProxyMemory::default().with_verdicts(true);
    // Nothing recorded: held, looked at again when the verdict is due (19 s by default).
    let plan = decide(&P::external().build(), endpoint(false), &waiting, &rules, at(0));
    assert_eq!(summary(&plan).outcome, "After(19s)");
    assert_eq!(plan.held_since, Some(start));
    assert!(plan.serve.is_some() && plan.status.is_held());
    // Held since then: the rest of the wait.
    let held = ProxyMemory {
        held: Some((UID.into(), start)),
        ..ProxyMemory::default().with_verdicts(true)
    };
    let plan = decide(&P::external().build(), endpoint(false), &held, &rules, at(5));
    assert_eq!(summary(&plan).outcome, "After(14s)");
    // Past due: Running is written.
    let plan = decide(&P::external().build(), endpoint(false), &held, &rules, at(19));
    assert_eq!(
        (
            plan.status.status().phase,
            summary(&plan).outcome.as_str(),
            plan.held_since
        ),
        (Some(Phase::Running), "Idle", None)
    );
    // The verdict known: written with it.
    let known = ProxyMemory {
        health: Some(verdict(true)),
        ..held
    };
    let plan = decide(&P::external().build(), endpoint(false), &known, &rules, at(3));
    assert_eq!(
        (plan.status.status().phase, plan.held_since),
        (Some(Phase::Ready), None)
    );
    // No prober: nothing waits.
    let plan = decide(
        &P::external().build(),
        endpoint(false),
        &ProxyMemory::default(),
        &rules,
        at(0),
    );
    assert_eq!(summary(&plan).outcome, "Idle");
    // A proxy with a status already is not held.
    let plan = decide(
        &P::external().status(json!({"phase": "Unhealthy"})).build(),
        endpoint(false),
        &waiting,
        &rules,
        at(0),
    );
    assert_eq!(plan.held_since, None);
}

#[test]
fn errors_settle_by_class_and_a_deletion_never_gives_up() {
    let proxy = P::managed().serving().build();
    let deleting = P::managed().serving().deleting().build();
    let mut schedule = Schedule::default();
    let permanent = || {
        ReconcileError::from(ProviderError::new(
            ErrorClass::Permanent,
            Op::Delete,
            "sim",
            Some(ID),
            "refused",
        ))
    };

    // A Permanent error fails the proxy; no retry.
    let mut status = StatusDraft::new(&proxy, wall());
    let (next, notice) = settle_error(&proxy, &mut status, permanent(), &mut schedule);
    assert_eq!((outcome(&next), notice), ("Idle".to_owned(), None));
    assert_eq!(status.status().phase, Some(Phase::Failed));

    // Anything else keeps the phase and says it will retry.
    let mut status = StatusDraft::new(&proxy, wall());
    let transient = ReconcileError::from(failed(ErrorClass::Transient));
    let (next, _) = settle_error(&proxy, &mut status, transient, &mut schedule);
    assert_eq!(outcome(&next), "Err(provider_transient)");
    assert_eq!(status.status().phase, Some(Phase::Ready));
    assert!(
        status
            .status()
            .message
            .as_deref()
            .unwrap()
            .ends_with("(will retry)")
    );

    // While deleting: Terminating, told once, retried after a growing wait.
    let mut status = StatusDraft::new(&deleting, wall());
    let (next, notice) = settle_error(&deleting, &mut status, permanent(), &mut schedule);
    assert_eq!(outcome(&next), "After(30s)");
    assert!(matches!(
        notice,
        Some(Notice::Event {
            reason: "DeletionBlocked",
            ..
        })
    ));
    assert_eq!(status.status().phase, Some(Phase::Terminating));
    let told = status.status().message.clone().unwrap();
    assert!(told.contains(SKIP_CLEANUP_ANNOTATION), "{told}");
    let again = P::managed()
        .deleting()
        .status(json!({"phase": "Terminating", "message": told}))
        .build();
    let mut status = StatusDraft::new(&again, wall());
    let (next, notice) = settle_error(&again, &mut status, permanent(), &mut schedule);
    assert_eq!((outcome(&next), notice), ("After(60s)".to_owned(), None));
}
