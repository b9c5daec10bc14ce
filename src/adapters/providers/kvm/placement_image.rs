//! Which image a Proxy's `placement.image` names: a key of the provider's
//! `images`, or — only with `kvm.allowImageUrls` — an http(s) URL carrying
//! its sha256 ([`super::image_url`]). Whoever may create a Proxy must not be
//! able to make the operator fetch and boot arbitrary bytes.

use super::image::ImageSpec;
use super::image_url;
use crate::domain::config::KvmConfig;

/// The image `placement.image` names on provider `provider`; the error
/// (for the Proxy's status) says what is refused and why.
pub fn resolve(config: &KvmConfig, provider: &str, image: Option<&str>) -> Result<ImageSpec, String> {
    let known = || {
        let keys: Vec<&str> = config.images.keys().map(String::as_str).collect();
        if keys.is_empty() {
            "none are configured".to_owned()
        } else {
            format!("configured: {}", keys.join(", "))
        }
    };
    let image = image.ok_or_else(|| format!("placement.image is required: an images key ({})", known()))?;
    if let Some(cfg) = config.images.get(image) {
        return Ok(ImageSpec {
            url: cfg.url.clone(),
            sha256: cfg.sha256.as_deref().map(str::to_ascii_lowercase),
            format: Some(cfg.format),
            firmware: cfg.firmware,
        });
    }
    if image_url::looks_like_url(image) {
        if !config.allow_image_urls {
            return Err(format!(
                "placement.image {image:?} is a URL, but provider {provider} boots only its configured \
                 images ({}): image URLs are refused unless kvm.allowImageUrls is true",
                known()
            ));
        }
        return image_url::parse(image).map_err(|e| e.to_string());
    }
    let urls = if config.allow_image_urls {
        " nor an http(s) URL with #sha256=<digest>"
    } else {
        ""
    };
    Err(format!(
        "placement.image {image:?} is not a configured image ({}){urls}",
        known()
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::domain::config::{DEFAULT_MAX_IMAGE_SIZE_GB, Firmware, ImageFormat, KvmImage};

    const D: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn config(allow_image_urls: bool) -> KvmConfig {
        KvmConfig {
            ssh_key_file: "k".into(),
            known_hosts_file: Some("kh".into()),
            insecure_ignore_host_key: false,
            disk_size_gb: 10,
            vendor_data: None,
            install_guest_agent: true,
            images: BTreeMap::from([(
                "debian-13".to_owned(),
                KvmImage {
                    url: "https://images.example/debian-13.qcow2".into(),
                    sha256: Some(D.to_uppercase()),
                    format: ImageFormat::Qcow2,
                    firmware: Firmware::Bios,
                },
            )]),
            allow_image_urls,
            max_image_size_gb: DEFAULT_MAX_IMAGE_SIZE_GB,
            machine_types: BTreeMap::new(),
            hosts: Vec::new(),
        }
    }

    #[test]
    fn a_configured_image_is_always_allowed() {
        for allow in [false, true] {
            let spec = resolve(&config(allow), "kvm-home", Some("debian-13")).unwrap();
            assert_eq!(spec.url, "https://images.example/debian-13.qcow2");
            assert_eq!(spec.sha256.as_deref(), Some(D), "digests are lowercased");
            assert_eq!(spec.firmware, Firmware::Bios);
        }
    }

    #[test]
    fn a_url_is_refused_unless_the_provider_allows_urls() {
        let url = format!("https://elsewhere.example/x.qcow2#sha256={D}");
        let err = resolve(&config(false), "kvm-home", Some(&url)).unwrap_err();
        assert!(
            err.contains(
                "is a URL, but provider kvm-home boots only its configured images (configured: debian-13)"
            ),
            "{err}"
        );
        assert!(err.contains("kvm.allowImageUrls"), "{err}");
        // Not even a file:// or a digest-less URL gets further.
        let err = resolve(&config(false), "kvm-home", Some("file:///etc/shadow")).unwrap_err();
        assert!(err.contains("kvm.allowImageUrls"), "{err}");

        let spec = resolve(&config(true), "kvm-home", Some(&url)).unwrap();
        assert_eq!(spec.url, "https://elsewhere.example/x.qcow2");
        assert_eq!(spec.sha256.as_deref(), Some(D));
    }

    #[test]
    fn an_allowed_url_without_its_sha256_is_refused() {
        let err = resolve(
            &config(true),
            "kvm-home",
            Some("https://elsewhere.example/latest.qcow2"),
        )
        .unwrap_err();
        assert!(err.contains("has no sha256"), "{err}");
        assert!(err.contains("#sha256=<64 hex digits>"), "{err}");
    }

    #[test]
    fn an_unknown_key_or_no_image_names_the_configured_ones() {
        let err = resolve(&config(false), "kvm-home", Some("ubuntu")).unwrap_err();
        assert_eq!(
            err,
            "placement.image \"ubuntu\" is not a configured image (configured: debian-13)"
        );
        let err = resolve(&config(true), "kvm-home", Some("ubuntu")).unwrap_err();
        assert!(err.ends_with("nor an http(s) URL with #sha256=<digest>"), "{err}");
        let err = resolve(&config(false), "kvm-home", None).unwrap_err();
        assert!(err.contains("placement.image is required"), "{err}");
    }
}
