//! Proxy pools: a pool's control loop, in the Proxy reconcile's shape.
//! Each turn runs in three steps, and only the middle one is a decision:
//!
//! ```text
//!   observe ──▶ step ──────────▶ execute
//!   (store:     (pure: members    (store, in order: delete, retire,
//!   the pool,   to make, retire,  annotate, create; then the status;
//!   its         delete, annotate; Gone and AlreadyExists absorbed)
//!   members)    the status)
//! ```
//!
//! The running system (one PoolActor per pool) adds the members' lease
//! figures from the lease store, the clock and a random seed, and runs a
//! turn a second.

mod autoscale;
mod execute;
mod members;
mod observe;
mod plan;
mod quarantine;
mod step;
#[cfg(test)]
mod store_tests;

pub use autoscale::{Bounds, Demand, SCALE_DOWN_DELAY, ScaleDownWindow, recommended_replicas};
pub use execute::execute;
pub use members::{
    LeaseFigures, is_member, name_suffixes, new_member, parse_retiring, planned, retiring_value,
    template_hash,
};
pub use observe::{Observed, observe};
pub use plan::{Member, PoolPlan, RetireReason, Retiring, Settings, plan};
pub use quarantine::{ADDRESSES_AVAILABLE, MAX_QUARANTINED, parse_annotation, quarantined_of};
pub use step::{Inputs, PoolMemory, Step, invalid_spec_status, is_retiring, note_creates, step};
