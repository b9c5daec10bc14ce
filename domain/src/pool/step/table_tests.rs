//! The transitions docs/pools.md describes, one row each: a pool, its
//! members as stored with their lease figures, what the loop remembers —
//! and the turn `step` decides. Each row is named after the case of
//! docs/pools.md it covers. No actors, no store: the decision alone.
//! (What a turn does with store answers — a failed create, a member gone —
//! and a pool being deleted are the store side's: `pool::store_tests`.)

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::resource::ProxyStatus;

/// The turn's time, in seconds after the test epoch.
const NOW: i64 = 100_000;
/// The scale-down delay the rows' autoscalers watch.
const DELAY: Duration = Duration::from_secs(60);

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

/// `secs` seconds before the turn.
fn ago(secs: i64) -> Timestamp {
    at(NOW - secs)
}

/// A pool as JSON, edited row by row.
struct P(Value);

impl P {
    /// `replicas` members of a Managed local template; maxSurge 1,
    /// maxUnavailable 0, drainTimeout 10m (the defaults).
    fn of(replicas: u32) -> P {
        P(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "eu", "namespace": "ns", "uid": "pool-uid", "generation": 1},
            "spec": {"replicas": replicas, "template": {"spec": {"mode": "Managed", "provider": "local"}}}
        }))
    }

    /// Replaced after 5 blocked targets, 20 errors or 2 hours.
    fn rotating(replicas: u32) -> P {
        P::of(replicas).spec(
            "rotation",
            json!({"afterBlockedTargets": 5, "afterErrors": 20, "maxAge": "2h"}),
        )
    }

    /// Autoscaled between 1 and 5 at `target` percent, 4 leases a member.
    fn autoscaled(replicas: u32, target: u32) -> P {
        P::of(replicas).spec(
            "autoscaling",
            json!({"minReplicas": 1, "maxReplicas": 5, "targetUtilization": target}),
        )
    }

    fn spec(mut self, field: &str, value: Value) -> P {
        self.0["spec"][field] = value;
        self
    }

    fn status(mut self, status: Value) -> P {
        self.0["status"] = status;
        self
    }

    fn build(self) -> ProxyPool {
        serde_json::from_value(self.0).unwrap()
    }
}

/// A member as stored, with its lease figures: by default Ready, made from
/// the current template 1000 s ago, known to the lease store, idle.
#[derive(Clone)]
struct M {
    suffix: &'static str,
    created: i64,
    /// `None`: Ready; `Some(s)`: not Ready for `s` seconds.
    unready_for: Option<i64>,
    /// Never Ready: no Ready condition yet (unready since its creation).
    never_ready: bool,
    old_template: bool,
    retiring: Option<(i64, RetireReason)>,
    deleting: bool,
    address: Option<&'static str>,
    carries: Option<String>,
    figures: LeaseFigures,
}

fn m(suffix: &'static str) -> M {
    M {
        suffix,
        created: 1000,
        unready_for: None,
        never_ready: false,
        old_template: false,
        retiring: None,
        deleting: false,
        address: None,
        carries: None,
        figures: LeaseFigures {
            known: true,
            ..LeaseFigures::default()
        },
    }
}

impl M {
    fn created(mut self, secs_ago: i64) -> M {
        self.created = secs_ago;
        self
    }

    /// Not Ready for `secs` seconds (its Ready condition turned False then).
    fn unready_for(mut self, secs: i64) -> M {
        self.unready_for = Some(secs);
        self
    }

    /// Never came up: not Ready since its creation, without a Ready condition.
    fn never_ready(mut self) -> M {
        self.unready_for = Some(self.created);
        self.never_ready = true;
        self
    }

    fn old_template(mut self) -> M {
        self.old_template = true;
        self
    }

    /// Annotated retiring `secs_ago` for `reason`; the lease store refuses
    /// it new leases already.
    fn retiring(mut self, secs_ago: i64, reason: RetireReason) -> M {
        self.retiring = Some((secs_ago, reason));
        self.figures.retiring = true;
        self
    }

