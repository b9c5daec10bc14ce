//! Base images in a host's pool ([`super::base_image`] names them by
//! content). A fetch streams the image from its URL through a running
//! sha256 straight into its base volume by libvirt's volume upload — never
//! buffered whole, never staged on the operator's disk — and writes the
//! digest marker last. Without a configured digest, a first read learns the
//! digest (the volume's name) and the format, and the pin records what the
//! URL gave this host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::base_image::{base_volume, detect_format, marker_name, parse_pin, pin_content, pin_name};
use super::ops::OpError;
use super::qcow2_header::{HEADER_PROBE_BYTES, Qcow2HeaderError, check_standalone};
use super::session::{HostSession, KvmError};
use super::volume_xml::plain_volume_xml;
use crate::config::{DEFAULT_MAX_IMAGE_SIZE_GB, Firmware, ImageFormat, KvmConfig};
use crate::provider::ErrorClass;

/// Packets in flight between the download and the upload (backpressure):
/// with [`STREAM_PACKET`], at most 2 MiB of an image is in memory.
const IN_FLIGHT: usize = 8;

/// The body is handed to libvirt in packets of this size, the largest one
/// libvirt's stream protocol carries (and what `virsh vol-upload` sends):
/// the HTTP body arrives in chunks of a few kilobytes, and one call per
/// chunk would make the upload call-bound.
const STREAM_PACKET: usize = 262_120;

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

/// The HTTP client images are fetched with, and its limits.
#[derive(Clone, Debug)]
pub struct Downloader {
    client: reqwest::Client,
    max_bytes: u64,
}

impl Downloader {
    pub fn new(limits: DownloadLimits) -> Result<Self, reqwest::Error> {
        crate::tls::ensure_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(limits.connect_timeout)
            .read_timeout(limits.idle_timeout)
            .redirect(reqwest::redirect::Policy::limited(limits.max_redirects))
            .build()?;
        Ok(Self {
            client,
            max_bytes: limits.max_bytes,
        })
    }

    /// Counts `more` bytes read so far into `total`; past the size limit
    /// or the pool's free space (`room`), fails.
    fn count(&self, url: &str, total: &mut u64, more: usize, room: u64) -> Result<(), ImageError> {
        *total += more as u64;
        self.check_size(url, *total, room)
    }

    /// An image of `size` bytes fits the limit and the pool's free space.
    fn check_size(&self, url: &str, size: u64, room: u64) -> Result<(), ImageError> {
        if size > self.max_bytes {
            return Err(ImageError::TooLarge {
                url: url.to_owned(),
                limit: self.max_bytes,
            });
        }
        if size > room {
            return Err(ImageError::NoRoom {
                url: url.to_owned(),
                size,
                available: room,
            });
        }
        Ok(())
    }
}

/// The leading bytes of an image as they stream past: enough for its
/// format and its qcow2 header.
#[derive(Default)]
struct Head(Vec<u8>);

impl Head {
    fn keep(&mut self, chunk: &[u8]) {
        let missing = HEADER_PROBE_BYTES.saturating_sub(self.0.len());
        self.0.extend_from_slice(&chunk[..missing.min(chunk.len())]);
    }

    fn format(&self) -> ImageFormat {
        detect_format(&self.0)
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

    /// The volumes a fetch of this image writes, when known before it starts
    /// (the pool GC leaves them alone meanwhile; a pin-less image's base is
    /// new when its upload starts, so never due).
    pub fn fetch_volumes(&self) -> Vec<String> {
        match self.configured_base() {
            Some(base) => vec![marker_name(&base), base],
            None => vec![pin_name(&self.url)],
        }
    }
}

/// How far the current read of an image has got (for the dashboard). A
/// digest-less image is read twice (digest, then upload): each read counts
/// from zero.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: std::sync::atomic::AtomicU64,
    /// 0 until the size is known.
    pub total: std::sync::atomic::AtomicU64,
}

impl Progress {
    fn start(&self, total: Option<u64>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.done.store(0, Relaxed);
        self.total.store(total.unwrap_or(0), Relaxed);
    }

