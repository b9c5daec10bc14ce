//! The requests a host's libvirt session serves, each answered with its own
//! type: a caller asking for a domain's state gets `Option<Observed>`, never
//! a sum of every possible answer it would have to pick apart. They run,
//! one at a time, on the host's libvirt thread (a host actor's worker in the
//! running system).

use crate::adapters::providers::kvm::image::{CachedBase, ImageSpec};
use crate::adapters::providers::kvm::ops::{CreatePlan, ManagedDomain, Observed, OpError, Released};
use crate::adapters::providers::kvm::pool_gc::{PoolSweep, SweepPlan};

use super::session::HostSession;
use super::{domain_ops as ops, image_fetch as image, pool_sweep as pool_gc};

/// One request to a host's libvirt session and the type it answers with.
pub trait HostCall: Send + 'static {
    type Output: Send + 'static;
    /// What the call does, for messages about it ("get", "create", …).
    const NAME: &'static str;
    /// Runs the call (blocking: only on the host's libvirt thread).
    fn run(self, session: &HostSession) -> Result<Self::Output, OpError>;
}

/// Creates (or finishes creating) an instance; starts it if it exists stopped.
#[derive(Clone, Debug)]
pub struct CreateDomain(pub Box<CreatePlan>);

impl HostCall for CreateDomain {
    type Output = ();
    const NAME: &'static str = "create";
    fn run(self, session: &HostSession) -> Result<(), OpError> {
        ops::create(session, &self.0)
    }
}

/// A domain's state; `None` when it does not exist.
#[derive(Clone, Debug)]
pub struct GetDomain(pub String);

impl HostCall for GetDomain {
    type Output = Option<Observed>;
    const NAME: &'static str = "get";
    fn run(self, session: &HostSession) -> Result<Option<Observed>, OpError> {
        ops::get(session, &self.0)
    }
}

/// Removes a domain and its volumes (gone already is success).
#[derive(Clone, Debug)]
pub struct DeleteDomain(pub String);

impl HostCall for DeleteDomain {
    type Output = ();
    const NAME: &'static str = "delete";
    fn run(self, session: &HostSession) -> Result<(), OpError> {
        ops::delete(session, &self.0)
    }
}

/// Marks a domain released (skip-cleanup); it keeps running.
#[derive(Clone, Debug)]
pub struct ReleaseDomain(pub String);

impl HostCall for ReleaseDomain {
    type Output = Released;
    const NAME: &'static str = "release";
    fn run(self, session: &HostSession) -> Result<Released, OpError> {
        ops::release(session, &self.0)
    }
}

/// Every domain on the host marked as managed.
#[derive(Clone, Copy, Debug)]
pub struct ListManaged;

impl HostCall for ListManaged {
    type Output = Vec<ManagedDomain>;
    const NAME: &'static str = "list";
    fn run(self, session: &HostSession) -> Result<Vec<ManagedDomain>, OpError> {
        Ok(session.managed_domains()?)
    }
}

/// The complete base of an image in the pool, if there is one.
#[derive(Clone, Debug)]
pub struct LookupBase(pub ImageSpec);

impl HostCall for LookupBase {
    type Output = Option<CachedBase>;
    const NAME: &'static str = "image lookup";
    fn run(self, session: &HostSession) -> Result<Option<CachedBase>, OpError> {
        image::lookup(session, &self.0)
    }
}

/// Inventories the pool and deletes the due leftovers.
#[derive(Clone, Debug)]
pub struct SweepPool(pub SweepPlan);

impl HostCall for SweepPool {
    type Output = PoolSweep;
    const NAME: &'static str = "pool sweep";
    fn run(self, session: &HostSession) -> Result<PoolSweep, OpError> {
        Ok(pool_gc::sweep(session, &self.0)?)
    }
}
