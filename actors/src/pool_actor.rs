//! `PoolActor`: one per ProxyPool. Every turn it reads the pool and its
//! members from the store and their lease figures from the lease store,
//! lets [`egress_proxies::pool::step`] decide, and writes what it decided:
//! new members, retiring annotations, deletions, the pool's status. The
//! members' own ProxyActors do the rest (instances, health, leases).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::pool::{Inputs, step};
use egress_proxies::resource::{ProxyPool, RETIRING_ANNOTATION};
use egress_proxies::store::{ObjectKey, PoolStore, ProxyStore, StoreError};

use crate::lease_store::{GetPoolFigures, LeaseStore};

/// What every pool's loop shares.
#[derive(Clone)]
pub struct PoolContext {
    pub pools: Arc<dyn PoolStore>,
    pub proxies: Arc<dyn ProxyStore>,
    pub leases: Option<Addr<LeaseStore>>,
    pub timing: PoolTiming,
}

/// How often a pool looks at itself, and its autoscaler's patience.
#[derive(Clone, Copy, Debug)]
pub struct PoolTiming {
    pub interval: Duration,
    pub scale_down_delay: Duration,
    /// `--max-leases-per-proxy` (0: unlimited).
    pub leases_per_proxy: u32,
}

/// A turn of a pool's loop failed; the next turn tries again.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct PoolActor {
    key: ObjectKey,
    ctx: PoolContext,
    busy: bool,
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
        Self {
            key,
            ctx,
            busy: false,
        }
    }

    fn turn(&mut self, ctx: &mut Context<Self>) {
        // One turn at a time: a slow store delays turns instead of piling them up.
        if std::mem::replace(&mut self.busy, true) {
            return;
        }
        let (key, pool_ctx) = (self.key.clone(), self.ctx.clone());
        ctx.spawn(
            async move { one_turn(&key, &pool_ctx).await }
                .into_actor(self)
                .map(|result, actor, _| {
                    actor.busy = false;
                    if let Err(e) = result {
                        tracing::warn!(pool = %actor.key, error = %e, "pool turn failed; trying again next turn");
                    }
                }),
        );
    }
}

async fn one_turn(key: &ObjectKey, ctx: &PoolContext) -> Result<(), PoolError> {
    let Some(pool) = ctx.pools.get_pool(key).await? else {
        return Ok(());
    };
    if pool.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let members = ctx.pools.members(&pool).await?;
    let name = pool.metadata.name.clone().unwrap_or_default();
    let figures = match &ctx.leases {
        Some(leases) => leases.send(GetPoolFigures(name)).await.unwrap_or_default(),
        None => Default::default(),
    };
    let inputs = Inputs {
        leases_per_proxy: ctx.timing.leases_per_proxy,
        denied: figures.denied,
        scale_down_delay: ctx.timing.scale_down_delay,
        now: jiff::Timestamp::now(),
    };
    let decided = match step(&pool, &members, &figures.members, inputs) {
        Ok(decided) => decided,
        Err(problems) => {
            tracing::error!(pool = %key, problems = %problems.join("; "), "pool spec is invalid; nothing changes");
            return Ok(());
        }
    };
    for member in &decided.create {
        match ctx.pools.create_member(member).await {
            Ok(()) => tracing::info!(pool = %key, proxy = %ObjectKey::of(member), "pool member created"),
            // A drawn name was taken: the next turn draws another.
            Err(StoreError::AlreadyExists(taken)) => {
                tracing::debug!(pool = %key, proxy = %taken, "member name taken")
            }
            Err(e) => return Err(e.into()),
        }
    }
    for (member, uid, value, reason) in &decided.retire {
        ctx.proxies
            .set_annotation(member, uid, RETIRING_ANNOTATION, Some(value))
            .await?;
        tracing::info!(pool = %key, proxy = %member, reason = reason.as_str(), "pool member retiring");
    }
    for (member, uid) in &decided.delete {
        match ctx.pools.delete_member(member, uid).await {
            Ok(()) | Err(StoreError::Gone { .. }) => {
                tracing::info!(pool = %key, proxy = %member, "pool member deleted")
            }
            Err(e) => return Err(e.into()),
        }
    }
    write_status(ctx, key, &pool, decided.status).await
}

async fn write_status(
    ctx: &PoolContext,
    key: &ObjectKey,
    pool: &ProxyPool,
    status: egress_proxies::resource::ProxyPoolStatus,
) -> Result<(), PoolError> {
    if pool.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    match ctx.pools.write_pool_status(key, &uid, &status).await {
        Ok(()) | Err(StoreError::Gone { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
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
        ctx.stop();
    }
}
