//! The adapters: everything that talks to the world on the domain's
//! behalf — the providers (Kubernetes pods, Compute Engine, libvirt over
//! SSH, local processes), the stores (the Kubernetes API, SQLite) with
//! their lease journals, the lease store every lease is taken at, the
//! Kubernetes client and leader election, the health probe's network side,
//! and the proxies the operator serves (the built-in forward proxy and the
//! gateway) with their guarded listeners. A new way to reach the world
//! goes here.

pub mod forward_proxy;
pub mod gateway;
pub mod guarded_listener;
pub mod kube_client;
pub mod leader;
pub mod lease_store;
pub mod probe;
pub mod providers;
pub mod stores;
