//! Base images: streamed from their URL through a running sha256 straight
//! into the host's pool by libvirt's volume upload — never buffered whole,
//! never staged on the operator's disk. The digest marker volume is written
//! last, so a base without its marker is known to be incomplete.

use std::time::{Duration, Instant};

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::session::{HostSession, KvmError};
use super::volume_xml::plain_volume_xml;
use crate::config::ImageFormat;
use crate::provider::ErrorClass;

/// Chunks in flight between the download and the upload (backpressure).
const IN_FLIGHT: usize = 16;

/// Fetching an image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("fetching {url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("fetching {url}: {reason}")]
    Transport { url: String, reason: String },
    #[error("{url} did not say how large it is (no Content-Length)")]
    NoLength { url: String },
    #[error("{url}: sha256 {actual} does not match the configured {expected}")]
    DigestMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error(transparent)]
    Libvirt(#[from] KvmError),
    #[error("upload task: {0}")]
    Task(String),
}

impl ImageError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ImageError::Http { status, .. } if (400..500).contains(status) => ErrorClass::Permanent,
            ImageError::NoLength { .. } | ImageError::DigestMismatch { .. } => ErrorClass::Permanent,
            ImageError::Libvirt(e) => e.class(),
            _ => ErrorClass::Transient,
        }
    }
}

/// A finished fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// Hex sha256 of the bytes.
    pub digest: String,
    pub bytes: u64,
    /// Detected from the magic bytes (`QFI\xfb` is qcow2).
    pub format: ImageFormat,
    pub duration: Duration,
}

/// The marker volume of a base volume.
pub fn marker_name(volume: &str) -> String {
    format!("{volume}.sha256")
}

/// Downloads `url` into `volume` on the host reachable at `libvirt_uri`.
pub async fn fetch_to_pool(
    client: &reqwest::Client,
    url: &str,
    expected_sha256: Option<&str>,
    libvirt_uri: &str,
    host: &str,
    pool: &str,
    volume: &str,
) -> Result<Fetched, ImageError> {
    let started = Instant::now();
    let transport = |e: reqwest::Error| ImageError::Transport {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    let response = client.get(url).send().await.map_err(transport)?;
    let status = response.status().as_u16();
    if !response.status().is_success() {
        return Err(ImageError::Http {
            url: url.to_owned(),
            status,
        });
    }
    let len = response
        .content_length()
        .ok_or_else(|| ImageError::NoLength { url: url.to_owned() })?;
    tracing::info!(host, volume, url, bytes = len, "image fetch started");

    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let (uri, host_name, pool_name, vol) = (
        libvirt_uri.to_owned(),
        host.to_owned(),
        pool.to_owned(),
        volume.to_owned(),
    );
    // Its own libvirt connection: a download never holds up the host's other callers.
    let upload = tokio::task::spawn_blocking(move || -> Result<HostSession, KvmError> {
        let session = HostSession::open(&uri, &host_name, &pool_name)?;
        session.upload_stream(&vol, len, std::iter::from_fn(|| rx.blocking_recv()))?;
        Ok(session)
    });

    let mut hasher = Sha256::new();
    let mut head: Vec<u8> = Vec::with_capacity(4);
    let mut body = response.bytes_stream();
    let mut download_error = None;
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                download_error = Some(transport(e));
                break;
            }
        };
        hasher.update(&chunk);
        if head.len() < 4 {
            head.extend(chunk.iter().take(4 - head.len()));
        }
        if tx.send(chunk.to_vec()).await.is_err() {
            break; // the upload side failed; its error is reported below
        }
    }
    drop(tx);
    let session = upload.await.map_err(|e| ImageError::Task(e.to_string()))??;
    if let Some(e) = download_error {
        return Err(e);
    }
    let digest = hex::encode(hasher.finalize());
    let marker = marker_name(volume);
    let vol = volume.to_owned();
    let expected = expected_sha256.map(str::to_ascii_lowercase);
    let checked = digest.clone();
    let url_owned = url.to_owned();
    tokio::task::spawn_blocking(move || -> Result<(), ImageError> {
        if let Some(expected) = expected
            && expected != checked
        {
            session.delete_volume(&vol)?;
            return Err(ImageError::DigestMismatch {
                url: url_owned,
                expected,
                actual: checked,
            });
        }
        // Marker last: a base without it is incomplete and is fetched again.
        session.delete_volume(&marker)?;
        session.create_volume(&marker, &plain_volume_xml(&marker, "raw", checked.len() as u64))?;
        session.upload(&marker, checked.as_bytes())?;
        Ok(())
    })
    .await
    .map_err(|e| ImageError::Task(e.to_string()))??;

    let format = if head == b"QFI\xfb" {
        ImageFormat::Qcow2
    } else {
        ImageFormat::Raw
    };
    let fetched = Fetched {
        digest,
        bytes: len,
        format,
        duration: started.elapsed(),
    };
    tracing::info!(
        host, volume, digest = %fetched.digest, bytes = fetched.bytes, durationMs = fetched.duration.as_millis() as u64,
        format = format.as_str(), "image fetch finished"
    );
    Ok(fetched)
}
