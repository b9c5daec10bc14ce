//! `PoolActor`: one per ProxyPool, the glue of its turns. Every second (or
//! when the pool changes) it runs one turn: [`egress_proxies::domain::pool::observe`]
//! reads the pool and its members, the lease store gives their lease
//! figures, [`egress_proxies::domain::pool::step`] decides with the clock and a
//! random seed this actor supplies, and [`egress_proxies::domain::pool::execute`]
//! writes what it decided (deletions, retiring annotations, quarantine
//! annotations, new members, the pool's status). The members' own
//! ProxyActors do the rest (instances, health, leases).
//!
//! After every turn the pool's gauges are set from the status it wrote, and
//! the lease store gets the pool's figures for the dashboard; when the pool
//! goes, both forget it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::domain::pool::{Inputs, Observed, PoolMemory, RetireReason, execute, observe, step};
use egress_proxies::domain::resource::{ObjectKey, ProxyPoolStatus};
use egress_proxies::domain::resource_store::{PoolStore, ProxyStore, StoreError};
use egress_proxies::telemetry::events::{PoolRemoved, PoolTurnCompleted};

use crate::lease_store_actor::{ForgetPool, GetPoolFigures, LeaseStoreActor, PoolReport, ReportPool};

/// What every pool's loop shares.
#[derive(Clone)]
pub struct PoolContext {
    pub pools: Arc<dyn PoolStore>,
    pub proxies: Arc<dyn ProxyStore>,
    pub leases: Option<Addr<LeaseStoreActor>>,
    pub timing: PoolTiming,
}

/// How often a pool looks at itself, and its autoscaler's patience.
#[derive(Clone, Copy, Debug)]
pub struct PoolTiming {
    pub interval: Duration,
    pub scale_down_delay: Duration,
    /// `--max-leases-per-proxy` (0: unlimited).
    pub leases_per_proxy: u32,
    /// The lease store's rest after a `blocked` report: how long an
    /// address a member was blocked on is quarantined.
    pub blocked_rest: Duration,
}

/// How often each pool looks at its members.
const TURN_INTERVAL: Duration = Duration::from_secs(1);

impl PoolTiming {
    /// The timing both modes run pools with.
    pub fn of(settings: &crate::system::Settings) -> Self {
        Self {
            interval: TURN_INTERVAL,
            scale_down_delay: settings.pool_scale_down_delay,
            leases_per_proxy: settings.leases.capacity,
            blocked_rest: settings.leases.blocked_cooldown,
        }
    }
}

/// A turn of a pool's loop failed; the next turn tries again.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Without its members' figures a turn could delete a member still
    /// leased, or shrink a busy pool: it waits instead.
    #[error("the lease store did not answer for the pool's lease figures")]
    LeaseStore,
}

pub struct PoolActor {
    key: ObjectKey,
    ctx: PoolContext,
    busy: bool,
    /// Stopped for good: a turn still under way reports nothing.
    gone: bool,
    /// Acquires refused for lack of capacity, summed over its turns.
    denied: u64,
    /// What the lease store was last told.
    reported: Option<PoolReport>,
    /// The autoscaler's recent recommendations and the rotation's turns
    /// (empty after a restart: the autoscaler then watches a whole
    /// scale-down delay before shrinking).
    memory: Arc<Mutex<PoolMemory>>,
}

/// What one turn saw and decided, for the pool's metrics and the dashboard.
#[derive(Default)]
struct Turned {
    /// Acquires refused for lack of capacity since the previous turn (taken
    /// from the lease store: counted even when the turn fails later).
    denied: u32,
    /// The status written, or found unchanged; `None` when the turn ended before.
    status: Option<ProxyPoolStatus>,
}

/// Look again now (the pool changed).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Turn;

/// Stop for good (the pool is gone).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct StopPool;

impl PoolActor {
    pub fn new(key: ObjectKey, ctx: PoolContext) -> Self {
        let delay = ctx.timing.scale_down_delay;
        Self {
            key,
            ctx,
            busy: false,
            gone: false,
            denied: 0,
            reported: None,
            memory: Arc::new(Mutex::new(PoolMemory::new(delay, jiff::Timestamp::now()))),
        }
    }

