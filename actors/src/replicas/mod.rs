//! Every replica serves crawlers (Kubernetes mode with
//! `--every-replica-serves`): the actors that tie a replica to the others.

pub mod every_replica;
pub mod member;
pub mod probe_router;
pub mod server;
pub mod view;
