//! Fetching base images into a host's pool. A fetch streams the image from
//! its URL through a running sha256 straight into its base volume by
//! libvirt's volume upload — never buffered whole, never staged on the
//! operator's disk — and writes the digest marker last. Every image is read
//! once: its format and qcow2 header are checked from its first bytes
//! before anything is written, and without a configured digest the base is
//! named by its URL and the fetch (the digest is known only at the end),
//! and the pin records what the URL gave this host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::adapters::providers::kvm::base_image::{
    PIN_MAX_BYTES, Pinned, base_volume, detect_format, marker_name, parse_pin, pin_content, pin_name,
    url_base_volume,
};
use crate::adapters::providers::kvm::errors::KvmError;
use crate::adapters::providers::kvm::image::{CachedBase, DownloadLimits, ImageError, ImageSpec};
use crate::adapters::providers::kvm::ops::OpError;
use crate::adapters::providers::kvm::qcow2_header::{HEADER_PROBE_BYTES, Qcow2HeaderError, check_standalone};
use crate::adapters::providers::kvm::volume_xml::plain_volume_xml;
use crate::domain::config::ImageFormat;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::session::HostSession;

/// Packets in flight between the download and the upload (backpressure):
/// with [`STREAM_PACKET`], at most 2 MiB of an image is in memory.
const IN_FLIGHT: usize = 8;

/// The body is handed to libvirt in packets of this size, the largest one
/// libvirt's stream protocol carries (and what `virsh vol-upload` sends):
/// the HTTP body arrives in chunks of a few kilobytes, and one call per
/// chunk would make the upload call-bound.
const STREAM_PACKET: usize = 262_120;

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

/// How far the read of an image has got (for the dashboard).
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
    let Pinned {
        digest,
        format,
        volume,
    } = match &image.sha256 {
        Some(d) => {
            let format = image.format.unwrap_or_default();
            Pinned {
                digest: d.clone(),
                format,
                volume: base_volume(d, format),
            }
        }
        None => match s
            .read_small(&pin_name(&image.url), PIN_MAX_BYTES)?
            .as_deref()
            .and_then(parse_pin)
        {
            Some(pinned) => pinned,
            None => return Ok(None),
        },
    };
    match found_base(s, &volume, &digest)? {
        None => Ok(None),
        Some(Err(problem)) => Err(OpError::UnsafeBase { volume, problem }),
        Some(Ok(())) => Ok(Some(CachedBase {
            volume,
            format,
            digest,
        })),
    }
}

/// A base in the pool, if complete (its marker names `digest`), with what
/// the inspection of its header found.
fn found_base(
    s: &HostSession,
    volume: &str,
    digest: &str,
) -> Result<Option<Result<(), Qcow2HeaderError>>, KvmError> {
    if !is_complete(s, volume, digest)? {
        return Ok(None);
    }
    inspect_base(s, volume).map(Some)
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
    let url = image.url.as_str();
    let host = session.host();
    // A configured digest names the base up front; it may be there already
    // (brought by another URL), and is then inspected as a download is.
    if let Some(base) = image.configured_base() {
        let (s, b, d) = (
            session.clone(),
            base.clone(),
            image.sha256.clone().unwrap_or_default(),
        );
        let already = blocking(move || match found_base(&s, &b, &d)? {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(problem)) => Err(ImageError::UnsafeBase { volume: b, problem }),
        })
        .await?;
        if already {
            return Ok(finished(host, cached(base, image), 0, started));
        }
    }
    // Free space is read before the download starts; the download is
    // refused when the size it announces would not fit.
    let s = session.clone();
    let room = blocking(move || Ok(s.pool_available_bytes()?)).await?;
    let mut body = Body::open(client, url, room, progress).await?;
    // The format and the qcow2 header come from the first bytes, read
    // before anything is written: a refused image leaves nothing behind.
    let head = body.read_head().await?;
    let format = head.format();
    let declared = image
        .format
        .or(image.sha256.as_ref().map(|_| ImageFormat::default()));
    if let Some(declared) = declared.filter(|d| *d != format) {
        return Err(ImageError::FormatMismatch {
            url: url.to_owned(),
            declared: declared.as_str(),
            detected: format.as_str(),
        });
    }
    check_standalone(&head.0).map_err(|problem| ImageError::Unsafe {
        url: url.to_owned(),
        problem,
    })?;
    let volume = match &image.sha256 {
        Some(digest) => base_volume(digest, format),
        // The digest is known only at the end; libvirt cannot rename a
        // volume, so the base is named by the URL and this fetch.
        None => url_base_volume(url, format),
    };
    let len = body.len;
    let actual = upload(body, session, &volume).await?;
    let base = match &image.sha256 {
        Some(expected) if *expected != actual => {
            let (s, v) = (session.clone(), volume.clone());
            blocking(move || Ok(s.delete_volume(&v)?)).await?;
            return Err(ImageError::DigestMismatch {
                url: url.to_owned(),
                expected: expected.clone(),
                actual,
            });
        }
        Some(_) => {
            let (s, v, d) = (session.clone(), volume.clone(), actual.clone());
            // Marker last: a base without it is incomplete and fetched again.
            blocking(move || Ok(write_small(&s, &marker_name(&v), d.as_bytes())?)).await?;
            CachedBase {
                volume,
                format,
                digest: actual,
            }
        }
        None => settle_url_base(session, url, volume, format, actual).await?,
    };
    Ok(finished(host, base, len, started))
}

