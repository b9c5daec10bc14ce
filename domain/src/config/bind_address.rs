//! Listen addresses as operators write them: `:8090`, `0.0.0.0:8090`,
//! `127.0.0.1:8090`, `[::]:8090`, or `0` to disable a listener.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

/// Where a server listens, or that it is switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindAddress {
    Listen(SocketAddr),
    Disabled,
}

/// A bind address that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a bind address (examples: :8090, 127.0.0.1:8090, [::]:8090, or 0 to disable)")]
pub struct BindAddressError(String);

impl FromStr for BindAddress {
    type Err = BindAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "0" {
            return Ok(BindAddress::Disabled);
        }
        if let Some(port) = s.strip_prefix(':') {
            let port = port.parse::<u16>().map_err(|_| BindAddressError(s.to_owned()))?;
            return Ok(BindAddress::Listen(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port,
            )));
        }
        s.parse::<SocketAddr>()
            .map(BindAddress::Listen)
            .map_err(|_| BindAddressError(s.to_owned()))
    }
}

impl fmt::Display for BindAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindAddress::Listen(addr) => write!(f, "{addr}"),
            BindAddress::Disabled => f.write_str("0"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_shapes() {
        assert_eq!(
            ":8090".parse(),
            Ok(BindAddress::Listen("0.0.0.0:8090".parse().unwrap()))
        );
        assert_eq!(
            "127.0.0.1:1".parse(),
            Ok(BindAddress::Listen("127.0.0.1:1".parse().unwrap()))
        );
        assert_eq!(
            "[::]:8080".parse(),
            Ok(BindAddress::Listen("[::]:8080".parse().unwrap()))
        );
        assert_eq!("0".parse(), Ok(BindAddress::Disabled));
        for bad in ["", "8090", ":http", "localhost:80", ":70000"] {
            assert!(bad.parse::<BindAddress>().is_err(), "{bad}");
        }
    }
}
