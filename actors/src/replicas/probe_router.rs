//! Shared probing: each proxy is probed by one member, the one
//! `probe_assignee` ranks first among the live members. Every member runs a
//! ProbeRouter in front of its HealthProber.
//!
//! ```text
//!  leader:   ProxyActor ─Watch/Unwatch─► ProbeRouter ─publish─► the leader's feed
//!  every member:        the feed (targets, members) ─ApplyProbeFeed─► ProbeRouter
//!                          │ its own share of the plan: Watch/Unwatch
//!                          ▼
//!                       HealthProber ─HealthVerdict─► ProbeRouter ─┬─► ProxyActor (on the leader)
//!                                                                 └─► upstream (to the leader)
//!  leader:   a member's verdict ─RemoteVerdict─► ProbeRouter ─► ProxyActor
//! ```
//!
//! Every member derives the same plan from the same feed, so no order
//! names a member: a member probes what the plan gives it. The leader
//! takes a member's verdict only for a proxy the plan gives that member,
//! so a late verdict from a former assignee is dropped.

use std::collections::HashMap;
use std::sync::Arc;

use actix::WeakRecipient;
use actix::prelude::*;
use egress_proxies::domain::health::{ProbeTarget, RecordedVerdict, Verdict};
use egress_proxies::domain::membership::{MemberTag, ProbeOrder, ProbePlan};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::telemetry::events::ProbesAssigned;

use crate::health_prober::{GetProberStats, HealthProber, HealthVerdict, ProberStats, Unwatch, Watch};

/// What a member's prober needs for one proxy.
#[derive(Clone, Debug, PartialEq)]
pub struct Assigned {
    pub target: Arc<ProbeTarget>,
    /// Where a prober that takes the proxy over starts from.
    pub recorded: Option<RecordedVerdict>,
}

/// A change of what is probed, as the leader publishes it.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeItem {
    Watch { key: ObjectKey, assigned: Assigned },
    Unwatch { key: ObjectKey },
}

/// Where the leader's router publishes what is to be probed.
pub type Publish = Arc<dyn Fn(ProbeItem) + Send + Sync>;
/// Where a member sends the verdicts of its probes for the leader.
pub type Upstream = Arc<dyn Fn(ObjectKey, Verdict) + Send + Sync>;

/// What is probed changed, as the feed says (in the feed's order).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ApplyProbeFeed {
    /// Start over: `items` is the whole set of proxies to probe.
    pub reset: bool,
    pub items: Vec<ProbeItem>,
    /// The live members, when they changed.
    pub members: Option<Vec<MemberTag>>,
}

/// A member's verdict, received by the leader.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RemoteVerdict {
    pub from: MemberTag,
    pub key: ObjectKey,
    pub verdict: Verdict,
}

/// Every proxy the plan holds, with what its probes need: what a new
/// leader publishes first (it had the old leader's feed).
#[derive(Message, Debug)]
#[rtype(result = "Vec<(ObjectKey, Assigned)>")]
pub struct GetPlan;

/// How many proxies this member probes, and its prober's counters.
#[derive(Message, Debug)]
#[rtype(result = "RouterStats")]
pub struct GetRouterStats;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterStats {
    pub assigned_here: usize,
    pub assigned: Vec<(MemberTag, usize)>,
}

pub struct ProbeRouter {
    me: MemberTag,
    prober: Addr<HealthProber>,
    plan: ProbePlan<Assigned>,
    /// The ProxyActors that watch (on the leader only).
    owners: HashMap<ObjectKey, WeakRecipient<HealthVerdict>>,
    /// Set while this member leads.
    publish: Option<Publish>,
    upstream: Upstream,
}

impl ProbeRouter {
    pub fn new(me: MemberTag, prober: Addr<HealthProber>, upstream: Upstream) -> Self {
        Self {
            me,
            prober,
            plan: ProbePlan::default(),
            owners: HashMap::new(),
            publish: None,
            upstream,
        }
    }

    /// Carries out the orders that concern this member.
    fn carry_out(&self, orders: Vec<ProbeOrder<Assigned>>, ctx: &mut Context<Self>) {
        let mut mine_changed = false;
        for order in orders {
            match order {
                ProbeOrder::Watch { member, key, target } if member == self.me => {
                    mine_changed = true;
                    self.prober.do_send(Watch {
                        key,
                        target: target.target,
                        owner: ctx.address().downgrade().recipient(),
                        recorded: target.recorded,
                    })
                }
                ProbeOrder::Unwatch { member, key } if member == self.me => {
                    mine_changed = true;
                    self.prober.do_send(Unwatch { key })
                }
                _ => {}
            }
        }
        if mine_changed {
            ProbesAssigned {
                count: self.assigned_here(),
            }
            .emit();
        }
    }

    fn assigned_here(&self) -> usize {
        self.plan.counts().get(&self.me).copied().unwrap_or(0)
    }
}

impl Actor for ProbeRouter {
    type Context = Context<Self>;
}

/// The router publishes while its member leads (and stops when it no
/// longer does).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetPublisher(pub Option<Publish>);

