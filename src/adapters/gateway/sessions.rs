//! Sticky sessions: which proxy each (client, session id) leaves through,
//! until the session's lifetime ends. Pure: the clock is passed in. Kept in
//! memory: a restart starts every session afresh.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::domain::resource::ObjectKey;

/// A session: the client's name (empty without one) and its id.
pub type SessionKey = (String, String);

struct Session {
    proxy: ObjectKey,
    expires: Instant,
    used: Instant,
}

/// The sessions, at most a configured number (the least recently used go).
pub struct Sessions {
    max: usize,
    entries: HashMap<SessionKey, Session>,
    by_use: BTreeSet<(Instant, SessionKey)>,
}

impl Sessions {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            entries: HashMap::new(),
            by_use: BTreeSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The proxy `key` leaves through, while its lifetime lasts.
    pub fn proxy_of(&mut self, key: &SessionKey, now: Instant) -> Option<ObjectKey> {
        let session = self.entries.get(key)?;
        if session.expires <= now {
            self.forget(key);
            return None;
        }
        Some(session.proxy.clone())
    }

    /// Records that `key` left through `proxy`: a new session lives for
    /// `lifetime`; a known one keeps its end. Returns the proxy the session
    /// moved from, if it moved.
    pub fn left_through(
        &mut self,
        key: &SessionKey,
        proxy: &ObjectKey,
        lifetime: Duration,
        now: Instant,
    ) -> Option<ObjectKey> {
        let known = self
            .entries
            .get(key)
            .filter(|s| s.expires > now)
            .map(|s| s.expires);
        let previous = self.forget(key).filter(|_| known.is_some());
        if self.entries.len() >= self.max
            && let Some((_, oldest)) = self.by_use.first().cloned()
        {
            self.forget(&oldest);
        }
        self.entries.insert(
            key.clone(),
            Session {
                proxy: proxy.clone(),
                expires: known.unwrap_or(now + lifetime),
                used: now,
            },
        );
        self.by_use.insert((now, key.clone()));
        previous.filter(|p| p != proxy)
    }

    fn forget(&mut self, key: &SessionKey) -> Option<ObjectKey> {
        let session = self.entries.remove(key)?;
        self.by_use.remove(&(session.used, key.clone()));
        Some(session.proxy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> SessionKey {
        ("spider".into(), id.into())
    }

    #[test]
    fn a_session_keeps_its_proxy_until_it_moves_or_ends() {
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let (a, b) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"));
        let mut sessions = Sessions::new(10);
        assert_eq!(sessions.proxy_of(&key("s"), t0), None);
        assert_eq!(sessions.left_through(&key("s"), &a, minute, t0), None);
        assert_eq!(sessions.proxy_of(&key("s"), t0), Some(a.clone()));
        assert_eq!(sessions.left_through(&key("s"), &a, minute, t0), None, "stayed");
        let later = t0 + Duration::from_secs(30);
        assert_eq!(
            sessions.left_through(&key("s"), &b, minute, later),
            Some(a.clone()),
            "moved"
        );
        assert_eq!(sessions.proxy_of(&key("s"), later), Some(b.clone()));
        // The lifetime counts from the session's start, not from the move.
        assert_eq!(sessions.proxy_of(&key("s"), t0 + minute), None);
        assert_eq!(
            sessions.left_through(&key("s"), &a, minute, t0 + minute),
            None,
            "a new session"
        );
        assert_eq!(sessions.len(), 1);
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        let p = ObjectKey::new("ns", "p");
        let mut sessions = Sessions::new(2);
        sessions.left_through(&key("1"), &p, hour, t0);
        sessions.left_through(&key("2"), &p, hour, t0 + Duration::from_secs(1));
        sessions.left_through(&key("1"), &p, hour, t0 + Duration::from_secs(2));
        sessions.left_through(&key("3"), &p, hour, t0 + Duration::from_secs(3));
        assert_eq!(sessions.len(), 2);
        assert!(
            sessions.proxy_of(&key("2"), t0).is_none(),
            "2 was the least recently used"
        );
        assert!(sessions.proxy_of(&key("1"), t0).is_some());
    }
}
