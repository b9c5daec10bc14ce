//! One turn of a pool's control loop, free of I/O: from the pool, its
//! members as stored and the lease store's figures, what to write — the
//! members to make, the annotations that retire members, the members to
//! delete, the quarantine annotations to refresh, and the pool's status.
//! The decision between [`observe`](super::observe()) and
//! [`execute`](super::execute()): the clock and the randomness it needs
//! come in with [`Inputs`].

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::autoscale::{Bounds, Demand, ScaleDownWindow, recommended_replicas};
use super::members::parse_retiring;
use super::members::{LeaseFigures, name_suffixes, new_member, planned, retiring_value, template_hash};
use super::plan::{PoolPlan, RetireReason, Settings, plan};
use super::quarantine::{BlockedOn, Leaving, annotation_stale, annotation_value, note_condition, quarantine};
use crate::resource::ObjectKey;
use crate::resource::{
    POOL_LABEL, Proxy, ProxyPool, ProxyPoolStatus, QUARANTINED_ADDRESSES_ANNOTATION, RETIRING_ANNOTATION,
    set_condition,
};

/// What the operator knows besides the pool and its members.
#[derive(Clone, Copy, Debug)]
pub struct Inputs {
    /// Leases one proxy may hold (`--max-leases-per-proxy`; 0: unlimited).
    pub leases_per_proxy: u32,
    /// Acquires for the pool refused for lack of capacity since the last turn.
    pub denied: u32,
    /// How long a proxy rests for a target after a `blocked` report: an
    /// address a member was blocked on is quarantined this long.
    pub blocked_rest: Duration,
    pub now: Timestamp,
    /// Where this turn's new member names are drawn from (the caller's
    /// random draw; a taken name is drawn again next turn, from another).
    pub seed: u64,
}

/// What a pool's loop remembers between turns. Lost on a restart: the
/// autoscaler then watches a whole delay before shrinking, and the
/// rotation's turns start again with the most urgent reason.
#[derive(Clone, Debug)]
pub struct PoolMemory {
    /// The autoscaler's recent recommendations.
    pub window: ScaleDownWindow,
    /// The reason whose turn was taken last ([`super::PoolPlan::served`]).
    pub served: Option<RetireReason>,
}

impl PoolMemory {
    pub fn new(scale_down_delay: Duration, now: Timestamp) -> Self {
        Self {
            window: ScaleDownWindow::new(scale_down_delay, now),
            served: None,
        }
    }
}

/// What one turn decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// New members (names drawn at random; a taken name is drawn again next turn).
    pub create: Vec<Proxy>,
    /// Members to retire: key, incarnation, the retiring annotation's value, why.
    pub retire: Vec<(ObjectKey, String, String, RetireReason)>,
    /// Members to delete: key and incarnation.
    pub delete: Vec<(ObjectKey, String)>,
    /// Members whose quarantine annotation is behind the pool's: key,
    /// incarnation, the annotation's value.
    pub annotate: Vec<(ObjectKey, String, String)>,
    pub status: ProxyPoolStatus,
}

