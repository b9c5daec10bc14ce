//! Lease ids. A book that is the only one hands out random UUIDs (version
//! 4). A replica serving from a share marks its ids with its member tag, so
//! any replica can tell which one holds a lease (a release, renewal or
//! report goes to the holder): a version 8 (vendor-specific) UUID whose
//! first 8 hex digits are the tag, the rest random.

use std::sync::Arc;

use crate::credentials::{CredentialsError, RandomSource};
use crate::membership::MemberTag;

/// Where a book's lease ids come from: its member tag, if it serves from a
/// share, and the random source (without one: the `uuid` crate's, as
/// before sources were passed in).
#[derive(Clone, Default)]
pub struct LeaseIds {
    pub tag: Option<MemberTag>,
    pub random: Option<Arc<dyn RandomSource>>,
}

impl std::fmt::Debug for LeaseIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseIds")
            .field("tag", &self.tag)
            .field("random", &self.random.as_ref().map(|_| "given"))
            .finish()
    }
}

impl LeaseIds {
    /// A new id.
    pub fn next(&self) -> Result<String, CredentialsError> {
        let mut random = [0u8; 16];
        match &self.random {
            Some(source) => source.fill(&mut random)?,
            None => random = uuid::Uuid::new_v4().into_bytes(),
        }
        Ok(make(self.tag.as_ref(), random))
    }
}

/// A lease id from 16 random bytes, marked with `tag` when given.
pub fn make(tag: Option<&MemberTag>, random: [u8; 16]) -> String {
    let Some(tag) = tag else {
        return uuid::Builder::from_random_bytes(random).into_uuid().to_string();
    };
    let mut bytes = random;
    let mut tag_bytes = [0u8; 4];
    if hex::decode_to_slice(tag.as_str(), &mut tag_bytes).is_ok() {
        bytes[..4].copy_from_slice(&tag_bytes);
    }
    uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
}

/// The member that granted the lease `id`; `None` for an id without one
/// (granted by a book that was the only one, or not a lease id at all).
pub fn tag_of(id: &str) -> Option<MemberTag> {
    let parsed = uuid::Uuid::try_parse(id).ok()?;
    if parsed.get_version_num() != 8 {
        return None;
    }
    MemberTag::parse(&hex::encode(&parsed.as_bytes()[..4]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tagged_id_names_its_member_and_an_untagged_one_none() {
        let tag = MemberTag::of("operator-0", &[3; 8]);
        let random = [0xab; 16];
        let tagged = make(Some(&tag), random);
        assert!(tagged.starts_with(tag.as_str()), "{tagged}");
        assert_eq!(tagged.len(), 36, "UUID-shaped: {tagged}");
        assert_eq!(tag_of(&tagged), Some(tag.clone()));
        assert_ne!(make(Some(&tag), [0xcd; 16]), tagged, "the rest is random");
        // (why, id, member)
        let untagged = make(None, random);
        let rows = [
            (
                "a version 4 id: granted by the only book",
                untagged.as_str(),
                None,
            ),
            ("not a UUID", "lease-1", None),
            ("empty", "", None),
            ("upper case is a UUID still", &tagged.to_uppercase(), Some(tag)),
        ];
        for (why, id, member) in rows {
            assert_eq!(tag_of(id), member, "{why}");
        }
        assert!(
            uuid::Uuid::try_parse(&untagged).is_ok_and(|u| u.get_version_num() == 4),
            "{untagged}"
        );
    }
}