    fn turn(&mut self, ctx: &mut Context<Self>) {
        // One turn at a time: a slow store delays turns instead of piling them up.
        if std::mem::replace(&mut self.busy, true) {
            return;
        }
        let (key, pool_ctx, memory) = (self.key.clone(), self.ctx.clone(), self.memory.clone());
        ctx.spawn(
            async move {
                let mut turned = Turned::default();
                let result = one_turn(&key, &pool_ctx, &memory, &mut turned).await;
                (turned, result)
            }
            .into_actor(self)
            .map(|(turned, result), actor, _| {
                actor.busy = false;
                if let Err(e) = result {
                    tracing::warn!(pool = %actor.key, error = %e, "pool turn failed; trying again next turn");
                }
                actor.turned(turned);
            }),
        );
    }

    /// Records a turn: the pool's metrics, and its figures for the dashboard.
    fn turned(&mut self, turned: Turned) {
        if self.gone {
            return;
        }
        self.denied += u64::from(turned.denied);
        PoolTurnCompleted {
            pool: &self.key.to_string(),
            status: turned.status.as_ref().map(ProxyPoolStatus::figures),
            denied: turned.denied,
        }
        .emit();
        // A turn that ended early leaves the last status standing.
        let Some(status) = turned
            .status
            .or_else(|| self.reported.as_ref().map(|r| r.status.clone()))
        else {
            return;
        };
        let rotating = match status.rotating {
            0 => String::new(),
            n => format!(", {n} rotating"),
        };
        crate::supervision::report_state(
            "pool",
            &self.key.to_string(),
            &format!(
                "{} of {} Ready{rotating}",
                status.ready,
                status.desired_replicas.unwrap_or_default()
            ),
            0,
        );
        let report = PoolReport {
            key: self.key.clone(),
            status,
            denied: self.denied,
            leases_per_member: self.ctx.timing.leases_per_proxy,
        };
        if self.reported.as_ref() != Some(&report) {
            if let Some(leases) = &self.ctx.leases {
                leases.do_send(ReportPool(report.clone()));
            }
            self.reported = Some(report);
        }
    }
}

/// One turn: observe, the lease figures, decide, execute. The next turn
/// comes from the interval timer (or a [`Turn`] when the pool changes).
async fn one_turn(
    key: &ObjectKey,
    ctx: &PoolContext,
    memory: &Mutex<PoolMemory>,
    turned: &mut Turned,
) -> Result<(), PoolError> {
    let Some(Observed { pool, members }) = observe(ctx.pools.as_ref(), key).await? else {
        return Ok(());
    };
    let name = pool.metadata.name.clone().unwrap_or_default();
    let figures = match &ctx.leases {
        Some(leases) => {
            let ask = GetPoolFigures {
                pool: name,
                members: members.iter().map(ObjectKey::of).collect(),
            };
            leases.send(ask).await.map_err(|_| PoolError::LeaseStore)?
        }
        // No lease store yet: every member's figures unknown, so nothing is
        // deleted before its drain timeout and nothing shrinks.
        None => Default::default(),
    };
    turned.denied = figures.denied;
    let now = jiff::Timestamp::now();
    let inputs = Inputs {
        leases_per_proxy: ctx.timing.leases_per_proxy,
        denied: figures.denied,
        blocked_rest: ctx.timing.blocked_rest,
        now,
        // The names of this turn's new members are drawn from it.
        seed: fastrand::u64(..),
    };
    let decided = {
        let mut memory = memory.lock().unwrap_or_else(|p| p.into_inner());
        step(&pool, &members, &figures.members, inputs, &mut memory)
    };
    let status = execute(key, &pool, decided, ctx.pools.as_ref(), ctx.proxies.as_ref(), now).await?;
    turned.status = Some(status);
    Ok(())
}

impl Actor for PoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.busy = false;
        self.turn(ctx);
        ctx.run_interval(self.ctx.timing.interval, |actor, ctx| actor.turn(ctx));
    }
}

impl actix::Supervised for PoolActor {}

impl Handler<Turn> for PoolActor {
    type Result = ();
    fn handle(&mut self, _: Turn, ctx: &mut Self::Context) {
        self.turn(ctx);
    }
}

impl Handler<StopPool> for PoolActor {
    type Result = ();
    fn handle(&mut self, _: StopPool, ctx: &mut Self::Context) {
        self.gone = true;
        PoolRemoved {
            pool: &self.key.to_string(),
            retire_reasons: &RetireReason::ALL.map(RetireReason::as_str),
        }
        .emit();
        if let Some(leases) = &self.ctx.leases {
            leases.do_send(ForgetPool(self.key.clone()));
        }
        ctx.stop();
    }
}
