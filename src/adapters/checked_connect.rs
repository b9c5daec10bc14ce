//! Connecting to a destination only after checking it: the name is resolved
//! once, every address is checked, and the connection goes to a checked
//! address, so a DNS answer cannot change between the check and the
//! connect. A proxy connects to the allowed addresses of a name only; the
//! gateway, which lets the leased proxy resolve a plain request's name
//! again, refuses a name when any of its addresses is refused.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

use crate::domain::destinations::{DestinationPolicy, Refusal};

/// Why no connection to a destination was made.
#[derive(Debug, thiserror::Error)]
pub enum CheckedConnectError {
    #[error("{host}:{port} is refused: {}{refusal}", resolved_to(host, *address))]
    Refused {
        host: String,
        port: u16,
        /// The refused address (the host itself, or one it resolves to).
        address: IpAddr,
        refusal: Refusal,
    },
    #[error("resolving {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("{host} has no address")]
    NoAddress { host: String },
    #[error("connecting to {address}: {source}")]
    Connect {
        address: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {host}:{port} timed out")]
    TimedOut { host: String, port: u16 },
}

/// "it resolves to X: " when the host is a name, nothing when it is the address.
fn resolved_to(host: &str, address: IpAddr) -> String {
    match host.parse::<IpAddr>() {
        Ok(literal) if literal.to_canonical() == address.to_canonical() => String::new(),
        _ => format!("it resolves to {address}: "),
    }
}

/// Connects to `host:port` (`host` a name or an address, IPv6 with or
/// without brackets) at one of its addresses the policy allows, never at
/// another; `tunnel` for `CONNECT`. When every address is refused, the
/// first refusal is returned.
pub async fn connect_checked(
    policy: &DestinationPolicy,
    host: &str,
    port: u16,
    tunnel: bool,
    timeout: Duration,
) -> Result<TcpStream, CheckedConnectError> {
    connect_checked_from(policy, host, port, tunnel, timeout, None).await
}

/// [`connect_checked`] from the source address `from` (a local proxy's
/// outgoing address) for destinations of its IP family; destinations of
/// the other family are reached from the address the kernel picks, as
/// Squid's `tcp_outgoing_address` does.
pub async fn connect_checked_from(
    policy: &DestinationPolicy,
    host: &str,
    port: u16,
    tunnel: bool,
    timeout: Duration,
    from: Option<IpAddr>,
) -> Result<TcpStream, CheckedConnectError> {
    let host = bare(host);
    let attempt = async {
        let mut refused = None;
        let mut last_error = None;
        for address in resolve(host, port).await? {
            if let Err(refusal) = policy.check(address.ip(), port, tunnel) {
                refused.get_or_insert_with(|| refused_at(host, address, refusal));
                continue;
            }
            match connect(address, from).await {
                Ok(stream) => return Ok(stream),
                Err(source) => last_error = Some(CheckedConnectError::Connect { address, source }),
            }
        }
        Err(last_error
            .or(refused)
            .unwrap_or_else(|| CheckedConnectError::NoAddress {
                host: host.to_owned(),
            }))
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| timed_out(host, port))?
}

/// The addresses of `host:port`, resolved once, when every one passes the
/// policy (the gateway asks before it takes a lease, and sends a tunnel to
/// one of them; the leased proxy checks again when it connects). Never
/// empty.
pub async fn check_destination(
    policy: &DestinationPolicy,
    host: &str,
    port: u16,
    tunnel: bool,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, CheckedConnectError> {
    let host = bare(host);
    tokio::time::timeout(timeout, resolve_and_check(policy, host, port, tunnel))
        .await
        .map_err(|_| timed_out(host, port))?
}

/// Resolves `host` once and checks every address: the first refused one
/// refuses the whole name.
async fn resolve_and_check(
    policy: &DestinationPolicy,
    host: &str,
    port: u16,
    tunnel: bool,
) -> Result<Vec<SocketAddr>, CheckedConnectError> {
    let addresses = resolve(host, port).await?;
    every_address_allowed(policy, host, &addresses, tunnel)?;
    Ok(addresses)
}

/// The addresses of `host`, at least one.
async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, CheckedConnectError> {
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| CheckedConnectError::Resolve {
            host: host.to_owned(),
            source,
        })?
        .collect();
    match addresses.is_empty() {
        true => Err(CheckedConnectError::NoAddress {
            host: host.to_owned(),
        }),
        false => Ok(addresses),
    }
}

/// The policy over every address of one name (pure): the first refused
/// address refuses them all.
pub fn every_address_allowed(
    policy: &DestinationPolicy,
    host: &str,
    addresses: &[SocketAddr],
    tunnel: bool,
) -> Result<(), CheckedConnectError> {
    for address in addresses {
        if let Err(refusal) = policy.check(address.ip(), address.port(), tunnel) {
            return Err(refused_at(host, *address, refusal));
        }
    }
    Ok(())
}

fn refused_at(host: &str, address: SocketAddr, refusal: Refusal) -> CheckedConnectError {
    CheckedConnectError::Refused {
        host: host.to_owned(),
        port: address.port(),
        address: address.ip(),
        refusal,
    }
}

fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

fn timed_out(host: &str, port: u16) -> CheckedConnectError {
    CheckedConnectError::TimedOut {
        host: host.to_owned(),
        port,
    }
}

/// Connects to `address`, bound first to `from` when it is of the same family.
async fn connect(address: SocketAddr, from: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(source) = from.filter(|f| f.is_ipv4() == address.is_ipv4()) else {
        return TcpStream::connect(address).await;
    };
    let socket = match source {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(address).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_destination_is_checked_without_connecting() {
        let timeout = Duration::from_secs(5);
        let err = check_destination(&DestinationPolicy::default(), "127.0.0.1", 80, false, timeout)
            .await
            .unwrap_err();
        assert!(matches!(err, CheckedConnectError::Refused { .. }), "{err}");
        let rules: crate::domain::destinations::DestinationRules =
            serde_json::from_str(r#"{"allow":["127.0.0.0/8"]}"#).unwrap();
        let policy = DestinationPolicy::new(&rules, &[]);
        // Nothing listens on port 9: only the rules are asked.
        check_destination(&policy, "localhost", 9, false, timeout)
            .await
            .unwrap();
        let err = check_destination(&policy, "127.0.0.1", 8443, true, timeout)
            .await
            .unwrap_err();
        assert!(
            matches!(err, CheckedConnectError::Refused { .. }),
            "CONNECT only to 443: {err}"
        );
    }

    #[test]
    fn a_name_is_refused_when_any_of_its_addresses_is() {
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 80);
        let rules: crate::domain::destinations::DestinationRules =
            serde_json::from_str(r#"{"allow": ["127.0.0.10"], "deny": ["127.0.0.11"]}"#).unwrap();
        let policy = DestinationPolicy::new(&rules, &[]);
        for (addresses, refused) in [
            (vec![at("127.0.0.10")], None),
            (vec![at("127.0.0.9"), at("127.0.0.10")], Some("127.0.0.9")),
            // Whatever the order the resolver gives.
            (vec![at("127.0.0.10"), at("127.0.0.9")], Some("127.0.0.9")),
            (vec![at("127.0.0.10"), at("127.0.0.11")], Some("127.0.0.11")),
            (vec![at("127.0.0.10"), at("::1")], Some("::1")),
            (
                vec![at("127.0.0.10"), at("::ffff:127.0.0.9")],
                Some("::ffff:127.0.0.9"),
            ),
        ] {
            let got = every_address_allowed(&policy, "multi", &addresses, false);
            match (got, refused) {
                (Ok(()), None) => {}
                (Err(e @ CheckedConnectError::Refused { address, .. }), Some(want)) => {
                    assert_eq!(address.to_string(), want, "{addresses:?}");
                    assert!(
                        e.to_string()
                            .starts_with(&format!("multi:80 is refused: it resolves to {want}: ")),
                        "{e}"
                    );
                }
                (got, want) => panic!("{addresses:?}: {got:?}, expected a refusal of {want:?}"),
            }
        }
        // An address given as the host is not said to resolve to itself.
        let e = every_address_allowed(&policy, "127.0.0.9", &[at("127.0.0.9")], false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "127.0.0.9:80 is refused: 127.0.0.0/8 is denied by default"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_denied_address_is_refused_without_connecting() {
        // Something listens, so only the check stands between it and a connection.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy = DestinationPolicy::default();
        for host in ["localhost", "127.0.0.1"] {
            let err = connect_checked(&policy, host, port, false, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    CheckedConnectError::Refused {
                        refusal: Refusal::DefaultDenied(_),
                        ..
                    }
                ),
                "{host}: {err}"
            );
        }
        let allowed: crate::domain::destinations::DestinationRules =
            serde_json::from_str(r#"{"allow": ["127.0.0.0/8"]}"#).unwrap();
        let policy = DestinationPolicy::new(&allowed, &[]);
        connect_checked(&policy, "127.0.0.1", port, false, Duration::from_secs(5))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_connection_from_an_outgoing_address_arrives_from_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let allowed: crate::domain::destinations::DestinationRules =
            serde_json::from_str(r#"{"allow": ["127.0.0.0/8"]}"#).unwrap();
        let policy = DestinationPolicy::new(&allowed, &[]);
        for from in ["127.0.3.7", "127.0.3.8"] {
            let from: IpAddr = from.parse().unwrap();
            let _stream = connect_checked_from(
                &policy,
                "127.0.0.1",
                port,
                false,
                Duration::from_secs(5),
                Some(from),
            )
            .await
            .unwrap();
            let (_, peer) = listener.accept().await.unwrap();
            assert_eq!(peer.ip(), from);
        }
        // An IPv6 source does not apply to an IPv4 destination.
        let _stream = connect_checked_from(
            &policy,
            "127.0.0.1",
            port,
            false,
            Duration::from_secs(5),
            Some("::1".parse().unwrap()),
        )
        .await
        .unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip().to_string(), "127.0.0.1");
    }
}
