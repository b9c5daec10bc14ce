//! One entry of a provider's `destinations.allow` or `destinations.deny`: a
//! network (CIDR or single address) or a port (or port range).

use std::fmt;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A network or a range of ports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DestinationEntry {
    /// `10.0.0.0/8`, `fd00::/8`, or one address (`10.1.2.3` is `10.1.2.3/32`).
    Network(IpNet),
    /// `8443` or `8000-8099`.
    Ports(RangeInclusive<u16>),
}

/// Why a destination entry was not understood.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationEntryError {
    #[error(
        "{0:?} is not a destination: expected a CIDR (10.0.0.0/8, fd00::/8), an IP address, a port (8443) or a port range (8000-8099)"
    )]
    Unrecognised(String),
    #[error("{0:?} is not a CIDR: expected a network such as 10.96.0.0/12 or fd00::/8")]
    NotCidr(String),
    #[error("{given:?} has host bits set: did you mean {network}?")]
    HostBits { given: String, network: IpNet },
    #[error("{0:?}: ports are 1-65535")]
    PortOutOfRange(String),
    #[error("{0:?}: a port range runs from the lower port to the higher")]
    EmptyRange(String),
}

/// A network written as a CIDR with its host bits zero (`10.96.0.0/12`).
pub fn parse_cidr(text: &str) -> Result<IpNet, DestinationEntryError> {
    let text = text.trim();
    let network: IpNet = text
        .parse()
        .map_err(|_| DestinationEntryError::NotCidr(text.to_owned()))?;
    // `10.0.0.1/8` is almost always a typo for `10.0.0.0/8` (or `/32`).
    if network.trunc() != network {
        return Err(DestinationEntryError::HostBits {
            given: text.to_owned(),
            network: network.trunc(),
        });
    }
    Ok(network)
}

impl FromStr for DestinationEntry {
    type Err = DestinationEntryError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.contains('/') {
            return match parse_cidr(text) {
                Err(DestinationEntryError::NotCidr(_)) => {
                    Err(DestinationEntryError::Unrecognised(text.to_owned()))
                }
                other => other.map(Self::Network),
            };
        }
        if let Ok(address) = text.parse::<IpAddr>() {
            return Ok(Self::Network(IpNet::from(address)));
        }
        let is_number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let port = |s: &str| match s.parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(DestinationEntryError::PortOutOfRange(text.to_owned())),
        };
        if is_number(text) {
            let p = port(text)?;
            return Ok(Self::Ports(p..=p));
        }
        if let Some((low, high)) = text.split_once('-')
            && is_number(low)
            && is_number(high)
        {
            let (low, high) = (port(low)?, port(high)?);
            if low > high {
                return Err(DestinationEntryError::EmptyRange(text.to_owned()));
            }
            return Ok(Self::Ports(low..=high));
        }
        Err(DestinationEntryError::Unrecognised(text.to_owned()))
    }
}

impl fmt::Display for DestinationEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Network(net) => write!(f, "{net}"),
            Self::Ports(range) if range.start() == range.end() => write!(f, "{}", range.start()),
            Self::Ports(range) => write!(f, "{}-{}", range.start(), range.end()),
        }
    }
}

impl Serialize for DestinationEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Ports(range) if range.start() == range.end() => serializer.serialize_u16(*range.start()),
            other => serializer.collect_str(other),
        }
    }
}

/// YAML writes a port as a number (`8443`) and everything else as a string.
impl<'de> Deserialize<'de> for DestinationEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(i64),
            Text(String),
        }
        let text = match Written::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom(
                "a destination is a string (CIDR, IP address or port range) or a port number",
            )
        })? {
            Written::Number(n) => n.to_string(),
            Written::Text(t) => t,
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<DestinationEntry, DestinationEntryError> {
        s.parse()
    }

    #[test]
    fn networks_addresses_and_ports_parse() {
        assert_eq!(
            parse("10.0.0.0/8").unwrap(),
            DestinationEntry::Network("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            parse("fd00::1").unwrap(),
            DestinationEntry::Network("fd00::1/128".parse().unwrap())
        );
        assert_eq!(parse("8443").unwrap(), DestinationEntry::Ports(8443..=8443));
        assert_eq!(parse("8000-8099").unwrap(), DestinationEntry::Ports(8000..=8099));
        assert_eq!(parse("8000-8099").unwrap().to_string(), "8000-8099");
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        assert_eq!(
            parse("10.0.0.1/8").unwrap_err().to_string(),
            "\"10.0.0.1/8\" has host bits set: did you mean 10.0.0.0/8?"
        );
        assert!(matches!(
            parse("10.0.0.0/33"),
            Err(DestinationEntryError::Unrecognised(_))
        ));
        assert!(matches!(
            parse("example.com"),
            Err(DestinationEntryError::Unrecognised(_))
        ));
        assert!(matches!(
            parse("0"),
            Err(DestinationEntryError::PortOutOfRange(_))
        ));
        assert!(matches!(
            parse("70000"),
            Err(DestinationEntryError::PortOutOfRange(_))
        ));
        assert!(matches!(parse("9-8"), Err(DestinationEntryError::EmptyRange(_))));
    }

    #[test]
    fn entries_read_back_as_written() {
        let rules: crate::destinations::DestinationRules =
            serde_json::from_str(r#"{"allow": ["127.0.0.0/8", 8443, "9000-9009", "fd00::1"]}"#).unwrap();
        let written = serde_json::to_string(&rules).unwrap();
        assert_eq!(
            written,
            r#"{"allow":["127.0.0.0/8",8443,"9000-9009","fd00::1/128"]}"#
        );
        assert_eq!(
            serde_json::from_str::<crate::destinations::DestinationRules>(&written).unwrap(),
            rules
        );
    }
}
