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

use crate::domain::config::ImageFormat;
use crate::domain::provider_contract::INSTANCE_NAME_PREFIX;

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

/// A new base volume for a fetch of `url` without a configured digest: a
/// fresh id per fetch, so a base in use is never written again.
pub fn url_base_volume(url: &str, format: ImageFormat) -> String {
    format!(
        "base-url-{}-{:016x}.{}",
        url_key(url),
        fastrand::u64(..),
        format.as_str()
    )
}

/// The pin of the URL a URL base was fetched from (a fetch under way
/// protects its pin, and with it the base it is writing).
pub fn pin_of_url_base(volume: &str) -> Option<String> {
    let (key, _) = url_base_parts(volume)?;
    Some(format!("base-url-{key}.pin"))
}

/// `base-url-<key>-<id>.<format>` → (key, format).
fn url_base_parts(volume: &str) -> Option<(&str, &str)> {
    let (stem, format) = volume.strip_prefix("base-url-")?.split_once('.')?;
    let (key, id) = stem.split_once('-')?;
    (is_url_key(key) && is_fetch_id(id) && matches!(format, "qcow2" | "raw")).then_some((key, format))
}

/// More than any pin holds (digest, format and a URL base's name: about 140 bytes).
pub const PIN_MAX_BYTES: u64 = 256;

/// What a URL gave this host: the bytes' digest and format, and the base holding them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    pub digest: String,
    pub format: ImageFormat,
    pub volume: String,
}

pub fn pin_content(pinned: &Pinned) -> String {
    format!("{} {} {}\n", pinned.digest, pinned.format.as_str(), pinned.volume)
}

/// A pin's content; `None` for anything malformed, or naming a volume that
/// is not a base (then the URL is fetched again).
pub fn parse_pin(bytes: &[u8]) -> Option<Pinned> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut fields = text.split_whitespace();
    let (digest, format) = (fields.next()?, fields.next()?);
    let format = match format {
        "qcow2" => ImageFormat::Qcow2,
        "raw" => ImageFormat::Raw,
        _ => return None,
    };
    if !is_digest(digest) {
        return None;
    }
    let volume = match fields.next() {
        Some(volume) => volume.to_owned(),
        None => base_volume(digest, format),
    };
    let sound = fields.next().is_none()
        && PoolName::of(&volume) == PoolName::Base
        && volume.ends_with(&format!(".{}", format.as_str()));
    sound.then(|| Pinned {
        digest: digest.to_owned(),
        format,
        volume,
    })
}

/// The format an image's first bytes say (`QFI\xfb` is the qcow2 magic).
pub fn detect_format(head: &[u8]) -> ImageFormat {
    if head.starts_with(b"QFI\xfb") {
        ImageFormat::Qcow2
    } else {
        ImageFormat::Raw
    }
}

/// `len` lowercase hex digits.
fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_digest(s: &str) -> bool {
    is_hex(s, 64)
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
                _ if url_base_parts(name).is_some() => PoolName::Base,
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
    is_hex(s, 32)
}

fn is_fetch_id(s: &str) -> bool {
    is_hex(s, 16)
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
    use crate::domain::provider_contract::instance_name;

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
            (url_base_volume(url, ImageFormat::Qcow2), PoolName::Base),
            (url_base_volume(url, ImageFormat::Raw), PoolName::Base),
            (
                marker_name(&url_base_volume(url, ImageFormat::Raw)),
                PoolName::Marker(String::new()),
            ),
            (format!("{instance}.qcow2"), PoolName::Overlay(instance.clone())),
            (format!("{instance}-seed.iso"), PoolName::Seed(instance.clone())),
            // The earlier naming by image key, users' own volumes, look-alikes.
            ("base-debian-13.qcow2".into(), PoolName::Foreign),
            ("base-debian-13.qcow2.sha256".into(), PoolName::Foreign),
            (format!("base-{}.qcow2", &D[..63]), PoolName::Foreign),
            (format!("base-{D}.vmdk"), PoolName::Foreign),
            ("base-url-abc.pin".into(), PoolName::Foreign),
            (
                format!("base-url-{}-0123456789abcdef.vmdk", "a".repeat(32)),
                PoolName::Foreign,
            ),
            (
                format!("base-url-{}-0123.qcow2", "a".repeat(32)),
                PoolName::Foreign,
            ),
            (format!("base-url-{}.qcow2", "a".repeat(32)), PoolName::Foreign),
            ("proxy-ABCDEFGHIJKLMNOP.qcow2".into(), PoolName::Foreign),
            ("proxy-short.qcow2".into(), PoolName::Foreign),
            ("windows-server.qcow2".into(), PoolName::Foreign),
            ("seed.iso".into(), PoolName::Foreign),
        ];
        for (name, want) in cases {
            match want {
                PoolName::Marker(_) => assert!(
                    matches!(PoolName::of(&name), PoolName::Marker(base) if marker_name(&base) == name),
                    "{name}"
                ),
                want => assert_eq!(PoolName::of(&name), want, "{name}"),
            }
        }
    }

    #[test]
    fn pins_round_trip_and_reject_garbage() {
        let url = "http://images.example/latest.img";
        let pinned = Pinned {
            digest: D.to_owned(),
            format: ImageFormat::Raw,
            volume: url_base_volume(url, ImageFormat::Raw),
        };
        assert_eq!(parse_pin(pin_content(&pinned).as_bytes()), Some(pinned.clone()));
        assert_eq!(pin_of_url_base(&pinned.volume), Some(pin_name(url)));
        assert_eq!(pin_of_url_base(&base_volume(D, ImageFormat::Raw)), None);
        // A pin of an earlier version names the content's base.
        assert_eq!(
            parse_pin(format!("{D} qcow2\n").as_bytes()),
            Some(Pinned {
                digest: D.to_owned(),
                format: ImageFormat::Qcow2,
                volume: base_volume(D, ImageFormat::Qcow2),
            })
        );
        let foreign = format!("{D} raw users-disk.raw");
        let other_format = format!("{D} qcow2 {}", pinned.volume);
        let trailing = format!("{} extra", pin_content(&pinned).trim());
        for bad in [
            &b""[..],
            b"nonsense",
            b"abc qcow2",
            &[0xff, 0xfe],
            b"9f86 qcow2",
            foreign.as_bytes(),
            other_format.as_bytes(),
            trailing.as_bytes(),
        ] {
            assert_eq!(parse_pin(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        let upper = format!("{} qcow2", D.to_uppercase());
        assert_eq!(parse_pin(upper.as_bytes()), None, "digests are lowercase hex");
    }

    #[test]
    fn every_fetch_of_a_url_gets_a_base_of_its_own() {
        let url = "http://images.example/latest.qcow2";
        let (a, b) = (
            url_base_volume(url, ImageFormat::Qcow2),
            url_base_volume(url, ImageFormat::Qcow2),
        );
        assert_ne!(a, b);
        assert_eq!(pin_of_url_base(&a), pin_of_url_base(&b));
        assert_ne!(
            pin_of_url_base(&a),
            pin_of_url_base(&url_base_volume("http://other/", ImageFormat::Qcow2))
        );
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
