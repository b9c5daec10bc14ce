//! The kvm provider's hosts in the running system.
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
//! - [`image_cache`]: one download per (host, image), shared by its waiters.
//!
//! Each request is a [`HostCall`](egress_proxies::providers::kvm::host_calls::HostCall)
//! answered with its own type: no caller picks its answer out of a sum.

pub mod host_actor;
pub mod image_cache;
pub mod libvirt_thread;
pub mod router;
