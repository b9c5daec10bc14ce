//! Proxy pools: the decisions of a pool's control loop, free of I/O. The
//! running system (one PoolActor per pool) feeds them with the pool's
//! members and lease demand and carries out what they decide.

mod plan;

pub use plan::{Member, Plan, RetireReason, Retiring, Settings, plan};