/// The turn for `pool` with `members` (as stored) and their lease `figures`;
/// what a turn remembers for the next is kept in `memory`.
pub fn step(
    pool: &ProxyPool,
    members: &[Proxy],
    figures: &HashMap<ObjectKey, LeaseFigures>,
    inputs: Inputs,
    memory: &mut PoolMemory,
) -> Result<Step, Vec<String>> {
    pool.spec.validate()?;
    let spec = &pool.spec;
    let now = inputs.now;
    let hash = template_hash(&spec.template);
    let previous = pool.status.clone().unwrap_or_default();
    // Members already being deleted count for nothing but the status.
    let live: Vec<&Proxy> = members
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    let figures_of = |m: &Proxy| figures.get(&ObjectKey::of(m)).copied().unwrap_or_default();
    let leased: u32 = live.iter().map(|m| figures_of(m).leases).sum();

    let mut status = ProxyPoolStatus {
        last_scale_time: previous.last_scale_time.clone(),
        conditions: previous.conditions.clone(),
        ..Default::default()
    };
    let replicas = match &spec.autoscaling {
        None => spec.replicas,
        Some(a) => {
            let (min, max) = (a.min_replicas, a.max_replicas.max(a.min_replicas));
            let current = previous.desired_replicas.unwrap_or(spec.replicas).clamp(min, max);
            let bounds = Bounds {
                min: a.min_replicas,
                max: a.max_replicas,
                target_utilization: a.target_utilization,
            };
            // Refusals say "too small" only once the members made for the
            // last growth serve: members still starting are capacity coming.
            let all_serving = live
                .iter()
                .filter(|m| !is_retiring(m))
                .all(|m| m.status.as_ref().and_then(|s| s.phase) == Some(crate::resource::Phase::Ready));
            let demand = Demand {
                leases: leased,
                denied: if all_serving { inputs.denied } else { 0 },
                per_proxy: inputs.leases_per_proxy,
            };
            let recommended = recommended_replicas(bounds, current, demand);
            let floor = memory.window.record(recommended, now);
            // Shrink only on figures for every member: right after a restart
            // the lease store may not know them yet, and 0 leases would be a guess.
            let all_known = live.iter().all(|m| figures_of(m).known);
            let next = match floor {
                _ if recommended > current => recommended,
                Some(floor) if floor < current && all_known => floor,
                _ => current,
            };
            if next != current {
                status.last_scale_time = Some(Time(now));
            }
            next
        }
    };
    let settings = Settings {
        replicas,
        max_surge: spec.max_surge,
        max_unavailable: spec.max_unavailable,
        drain_timeout: spec.drain_timeout().map_err(|e| vec![e])?,
        max_age: spec.max_age().map_err(|e| vec![e])?,
        after_blocked_targets: spec.rotation.as_ref().and_then(|r| r.after_blocked_targets),
        after_errors: spec.rotation.as_ref().and_then(|r| r.after_errors),
        template_hash: hash.clone(),
    };
    let planned_members: Vec<_> = live.iter().map(|m| planned(m, figures_of(m), now)).collect();
    let PoolPlan {
        create,
        retire,
        delete,
        rotating,
        served,
    } = plan(
        &settings,
        &planned_members,
        members.len() - live.len(),
        memory.served,
        now,
    );
    memory.served = served.or(memory.served);

    // Addresses members were blocked on: those retiring for blocks (from
    // their annotation, so a turn that failed after writing it loses
    // nothing) and those retired now.
    let outgoing = |m: &Proxy| {
        m.status
            .as_ref()
            .and_then(|s| s.outgoing_address.as_deref())
            .and_then(|a| a.parse().ok())
    };
    let retired_for_blocks = members.iter().filter_map(|m| {
        let value = m.metadata.annotations.as_ref()?.get(RETIRING_ANNOTATION)?;
        let retiring = parse_retiring(value, now);
        (retiring.reason == RetireReason::Blocked).then_some((m, retiring.since))
    });
    let retired_now = retire
        .iter()
        .filter(|(_, reason)| *reason == RetireReason::Blocked)
        .filter_map(|(name, _)| live.iter().find(|m| m.metadata.name.as_deref() == Some(name)))
        .map(|m| (*m, now));
    let blocked: Vec<BlockedOn> = retired_for_blocks
        .chain(retired_now)
        .filter_map(|(m, since)| {
            Some(BlockedOn {
                member: m.metadata.name.clone()?,
                address: outgoing(m)?,
                since,
            })
        })
        .collect();
    let quarantined = quarantine(
        &previous.quarantined_addresses,
        &blocked,
        inputs.blocked_rest,
        now,
    );
    let annotation = annotation_value(&quarantined, now);

    let by_name = |name: &str| live.iter().find(|m| m.metadata.name.as_deref() == Some(name));
    let incarnation = |m: &Proxy| m.metadata.uid.clone().unwrap_or_default();
    let mut out = Step {
        create: name_suffixes(inputs.seed)
            .take(create as usize)
            .map(|suffix| {
                let mut member = new_member(pool, &suffix, &hash);
                if !annotation.is_empty() {
                    member
                        .metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(QUARANTINED_ADDRESSES_ANNOTATION.to_owned(), annotation.clone());
                }
                member
            })
            .collect(),
        ..Default::default()
    };
    // Members that may still create an instance (a new one, or a
    // replacement for a lost one) carry the quarantine as it is now.
    let retired_names: std::collections::HashSet<String> =
        retire.iter().map(|(name, _)| name.clone()).collect();
    let retiring_now = |m: &Proxy| {
        m.metadata
            .name
            .as_ref()
            .is_some_and(|n| retired_names.contains(n))
    };
    for m in &live {
        if !is_retiring(m) && !retiring_now(m) && annotation_stale(m, &quarantined, now) {
            out.annotate
                .push((ObjectKey::of(m), incarnation(m), annotation.clone()));
        }
    }
    for (name, reason) in retire {
        if let Some(m) = by_name(&name) {
            out.retire.push((
                ObjectKey::of(m),
                incarnation(m),
                retiring_value(now, reason),
                reason,
            ));
        }
    }
    for name in delete {
        if let Some(m) = by_name(&name) {
            out.delete.push((ObjectKey::of(m), incarnation(m)));
        }
    }

    let ready = planned_members
        .iter()
        .filter(|m| m.ready && m.retiring.is_none())
        .count() as u32;
    status.replicas = members.len() as u32;
    status.ready = ready;
    status.leased = leased;
    status.rotating = rotating;
    status.desired_replicas = Some(replicas);
    status.selector = Some(format!(
        "{POOL_LABEL}={}",
        pool.metadata.name.as_deref().unwrap_or_default()
    ));
    status.observed_generation = pool.metadata.generation;
    let generation = pool.metadata.generation;
    let time = Time(now);
    set_condition(
        &mut status.conditions,
        "Ready",
        ready >= replicas,
        if ready >= replicas {
            "AllReady"
        } else {
            "MembersNotReady"
        },
        &format!("{ready} of {replicas} members Ready"),
        generation,
        time.clone(),
    );
    let progressing = rotating > 0 || status.replicas != replicas || create > 0;
    set_condition(
        &mut status.conditions,
        "Progressing",
        progressing,
        if rotating > 0 {
            "Rotating"
        } else if progressing {
            "Scaling"
        } else {
            "Steady"
        },
        &format!(
            "{rotating} rotating, {} members for {replicas} wanted",
            status.replicas
        ),
        generation,
        time,
    );
    let leaving: Vec<Leaving> = live
        .iter()
        .map(|m| Leaving {
            member: m.metadata.name.clone().unwrap_or_default(),
            retiring: is_retiring(m) || retiring_now(m),
            address: outgoing(m),
        })
        .collect();
    note_condition(&mut status.conditions, &quarantined, &leaving, generation, now);
    status.quarantined_addresses = quarantined;
    out.status = status;
    Ok(out)
}

