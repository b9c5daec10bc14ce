//! Proxy pools: the decisions of a pool's control loop, free of I/O. The
//! running system (one PoolActor per pool) feeds them with the pool's
//! members and lease demand and carries out what they decide.

mod autoscale;
mod members;
mod plan;
mod quarantine;
mod step;

pub use autoscale::{Bounds, Demand, SCALE_DOWN_DELAY, ScaleDownWindow, recommended_replicas};
pub use members::{
    LeaseFigures, is_member, name_suffixes, new_member, parse_retiring, planned, retiring_value,
    template_hash,
};
pub use plan::{Member, Plan, RetireReason, Retiring, Settings, plan};
pub use quarantine::{ADDRESSES_AVAILABLE, MAX_QUARANTINED, parse_annotation, quarantined_of};
pub use step::{Inputs, Memory, Step, invalid_spec_status, is_retiring, note_creates, step};