    /// Annotated retiring, but the lease store has not heard of it yet.
    fn lease_store_unaware(mut self) -> M {
        self.figures.retiring = false;
        self
    }

    fn deleting(mut self) -> M {
        self.deleting = true;
        self
    }

    fn from(mut self, address: &'static str) -> M {
        self.address = Some(address);
        self
    }

    /// Carries this quarantine annotation.
    fn carrying(mut self, annotation: String) -> M {
        self.carries = Some(annotation);
        self
    }

    fn leases(mut self, n: u32) -> M {
        self.figures.leases = n;
        self
    }

    fn blocked(mut self, targets: u32) -> M {
        self.figures.blocked_targets = targets;
        self
    }

    fn errors(mut self, n: u32) -> M {
        self.figures.errors = n;
        self
    }

    /// The lease store does not know it (yet): after an operator restart.
    fn unknown(mut self) -> M {
        self.figures.known = false;
        self
    }

    fn build(&self, pool: &ProxyPool) -> Proxy {
        let hash = match self.old_template {
            true => "an-older-one".to_owned(),
            false => template_hash(&pool.spec.template),
        };
        let mut proxy = new_member(pool, self.suffix, &hash);
        proxy.metadata.uid = Some(format!("uid-{}", self.suffix));
        proxy.metadata.creation_timestamp = Some(Time(ago(self.created)));
        if self.deleting {
            proxy.metadata.deletion_timestamp = Some(Time(ago(5)));
        }
        let annotations = proxy.metadata.annotations.get_or_insert_default();
        if let Some((since, reason)) = self.retiring {
            annotations.insert(RETIRING_ANNOTATION.into(), retiring_value(ago(since), reason));
        }
        if let Some(carried) = &self.carries {
            annotations.insert(QUARANTINED_ADDRESSES_ANNOTATION.into(), carried.clone());
        }
        let status = match self.unready_for {
            None => json!({"phase": "Ready"}),
            Some(_) if self.never_ready => json!({"phase": "Provisioning"}),
            Some(secs) => json!({"phase": "Provisioning", "conditions": [{"type": "Ready",
                "status": "False", "reason": "Unhealthy", "message": "",
                "lastTransitionTime": ago(secs).to_string()}]}),
        };
        let mut status: ProxyStatus = serde_json::from_value(status).unwrap();
        status.outgoing_address = self.address.map(str::to_owned);
        proxy.status = Some(status);
        proxy
    }
}

/// The quarantine annotation for 127.0.0.2 until `until`.
fn quarantine_of_2(until: Timestamp) -> String {
    format!("127.0.0.2={until}")
}

/// A pool status quarantining 127.0.0.2 (member eu-a) from `since` to `until`.
fn quarantining_2(since: Timestamp, until: Timestamp) -> Value {
    json!({"quarantinedAddresses": [{"address": "127.0.0.2", "member": "eu-a",
        "since": since.to_string(), "until": until.to_string()}],
        "conditions": [{"type": "AddressesAvailable", "status": "True", "reason": "Quarantined",
            "message": "", "lastTransitionTime": since.to_string()}]})
}

/// What the loop remembers after a whole scale-down delay of watching.
fn watched() -> PoolMemory {
    PoolMemory::new(DELAY, at(0))
}

/// What the loop remembers right after an operator start.
fn just_started() -> PoolMemory {
    PoolMemory::new(DELAY, at(NOW))
}

/// The reason whose turn was taken last.
fn served(reason: RetireReason) -> PoolMemory {
    PoolMemory {
        served: Some(reason),
        ..watched()
    }
}

/// What a turn comes to, in words.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    /// The spec could not be planned.
    invalid: bool,
    create: usize,
    /// Of them, made carrying the quarantine annotation.
    create_quarantined: usize,
    /// `"<member> <reason>"`.
    retire: Vec<String>,
    delete: Vec<String>,
    annotate: Vec<String>,
    desired: Option<u32>,
    rotating: u32,
    /// The `Progressing` condition's reason.
    progressing: String,
}

