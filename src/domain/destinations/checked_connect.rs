//! Connecting to a destination only after checking it: the name is resolved
//! once, every address is checked, and the connection goes to a checked
//! address, so a DNS answer cannot change between the check and the connect.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

use super::{DestinationPolicy, Refusal};

/// Why no connection to a destination was made.
#[derive(Debug, thiserror::Error)]
pub enum CheckedConnectError {
    #[error("{host}:{port} is refused: {refusal}")]
    Refused {
        host: String,
        port: u16,
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

/// Connects to `host:port` (`host` a name or an address, IPv6 with or
/// without brackets) at one of its addresses the policy allows; `tunnel` for
/// `CONNECT`. When every address is refused, the first refusal is returned.
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
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let attempt = async {
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|source| CheckedConnectError::Resolve {
                host: host.to_owned(),
                source,
            })?
            .collect();
        let mut refused = None;
        let mut last_error = None;
        for address in addresses {
            if let Err(refusal) = policy.check(address.ip(), port, tunnel) {
                refused.get_or_insert(refusal);
                continue;
            }
            match connect(address, from).await {
                Ok(stream) => return Ok(stream),
                Err(source) => last_error = Some(CheckedConnectError::Connect { address, source }),
            }
        }
        Err(last_error
            .or(refused.map(|refusal| CheckedConnectError::Refused {
                host: host.to_owned(),
                port,
                refusal,
            }))
            .unwrap_or_else(|| CheckedConnectError::NoAddress {
                host: host.to_owned(),
            }))
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| CheckedConnectError::TimedOut {
            host: host.to_owned(),
            port,
        })?
}

/// Whether `host:port` may be reached at all: its name resolved and at
/// least one address allowed (the gateway asks before it takes a lease;
/// the leased proxy checks again when it connects).
pub async fn check_destination(
    policy: &DestinationPolicy,
    host: &str,
    port: u16,
    tunnel: bool,
    timeout: Duration,
) -> Result<(), CheckedConnectError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let attempt = async {
        let addresses =
            tokio::net::lookup_host((host, port))
                .await
                .map_err(|source| CheckedConnectError::Resolve {
                    host: host.to_owned(),
                    source,
                })?;
        let mut refused = None;
        for address in addresses {
            match policy.check(address.ip(), port, tunnel) {
                Ok(()) => return Ok(()),
                Err(refusal) => {
                    refused.get_or_insert(refusal);
                }
            }
        }
        Err(match refused {
            Some(refusal) => CheckedConnectError::Refused {
                host: host.to_owned(),
                port,
                refusal,
            },
            None => CheckedConnectError::NoAddress {
                host: host.to_owned(),
            },
        })
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| CheckedConnectError::TimedOut {
            host: host.to_owned(),
            port,
        })?
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
        let rules: super::super::DestinationRules =
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
        let allowed: super::super::DestinationRules =
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
        let allowed: super::super::DestinationRules =
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
