//! Base images in a host's pool, as the provider names and asks for them
//! ([`super::base_image`] names them by content): what an image is, where
//! a complete base stands, what may go wrong fetching one, and the bounds
//! on a download. The fetch itself runs beside the host's actors
//! ([`image_fetch`](super::host::image_fetch)).

use std::time::Duration;

use super::base_image::{base_volume, marker_name, pin_name};
use super::errors::KvmError;
use super::qcow2_header::Qcow2HeaderError;
use crate::domain::config::{DEFAULT_MAX_IMAGE_SIZE_GB, Firmware, ImageFormat, KvmConfig};
use crate::domain::provider_contract::ErrorClass;

/// Bounds on an image download: a server that stalls, loops or sends more
/// than any image should fails the fetch (and its waiters) instead of
/// holding it for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DownloadLimits {
    pub connect_timeout: Duration,
    /// A read that brings nothing for this long fails the download.
    pub idle_timeout: Duration,
    pub max_redirects: usize,
    /// The largest image accepted (`kvm.maxImageSizeGb`).
    pub max_bytes: u64,
}

impl DownloadLimits {
    /// The defaults, with the provider's own bound on image size.
    pub fn for_config(config: &KvmConfig) -> Self {
        Self {
            max_bytes: config.max_image_bytes(),
            ..Self::default()
        }
    }
}

impl Default for DownloadLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_redirects: 5,
            max_bytes: u64::from(DEFAULT_MAX_IMAGE_SIZE_GB) << 30,
        }
    }
}

/// An image to have in a host's pool before a create.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageSpec {
    pub url: String,
    /// Configured digest, lowercase hex.
    pub sha256: Option<String>,
    /// Declared format; `None` for URL images (read from the first bytes).
    pub format: Option<ImageFormat>,
    pub firmware: Firmware,
}

impl ImageSpec {
    /// The base volume, when the digest is known before any fetch.
    pub fn configured_base(&self) -> Option<String> {
        let digest = self.sha256.as_deref()?;
        Some(base_volume(digest, self.format.unwrap_or_default()))
    }

    /// The volumes a fetch of this image writes (the pool GC leaves them
    /// alone meanwhile): a digest-less image's pin stands for the URL bases
    /// of its URL, whose names are chosen as the fetch starts.
    pub fn fetch_volumes(&self) -> Vec<String> {
        match self.configured_base() {
            Some(base) => vec![marker_name(&base), base],
            None => vec![pin_name(&self.url)],
        }
    }
}

/// A complete base in the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedBase {
    pub volume: String,
    pub format: ImageFormat,
    pub digest: String,
}

/// Fetching an image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("fetching {url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("fetching {url}: {reason}")]
    Transport { url: String, reason: String },
    #[error("{url} is larger than the {limit}-byte limit on images (kvm.maxImageSizeGb)")]
    TooLarge { url: String, limit: u64 },
    #[error(
        "{url} is at least {size} bytes but the storage pool has only {available} bytes free; \
         not fetched"
    )]
    NoRoom { url: String, size: u64, available: u64 },
    #[error("{url} is refused as a base image: {problem}")]
    Unsafe { url: String, problem: Qcow2HeaderError },
    #[error("base volume {volume} in the pool is refused: {problem}")]
    UnsafeBase {
        volume: String,
        problem: Qcow2HeaderError,
    },
    #[error("{url} did not say how large it is (no Content-Length)")]
    NoLength { url: String },
    #[error("{url}: sha256 {actual} does not match the configured {expected}")]
    DigestMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{url}: declared format {declared} but the image's first bytes say {detected}")]
    FormatMismatch {
        url: String,
        declared: &'static str,
        detected: &'static str,
    },
    #[error(
        "base volume {volume} has no digest marker but backs {users:?}; not replacing a base in use \
         (restore its marker or delete those instances)"
    )]
    InUse { volume: String, users: Vec<String> },
    #[error(transparent)]
    Libvirt(#[from] KvmError),
    #[error("upload task: {0}")]
    Task(String),
}

impl ImageError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ImageError::Http { status, .. } if (400..500).contains(status) => ErrorClass::Permanent,
            ImageError::NoLength { .. }
            | ImageError::TooLarge { .. }
            | ImageError::DigestMismatch { .. }
            | ImageError::FormatMismatch { .. }
            | ImageError::Unsafe { .. }
            | ImageError::UnsafeBase { .. }
            | ImageError::InUse { .. } => ErrorClass::Permanent,
            // As a full pool for an overlay: retried slowly, space may be freed.
            ImageError::NoRoom { .. } => ErrorClass::QuotaExceeded,
            ImageError::Libvirt(e) => e.class(),
            _ => ErrorClass::Transient,
        }
    }
}