fn summary(decided: &Result<Step, Vec<String>>) -> Summary {
    let Ok(step) = decided else {
        return Summary {
            invalid: true,
            ..Summary::default()
        };
    };
    let quarantined = |p: &Proxy| {
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(QUARANTINED_ADDRESSES_ANNOTATION))
    };
    Summary {
        invalid: false,
        create: step.create.len(),
        create_quarantined: step.create.iter().filter(|p| quarantined(p)).count(),
        retire: step
            .retire
            .iter()
            .map(|(k, _, _, r)| format!("{} {}", k.name, r.as_str()))
            .collect(),
        delete: step.delete.iter().map(|(k, _)| k.name.clone()).collect(),
        annotate: step.annotate.iter().map(|(k, _, _)| k.name.clone()).collect(),
        desired: step.status.desired_replicas,
        rotating: step.status.rotating,
        progressing: condition(&step.status, "Progressing")
            .map(|c| c.split('/').nth(1).unwrap_or_default().to_owned())
            .unwrap_or_default(),
    }
}

/// A condition of `status` as `"<type>=<status>/<reason>"`.
fn condition(status: &ProxyPoolStatus, kind: &str) -> Option<String> {
    let c = status.conditions.iter().find(|c| c.type_ == kind)?;
    Some(format!("{}={}/{}", c.type_, c.status, c.reason))
}

/// One case of docs/pools.md: the situation and the turn it must give.
struct Row {
    case: &'static str,
    pool: ProxyPool,
    members: Vec<M>,
    memory: PoolMemory,
    denied: u32,
    want: Summary,
    /// Conditions the status must hold, `"<type>=<status>/<reason>"`.
    says: &'static [&'static str],
}

fn row(case: &'static str, pool: P, members: &[M]) -> Row {
    let pool = pool.build();
    let replicas = pool.spec.replicas;
    Row {
        case,
        pool,
        members: members.to_vec(),
        memory: watched(),
        denied: 0,
        want: Summary {
            desired: Some(replicas),
            progressing: "Steady".into(),
            ..Summary::default()
        },
        says: &[],
    }
}

impl Row {
    fn memory(mut self, memory: PoolMemory) -> Row {
        self.memory = memory;
        self
    }

    fn denied(mut self, n: u32) -> Row {
        self.denied = n;
        self
    }

    fn creates(mut self, n: usize) -> Row {
        self.want.create = n;
        self
    }

    fn creates_quarantined(mut self, n: usize) -> Row {
        self.want.create = n;
        self.want.create_quarantined = n;
        self
    }

    fn retires(mut self, members: &[&str]) -> Row {
        self.want.retire = members.iter().map(|s| s.to_string()).collect();
        self
    }

    fn deletes(mut self, members: &[&str]) -> Row {
        self.want.delete = members.iter().map(|s| s.to_string()).collect();
        self
    }

    fn annotates(mut self, members: &[&str]) -> Row {
        self.want.annotate = members.iter().map(|s| s.to_string()).collect();
        self
    }

    fn desired(mut self, n: u32) -> Row {
        self.want.desired = Some(n);
        self
    }

    fn rotating(mut self, n: u32) -> Row {
        self.want.rotating = n;
        self.want.progressing = "Rotating".into();
        self
    }

    fn scaling(mut self) -> Row {
        self.want.progressing = "Scaling".into();
        self
    }

    fn invalid(mut self) -> Row {
        self.want = Summary {
            invalid: true,
            ..Summary::default()
        };
        self
    }

    fn says(mut self, conditions: &'static [&'static str]) -> Row {
        self.says = conditions;
        self
    }
}

