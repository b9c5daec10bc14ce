//! `PoolRegistry`: one supervised PoolActor per existing ProxyPool, driven
//! by the store's pool events (a [`KeyedRegistry`]).

use actix::prelude::*;
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource_store::StoreError;
use futures::future::BoxFuture;

use crate::keyed_registry::{KeyedRegistry, Kind};
use crate::pool_actor::{PoolActor, PoolContext, StopPool, Turn};

/// ProxyPools, each with its PoolActor.
pub struct Pools;

pub type PoolRegistry = KeyedRegistry<Pools>;

impl Kind for Pools {
    type Member = PoolActor;
    type Shared = PoolContext;
    const REGISTRY: &'static str = "pool_registry";
    const MEMBER: &'static str = "pool";

    fn member(key: ObjectKey, ctx: PoolContext) -> PoolActor {
        PoolActor::new(key, ctx)
    }

    fn changed(member: &Addr<PoolActor>) {
        member.do_send(Turn);
    }

    fn stop(member: Addr<PoolActor>) {
        member.do_send(StopPool);
    }

    fn keys(ctx: &PoolContext) -> BoxFuture<'static, Result<Vec<ObjectKey>, StoreError>> {
        let pools = ctx.pools.clone();
        Box::pin(async move { pools.pool_keys().await })
    }
}

impl KeyedRegistry<Pools> {
    pub fn new(ctx: PoolContext) -> Self {
        Self::with_shared(ctx)
    }
}