    fn add(&self, n: usize) {
        self.done
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
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
    #[error("{url} changed while it was fetched (sha256 {first}, then {second}); fetching again")]
    Changed {
        url: String,
        first: String,
        second: String,
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

/// A finished fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub base: CachedBase,
    pub bytes: u64,
    pub duration: Duration,
}

/// The complete base for `image` on this host, if there is one: the
/// configured digest's, or the one the URL's pin records. A base found
/// there is inspected before use, as a downloaded one is (it may have been
/// written by an earlier version, or by hand).
pub fn lookup(s: &HostSession, image: &ImageSpec) -> Result<Option<CachedBase>, OpError> {
    let (digest, format) = match &image.sha256 {
        Some(d) => (d.clone(), image.format.unwrap_or_default()),
        None => match s
            .read_small(&pin_name(&image.url), 128)?
            .as_deref()
            .and_then(parse_pin)
        {
            Some(pinned) => pinned,
            None => return Ok(None),
        },
    };
    let volume = base_volume(&digest, format);
    if !is_complete(s, &volume, &digest)? {
        return Ok(None);
    }
    if let Err(problem) = inspect_base(s, &volume)? {
        return Err(OpError::UnsafeBase { volume, problem });
    }
    Ok(Some(CachedBase {
        volume,
        format,
        digest,
    }))
}

/// Reads a base's leading bytes from the pool and checks its qcow2 header.
fn inspect_base(s: &HostSession, volume: &str) -> Result<Result<(), Qcow2HeaderError>, KvmError> {
    let head = s
        .read_small(volume, HEADER_PROBE_BYTES as u64)?
        .unwrap_or_default();
    Ok(check_standalone(&head))
}

/// The base exists and its marker names `digest`.
fn is_complete(s: &HostSession, base: &str, digest: &str) -> Result<bool, KvmError> {
    if s.volume_path(base)?.is_none() {
        return Ok(false);
    }
    let marker = s.read_small(&marker_name(base), 128)?;
    Ok(marker.is_some_and(|m| String::from_utf8_lossy(&m).trim() == digest))
}

/// Writes a small volume whole (markers, pins).
fn write_small(s: &HostSession, name: &str, content: &[u8]) -> Result<(), KvmError> {
    s.delete_volume(name)?;
    let vol = s.create_volume_from(name, &plain_volume_xml(name, "raw", content.len() as u64))?;
    s.upload_to(&vol, name, content)
}

/// A volume about to be (re)written must back no overlay: never pull a base
/// out from under a VM.
fn refuse_if_in_use(s: &HostSession, volume: &str) -> Result<(), ImageError> {
    let Some(path) = s.volume_path(volume)? else {
        return Ok(());
    };
    let users: Vec<String> = s
        .volumes()?
        .into_iter()
        .filter(|v| v.backing.as_deref() == Some(path.as_str()))
        .map(|v| v.name)
        .collect();
    if users.is_empty() {
        Ok(())
    } else {
        Err(ImageError::InUse {
            volume: volume.to_owned(),
            users,
        })
    }
}

/// Reads `url` once only to learn its digest and format (images without a
/// configured digest: the base's name must be known before its upload).
/// An image that would not fit the pool (`room` bytes free), or whose
/// header names other files, is refused before anything is written.
async fn probe_digest(
    client: &Downloader,
    url: &str,
    room: u64,
    progress: &Progress,
) -> Result<(String, ImageFormat), ImageError> {
    let response = get(client, url, room).await?;
    progress.start(response.content_length());
    let mut body = response.bytes_stream();
    let mut hasher = Sha256::new();
    let mut head = Head::default();
    let mut total = 0;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| transport(url, e))?;
        client.count(url, &mut total, chunk.len(), room)?;
        head.keep(&chunk);
        hasher.update(&chunk);
        progress.add(chunk.len());
    }
    check_standalone(&head.0).map_err(|problem| ImageError::Unsafe {
        url: url.to_owned(),
        problem,
    })?;
    Ok((hex::encode(hasher.finalize()), head.format()))
}

fn transport(url: &str, e: reqwest::Error) -> ImageError {
    // reqwest says what it was doing; the causes say what went wrong.
    let mut reason = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        reason.push_str(": ");
        reason.push_str(&c.to_string());
        cause = c.source();
    }
    ImageError::Transport {
        url: url.to_owned(),
        reason,
    }
}

/// Starts the download; an announced size over the limit or the pool's
/// free space (`room`) fails before a byte of the body is read.
async fn get(client: &Downloader, url: &str, room: u64) -> Result<reqwest::Response, ImageError> {
    let response = client
        .client
        .get(url)
        .send()
        .await
        .map_err(|e| transport(url, e))?;
    if !response.status().is_success() {
        return Err(ImageError::Http {
            url: url.to_owned(),
            status: response.status().as_u16(),
        });
    }
    if let Some(len) = response.content_length() {
        client.check_size(url, len, room)?;
    }
    Ok(response)
}

