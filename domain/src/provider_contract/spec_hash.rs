//! The hash of everything whose change replaces a Managed instance.
//!
//! Fields are length-prefixed before hashing so that no two different specs
//! can produce the same byte stream (`("ab", "c")` vs `("a", "bc")`), and an
//! absent field is distinct from an empty one.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::resource::Placement;

/// Hex sha256 stored in the `crawl.example.com/spec-hash` annotation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpecHash(String);

impl SpecHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hash with a credentials rotation mixed in: each new value of the
    /// rotate annotation is a new spec (a new instance with new
    /// credentials); no annotation leaves the hash as it was.
    pub fn rotated(self, rotation: Option<&str>) -> SpecHash {
        let Some(rotation) = rotation else {
            return self;
        };
        let mut hasher = Sha256::new();
        hasher.update(b"spec-hash/rotation/v1");
        field(&mut hasher, Some(self.0.as_bytes()));
        field(&mut hasher, Some(rotation.as_bytes()));
        SpecHash(hex::encode(hasher.finalize()))
    }

    /// Wraps a value read back from an annotation.
    pub fn from_annotation(value: &str) -> Self {
        SpecHash(value.to_owned())
    }
}

impl fmt::Display for SpecHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Version tag mixed into the hash; bump it only together with a migration,
/// since a new value replaces every running instance.
const SCHEME: &[u8] = b"spec-hash/v1";

/// Hash of provider, placement, port and the resolved cloud-init bytes.
pub fn spec_hash(provider: &str, placement: &Placement, port: u16, cloud_init: Option<&[u8]>) -> SpecHash {
    let mut hasher = Sha256::new();
    hasher.update(SCHEME);
    field(&mut hasher, Some(provider.as_bytes()));
    for part in [
        &placement.region,
        &placement.zone,
        &placement.machine_type,
        &placement.image,
    ] {
        field(&mut hasher, part.as_deref().map(str::as_bytes));
    }
    field(&mut hasher, Some(&port.to_be_bytes()));
    field(&mut hasher, cloud_init);
    SpecHash(hex::encode(hasher.finalize()))
}

fn field(hasher: &mut Sha256, value: Option<&[u8]>) {
    match value {
        None => hasher.update([0u8]),
        Some(bytes) => {
            hasher.update([1u8]);
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rotation_value_is_a_new_hash_and_none_keeps_it() {
        let base = spec_hash("p", &Placement::default(), 3128, None);
        assert_eq!(base.clone().rotated(None), base);
        let one = base.clone().rotated(Some("1"));
        assert_ne!(one, base);
        assert_ne!(one, base.clone().rotated(Some("2")));
        assert_eq!(one, base.rotated(Some("1")));
    }
    use proptest::prelude::*;

    fn placement(zone: Option<&str>, image: Option<&str>) -> Placement {
        Placement {
            zone: zone.map(Into::into),
            image: image.map(Into::into),
            ..Placement::default()
        }
    }

    #[test]
    fn every_field_matters() {
        let base = spec_hash("kvm", &placement(Some("a"), None), 3128, Some(b"x"));
        assert_ne!(
            base,
            spec_hash("gcp", &placement(Some("a"), None), 3128, Some(b"x"))
        );
        assert_ne!(
            base,
            spec_hash("kvm", &placement(Some("b"), None), 3128, Some(b"x"))
        );
        assert_ne!(
            base,
            spec_hash("kvm", &placement(Some("a"), Some("i")), 3128, Some(b"x"))
        );
        assert_ne!(
            base,
            spec_hash("kvm", &placement(Some("a"), None), 3129, Some(b"x"))
        );
        assert_ne!(
            base,
            spec_hash("kvm", &placement(Some("a"), None), 3128, Some(b"y"))
        );
        assert_ne!(base, spec_hash("kvm", &placement(Some("a"), None), 3128, None));
    }

    #[test]
    fn absent_differs_from_empty_and_fields_do_not_bleed() {
        assert_ne!(
            spec_hash("p", &Placement::default(), 1, None),
            spec_hash("p", &Placement::default(), 1, Some(b""))
        );
        assert_ne!(
            spec_hash("p", &placement(Some("ab"), Some("c")), 1, None),
            spec_hash("p", &placement(Some("a"), Some("bc")), 1, None)
        );
        assert_ne!(
            spec_hash("p", &placement(Some("x"), None), 1, None),
            spec_hash("p", &placement(None, Some("x")), 1, None)
        );
    }

    proptest! {
        #[test]
        fn deterministic(provider in ".{0,20}", zone in proptest::option::of(".{0,20}"), port: u16,
                         ci in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..256))) {
            let p = placement(zone.as_deref(), None);
            let a = spec_hash(&provider, &p, port, ci.as_deref());
            prop_assert_eq!(a.as_str().len(), 64);
            prop_assert_eq!(a, spec_hash(&provider, &p, port, ci.as_deref()));
        }

        #[test]
        fn distinct_cloud_init_distinct_hash(a in proptest::collection::vec(any::<u8>(), 0..128),
                                             b in proptest::collection::vec(any::<u8>(), 0..128)) {
            prop_assume!(a != b);
            let p = Placement::default();
            prop_assert_ne!(spec_hash("p", &p, 3128, Some(&a)), spec_hash("p", &p, 3128, Some(&b)));
        }
    }
}
