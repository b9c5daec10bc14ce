//! The adapters: everything that talks to the world on the domain's
//! behalf — the providers (Kubernetes pods, Compute Engine, libvirt over
//! SSH, local processes), the stores (the Kubernetes API, SQLite) with
//! their lease journals, the lease store every lease is taken at, the
//! Kubernetes client and leader election (with the thread its Leases are
//! kept on), the health probe's network side, the proxies the operator
//! serves (the built-in forward proxy and the gateway) with their guarded
//! listeners, and what its users speak to it (the command line, the
//! discovery API's contract). A new way to reach the world goes here.

pub mod checked_connect;
pub mod clock;
pub mod command_line;
pub mod config_files;
pub mod discovery_api;
pub mod forward_proxy;
pub mod gateway;
pub mod guarded_listener;
pub mod kube_client;
pub mod leader;
pub mod lease_keeper;
pub mod lease_store;
pub mod name_resolver;
pub mod probe;
pub mod providers;
pub mod random;
pub mod replicas;
pub mod stores;