/// The status of a pool whose spec is invalid: as it was, `Ready` false
/// with reason `InvalidSpec` naming every problem.
pub fn invalid_spec_status(pool: &ProxyPool, problems: &[String], now: Timestamp) -> ProxyPoolStatus {
    let mut status = pool.status.clone().unwrap_or_default();
    let message = problems.join("; ");
    let generation = pool.metadata.generation;
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        "InvalidSpec",
        &message,
        generation,
        Time(now),
    );
    status
}

/// Records in `status` how this turn's creates went: `ReplicaFailure`
/// true with the error when one failed, false again once members were
/// created after a failure.
pub fn note_creates(
    status: &mut ProxyPoolStatus,
    failure: Option<&str>,
    created: bool,
    generation: Option<i64>,
    now: Timestamp,
) {
    let failing = status
        .conditions
        .iter()
        .any(|c| c.type_ == "ReplicaFailure" && c.status == "True");
    match failure {
        Some(error) => set_condition(
            &mut status.conditions,
            "ReplicaFailure",
            true,
            "FailedCreate",
            error,
            generation,
            Time(now),
        ),
        None if failing && created => set_condition(
            &mut status.conditions,
            "ReplicaFailure",
            false,
            "Created",
            "members are created again",
            generation,
            Time(now),
        ),
        None => {}
    }
}

