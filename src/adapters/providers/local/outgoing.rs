//! Which outgoing address a new instance gets: the first of
//! `outgoingAddresses` that no instance of this provider holds — running,
//! stopped or released, since a released proxy keeps running with its
//! address — and that its pool has not quarantined (a member was blocked
//! on it). When every free address is quarantined, the one blocked longest
//! ago (its quarantine ends first): the pool keeps serving, and says so.
//! Only the instance records say which are held, so picking and writing
//! the record happen under one lock (see `LocalProvider::create`).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use jiff::Timestamp;

use crate::domain::config::OutgoingNetwork;
use crate::domain::provider_contract::QuarantinedAddress;

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

/// The address a new instance gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picked {
    pub address: IpAddr,
    /// Set when every free address was quarantined: this one's quarantine
    /// ends then.
    pub quarantined_until: Option<Timestamp>,
}

/// The address for a new instance under `instances_dir`, avoiding
/// `quarantined` ones while another is free, checked to be one this machine
/// can connect from; `None` when none are configured.
pub fn pick(
    networks: &[OutgoingNetwork],
    instances_dir: &Path,
    quarantined: &[QuarantinedAddress],
    now: Timestamp,
) -> Result<Option<Picked>, OutgoingError> {
    if networks.is_empty() {
        return Ok(None);
    }
    let held = held(instances_dir)?;
    let picked =
        choose(networks, &held, quarantined, now).ok_or(OutgoingError::Exhausted { held: held.len() })?;
    let address = picked.address;
    // Binding is what the proxy does before each connection: fail the
    // create now, in words, rather than every fetch later.
    std::net::TcpListener::bind(SocketAddr::new(address, 0))
        .map_err(|source| OutgoingError::NotLocal { address, source })?;
    Ok(Some(picked))
}

/// The first free address of `networks` not quarantined at `now`; else the
/// free quarantined one whose quarantine ends first (blocked longest ago);
/// `None` when every address is held.
fn choose(
    networks: &[OutgoingNetwork],
    held: &HashSet<IpAddr>,
    quarantined: &[QuarantinedAddress],
    now: Timestamp,
) -> Option<Picked> {
    let running: Vec<&QuarantinedAddress> = quarantined.iter().filter(|q| q.until > now).collect();
    let in_quarantine = |a: &IpAddr| running.iter().any(|q| q.address == *a);
    // Lazily: a large network is walked only as far as the first free address.
    if let Some(address) = networks
        .iter()
        .flat_map(OutgoingNetwork::addresses)
        .find(|a| !held.contains(a) && !in_quarantine(a))
    {
        return Some(Picked {
            address,
            quarantined_until: None,
        });
    }
    let ours = |a: &IpAddr| networks.iter().any(|n| n.network().contains(a));
    running
        .iter()
        .filter(|q| ours(&q.address) && !held.contains(&q.address))
        .min_by_key(|q| (q.until, q.address))
        .map(|q| Picked {
            address: q.address,
            quarantined_until: Some(q.until),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn quarantined(address: &str, until: i64) -> QuarantinedAddress {
        QuarantinedAddress {
            address: ip(address),
            until: at(until),
        }
    }

    #[test]
    fn a_quarantined_address_is_given_only_when_no_other_is_free() {
        let networks: Vec<OutgoingNetwork> = vec!["127.0.5.0/29".parse().unwrap()];
        let held: HashSet<IpAddr> = ["127.0.5.1", "127.0.5.3"].map(ip).into();
        let banned = [quarantined("127.0.5.2", 600), quarantined("127.0.5.4", 500)];
        let picked = choose(&networks, &held, &banned, at(0)).unwrap();
        assert_eq!(
            picked,
            Picked {
                address: ip("127.0.5.5"),
                quarantined_until: None
            }
        );
        // Every other address held: the one whose quarantine ends first.
        let all_but_banned: HashSet<IpAddr> = networks[0]
            .addresses()
            .filter(|a| !banned.iter().any(|b| b.address == *a))
            .collect();
        let picked = choose(&networks, &all_but_banned, &banned, at(0)).unwrap();
        assert_eq!(
            picked,
            Picked {
                address: ip("127.0.5.4"),
                quarantined_until: Some(at(500))
            }
        );
        // An ended quarantine is no quarantine.
        let picked = choose(&networks, &held, &banned, at(600)).unwrap();
        assert_eq!(picked.address, ip("127.0.5.2"));
        // Every address held: none.
        let everything: HashSet<IpAddr> = networks[0].addresses().collect();
        assert_eq!(choose(&networks, &everything, &banned, at(0)), None);
    }

    #[test]
    fn addresses_outside_the_list_are_never_given() {
        let networks: Vec<OutgoingNetwork> = vec!["127.0.6.1".parse().unwrap()];
        let held: HashSet<IpAddr> = [ip("127.0.6.1")].into();
        assert_eq!(
            choose(&networks, &held, &[quarantined("127.0.7.1", 9)], at(0)),
            None
        );
    }
}
