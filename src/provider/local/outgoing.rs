//! Which outgoing address a new instance gets: the first of
//! `outgoingAddresses` that no instance of this provider holds — running,
//! stopped or released, since a released proxy keeps running with its
//! address. Only the instance records say which are held, so picking and
//! writing the record happen under one lock (see `LocalProvider::create`).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use crate::config::OutgoingNetwork;

use super::record;

/// Why no address could be given.
#[derive(Debug, thiserror::Error)]
pub enum OutgoingError {
    #[error(
        "every address of outgoingAddresses is held by another instance ({held} instance(s) hold one): add addresses or delete a proxy"
    )]
    Exhausted { held: usize },
    #[error(
        "outgoing address {address} cannot be bound ({source}): outgoingAddresses must list addresses of this machine"
    )]
    NotLocal {
        address: IpAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the instances in {dir}: {source}")]
    Read {
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

/// The address for a new instance under `instances_dir`, checked to be one
/// this machine can connect from; `None` when none are configured.
pub fn pick(networks: &[OutgoingNetwork], instances_dir: &Path) -> Result<Option<IpAddr>, OutgoingError> {
    if networks.is_empty() {
        return Ok(None);
    }
    let held = held(instances_dir)?;
    let address = networks
        .iter()
        .flat_map(OutgoingNetwork::addresses)
        .find(|a| !held.contains(a))
        .ok_or(OutgoingError::Exhausted { held: held.len() })?;
    // Binding is what the proxy does before each connection: fail the
    // create now, in words, rather than every fetch later.
    std::net::TcpListener::bind(SocketAddr::new(address, 0))
        .map_err(|source| OutgoingError::NotLocal { address, source })?;
    Ok(Some(address))
}

/// Outgoing addresses named by the instance records under `instances_dir`.
fn held(instances_dir: &Path) -> Result<HashSet<IpAddr>, OutgoingError> {
    let entries = std::fs::read_dir(instances_dir).map_err(|source| OutgoingError::Read {
        dir: instances_dir.display().to_string(),
        source,
    })?;
    Ok(entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| record::read(&e.path()).ok().flatten()?.outgoing_address)
        .collect())
}
