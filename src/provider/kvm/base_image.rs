//! Content-addressed base images. A base volume is named by the sha256 of
//! its bytes (`base-<digest>.<format>`), so it is written once and never
//! replaced: a changed URL or digest yields a new base beside the old one,
//! and VMs whose overlays sit on the old one keep running. Around the bases:
//!
//! - the marker `base-<digest>.<format>.sha256`, written last — a base
//!   without it is incomplete;
//! - the pin `base-url-<key>.pin` (`<digest> <format>`) of a URL fetched
//!   without a configured digest: which content that URL gave this host at
//!   its first fetch (a `latest` URL stays pinned per host).
//!
//! [`PoolName`] tells these apart from the instances' overlays and seeds, and
//! from anything else in the pool (which the operator never touches).

use sha2::{Digest, Sha256};

use crate::config::ImageFormat;
use crate::provider::INSTANCE_NAME_PREFIX;

/// The base volume holding bytes with `digest`.
pub fn base_volume(digest: &str, format: ImageFormat) -> String {
    format!("base-{digest}.{}", format.as_str())
}

/// The marker volume of a base volume.
pub fn marker_name(base: &str) -> String {
    format!("{base}.sha256")
}

/// 32 hex characters of the URL's sha256: one pin per URL.
fn url_key(url: &str) -> String {
    hex::encode(Sha256::digest(url.as_bytes()))[..32].to_owned()
}

pub fn pin_name(url: &str) -> String {
    format!("base-url-{}.pin", url_key(url))
}

pub fn pin_content(digest: &str, format: ImageFormat) -> String {
    format!("{digest} {}\n", format.as_str())
}

/// A pin's digest and format; `None` for anything malformed (then the URL is fetched again).
pub fn parse_pin(bytes: &[u8]) -> Option<(String, ImageFormat)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (digest, format) = text.trim().split_once(' ')?;
    let format = match format {
        "qcow2" => ImageFormat::Qcow2,
        "raw" => ImageFormat::Raw,
        _ => return None,
    };
    is_digest(digest).then(|| (digest.to_owned(), format))
}

/// The format an image's first bytes say (`QFI\xfb` is the qcow2 magic).
pub fn detect_format(head: &[u8]) -> ImageFormat {
    if head.starts_with(b"QFI\xfb") {
        ImageFormat::Qcow2
    } else {
        ImageFormat::Raw
    }
}

fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What a volume in the pool is, judged by its name alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolName {
    Base,
    /// The marker of the named base.
    Marker(String),
    Pin,
    /// The overlay disk of the named instance (= domain name).
    Overlay(String),
    /// The seed ISO of the named instance.
    Seed(String),
    /// Not the operator's: never touched.
    Foreign,
}

impl PoolName {
    pub fn of(name: &str) -> PoolName {
        if let Some(base) = name.strip_suffix(".sha256")
            && PoolName::of(base) == PoolName::Base
        {
            return PoolName::Marker(base.to_owned());
        }
        if let Some(rest) = name.strip_prefix("base-url-") {
            return match rest.split_once('.') {
                Some((key, "pin")) if is_url_key(key) => PoolName::Pin,
                _ => PoolName::Foreign,
            };
        }
        if let Some(rest) = name.strip_prefix("base-")
            && let Some((digest, format)) = rest.split_once('.')
            && is_digest(digest)
            && matches!(format, "qcow2" | "raw")
        {
            return PoolName::Base;
        }
        if let Some(instance) = name.strip_suffix("-seed.iso")
            && is_instance(instance)
        {
            return PoolName::Seed(instance.to_owned());
        }
        if let Some(instance) = name.strip_suffix(".qcow2")
            && is_instance(instance)
        {
            return PoolName::Overlay(instance.to_owned());
        }
        PoolName::Foreign
    }
}

fn is_url_key(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `proxy-` + 16 lowercase base32 characters (see `provider::instance_name`).
fn is_instance(s: &str) -> bool {
    s.strip_prefix(INSTANCE_NAME_PREFIX).is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::instance_name;

    const D: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn names_are_classified_and_foreign_volumes_left_alone() {
        let instance = instance_name("0b5f2a64-8a4c-4d4e-9d1e-3f9c5b7a1234").to_string();
        let base = base_volume(D, ImageFormat::Qcow2);
        let url = "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2";
        let cases = [
            (base.clone(), PoolName::Base),
            (base_volume(D, ImageFormat::Raw), PoolName::Base),
            (marker_name(&base), PoolName::Marker(base.clone())),
            (pin_name(url), PoolName::Pin),
            (format!("{instance}.qcow2"), PoolName::Overlay(instance.clone())),
            (format!("{instance}-seed.iso"), PoolName::Seed(instance.clone())),
            // The earlier naming by image key, users' own volumes, look-alikes.
            ("base-debian-13.qcow2".into(), PoolName::Foreign),
            ("base-debian-13.qcow2.sha256".into(), PoolName::Foreign),
            (format!("base-{}.qcow2", &D[..63]), PoolName::Foreign),
            (format!("base-{D}.vmdk"), PoolName::Foreign),
            ("base-url-abc.pin".into(), PoolName::Foreign),
            ("proxy-ABCDEFGHIJKLMNOP.qcow2".into(), PoolName::Foreign),
            ("proxy-short.qcow2".into(), PoolName::Foreign),
            ("windows-server.qcow2".into(), PoolName::Foreign),
            ("seed.iso".into(), PoolName::Foreign),
        ];
        for (name, want) in cases {
            assert_eq!(PoolName::of(&name), want, "{name}");
        }
    }

    #[test]
    fn pins_round_trip_and_reject_garbage() {
        assert_eq!(
            parse_pin(pin_content(D, ImageFormat::Raw).as_bytes()),
            Some((D.to_owned(), ImageFormat::Raw))
        );
        for bad in [&b""[..], b"nonsense", b"abc qcow2", &[0xff, 0xfe], b"9f86 qcow2"] {
            assert_eq!(parse_pin(bad), None);
        }
        let upper = format!("{} qcow2", D.to_uppercase());
        assert_eq!(parse_pin(upper.as_bytes()), None, "digests are lowercase hex");
    }

    #[test]
    fn a_different_url_is_a_different_pin() {
        assert_ne!(pin_name("http://a/img"), pin_name("http://a/img2"));
        assert_eq!(pin_name("http://a/img").len(), "base-url-.pin".len() + 32);
    }

    #[test]
    fn format_comes_from_the_magic_bytes() {
        assert_eq!(detect_format(b"QFI\xfb\0\0\0\x03"), ImageFormat::Qcow2);
        assert_eq!(detect_format(b"\xebc\x90"), ImageFormat::Raw);
        assert_eq!(detect_format(b""), ImageFormat::Raw);
    }
}
