//! Replicas talking to each other and to the cluster when every replica
//! serves: each replica is a member with a Lease of its own
//! ([`members`]), members sync with the leader over an internal HTTP
//! listener ([`wire`] is what they say, [`client`] how a member says it,
//! [`token`] how they know each other). No actix here: the actors host
//! these parts.

pub mod client;
pub mod desk;
mod error;
pub mod fleet_state;
pub mod link;
pub mod members;
pub mod routes;
pub mod token;
pub mod wire;

pub use error::ReplicaError;
