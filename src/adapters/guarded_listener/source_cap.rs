//! How many connections that have not authenticated yet one source may
//! hold open: an address, or for IPv6 its /64 (one host usually holds a
//! whole /64, so counting single IPv6 addresses would cap nothing). A
//! connection stops counting once it has authenticated, and when it closes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// The source a peer address counts against: an IPv4 address (an
/// IPv4-mapped IPv6 one too), or an IPv6 /64.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// The unauthenticated connections of one listener, by source.
#[derive(Debug)]
pub struct SourceCounts {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its source until it authenticates or
/// closes (dropped).
#[derive(Debug)]
pub struct SourceTicket {
    source: IpAddr,
    counts: Arc<SourceCounts>,
}

impl SourceCounts {
    /// At most `max` per source (at least 1).
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            open: Mutex::default(),
        })
    }

    /// Counts a new connection from `peer`; `None` when its source already
    /// holds the most it may.
    pub fn enter(self: &Arc<Self>, peer: IpAddr) -> Option<SourceTicket> {
        let source = source_of(peer);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(source).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(SourceTicket {
            source,
            counts: self.clone(),
        })
    }

    /// Unauthenticated connections `peer`'s source holds now.
    pub fn held_by(&self, peer: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&source_of(peer)).copied().unwrap_or(0)
    }
}

impl Drop for SourceTicket {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                // Sources come and go: the map holds only those with connections open.
                open.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_counts_by_address_and_ipv6_by_its_64() {
        for (peer, source) in [
            ("10.1.2.3", "10.1.2.3"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::"),
            ("2001:db8:1:2::1", "2001:db8:1:2::"),
            ("2001:db8:1:3::1", "2001:db8:1:3::"),
            ("::1", "::"),
        ] {
            assert_eq!(source_of(ip(peer)), ip(source), "{peer}");
        }
    }

    #[test]
    fn a_source_holds_at_most_its_cap_and_gets_room_back_as_connections_leave() {
        let counts = SourceCounts::new(2);
        let a = counts.enter(ip("2001:db8::1")).unwrap();
        let b = counts.enter(ip("2001:db8::2")).unwrap();
        assert!(counts.enter(ip("2001:db8::3")).is_none(), "the same /64 is full");
        assert!(
            counts.enter(ip("2001:db8:0:1::1")).is_some(),
            "another /64 is not"
        );
        let other = counts.enter(ip("10.0.0.1")).unwrap();
        assert_eq!(counts.held_by(ip("2001:db8::ffff")), 2);
        drop(a);
        let c = counts.enter(ip("2001:db8::3")).unwrap();
        drop((b, c, other));
        assert_eq!(counts.held_by(ip("2001:db8::1")), 0);
        assert!(
            counts.open.lock().unwrap().is_empty(),
            "no source is remembered without connections"
        );
    }
}
