//! Looking at a pool for one turn: the pool and its members as the store
//! has them, as a plain value for [`step`](super::step()) to decide on.
//! Reads only. The members' lease figures come from the lease store, which
//! the caller asks (it lives in the running system, not behind this port).

use crate::resource::{ObjectKey, Proxy, ProxyPool};
use crate::resource_store::{PoolStore, StoreError};

/// What the store says about a pool that is there to be turned.
#[derive(Clone, Debug)]
pub struct Observed {
    pub pool: ProxyPool,
    /// The Proxies this incarnation of the pool owns, those being deleted included.
    pub members: Vec<Proxy>,
}

/// The pool `key` and its members; `None` when the pool is gone or being
/// deleted: its members go with it (the owner's garbage collection), so a
/// turn has nothing to do.
pub async fn observe(pools: &dyn PoolStore, key: &ObjectKey) -> Result<Option<Observed>, StoreError> {
    let Some(pool) = pools.get_pool(key).await? else {
        return Ok(None);
    };
    if pool.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let members = pools.members(&pool).await?;
    Ok(Some(Observed { pool, members }))
}
