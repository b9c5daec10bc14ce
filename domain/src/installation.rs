//! The installation: one operator deployment (a standalone state directory,
//! or one Kubernetes installation with all its replicas). Its id is
//! generated once, kept (in the state database, or in a ConfigMap of the
//! operator's namespace) and written on every instance it creates, so that
//! installations sharing a KVM host, a GCP project or a cluster never
//! delete each other's instances.

use std::fmt;

/// How an installation id is spelt: 1–63 characters `a-z`, `0-9` and `-`,
/// starting with a letter and not ending with `-` — a valid GCE label value,
/// Kubernetes label value and libvirt metadata text alike.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstallationId(String);

/// An installation id that breaks the spelling rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "installation id {0:?} is invalid: use 1-63 characters a-z, 0-9 and '-', starting with a letter and not ending with '-'"
)]
pub struct InvalidInstallationId(pub String);

/// Characters of a generated id after its `i` (80 random bits in base32).
const GENERATED_CHARS: usize = 16;

impl InstallationId {
    /// A new random id: `i` + 16 lowercase base32 characters.
    pub fn generate() -> Self {
        let random = uuid::Uuid::new_v4();
        let encoded = data_encoding::BASE32_NOPAD
            .encode(random.as_bytes())
            .to_ascii_lowercase();
        Self(format!("i{}", &encoded[..GENERATED_CHARS]))
    }

    pub fn parse(text: &str) -> Result<Self, InvalidInstallationId> {
        let valid = (1..=63).contains(&text.len())
            && text.starts_with(|c: char| c.is_ascii_lowercase())
            && !text.ends_with('-')
            && text
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidInstallationId(text.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstallationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for InstallationId {
    type Err = InvalidInstallationId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let a = InstallationId::generate();
        assert_eq!(InstallationId::parse(a.as_str()), Ok(a.clone()));
        assert_eq!(a.as_str().len(), 1 + GENERATED_CHARS);
        assert_ne!(a, InstallationId::generate());
    }

    #[test]
    fn the_spelling_rule_is_enforced() {
        for good in ["a", "prod-eu-1", "i2x7"] {
            assert!(InstallationId::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "Prod", "1abc", "a_b", "a-", &"a".repeat(64), "a b"] {
            assert!(InstallationId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