impl Handler<SetPublisher> for ProbeRouter {
    type Result = ();

    fn handle(&mut self, msg: SetPublisher, _: &mut Self::Context) {
        self.publish = msg.0;
        if self.publish.is_none() {
            self.owners.clear();
        }
    }
}

impl Handler<Watch> for ProbeRouter {
    type Result = ();

    fn handle(&mut self, msg: Watch, _: &mut Self::Context) {
        self.owners.insert(msg.key.clone(), msg.owner);
        if let Some(publish) = &self.publish {
            publish(ProbeItem::Watch {
                key: msg.key,
                assigned: Assigned {
                    target: msg.target,
                    recorded: msg.recorded,
                },
            });
        }
    }
}

impl Handler<Unwatch> for ProbeRouter {
    type Result = ();

    fn handle(&mut self, msg: Unwatch, _: &mut Self::Context) {
        self.owners.remove(&msg.key);
        if let Some(publish) = &self.publish {
            publish(ProbeItem::Unwatch { key: msg.key });
        }
    }
}

impl Handler<ApplyProbeFeed> for ProbeRouter {
    type Result = ();

    fn handle(&mut self, msg: ApplyProbeFeed, ctx: &mut Self::Context) {
        let mut orders = Vec::new();
        if msg.reset {
            // What this member probes now and keeps probing is not stopped:
            // the prober keeps its state for a Watch of the same target.
            let mine: Vec<ObjectKey> = self
                .plan
                .assignment_of(&self.me)
                .into_iter()
                .filter_map(|order| match order {
                    ProbeOrder::Watch { key, .. } => Some(key),
                    ProbeOrder::Unwatch { .. } => None,
                })
                .collect();
            let mut plan = ProbePlan::default();
            if let Some(members) = &msg.members {
                plan.set_members(members.clone());
            }
            self.plan = plan;
            for key in mine {
                orders.push(ProbeOrder::Unwatch {
                    member: self.me.clone(),
                    key,
                });
            }
        } else if let Some(members) = msg.members {
            orders.extend(self.plan.set_members(members));
        }
        for item in msg.items {
            match item {
                ProbeItem::Watch { key, assigned } => orders.extend(self.plan.watch(key, assigned)),
                ProbeItem::Unwatch { key } => orders.extend(self.plan.unwatch(&key)),
            }
        }
        if msg.reset {
            // An Unwatch followed by a Watch of the same key would restart
            // its probes: keep only the last order per key.
            let mut last: HashMap<ObjectKey, usize> = HashMap::new();
            for (i, order) in orders.iter().enumerate() {
                let key = match order {
                    ProbeOrder::Watch { key, .. } | ProbeOrder::Unwatch { key, .. } => key,
                };
                last.insert(key.clone(), i);
            }
            orders = orders
                .into_iter()
                .enumerate()
                .filter(|(i, order)| {
                    let key = match order {
                        ProbeOrder::Watch { key, .. } | ProbeOrder::Unwatch { key, .. } => key,
                    };
                    last.get(key) == Some(i)
                })
                .map(|(_, order)| order)
                .collect();
        }
        self.carry_out(orders, ctx);
    }
}

impl Handler<HealthVerdict> for ProbeRouter {
    type Result = ();

    fn handle(&mut self, msg: HealthVerdict, _: &mut Self::Context) {
        match self.owners.get(&msg.key).and_then(WeakRecipient::upgrade) {
            Some(owner) => owner.do_send(msg),
            None => (self.upstream)(msg.key, msg.verdict),
        }
    }
}

impl Handler<RemoteVerdict> for ProbeRouter {
    type Result = ();

    fn handle(&mut self, msg: RemoteVerdict, _: &mut Self::Context) {
        if self.plan.assignee(&msg.key) != Some(&msg.from) {
            return;
        }
        if let Some(owner) = self.owners.get(&msg.key).and_then(WeakRecipient::upgrade) {
            owner.do_send(HealthVerdict {
                key: msg.key,
                verdict: msg.verdict,
                span: None,
            });
        }
    }
}

impl Handler<GetProberStats> for ProbeRouter {
    type Result = ResponseFuture<ProberStats>;

    fn handle(&mut self, msg: GetProberStats, _: &mut Self::Context) -> Self::Result {
        let prober = self.prober.clone();
        Box::pin(async move { prober.send(msg).await.unwrap_or_default() })
    }
}

impl Handler<GetRouterStats> for ProbeRouter {
    type Result = MessageResult<GetRouterStats>;

    fn handle(&mut self, _: GetRouterStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(RouterStats {
            assigned_here: self.assigned_here(),
            assigned: self.plan.counts().into_iter().collect(),
        })
    }
}

impl Handler<GetPlan> for ProbeRouter {
    type Result = MessageResult<GetPlan>;

    fn handle(&mut self, _: GetPlan, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.plan
                .watched()
                .map(|(key, assigned)| (key.clone(), assigned.clone()))
                .collect(),
        )
    }
}