/// Completes a fetched URL base and pins the URL to it. Bytes another
/// source already brought to the pool (a complete, sound content-named
/// base) are not kept twice: the pin names that base and the new volume
/// goes.
async fn settle_url_base(
    session: &Arc<HostSession>,
    url: &str,
    volume: String,
    format: ImageFormat,
    digest: String,
) -> Result<CachedBase, ImageError> {
    let (s, url) = (session.clone(), url.to_owned());
    blocking(move || {
        let by_content = base_volume(&digest, format);
        let shared = matches!(found_base(&s, &by_content, &digest)?, Some(Ok(())));
        let volume = if shared {
            s.delete_volume(&volume)?;
            by_content
        } else {
            write_small(&s, &marker_name(&volume), digest.as_bytes())?;
            volume
        };
        let pinned = Pinned {
            digest,
            format,
            volume,
        };
        write_small(&s, &pin_name(&url), pin_content(&pinned).as_bytes())?;
        Ok(CachedBase {
            volume: pinned.volume,
            format,
            digest: pinned.digest,
        })
    })
    .await
}

/// The configured image's base, found complete.
fn cached(volume: String, image: &ImageSpec) -> CachedBase {
    CachedBase {
        volume,
        format: image.format.unwrap_or_default(),
        digest: image.sha256.clone().unwrap_or_default(),
    }
}

fn finished(host: &str, base: CachedBase, bytes: u64, started: Instant) -> Fetched {
    let fetched = Fetched {
        base,
        bytes,
        duration: started.elapsed(),
    };
    tracing::info!(
        host, volume = %fetched.base.volume, digest = %fetched.base.digest, bytes = fetched.bytes,
        durationMs = fetched.duration.as_millis() as u64, format = fetched.base.format.as_str(),
        "image fetch finished"
    );
    fetched
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::Task(e.to_string()))?
}

/// An image's body as it is read: hashed and counted as it streams past,
/// its head kept; chunks read ahead (to see the head before writing
/// anything) are handed out first.
struct Body<'a> {
    url: &'a str,
    /// What the server announced (an upload needs the size up front).
    len: u64,
    progress: &'a Progress,
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    ahead: std::collections::VecDeque<bytes::Bytes>,
    hasher: Sha256,
    head: Head,
}

impl<'a> Body<'a> {
    /// Starts the download; a size over the limit or the pool's free space
    /// (`room`), or none announced, fails before a byte of the body is read.
    async fn open(
        client: &Downloader,
        url: &'a str,
        room: u64,
        progress: &'a Progress,
    ) -> Result<Self, ImageError> {
        let response = get(client, url, room).await?;
        let len = response
            .content_length()
            .ok_or_else(|| ImageError::NoLength { url: url.to_owned() })?;
        progress.start(Some(len));
        Ok(Self {
            url,
            len,
            progress,
            stream: response.bytes_stream().boxed(),
            ahead: Default::default(),
            hasher: Sha256::new(),
            head: Head::default(),
        })
    }

