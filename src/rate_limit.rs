//! Request rate limits of the discovery API: a token bucket per client
//! address and one for everyone. Pure (the clock is passed in); the HTTP
//! layer answers 429 with the `Retry-After` this returns.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

/// Rates and bursts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimits {
    /// Requests per second one client address may sustain.
    pub per_client: f64,
    /// Requests one client address may send at once after being idle.
    pub per_client_burst: f64,
    /// Requests per second of all clients together.
    pub global: f64,
    pub global_burst: f64,
    /// Client addresses tracked at once. Idle ones (full bucket) are
    /// forgotten to make room, which loses nothing; when every tracked
    /// client is busy, a new one is refused.
    pub max_clients: usize,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            per_client: 1_000.0,
            per_client_burst: 2_000.0,
            global: 20_000.0,
            global_burst: 40_000.0,
            max_clients: 10_000,
        }
    }
}

/// A request over a limit.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{scope}; retry in {}s", retry_after_secs(*retry_after))]
pub struct Limited {
    pub scope: Scope,
    pub retry_after: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Scope {
    #[error("too many requests from this client address")]
    Client,
    #[error("too many requests from all clients together")]
    Global,
    #[error("too many client addresses are busy at once")]
    Clients,
    /// Open dashboard streams of one client address (counted by the server, not here).
    #[error("too many dashboard streams are open from this client address; close one")]
    Streams,
}

/// `Retry-After` in whole seconds, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at = now;
    }

    /// How long until one token is there.
    fn wait(&self, rate: f64) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens) / rate).max(0.0))
    }
}

/// The key a client is counted under: its IPv4 address, or the /64 of its
/// IPv6 address (one host usually owns a whole /64).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// The buckets, per client key (an address by default; the gateway counts
/// its crawlers by client name).
#[derive(Debug)]
pub struct RateLimiter<K = IpAddr> {
    limits: RateLimits,
    global: Bucket,
    clients: HashMap<K, Bucket>,
}

impl RateLimiter<IpAddr> {
    /// Counts one request of `client`, or says how long it must wait.
    pub fn check(&mut self, client: IpAddr, now: Instant) -> Result<(), Limited> {
        self.check_key(client_key(client), now)
    }
}

impl<K: std::hash::Hash + Eq> RateLimiter<K> {
    pub fn new(limits: RateLimits, now: Instant) -> Self {
        Self {
            limits,
            global: Bucket::full(limits.global_burst, now),
            clients: HashMap::new(),
        }
    }

    /// Client addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.clients.len()
    }

    /// Counts one request of the client counted under `key`, or says how
    /// long it must wait.
    pub fn check_key(&mut self, key: K, now: Instant) -> Result<(), Limited> {
        let l = self.limits;
        if !self.clients.contains_key(&key) && self.clients.len() >= l.max_clients {
            self.forget_idle(now)?;
        }
        let bucket = self
            .clients
            .entry(key)
            .or_insert_with(|| Bucket::full(l.per_client_burst, now));
        bucket.refill(l.per_client, l.per_client_burst, now);
        self.global.refill(l.global, l.global_burst, now);
        if bucket.tokens < 1.0 {
            return Err(Limited {
                scope: Scope::Client,
                retry_after: bucket.wait(l.per_client),
            });
        }
        if self.global.tokens < 1.0 {
            return Err(Limited {
                scope: Scope::Global,
                retry_after: self.global.wait(l.global),
            });
        }
        bucket.tokens -= 1.0;
        self.global.tokens -= 1.0;
        Ok(())
    }

    /// Forgets every client whose bucket has refilled (a new bucket would be
    /// the same); refuses when none has.
    fn forget_idle(&mut self, now: Instant) -> Result<(), Limited> {
        let l = self.limits;
        self.clients.retain(|_, b| {
            b.refill(l.per_client, l.per_client_burst, now);
            b.tokens < l.per_client_burst
        });
        if self.clients.len() < l.max_clients {
            return Ok(());
        }
        let soonest = self
            .clients
            .values()
            .map(|b| (l.per_client_burst - b.tokens) / l.per_client)
            .fold(f64::INFINITY, f64::min);
        Err(Limited {
            scope: Scope::Clients,
            retry_after: Duration::from_secs_f64(soonest.clamp(0.0, 3600.0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limits() -> RateLimits {
        RateLimits {
            per_client: 10.0,
            per_client_burst: 5.0,
            global: 100.0,
            global_burst: 8.0,
            max_clients: 2,
        }
    }

    #[test]
    fn a_client_gets_its_burst_then_waits_for_its_rate() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(limits(), t0);
        for _ in 0..5 {
            r.check(ip("10.0.0.1"), t0).unwrap();
        }
        let limited = r.check(ip("10.0.0.1"), t0).unwrap_err();
        assert_eq!(limited.scope, Scope::Client);
        assert_eq!(limited.retry_after, Duration::from_millis(100));
        assert_eq!(retry_after_secs(limited.retry_after), 1);
        assert!(r.check(ip("10.0.0.1"), t0 + Duration::from_millis(100)).is_ok());
        // Another client is not held back by the first.
        assert!(r.check(ip("10.0.0.2"), t0).is_ok());
    }

    #[test]
    fn everyone_together_is_limited_too() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(
            RateLimits {
                max_clients: 100,
                ..limits()
            },
            t0,
        );
        for i in 0..8 {
            r.check(ip(&format!("10.0.0.{i}")), t0).unwrap();
        }
        let limited = r.check(ip("10.0.0.99"), t0).unwrap_err();
        assert_eq!(limited.scope, Scope::Global);
        assert_eq!(limited.retry_after, Duration::from_millis(10));
    }

    #[test]
    fn ipv6_clients_count_per_64_and_mapped_ipv4_as_ipv4() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(
            RateLimits {
                global_burst: 100.0,
                ..limits()
            },
            t0,
        );
        for i in 0..5 {
            r.check(ip(&format!("2001:db8:1:2::{i}")), t0).unwrap();
        }
        assert!(r.check(ip("2001:db8:1:2:ffff::1"), t0).is_err(), "same /64");
        for _ in 0..5 {
            r.check(ip("::ffff:192.0.2.1"), t0).unwrap();
        }
        assert!(r.check(ip("192.0.2.1"), t0).is_err(), "same client");
    }

    #[test]
    fn the_client_table_forgets_only_idle_clients_and_refuses_when_all_are_busy() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(limits(), t0);
        r.check(ip("10.0.0.1"), t0).unwrap();
        r.check(ip("10.0.0.2"), t0).unwrap();
        let limited = r.check(ip("10.0.0.3"), t0).unwrap_err();
        assert_eq!(limited.scope, Scope::Clients);
        assert_eq!(
            limited.retry_after,
            Duration::from_millis(100),
            "one token to refill"
        );
        assert_eq!(r.tracked(), 2);
        // Both refilled: forgotten, the newcomer is counted.
        let later = t0 + Duration::from_millis(100);
        assert!(r.check(ip("10.0.0.3"), later).is_ok());
        assert_eq!(r.tracked(), 1);
    }
}
