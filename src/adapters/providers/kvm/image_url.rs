//! An image URL named directly in `placement.image` (allowed only with
//! `kvm.allowImageUrls`). It must carry the sha256 of the bytes to boot, in
//! the URL's fragment as pip's hash-checking URLs do
//! (`https://host/disk.qcow2#sha256=<64 hex>`); the fragment is never sent to
//! the server. `format=raw|qcow2` (default qcow2) and `firmware=uefi|bios`
//! (default uefi) may follow, joined by `&`.

use super::image::ImageSpec;
use crate::domain::config::{Firmware, ImageFormat, is_sha256_hex};

/// Why `placement.image` is not an acceptable image URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageUrlError {
    #[error("placement.image {url:?} is not an http(s) URL: {reason}")]
    NotHttp { url: String, reason: String },
    #[error(
        "placement.image {url:?} has no sha256: an image URL must name the digest of the bytes \
         to boot in its fragment, e.g. {url}#sha256=<64 hex digits>"
    )]
    MissingSha256 { url: String },
    #[error("placement.image {url:?}: sha256 {value:?} must be 64 hexadecimal characters")]
    BadSha256 { url: String, value: String },
    #[error("placement.image {url:?}: format {value:?} must be qcow2 or raw")]
    BadFormat { url: String, value: String },
    #[error("placement.image {url:?}: firmware {value:?} must be uefi or bios")]
    BadFirmware { url: String, value: String },
    #[error("placement.image {url:?}: unknown fragment parameter {key:?} (known: sha256, format, firmware)")]
    UnknownParameter { url: String, key: String },
}

/// Whether `placement.image` is meant as a URL rather than an image key.
pub fn looks_like_url(image: &str) -> bool {
    image.contains("://")
}

/// The image a `placement.image` URL names.
pub fn parse(image: &str) -> Result<ImageSpec, ImageUrlError> {
    let not_http = |reason: String| ImageUrlError::NotHttp {
        url: image.to_owned(),
        reason,
    };
    let mut url = url::Url::parse(image).map_err(|e| not_http(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(not_http(
            "only http:// and https:// with a host are fetched".into(),
        ));
    }
    let fragment = url.fragment().unwrap_or_default().to_owned();
    url.set_fragment(None);
    let bare = url.to_string();
    let (mut sha256, mut format, mut firmware) = (None, ImageFormat::Qcow2, Firmware::Uefi);
    for (key, value) in url::form_urlencoded::parse(fragment.as_bytes()) {
        let value = value.into_owned();
        match key.as_ref() {
            "sha256" if is_sha256_hex(&value) => sha256 = Some(value.to_ascii_lowercase()),
            "sha256" => return Err(ImageUrlError::BadSha256 { url: bare, value }),
            "format" => {
                format = match value.as_str() {
                    "qcow2" => ImageFormat::Qcow2,
                    "raw" => ImageFormat::Raw,
                    _ => return Err(ImageUrlError::BadFormat { url: bare, value }),
                }
            }
            "firmware" => {
                firmware = match value.as_str() {
                    "uefi" => Firmware::Uefi,
                    "bios" => Firmware::Bios,
                    _ => return Err(ImageUrlError::BadFirmware { url: bare, value }),
                }
            }
            other => {
                return Err(ImageUrlError::UnknownParameter {
                    url: bare,
                    key: other.to_owned(),
                });
            }
        }
    }
    let sha256 = sha256.ok_or_else(|| ImageUrlError::MissingSha256 { url: bare.clone() })?;
    Ok(ImageSpec {
        url: bare,
        sha256: Some(sha256),
        format: Some(format),
        firmware,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_url_with_its_digest_names_the_bytes_to_boot() {
        let spec = parse(&format!(
            "https://images.example/disk.qcow2?v=2#sha256={}",
            D.to_uppercase()
        ))
        .unwrap();
        assert_eq!(
            spec,
            ImageSpec {
                url: "https://images.example/disk.qcow2?v=2".into(),
                sha256: Some(D.into()),
                format: Some(ImageFormat::Qcow2),
                firmware: Firmware::Uefi,
            },
            "the fragment is not part of what is fetched; digests are lowercased"
        );
        let raw = parse(&format!(
            "http://10.0.0.9/disk.img#sha256={D}&format=raw&firmware=bios"
        ))
        .unwrap();
        assert_eq!(
            (raw.format, raw.firmware),
            (Some(ImageFormat::Raw), Firmware::Bios)
        );
    }

    #[test]
    fn a_url_without_a_digest_is_refused_saying_how_to_give_one() {
        let err = parse("https://images.example/latest.qcow2").unwrap_err();
        assert_eq!(
            err,
            ImageUrlError::MissingSha256 {
                url: "https://images.example/latest.qcow2".into()
            }
        );
        assert!(err.to_string().contains("#sha256=<64 hex digits>"), "{err}");
        let only_format = parse("https://images.example/d.img#format=raw").unwrap_err();
        assert!(matches!(only_format, ImageUrlError::MissingSha256 { .. }));
    }

    #[test]
    fn every_bad_part_is_named() {
        let bad = |text: &str| parse(text).unwrap_err().to_string();
        assert!(bad("ftp://h/x.qcow2#sha256=00").contains("not an http(s) URL"));
        assert!(bad("http://").contains("not an http(s) URL"));
        assert!(bad("http://h/x#sha256=abc").contains("sha256 \"abc\" must be 64 hexadecimal"));
        assert!(bad(&format!("http://h/x#sha256={D}&format=vmdk")).contains("format \"vmdk\""));
        assert!(bad(&format!("http://h/x#sha256={D}&firmware=coreboot")).contains("firmware \"coreboot\""));
        assert!(bad(&format!("http://h/x#sha256={D}&md5=1")).contains("unknown fragment parameter \"md5\""));
    }

    #[test]
    fn keys_and_urls_are_told_apart() {
        assert!(looks_like_url("https://h/x"));
        assert!(looks_like_url("file:///etc/passwd"));
        assert!(!looks_like_url("debian-13"));
    }
}