/// Downloads `image` into the pool of the host reachable at `libvirt_uri`.
pub async fn fetch_to_pool(
    client: &Downloader,
    image: &ImageSpec,
    libvirt_uri: &str,
    host: &str,
    pool: &str,
    progress: &Progress,
) -> Result<Fetched, ImageError> {
    let started = Instant::now();
    let url = image.url.as_str();
    let (uri, host_name, pool_name) = (libvirt_uri.to_owned(), host.to_owned(), pool.to_owned());
    let session = tokio::task::spawn_blocking(move || HostSession::open(&uri, &host_name, &pool_name))
        .await
        .map_err(|e| ImageError::Task(e.to_string()))??;
    let session = Arc::new(session);
    let result = fetch_into(client, image, &session, started, progress).await;
    crate::telemetry::events::ImageDownloadCompleted {
        host,
        url,
        result: match &result {
            Ok(_) => "ok",
            Err(e) => e.class().as_str(),
        },
        bytes: result.as_ref().map_or(0, |f| f.bytes),
    }
    .emit();
    // Closing is a libvirt call over the SSH link, whose forwarding may need
    // the very runtime thread a plain drop here would block.
    drop(tokio::task::spawn_blocking(move || drop(session)));
    result
}

async fn fetch_into(
    client: &Downloader,
    image: &ImageSpec,
    session: &Arc<HostSession>,
    started: Instant,
    progress: &Progress,
) -> Result<Fetched, ImageError> {
    // Free space is read before the download starts; the download is refused
    // (announced) or cut off (not announced) when the image would not fit.
    let s = session.clone();
    let room = blocking(move || Ok(s.pool_available_bytes()?)).await?;
    // The base is named by content: without a configured digest, one read
    // learns it first (libvirt cannot rename a volume, and copying one on the
    // host converts formats instead of copying bytes).
    let (digest, format) = match (&image.sha256, image.format) {
        (Some(d), declared) => (d.clone(), declared.unwrap_or_default()),
        (None, _) => probe_digest(client, &image.url, room, progress).await?,
    };
    fetch_with(client, image, session, digest, format, room, started, progress).await
}

#[allow(
    clippy::too_many_arguments,
    reason = "the steps of one download, passed through as they are"
)]
async fn fetch_with(
    client: &Downloader,
    image: &ImageSpec,
    session: &Arc<HostSession>,
    digest: String,
    format: ImageFormat,
    room: u64,
    started: Instant,
    progress: &Progress,
) -> Result<Fetched, ImageError> {
    let url = image.url.as_str();
    let host = session.host();
    let base = base_volume(&digest, format);
    // Another URL may already have brought the same bytes; they are inspected as a download is.
    let (s, b, d) = (session.clone(), base.clone(), digest.clone());
    let already = blocking(move || {
        if !is_complete(&s, &b, &d)? {
            return Ok(false);
        }
        match inspect_base(&s, &b)? {
            Ok(()) => Ok(true),
            Err(problem) => Err(ImageError::UnsafeBase { volume: b, problem }),
        }
    })
    .await?;
    let bytes = if already {
        0
    } else {
        upload(client, image, session, &base, &digest, format, room, progress).await?
    };
    if image.sha256.is_none() {
        let (s, pin) = (session.clone(), pin_name(url));
        let content = pin_content(&digest, format);
        blocking(move || Ok(write_small(&s, &pin, content.as_bytes())?)).await?;
    }
    let fetched = Fetched {
        base: CachedBase {
            volume: base,
            format,
            digest,
        },
        bytes,
        duration: started.elapsed(),
    };
    tracing::info!(
        host, volume = %fetched.base.volume, digest = %fetched.base.digest, bytes = fetched.bytes,
        durationMs = fetched.duration.as_millis() as u64, format = fetched.base.format.as_str(),
        "image fetch finished"
    );
    Ok(fetched)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::Task(e.to_string()))?
}