    /// Reads ahead until the head is whole (or the body ends).
    async fn read_head(&mut self) -> Result<&Head, ImageError> {
        while self.head.0.len() < HEADER_PROBE_BYTES {
            match self.pull().await? {
                Some(chunk) => self.ahead.push_back(chunk),
                None => break,
            }
        }
        Ok(&self.head)
    }

    async fn next(&mut self) -> Result<Option<bytes::Bytes>, ImageError> {
        match self.ahead.pop_front() {
            Some(chunk) => Ok(Some(chunk)),
            None => self.pull().await,
        }
    }

    async fn pull(&mut self) -> Result<Option<bytes::Bytes>, ImageError> {
        let Some(chunk) = self.stream.next().await else {
            return Ok(None);
        };
        let chunk = chunk.map_err(|e| transport(self.url, e))?;
        self.hasher.update(&chunk);
        self.head.keep(&chunk);
        self.progress.add(chunk.len());
        Ok(Some(chunk))
    }
}

/// Streams the body into a new volume `volume` and returns the sha256 of
/// what was written. A volume of that name must back no overlay (never
/// pull a base out from under a VM).
async fn upload(mut body: Body<'_>, session: &Arc<HostSession>, volume: &str) -> Result<String, ImageError> {
    let (url, len) = (body.url, body.len);
    tracing::info!(host = %session.host(), volume, url, bytes = len, "image fetch started");
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let (s, vol) = (session.clone(), volume.to_owned());
    let writer = blocking(move || {
        refuse_if_in_use(&s, &vol)?;
        s.upload_stream(&vol, len, std::iter::from_fn(|| rx.blocking_recv()))?;
        Ok(())
    });
    let reader = async move {
        let mut packet = Vec::with_capacity(STREAM_PACKET);
        'body: while let Some(chunk) = body.next().await? {
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
        Ok::<_, ImageError>(hex::encode(body.hasher.finalize()))
    };
    match tokio::join!(writer, reader) {
        // A cut-off download also fails the upload; the download's error says why.
        (_, Err(e)) | (Err(e), _) => Err(e),
        (Ok(()), Ok(digest)) => Ok(digest),
    }
}

#[cfg(test)]
mod download_limit_tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::domain::provider_contract::ErrorClass;

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

    /// Reads the whole body as a fetch does, writing it nowhere.
    async fn read_all(client: &Downloader, url: &str, room: u64) -> Result<(), ImageError> {
        let progress = Progress::default();
        let mut body = Body::open(client, url, room, &progress).await?;
        body.read_head().await?;
        while body.next().await?.is_some() {}
        Ok(())
    }

    async fn probe(url: &str) -> ImageError {
        let client = Downloader::new(limits()).unwrap();
        read_all(&client, url, u64::MAX)
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
    async fn an_image_over_the_limit_or_the_pool_or_of_unknown_size_is_refused_unread() {
        let announced = server(
            |_| b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n".to_vec(),
            Duration::from_secs(30),
        )
        .await;
        let err = probe(&announced).await;
        assert!(matches!(err, ImageError::TooLarge { limit: 1024, .. }), "{err}");
        assert_eq!(err.class(), ErrorClass::Permanent);

        // Under the limit but over the pool's free space.
        let fits_the_limit = server(
            |_| b"HTTP/1.1 200 OK\r\nContent-Length: 1500\r\n\r\n".to_vec(),
            Duration::from_secs(30),
        )
        .await;
        let client = Downloader::new(DownloadLimits {
            max_bytes: 1 << 20,
            ..limits()
        })
        .unwrap();
        let err = read_all(&client, &fits_the_limit, 1000)
            .await
            .expect_err("more than the pool holds");
        assert!(
            matches!(
                err,
                ImageError::NoRoom {
                    size: 1500,
                    available: 1000,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.class(), ErrorClass::QuotaExceeded);

        // No size announced: the upload cannot start, and an endless body is never read.
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
        assert!(matches!(err, ImageError::NoLength { .. }), "{err}");
        assert_eq!(err.class(), ErrorClass::Permanent);
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
