//! The kvm provider's hosts in the running system: everything that runs on
//! a host's link. The provider (`egress_proxies::adapters::providers::kvm`) plans
//! each request as data and reaches this module through one port, its
//! `HostRunner`; from here on only pure pieces of the library are used.
//!
//! ```text
//!  KvmProvider ──HostRunner──► router: LazyKvmHosts → KvmHosts
//!  (src/adapters/providers/kvm)             │ Call<C> (typed)     │ Ensure
//!                                 ▼                     ▼
//!                KvmHostActor (one per host,     ImageCacheActor
//!                each under a Supervisor)        (one fetch per host+image,
//!                  │ owns the SSH link             beside the actor)
//!                  ▼                                    │ LookupBase, LinkUri
//!                libvirt thread: one call at a time ◄───┘
//! ```
//!
//! - [`host_actor`]: one actor per host owns its SSH link and libvirt
//!   thread; a dead link, a transport error or a call past its deadline
//!   restarts only that host's actor.
//! - [`libvirt_thread`]: where the blocking calls run; a call's deadline
//!   counts from when it starts there, not from when it was queued.
//! - [`router`]: the provider's `HostRunner`: typed requests to the host
//!   actors, images through the cache.
//! - [`image_cache`]: one download per (host, image), shared by its waiters;
//!   [`image_fetch`] streams an image into the pool.
//! - [`ssh_link`], [`redial`]: the SSH link carrying libvirt's protocol, and
//!   when to dial it again.
//! - [`session`]: the blocking libvirt calls on one host; [`host_calls`]
//!   the requests it serves, run through [`domain_ops`] and [`pool_sweep`].
//!
//! Each request is a [`HostCall`](host_calls::HostCall)
//! answered with its own type: no caller picks its answer out of a sum.

pub mod domain_ops;
pub mod host_actor;
pub mod host_calls;
pub mod image_cache;
pub mod image_fetch;
pub mod libvirt_thread;
pub mod pool_sweep;
pub mod redial;
pub mod router;
pub mod session;
pub mod ssh_link;