/// Streams the image into `base`, checks digest, format and qcow2 header
/// (a refused image's volume is deleted), writes the marker last.
#[allow(
    clippy::too_many_arguments,
    reason = "the steps of one download, passed through as they are"
)]
async fn upload(
    client: &Downloader,
    image: &ImageSpec,
    session: &Arc<HostSession>,
    base: &str,
    digest: &str,
    format: ImageFormat,
    room: u64,
    progress: &Progress,
) -> Result<u64, ImageError> {
    let url = image.url.as_str();
    let response = get(client, url, room).await?;
    let len = response
        .content_length()
        .ok_or_else(|| ImageError::NoLength { url: url.to_owned() })?;
    progress.start(Some(len));
    tracing::info!(host = %session.host(), volume = %base, url, bytes = len, "image fetch started");

    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let (s, vol) = (session.clone(), base.to_owned());
    let writer = blocking(move || {
        refuse_if_in_use(&s, &vol)?;
        s.upload_stream(&vol, len, std::iter::from_fn(|| rx.blocking_recv()))?;
        Ok(())
    });
    let reader = async move {
        let mut hasher = Sha256::new();
        let mut head = Head::default();
        let mut body = response.bytes_stream();
        let mut total = 0;
        let mut packet = Vec::with_capacity(STREAM_PACKET);
        'body: while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| transport(url, e))?;
            client.count(url, &mut total, chunk.len(), room)?;
            hasher.update(&chunk);
            head.keep(&chunk);
            progress.add(chunk.len());
            let mut rest = &chunk[..];
            while !rest.is_empty() {
                let take = rest.len().min(STREAM_PACKET - packet.len());
                packet.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if packet.len() == STREAM_PACKET {
                    let full = std::mem::replace(&mut packet, Vec::with_capacity(STREAM_PACKET));
                    if tx.send(full).await.is_err() {
                        break 'body; // the upload side failed; its error is reported first
                    }
                }
            }
        }
        if !packet.is_empty() {
            let _ = tx.send(packet).await;
        }
        Ok::<_, ImageError>((hex::encode(hasher.finalize()), head))
    };
    let (actual, head) = match tokio::join!(writer, reader) {
        // A cut-off download also fails the upload; the download's error says why.
        (_, Err(e)) | (Err(e), _) => return Err(e),
        (Ok(()), Ok(read)) => read,
    };

    let problem = if actual != digest {
        Some(match &image.sha256 {
            Some(expected) => ImageError::DigestMismatch {
                url: url.to_owned(),
                expected: expected.clone(),
                actual,
            },
            None => ImageError::Changed {
                url: url.to_owned(),
                first: digest.to_owned(),
                second: actual,
            },
        })
    } else if head.format() != format {
        Some(ImageError::FormatMismatch {
            url: url.to_owned(),
            declared: format.as_str(),
            detected: head.format().as_str(),
        })
    } else {
        check_standalone(&head.0).err().map(|problem| ImageError::Unsafe {
            url: url.to_owned(),
            problem,
        })
    };
    let (s, vol, digest) = (session.clone(), base.to_owned(), digest.to_owned());
    blocking(move || match problem {
        Some(e) => {
            s.delete_volume(&vol)?;
            Err(e)
        }
        // Marker last: a base without it is incomplete and fetched again.
        None => Ok(write_small(&s, &marker_name(&vol), digest.as_bytes())?),
    })
    .await?;
    Ok(len)
}

#[cfg(test)]
mod download_limit_tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A loopback server answering every connection with `reply(port)`,
    /// then holding the connection open for `hold`.
    async fn server(reply: fn(u16) -> Vec<u8>, hold: Duration) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = conn.read(&mut request).await;
                    let _ = conn.write_all(&reply(port)).await;
                    tokio::time::sleep(hold).await;
                });
            }
        });
        format!("http://127.0.0.1:{port}/image.qcow2")
    }

    fn limits() -> DownloadLimits {
        DownloadLimits {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_millis(300),
            max_redirects: 3,
            max_bytes: 1024,
        }
    }

    async fn probe(url: &str) -> ImageError {
        let client = Downloader::new(limits()).unwrap();
        probe_digest(&client, url, u64::MAX, &Progress::default())
            .await
            .expect_err("the download must fail")
    }

    #[tokio::test]
    async fn a_server_that_stops_sending_fails_the_download() {
        let url = server(
            |_| b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nQFI".to_vec(),
            Duration::from_secs(30),
        )
        .await;
        let started = Instant::now();
        let err = probe(&url).await;
        assert!(matches!(err, ImageError::Transport { .. }), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(err.class(), ErrorClass::Transient, "retried later");
    }

    #[tokio::test]
    async fn an_image_over_the_size_limit_is_refused_announced_or_not() {
        let announced = server(
            |_| b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n".to_vec(),
            Duration::from_secs(30),
        )
        .await;
        let err = probe(&announced).await;
        assert!(matches!(err, ImageError::TooLarge { limit: 1024, .. }), "{err}");
        assert_eq!(err.class(), ErrorClass::Permanent);

        let chunked = server(
            |_| {
                let chunk = vec![b'x'; 600];
                let mut body = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                for _ in 0..3 {
                    body.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
                    body.extend(&chunk);
                    body.extend(b"\r\n");
                }
                body.extend(b"0\r\n\r\n");
                body
            },
            Duration::ZERO,
        )
        .await;
        let err = probe(&chunked).await;
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");

        // Under the limit but past the pool's free space: cut off as the bytes pass it.
        let client = Downloader::new(DownloadLimits {
            max_bytes: 1 << 20,
            ..limits()
        })
        .unwrap();
        let err = probe_digest(&client, &chunked, 1000, &Progress::default())
            .await
            .expect_err("more than the pool holds");
        assert!(
            matches!(
                err,
                ImageError::NoRoom {
                    size: 1001..=1800,
                    available: 1000,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.class(), ErrorClass::QuotaExceeded);
    }

    #[tokio::test]
    async fn a_redirect_loop_ends() {
        let url = server(
            |port| {
                format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{port}/again\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .into_bytes()
            },
            Duration::ZERO,
        )
        .await;
        let err = probe(&url).await;
        assert!(err.to_string().contains("redirect"), "{err}");
    }
}
