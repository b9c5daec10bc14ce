//! Where a sticky session goes when it has no proxy of its own yet, or
//! loses it: the eligible proxy that ranks highest for the session
//! (rendezvous, or highest-random-weight, hashing). The ranking depends
//! only on the session's and the proxies' names, so every process that
//! sees the same fleet sends a session to the same proxy — after an
//! operator restart or a leader change as before it — and a proxy that
//! leaves or joins moves only the sessions it ranks first for.

use sha2::{Digest, Sha256};

use crate::resource::ObjectKey;

/// A stable 64-bit digest of `parts` (the first 8 bytes of their SHA-256,
/// each part followed by a zero byte so that `("ab", "c")` and `("a",
/// "bc")` differ).
fn digest(parts: &[&str]) -> u64 {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.finalize()[..8]);
    u64::from_be_bytes(first)
}

/// A session's digest: its client's name (empty without one) and its id.
pub fn session_digest(client: &str, id: &str) -> u64 {
    digest(&[client, id])
}

/// A proxy's digest, computed once when the book first sees it.
pub fn proxy_digest(proxy: &ObjectKey) -> u64 {
    digest(&[&proxy.namespace, &proxy.name])
}

/// How highly `proxy` ranks for `session`: the session goes to the
/// eligible proxy with the highest rank. SplitMix64's finalizer over both
/// digests: cheap enough to rank a fleet of thousands per new session, and
/// well mixed, so sessions spread evenly over the proxies.
pub fn rank(session: u64, proxy: u64) -> u64 {
    let mut z = session ^ proxy.rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_choice(session: u64, proxies: &[ObjectKey]) -> ObjectKey {
        proxies
            .iter()
            .max_by_key(|p| rank(session, proxy_digest(p)))
            .unwrap()
            .clone()
    }

    #[test]
    fn sessions_spread_evenly_and_a_leaving_proxy_moves_only_its_own() {
        let proxies: Vec<ObjectKey> = (0..8).map(|i| ObjectKey::new("crawl", format!("p{i}"))).collect();
        let sessions: Vec<u64> = (0..8_000)
            .map(|i| session_digest("spider", &format!("s{i}")))
            .collect();
        let before: Vec<ObjectKey> = sessions.iter().map(|s| first_choice(*s, &proxies)).collect();
        for proxy in &proxies {
            let count = before.iter().filter(|p| *p == proxy).count();
            assert!((850..=1150).contains(&count), "{proxy}: {count} of 8000 sessions");
        }
        let gone = &proxies[3];
        let rest: Vec<ObjectKey> = proxies.iter().filter(|p| *p != gone).cloned().collect();
        for (session, was) in sessions.iter().zip(&before) {
            let now = first_choice(*session, &rest);
            if was != gone {
                assert_eq!(&now, was, "only the leaving proxy's sessions move");
            }
        }
    }

    #[test]
    fn digests_keep_their_parts_apart() {
        assert_ne!(session_digest("ab", "c"), session_digest("a", "bc"));
        assert_ne!(session_digest("", "s1"), session_digest("", "s2"));
        assert_eq!(session_digest("spider", "s1"), session_digest("spider", "s1"));
        assert_ne!(
            proxy_digest(&ObjectKey::new("a", "b")),
            proxy_digest(&ObjectKey::new("b", "a"))
        );
    }
}
