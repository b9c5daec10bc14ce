//! The adapters of the object-store port (`crate::domain::resource_store`): the Kubernetes
//! API server and the embedded store of standalone mode, each with where it
//! keeps leases, credentials and the installation id; and the ports fenced
//! by the leader's tenure.

mod checkpoint_shard;
pub mod configmap_lease_journal;
pub mod crawler_tokens;
pub mod credentials_file;
pub mod credentials_secret;
pub mod embedded;
mod fenced;
pub mod installation;
pub mod journal_adoption;
pub mod kubernetes;

pub use fenced::{FencedPools, FencedStore};