fn table() -> Vec<Row> {
    use RetireReason::*;
    let until = ago(10).checked_add(Duration::from_secs(600)).unwrap();
    vec![
        // --- spec.replicas and scaling by hand ---
        row("replicas: an empty pool gets its members", P::of(3), &[])
            .creates(3)
            .scaling()
            .says(&["Ready=False/MembersNotReady"]),
        row(
            "replicas: every wanted member Ready on the current template: steady",
            P::of(2),
            &[m("a"), m("b")],
        )
        .says(&["Ready=True/AllReady", "Progressing=False/Steady"]),
        row(
            "scaling up (kubectl scale): the new members are made at once",
            P::of(4),
            &[m("a"), m("b")],
        )
        .creates(2)
        .scaling(),
        row(
            "shrinking retires members that are not due, those not Ready first",
            P::of(2),
            &[m("a").created(3000), m("b").created(2000), m("c").created(60).unready_for(60)],
        )
        .retires(&["eu-c scale-down"])
        .scaling(),
        row(
            "shrinking retires members that are not due: then the oldest",
            P::of(1),
            &[m("a").created(3000), m("b").created(2000)],
        )
        .retires(&["eu-a scale-down"])
        .scaling(),
        row(
            "shrinking retires members that are not due; a due one is replaced as due",
            P::rotating(1),
            &[m("a").created(3000), m("b").created(2000).blocked(5), m("c").created(60)],
        )
        .retires(&["eu-a scale-down", "eu-b blocked"])
        .rotating(1),
        // --- autoscaling ---
        row(
            "autoscaling: growing happens at once, sized by the leases held",
            P::autoscaled(2, 50),
            &[m("a").leases(4), m("b").leases(4)],
        )
        .desired(4)
        .creates(2)
        .scaling(),
        row(
            "autoscaling: an acquire refused because every member was full grows the pool (at least by one)",
            P::autoscaled(2, 100).status(json!({"desiredReplicas": 2})),
            &[m("a").leases(4), m("b").leases(4)],
        )
        .memory(just_started())
        .denied(3)
        .desired(3)
        .creates(1)
        .scaling(),
        row(
            "autoscaling: refusals grow the pool only once the members made for the last growth serve",
            P::autoscaled(2, 100).status(json!({"desiredReplicas": 2})),
            &[m("a").leases(4), m("b").created(30).unready_for(30)],
        )
        .memory(just_started())
        .denied(3)
        .says(&["Ready=False/MembersNotReady"]),
        row(
            "autoscaling: within the bounds (maxReplicas)",
            P::autoscaled(2, 50),
            &[m("a").leases(20), m("b").leases(20)],
        )
        .desired(5)
        .creates(3)
        .scaling(),
        row(
            "autoscaling: after an operator start the pool watches a whole delay before it shrinks",
            P::autoscaled(2, 100).status(json!({"desiredReplicas": 4})),
            &[m("a"), m("b"), m("c"), m("d")],
        )
        .memory(just_started())
        .desired(4),
        row(
            "autoscaling: shrinking goes only down to the largest size recommended over the delay",
            P::autoscaled(2, 100).status(json!({"desiredReplicas": 4})),
            &[
                m("a").created(4000),
                m("b").created(3000),
                m("c").created(2000),
                m("d").created(1000),
            ],
        )
        .memory({
            let mut memory = watched();
            memory.window.record(3, ago(30));
            memory
        })
        .desired(3)
        .retires(&["eu-a scale-down"])
        .scaling(),
        row(
            "autoscaling: it never shrinks on figures the lease store does not have yet",
            P::autoscaled(2, 100).status(json!({"desiredReplicas": 4})),
            &[m("a"), m("b"), m("c"), m("d").unknown()],
        )
        .desired(4),
        row(
            "autoscaling: spec.replicas is only the starting size, status.desiredReplicas the autoscaler's choice",
            P::autoscaled(2, 100).status(json!({"desiredReplicas": 3})),
            &[m("a").leases(4), m("b").leases(4), m("c").leases(4)],
        )
        .desired(3),
        // --- rotation: each reason ---
        row(
            "blocked (afterBlockedTargets): a successor is made first, within maxSurge",
            P::rotating(2),
            &[m("a").blocked(5), m("b")],
        )
        .creates(1)
        .rotating(1),
        row(
            "blocked: once enough members are Ready (replicas - maxUnavailable), the old one retires",
            P::rotating(2),
            &[m("a").blocked(5), m("b"), m("c").created(60)],
        )
        .retires(&["eu-a blocked"])
        .rotating(1),
        row(
            "errors (afterErrors): replaced as for blocks",
            P::rotating(2),
            &[m("a").errors(20), m("b"), m("c").created(60)],
        )
        .retires(&["eu-a errors"])
        .rotating(1),
        row(
            "unready: not Ready for ten minutes (failed, never came up, unhealthy) it is due, and retires at once",
            P::rotating(2),
            &[m("a").created(3000).unready_for(601), m("b")],
        )
        .retires(&["eu-a unready"])
        .creates(1)
        .rotating(1),
        row(
            "unready: a member that never came up within ten minutes of its creation is due",
            P::rotating(2),
            &[m("a").created(700).never_ready(), m("b")],
        )
        .retires(&["eu-a unready"])
        .creates(1)
        .rotating(1),
        row(
            "unready: not Ready for less than ten minutes is not due",
            P::rotating(2),
            &[m("a").created(3000).unready_for(300), m("b")],
        )
        .says(&["Ready=False/MembersNotReady"]),
        row(
            "template change: members of another template hash get successors, within maxSurge",
            P::rotating(2),
            &[m("a").old_template(), m("b").old_template()],
        )
        .creates(1)
        .rotating(2),
        row(
            "template change: rolls out one old member per Ready successor (maxSurge 1, maxUnavailable 0)",
            P::rotating(2),
            &[
                m("a").old_template().created(3000),
                m("b").old_template().created(2000),
                m("c").created(60),
            ],
        )
        .retires(&["eu-a template"])
        .rotating(2),
        row(
            "age (maxAge): a member older than maxAge gets a successor",
            P::rotating(2),
            &[m("a").created(7201), m("b")],
        )
        .creates(1)
        .rotating(1),
        row(
            "age: and retires once its successor is Ready",
            P::rotating(2),
            &[m("a").created(7201), m("b"), m("c").created(60)],
        )
        .retires(&["eu-a age"])
        .rotating(1),
        row(
            "rotation unset: blocks, errors and age replace nobody",
            P::of(2),
            &[m("a").created(9000).blocked(64).errors(1000), m("b")],
        ),
        // --- rotation: order, surge, unavailability ---
        row(
            "a member due for several reasons is due for the first (blocked, errors, unready, template, age)",
            P::rotating(2),
            &[
                m("a").created(8000).old_template().errors(20).blocked(5),
                m("b"),
                m("c").created(60),
            ],
        )
        .retires(&["eu-a blocked"])
        .rotating(1),
        row(
            "a member that is due but not Ready serves nobody and retires at once",
            P::rotating(2),
            &[m("a").blocked(5).unready_for(60), m("b")],
        )
        .retires(&["eu-a blocked"])
        .creates(1)
        .rotating(1),
        row(
            "maxUnavailable: Ready members may be missing below replicas, so a due one retires before its successor",
            P::rotating(2).spec("maxUnavailable", json!(1)),
            &[m("a").old_template(), m("b")],
        )
        .retires(&["eu-a template"])
        .creates(1)
        .rotating(1),
        row(
            "maxSurge 0: a retiring member counts until it is gone, so no successor runs beside it",
            P::rotating(2)
                .spec("maxSurge", json!(0))
                .spec("maxUnavailable", json!(1)),
            &[m("a").retiring(10, Template).leases(1), m("b")],
        )
        .rotating(1),
        row(
            "maxSurge 0: a member being deleted still holds its instance",
            P::rotating(2)
                .spec("maxSurge", json!(0))
                .spec("maxUnavailable", json!(1)),
            &[m("a").deleting(), m("b")],
        ),
        row(
            "maxSurge 0: the successor is made once the old member is gone",
            P::rotating(2)
                .spec("maxSurge", json!(0))
                .spec("maxUnavailable", json!(1)),
            &[m("b")],
        )
        .creates(1)
        .scaling(),
        // --- every reason keeps moving ---
        row(
            "reasons take turns: after a member retired for blocks, the next turn goes to the next reason waiting",
            P::rotating(2),
            &[m("a").blocked(5), m("b").created(8000), m("c").created(60)],
        )
        .memory(served(Blocked))
        .retires(&["eu-b age"])
        .rotating(2),
        row(
            "reasons take turns: blocks come first after an operator start",
            P::rotating(2),
            &[m("a").blocked(5), m("b").created(8000), m("c").created(60)],
        )
        .memory(just_started())
        .retires(&["eu-a blocked"])
        .rotating(2),
        row(
            "reasons take turns: wrapping round",
            P::rotating(2),
            &[m("a").blocked(5), m("b").created(8000), m("c").created(60)],
        )
        .memory(served(Age))
        .retires(&["eu-a blocked"])
        .rotating(2),
        row(
            "reasons take turns: within a reason, the oldest member first",
            P::rotating(2),
            &[
                m("a").blocked(5).created(1000),
                m("b").blocked(5).created(2000),
                m("c").created(60),
            ],
        )
        .retires(&["eu-b blocked"])
        .rotating(2),
        // --- deletion of a retiring member ---
        row(
            "deleted once the lease store refuses it new leases and its last lease ended",
            P::rotating(1),
            &[m("a").retiring(10, Blocked), m("b")],
        )
        .deletes(&["eu-a"])
        .rotating(1),
        row(
            "not deleted while a lease is on it",
            P::rotating(1),
            &[m("a").retiring(10, Blocked).leases(1), m("b")],
        )
        .rotating(1),
        row(
            "the annotation alone is not enough: not deleted before the lease store refuses it",
            P::rotating(1),
            &[m("a").retiring(10, Blocked).lease_store_unaware(), m("b")],
        )
        .rotating(1),
        row(
            "after an operator restart, a member whose actor has not reported is not deleted",
            P::rotating(1),
            &[m("a").retiring(10, Blocked).unknown(), m("b")],
        )
        .rotating(1),
        row(
            "deleted after drainTimeout even with leases left",
            P::rotating(1),
            &[m("a").retiring(601, Blocked).leases(1), m("b")],
        )
        .deletes(&["eu-a"])
        .rotating(1),
        row(
            "a member retiring for a scale-down is deleted once drained, and is no rotation",
            P::of(1),
            &[m("a").retiring(10, ScaleDown), m("b")],
        )
        .deletes(&["eu-a"])
        .scaling(),
        // --- quarantined addresses ---
        row(
            "quarantine: a member retired for blocks quarantines its address; members that may still create get it",
            P::of(2).spec("rotation", json!({"afterBlockedTargets": 1})),
            &[
                m("a").blocked(1).from("127.0.0.2"),
                m("b").from("127.0.0.3"),
                m("c").created(60).from("127.0.0.4"),
            ],
        )
        .retires(&["eu-a blocked"])
        .annotates(&["eu-b", "eu-c"])
        .rotating(1)
        .says(&["AddressesAvailable=True/Quarantined"]),
        row(
            "quarantine: new members are made with it; retiring members and members carrying it are not written",
            P::of(2)
                .spec("rotation", json!({"afterBlockedTargets": 1}))
                .status(quarantining_2(ago(10), until)),
            &[
                m("a").retiring(10, Blocked).leases(1).from("127.0.0.2"),
                m("b").from("127.0.0.3").carrying(quarantine_of_2(until)),
            ],
        )
        .creates_quarantined(1)
        .rotating(1)
        .says(&["AddressesAvailable=True/Quarantined"]),
        row(
            "quarantine: every free address quarantined, the pool keeps serving and says so",
            P::of(2)
                .spec("rotation", json!({"afterBlockedTargets": 1}))
                .status(quarantining_2(ago(10), until)),
            &[
                m("a").retiring(10, Blocked).leases(1).from("127.0.0.2"),
                m("b").from("127.0.0.3").carrying(quarantine_of_2(until)),
                m("d").created(5).from("127.0.0.2").carrying(quarantine_of_2(until)),
            ],
        )
        .rotating(1)
        .says(&["AddressesAvailable=False/AddressesExhausted"]),
        row(
            "quarantine: once every quarantine ended, NoneQuarantined",
            P::of(2)
                .spec("rotation", json!({"afterBlockedTargets": 1}))
                .status(quarantining_2(ago(700), ago(100))),
            &[m("b").from("127.0.0.3"), m("c").from("127.0.0.4")],
        )
        .says(&["AddressesAvailable=True/NoneQuarantined"]),
        row(
            "quarantine: nothing quarantined for a member without an outgoing address (gcp, kvm)",
            P::of(2).spec("rotation", json!({"afterBlockedTargets": 1})),
            &[m("a").blocked(1), m("b"), m("c").created(60)],
        )
        .retires(&["eu-a blocked"])
        .rotating(1),
        // --- an invalid spec ---
        row(
            "Ready False with InvalidSpec: a spec that cannot be planned changes nothing",
            P::of(2)
                .spec("maxSurge", json!(0))
                .spec("maxUnavailable", json!(0)),
            &[m("a")],
        )
        .invalid(),
    ]
}

