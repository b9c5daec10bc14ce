//! The replicas of one installation, as members: each has a tag, and the
//! work that is split between them (which replica probes which proxy) is
//! assigned by rendezvous ranking over the live members. The ranking
//! depends only on names, so every replica that sees the same members
//! computes the same assignment, and a member that leaves or joins moves
//! only the proxies it ranks first for.

mod feed;
mod liveness;
mod probe_plan;

use std::fmt;

use sha2::{Digest, Sha256};

use crate::rendezvous::{proxy_digest, rank};
use crate::resource::ObjectKey;

pub use feed::{Feed, Since};
pub use liveness::{Decision, Liveness, holder_of};
pub use probe_plan::{ProbeOrder, ProbePlan};

/// A replica's name among the members: 8 hex digits derived from its pod
/// and its incarnation (random per process start), so a restarted pod is
/// a new member and nothing it held before is taken to be held still.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberTag(String);

impl MemberTag {
    /// The tag of `pod`'s process started with `incarnation` (random bytes
    /// the caller draws).
    pub fn of(pod: &str, incarnation: &[u8; 8]) -> MemberTag {
        let mut hash = Sha256::new();
        hash.update(pod.as_bytes());
        hash.update([0]);
        hash.update(incarnation);
        MemberTag(hex::encode(&hash.finalize()[..4]))
    }

    /// A tag as written in a Lease name or a lease id; `None` unless it is
    /// 8 lowercase hex digits.
    pub fn parse(text: &str) -> Option<MemberTag> {
        let valid = text.len() == 8
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| MemberTag(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The digest rendezvous ranks this member by (probes, shares).
    pub fn digest(&self) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&Sha256::digest(self.0.as_bytes())[..8]);
        u64::from_be_bytes(first)
    }
}

impl fmt::Display for MemberTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The live member that probes `proxy`: the one ranking highest for it;
/// `None` without live members.
pub fn probe_assignee<'a>(proxy: &ObjectKey, live: &'a [MemberTag]) -> Option<&'a MemberTag> {
    let proxy = proxy_digest(proxy);
    live.iter()
        .max_by_key(|member| (rank(proxy, member.digest()), member.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<MemberTag> {
        (0..n)
            .map(|i| MemberTag::of(&format!("operator-{i}"), &[i as u8; 8]))
            .collect()
    }

    fn proxies(n: usize) -> Vec<ObjectKey> {
        (0..n)
            .map(|i| ObjectKey::new("crawl", format!("ext-{i}")))
            .collect()
    }

    #[test]
    fn a_tag_is_8_hex_digits_of_the_pod_and_its_incarnation() {
        let tag = MemberTag::of("operator-0", &[1; 8]);
        assert_eq!(MemberTag::parse(tag.as_str()), Some(tag.clone()));
        assert_eq!(
            tag,
            MemberTag::of("operator-0", &[1; 8]),
            "the same process, the same tag"
        );
        assert_ne!(
            tag,
            MemberTag::of("operator-0", &[2; 8]),
            "a restart is a new member"
        );
        assert_ne!(tag, MemberTag::of("operator-1", &[1; 8]));
        for bad in ["", "0123456", "012345678", "0123456G", "ABCDEF01", "0123 567"] {
            assert_eq!(MemberTag::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn probes_spread_evenly_over_the_live_members() {
        let live = members(3);
        let fleet = proxies(3_000);
        for member in &live {
            let share = fleet
                .iter()
                .filter(|p| probe_assignee(p, &live) == Some(member))
                .count();
            assert!((900..=1_100).contains(&share), "{member}: {share} of 3000");
        }
    }

    #[test]
    fn a_member_that_leaves_hands_on_only_its_own_proxies() {
        let live = members(3);
        let fleet = proxies(3_000);
        let before: Vec<MemberTag> = fleet
            .iter()
            .map(|p| probe_assignee(p, &live).unwrap().clone())
            .collect();
        let gone = &live[1];
        let rest: Vec<MemberTag> = live.iter().filter(|m| *m != gone).cloned().collect();
        let mut moved = 0;
        for (proxy, was) in fleet.iter().zip(&before) {
            let now = probe_assignee(proxy, &rest).unwrap();
            if was == gone {
                moved += 1;
                assert_ne!(now, gone);
            } else {
                assert_eq!(now, was, "{proxy} moved though its member stayed");
            }
        }
        assert!(moved > 0);
    }

    #[test]
    fn every_replica_computes_the_same_assignment_in_any_order() {
        let live = members(3);
        let mut shuffled = live.clone();
        shuffled.reverse();
        for proxy in proxies(500) {
            assert_eq!(probe_assignee(&proxy, &live), probe_assignee(&proxy, &shuffled));
        }
        assert_eq!(probe_assignee(&ObjectKey::new("crawl", "p"), &[]), None);
    }
}