/// Whether `proxy` is retiring (carries the annotation).
pub fn is_retiring(proxy: &Proxy) -> bool {
    proxy
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(RETIRING_ANNOTATION))
}

#[cfg(test)]
mod table_tests;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resource::{Phase, ProxyStatus};

    fn pool(replicas: u32, extra: serde_json::Value) -> ProxyPool {
        let mut spec = json!({"replicas": replicas,
            "template": {"spec": {"mode": "Managed", "provider": "local"}}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "eu", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": spec
        }))
        .unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn inputs(now: Timestamp) -> Inputs {
        Inputs {
            leases_per_proxy: 4,
            denied: 0,
            blocked_rest: Duration::from_secs(600),
            now,
            seed: 1,
        }
    }

    fn window() -> PoolMemory {
        PoolMemory::new(std::time::Duration::from_secs(60), at(0))
    }

    /// A stored member: created at `created`, Ready or not.
    fn stored(pool: &ProxyPool, suffix: &str, created: i64, ready: bool) -> Proxy {
        let mut m = new_member(pool, suffix, &template_hash(&pool.spec.template));
        m.metadata.uid = Some(format!("uid-{suffix}"));
        m.metadata.creation_timestamp = Some(Time(at(created)));
        m.status = Some(ProxyStatus {
            phase: Some(if ready { Phase::Ready } else { Phase::Provisioning }),
            ..Default::default()
        });
        m
    }

    #[test]
    fn an_empty_pool_gets_its_members_and_a_status_saying_so() {
        let p = pool(3, json!({}));
        let s = step(&p, &[], &HashMap::new(), inputs(at(0)), &mut window()).unwrap();
        assert_eq!(s.create.len(), 3);
        assert!(s.create.iter().all(|m| crate::pool::is_member(m, &p)));
        assert_eq!(s.status.desired_replicas, Some(3));
        assert_eq!(s.status.selector.as_deref(), Some("crawl.example.com/pool=eu"));
        let ready = s.status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.message.as_str()),
            ("False", "0 of 3 members Ready")
        );
    }

    #[test]
    fn a_blocked_member_is_replaced_first_and_retired_once_its_successor_is_ready() {
        let p = pool(2, json!({"rotation": {"afterBlockedTargets": 2}}));
        let members = vec![stored(&p, "aaaaa", 0, true), stored(&p, "bbbbb", 0, true)];
        let blocked: HashMap<ObjectKey, LeaseFigures> = [(
            ObjectKey::new("ns", "eu-aaaaa"),
            LeaseFigures {
                known: true,
                leases: 1,
                blocked_targets: 2,
                ..Default::default()
            },
        )]
        .into();
        let s = step(&p, &members, &blocked, inputs(at(10)), &mut window()).unwrap();
        assert_eq!((s.create.len(), s.retire.len()), (1, 0), "successor first");
        assert_eq!(s.status.rotating, 1);

        let mut with_successor = members.clone();
        with_successor.push(stored(&p, "ccccc", 10, true));
        let s = step(&p, &with_successor, &blocked, inputs(at(20)), &mut window()).unwrap();
        assert_eq!(s.create.len(), 0);
        assert_eq!(s.retire.len(), 1);
        let (key, uid, value, reason) = &s.retire[0];
        assert_eq!(
            (key.name.as_str(), uid.as_str(), *reason),
            ("eu-aaaaa", "uid-aaaaa", RetireReason::Blocked)
        );
        assert!(value.ends_with(" blocked"), "{value}");
    }

    #[test]
    fn autoscaling_follows_demand_and_records_when_it_changed() {
        let p = pool(
            2,
            json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 5, "targetUtilization": 50}}),
        );
        let members = vec![stored(&p, "aaaaa", 0, true), stored(&p, "bbbbb", 0, true)];
        let busy: HashMap<ObjectKey, LeaseFigures> = members
            .iter()
            .map(|m| {
                let figures = LeaseFigures {
                    known: true,
                    leases: 4,
                    ..Default::default()
                };
                (ObjectKey::of(m), figures)
            })
            .collect();
        // 8 leases, 2 per proxy at 50 % of 4: 4 members.
        let s = step(&p, &members, &busy, inputs(at(0)), &mut window()).unwrap();
        assert_eq!(s.status.desired_replicas, Some(4));
        assert_eq!(s.status.last_scale_time, Some(Time(at(0))));
        assert_eq!(s.create.len(), 2, "grows to the new size at once");
    }

    #[test]
    fn an_autoscaled_pool_shrinks_only_after_a_whole_quiet_window_with_known_figures() {
        let mut p = pool(
            4,
            json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 5, "targetUtilization": 100}}),
        );
        p.status = Some(ProxyPoolStatus {
            desired_replicas: Some(4),
            ..Default::default()
        });
        let members: Vec<Proxy> = ["aaaaa", "bbbbb", "ccccc", "ddddd"]
            .iter()
            .map(|s| stored(&p, s, 0, true))
            .collect();
        let idle = |known: bool| -> HashMap<ObjectKey, LeaseFigures> {
            members
                .iter()
                .map(|m| {
                    (
                        ObjectKey::of(m),
                        LeaseFigures {
                            known,
                            ..Default::default()
                        },
                    )
                })
                .collect()
        };
        let mut window = window();
        let s = step(&p, &members, &idle(true), inputs(at(10)), &mut window).unwrap();
        assert_eq!(s.status.desired_replicas, Some(4), "the window is not whole yet");
        let s = step(&p, &members, &idle(false), inputs(at(70)), &mut window).unwrap();
        assert_eq!(
            s.status.desired_replicas,
            Some(4),
            "figures unknown (after a restart): no guess"
        );
        let s = step(&p, &members, &idle(true), inputs(at(71)), &mut window).unwrap();
        assert_eq!(
            s.status.desired_replicas,
            Some(1),
            "a whole minute without demand"
        );
        assert_eq!(s.retire.len(), 3);
    }

    #[test]
    fn refused_acquires_grow_the_pool_only_once_its_members_serve() {
        let mut p = pool(
            2,
            json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 9, "targetUtilization": 100}}),
        );
        p.status = Some(ProxyPoolStatus {
            desired_replicas: Some(2),
            ..Default::default()
        });
        let starting = vec![stored(&p, "aaaaa", 0, true), stored(&p, "bbbbb", 0, false)];
        let denied = Inputs {
            denied: 5,
            ..inputs(at(10))
        };
        let s = step(&p, &starting, &HashMap::new(), denied, &mut window()).unwrap();
        assert_eq!(s.status.desired_replicas, Some(2), "one member still starting");
        let serving = vec![stored(&p, "aaaaa", 0, true), stored(&p, "bbbbb", 0, true)];
        let s = step(&p, &serving, &HashMap::new(), denied, &mut window()).unwrap();
        assert_eq!(s.status.desired_replicas, Some(3));
    }

    #[test]
    fn an_invalid_pool_plans_nothing_and_says_why() {
        let p = pool(2, json!({"maxSurge": 0, "maxUnavailable": 0}));
        let problems = step(&p, &[], &HashMap::new(), inputs(at(0)), &mut window()).unwrap_err();
        assert!(problems[0].contains("cannot both be 0"), "{problems:?}");
        let status = invalid_spec_status(&p, &problems, at(0));
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(ready.message.contains("cannot both be 0"));
    }

    #[test]
    fn a_failed_create_is_a_condition_until_members_are_created_again() {
        let mut status = ProxyPoolStatus::default();
        note_creates(&mut status, Some("quota exceeded"), false, Some(1), at(0));
        let failure = |s: &ProxyPoolStatus| {
            let c = s.conditions.iter().find(|c| c.type_ == "ReplicaFailure").unwrap();
            (c.status.clone(), c.reason.clone())
        };
        assert_eq!(failure(&status), ("True".into(), "FailedCreate".into()));
        note_creates(&mut status, None, false, Some(1), at(1));
        assert_eq!(failure(&status).0, "True", "nothing created yet");
        note_creates(&mut status, None, true, Some(1), at(2));
        assert_eq!(failure(&status), ("False".into(), "Created".into()));
    }

    #[test]
    fn an_address_a_member_was_blocked_on_is_quarantined_and_handed_to_the_members() {
        let p = pool(2, json!({"rotation": {"afterBlockedTargets": 1}}));
        let on = |mut m: Proxy, address: &str| {
            m.status.get_or_insert_default().outgoing_address = Some(address.to_owned());
            m
        };
        let members = vec![
            on(stored(&p, "aaaaa", 0, true), "127.0.0.2"),
            on(stored(&p, "bbbbb", 0, true), "127.0.0.3"),
            on(stored(&p, "ccccc", 5, true), "127.0.0.4"),
        ];
        let blocked: HashMap<ObjectKey, LeaseFigures> = [(
            ObjectKey::new("ns", "eu-aaaaa"),
            LeaseFigures {
                known: true,
                blocked_targets: 1,
                ..Default::default()
            },
        )]
        .into();
        // The successor (ccccc) is Ready: aaaaa retires, its address is quarantined.
        let s = step(&p, &members, &blocked, inputs(at(10)), &mut window()).unwrap();
        assert_eq!(s.retire.len(), 1);
        let q = &s.status.quarantined_addresses;
        assert_eq!(q.len(), 1, "{q:?}");
        assert_eq!(
            (q[0].address.as_str(), q[0].member.as_str(), q[0].until.0),
            ("127.0.0.2", "eu-aaaaa", at(610))
        );
        let annotated: Vec<&str> = s.annotate.iter().map(|(k, _, _)| k.name.as_str()).collect();
        assert_eq!(annotated, ["eu-bbbbb", "eu-ccccc"], "not the retiring one");
        assert_eq!(s.annotate[0].2, format!("127.0.0.2={}", at(610)));
        let condition = s
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == crate::pool::ADDRESSES_AVAILABLE)
            .unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "Quarantined")
        );

        // Next turn: it is retiring; the quarantine stays as it was, members
        // carrying it are not written again, a new member is made with it.
        let mut after = members.clone();
        after[0]
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(RETIRING_ANNOTATION.into(), s.retire[0].2.clone());
        for m in after.iter_mut().skip(1) {
            m.metadata
                .annotations
                .get_or_insert_default()
                .insert(QUARANTINED_ADDRESSES_ANNOTATION.into(), s.annotate[0].2.clone());
        }
        after.remove(2);
        let mut p2 = p.clone();
        p2.status = Some(s.status.clone());
        let s2 = step(&p2, &after, &blocked, inputs(at(20)), &mut window()).unwrap();
        assert_eq!(s2.status.quarantined_addresses, s.status.quarantined_addresses);
        assert!(s2.annotate.is_empty(), "{:?}", s2.annotate);
        assert_eq!(s2.create.len(), 1);
        let made = &s2.create[0].metadata.annotations.as_ref().unwrap()[QUARANTINED_ADDRESSES_ANNOTATION];
        assert_eq!(made, &s.annotate[0].2);

        // A new member given the quarantined address (none other was free): exhausted.
        after.push(on(stored(&p, "ddddd", 20, true), "127.0.0.2"));
        let s3 = step(&p2, &after, &blocked, inputs(at(30)), &mut window()).unwrap();
        let condition = s3
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == crate::pool::ADDRESSES_AVAILABLE)
            .unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "AddressesExhausted"),
            "{}",
            condition.message
        );
        assert!(
            condition.message.contains("eu-ddddd from 127.0.0.2"),
            "{}",
            condition.message
        );
    }
}