fn inputs(denied: u32) -> Inputs {
    Inputs {
        leases_per_proxy: 4,
        denied,
        blocked_rest: Duration::from_secs(600),
        now: at(NOW),
        seed: 1,
    }
}

#[test]
fn every_documented_pool_transition_decides_what_docs_pools_md_says() {
    let mut failures = Vec::new();
    for mut row in table() {
        let members: Vec<Proxy> = row.members.iter().map(|m| m.build(&row.pool)).collect();
        let figures: HashMap<ObjectKey, LeaseFigures> = row
            .members
            .iter()
            .map(|m| (ObjectKey::new("ns", format!("eu-{}", m.suffix)), m.figures))
            .collect();
        let decided = step(&row.pool, &members, &figures, inputs(row.denied), &mut row.memory);
        let got = summary(&decided);
        let conditions = decided.as_ref().map(|s| s.status.clone()).unwrap_or_default();
        let missing: Vec<&str> = row
            .says
            .iter()
            .copied()
            .filter(|want| {
                let kind = want.split('=').next().unwrap_or_default();
                condition(&conditions, kind).as_deref() != Some(*want)
            })
            .collect();
        if got != row.want || !missing.is_empty() {
            failures.push(format!(
                "{}:\n  want {:?}\n  got  {got:?}\n  conditions missing {missing:?} in {:?}",
                row.case, row.want, conditions.conditions
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_covers_every_reason_and_names_each_case_once() {
    let rows = table();
    println!("{} rows", rows.len());
    let mut cases: Vec<&str> = rows.iter().map(|r| r.case).collect();
    cases.sort();
    cases.dedup();
    assert_eq!(cases.len(), rows.len(), "a case named twice");
    for reason in RetireReason::ALL {
        let label = format!(" {}", reason.as_str());
        assert!(
            rows.iter()
                .any(|r| r.want.retire.iter().any(|w| w.ends_with(&label))),
            "no row retires a member for {reason:?}"
        );
    }
    let with = |f: fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count();
    assert!(with(|r| r.want.create > 0) >= 8);
    assert!(with(|r| !r.want.delete.is_empty()) >= 3);
    assert!(with(|r| !r.want.annotate.is_empty() || r.want.create_quarantined > 0) >= 2);
    assert!(with(|r| r.pool.spec.autoscaling.is_some()) >= 6);
}

#[test]
fn the_same_seed_names_the_same_members_and_another_seed_others() {
    let pool = P::of(3).build();
    let names = |seed: u64| -> Vec<String> {
        let inputs = Inputs { seed, ..inputs(0) };
        step(&pool, &[], &HashMap::new(), inputs, &mut watched())
            .unwrap()
            .create
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(names(7), names(7), "a decision is a function of its inputs");
    assert_ne!(names(7), names(8));
    let distinct: std::collections::HashSet<String> = names(7).into_iter().collect();
    assert_eq!(distinct.len(), 3, "one turn's names differ");
    assert!(names(7).iter().all(|n| n.starts_with("eu-")));
}
