//! Image fetches into the real daemon's pool over the SSH link, from a local
//! HTTP server: content-addressed bases, pins for digest-less URLs, format
//! from the magic bytes, no base ever replaced under an overlay, and bad
//! digests, HTTP errors and cut-off downloads leaving nothing behind;
//! images naming a backing or external data file, or too large for the
//! limit or the pool, refused before use with nothing left in the pool.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use egress_proxies::config::{Firmware, ImageFormat};
use egress_proxies::provider::ErrorClass;
use egress_proxies::provider::kvm::base_image::{base_volume, marker_name, pin_name};
use egress_proxies::provider::kvm::image::{
    DownloadLimits, Downloader, ImageError, ImageSpec, Progress, fetch_to_pool, lookup,
};
use egress_proxies::provider::kvm::ops::OpError;
use egress_proxies::provider::kvm::qcow2_header::Qcow2HeaderError;
use egress_proxies::provider::kvm::session::HostSession;
use egress_proxies::provider::kvm::volume_xml::overlay_volume_xml;
use egress_proxies::provider::kvm::volume_xml::plain_volume_xml;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Served = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// Serves the bytes registered for each path; unknown paths are 404,
/// `/cut/...` stops half-way through, `/huge/...` announces a petabyte.
async fn image_server() -> (SocketAddr, Served) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served: Served = Arc::default();
    let files = served.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let files = files.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let Some(body) = files.lock().unwrap().get(&path).cloned() else {
                    let _ = s
                        .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                };
                let announced = if path.starts_with("/huge") {
                    1u64 << 50
                } else {
                    body.len() as u64
                };
                let head =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {announced}\r\nConnection: close\r\n\r\n");
                let _ = s.write_all(head.as_bytes()).await;
                let part = if path.starts_with("/cut") {
                    body.len() / 2
                } else {
                    body.len()
                };
                let _ = s.write_all(&body[..part]).await;
            });
        }
    });
    (addr, served)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A qcow2 image of a few MiB (several chunks), unique to this run.
fn qcow2_image(salt: u8) -> Vec<u8> {
    let mut bytes = support::kvm_bed::tiny_qcow2("1G");
    bytes.resize(bytes.len() + 3 * 1024 * 1024 + 17, 0xab);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    bytes.extend_from_slice(format!("{nonce}-{salt}").as_bytes());
    bytes
}

fn spec(url: String, sha256: Option<String>, format: Option<ImageFormat>) -> ImageSpec {
    ImageSpec {
        url,
        sha256,
        format,
        firmware: Firmware::Uefi,
    }
}

/// Runs `f` on a fresh libvirt session (blocking calls, off the runtime).
async fn with_session<T: Send + 'static>(uri: &str, f: impl FnOnce(&HostSession) -> T + Send + 'static) -> T {
    let uri = uri.to_owned();
    tokio::task::spawn_blocking(move || f(&HostSession::open(&uri, "a", "default").unwrap()))
        .await
        .unwrap()
}

#[tokio::test]
async fn bases_are_named_by_content_and_never_replaced_under_an_overlay() {
    let bed = bed_or_skip!();
    egress_proxies::tls::ensure_crypto_provider();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();
    let client = Downloader::new(DownloadLimits::default()).unwrap();
    let (server, served) = image_server().await;

    // A `latest` URL without a digest: read once for its digest, streamed into the base it names, pinned.
    let first = qcow2_image(1);
    let first_digest = sha(&first);
    served
        .lock()
        .unwrap()
        .insert("/latest.qcow2".into(), first.clone());
    let latest = spec(format!("http://{server}/latest.qcow2"), None, None);
    let fetched = fetch_to_pool(&client, &latest, &uri, "a", "default", &Progress::default())
        .await
        .unwrap();
    let first_base = base_volume(&first_digest, ImageFormat::Qcow2);
    assert_eq!(
        (
            fetched.base.volume.as_str(),
            fetched.base.digest.as_str(),
            fetched.base.format,
            fetched.bytes
        ),
        (
            first_base.as_str(),
            first_digest.as_str(),
            ImageFormat::Qcow2,
            first.len() as u64
        )
    );

    // A VM on it: an overlay backed by the base.
    let overlay = format!("proxy-imagetest{}.qcow2", &first_digest[..2]);
    let (b, o) = (first_base.clone(), overlay.clone());
    let base_path = with_session(&uri, move |s| {
        let path = s.volume_path(&b).unwrap().unwrap();
        s.delete_volume(&o).unwrap();
        s.create_volume(&o, &overlay_volume_xml(&o, 1 << 30, &path, "qcow2"))
            .unwrap();
        path
    })
    .await;

    // The URL now serves other bytes: the host stays pinned to what it first got.
    let second = qcow2_image(2);
    served
        .lock()
        .unwrap()
        .insert("/latest.qcow2".into(), second.clone());
    let l = latest.clone();
    let pinned = with_session(&uri, move |s| lookup(s, &l).unwrap()).await;
    assert_eq!(
        pinned.map(|b| b.volume),
        Some(first_base.clone()),
        "pinned per host"
    );

    // A configured digest for the new bytes is a new base beside the old one, fetched straight into place.
    let second_digest = sha(&second);
    let configured = spec(
        format!("http://{server}/latest.qcow2"),
        Some(second_digest.clone()),
        Some(ImageFormat::Qcow2),
    );
    let progress = Progress::default();
    let fetched = fetch_to_pool(&client, &configured, &uri, "a", "default", &progress)
        .await
        .unwrap();
    let second_base = base_volume(&second_digest, ImageFormat::Qcow2);
    assert_eq!(fetched.base.volume, second_base);
    let read = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (read(&progress.done), read(&progress.total)),
        (second.len() as u64, second.len() as u64),
        "progress counts every byte of the upload"
    );

    // The old base's marker lost (say, by hand) while an overlay uses it: a fetch
    // that would rewrite it refuses, naming the overlay, and leaves the base alone.
    let b = first_base.clone();
    with_session(&uri, move |s| s.delete_volume(&marker_name(&b)).unwrap()).await;
    let pinned_again = spec(
        format!("http://{server}/again.qcow2"),
        Some(first_digest.clone()),
        Some(ImageFormat::Qcow2),
    );
    served
        .lock()
        .unwrap()
        .insert("/again.qcow2".into(), first.clone());
    let err = fetch_to_pool(&client, &pinned_again, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ImageError::InUse { users, .. } if users == &vec![overlay.clone()])
            && err.class() == ErrorClass::Permanent,
        "{err}"
    );
    let (b, second_b, o, p) = (
        first_base.clone(),
        second_base.clone(),
        overlay.clone(),
        base_path.clone(),
    );
    with_session(&uri, move |s| {
        assert_eq!(
            s.volume_path(&b).unwrap(),
            Some(p),
            "the base in use is still there"
        );
        let head = s.read_small(&b, 4).unwrap().unwrap();
        assert_eq!(head, b"QFI\xfb", "and still holds its image");
        for v in [
            o,
            b.clone(),
            marker_name(&b),
            second_b.clone(),
            marker_name(&second_b),
        ] {
            s.delete_volume(&v).unwrap();
        }
        s.delete_volume(&pin_name(&format!("http://{server}/latest.qcow2")))
            .unwrap();
    })
    .await;
    link.close().await;
}

#[tokio::test]
async fn format_comes_from_the_bytes_and_failures_leave_nothing() {
    let bed = bed_or_skip!();
    egress_proxies::tls::ensure_crypto_provider();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();
    let client = Downloader::new(DownloadLimits::default()).unwrap();
    let (server, served) = image_server().await;

    // A raw disk image by URL is a raw base (never assumed qcow2).
    let mut raw = vec![0u8; 2 * 1024 * 1024];
    raw[510] = 0x55;
    raw[511] = 0xaa;
    raw.extend_from_slice(&qcow2_image(3)[..64]); // unique per run, still not a qcow2 header
    let raw_digest = sha(&raw);
    served.lock().unwrap().insert("/disk.img".into(), raw.clone());
    let url_image = spec(format!("http://{server}/disk.img"), None, None);
    let fetched = fetch_to_pool(&client, &url_image, &uri, "a", "default", &Progress::default())
        .await
        .unwrap();
    assert_eq!(
        (fetched.base.format, fetched.base.volume.as_str()),
        (
            ImageFormat::Raw,
            base_volume(&raw_digest, ImageFormat::Raw).as_str()
        )
    );

    // Declared qcow2, but the bytes are raw: refused, naming both.
    let declared = spec(
        format!("http://{server}/disk.img"),
        Some(raw_digest.clone()),
        Some(ImageFormat::Qcow2),
    );
    let err = fetch_to_pool(&client, &declared, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::FormatMismatch {
                declared: "qcow2",
                detected: "raw",
                ..
            }
        ) && err.class() == ErrorClass::Permanent,
        "{err}"
    );

    // Bad digest: an error naming both, and no base left.
    let image = qcow2_image(4);
    let digest = sha(&image);
    served.lock().unwrap().insert("/img.qcow2".into(), image.clone());
    served
        .lock()
        .unwrap()
        .insert("/cut/img.qcow2".into(), image.clone());
    let wrong = "0".repeat(64);
    let bad = spec(
        format!("http://{server}/img.qcow2"),
        Some(wrong.clone()),
        Some(ImageFormat::Qcow2),
    );
    let err = fetch_to_pool(&client, &bad, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Permanent);
    assert!(
        err.to_string().contains(&wrong) && err.to_string().contains(&digest),
        "{err}"
    );
    let missing = spec(format!("http://{server}/missing"), None, None);
    let err = fetch_to_pool(&client, &missing, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ImageError::Http { status: 404, .. }) && err.class() == ErrorClass::Permanent,
        "{err}"
    );
    let cut = spec(format!("http://{server}/cut/img.qcow2"), None, None);
    let err = fetch_to_pool(&client, &cut, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");

    let raw_base = base_volume(&raw_digest, ImageFormat::Raw);
    with_session(&uri, move |s| {
        for gone in [
            base_volume(&wrong, ImageFormat::Qcow2),
            base_volume(&digest, ImageFormat::Qcow2),
            pin_name(&format!("http://{server}/cut/img.qcow2")),
        ] {
            assert_eq!(s.volume_path(&gone).unwrap(), None, "{gone} left behind");
            assert_eq!(s.volume_path(&marker_name(&gone)).unwrap(), None);
        }
        for v in [
            raw_base.clone(),
            marker_name(&raw_base),
            pin_name(&format!("http://{server}/disk.img")),
        ] {
            s.delete_volume(&v).unwrap();
        }
    })
    .await;
    link.close().await;
}

/// A qcow2 made by `qemu-img create` with `args` (in a scratch directory
/// holding an empty raw `base.raw`), plus a nonce so every run's image is new.
fn qemu_img_image(args: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("qemu-img")
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["create", "-q", "-f", "raw", "base.raw", "1M"]);
    run(args);
    let mut bytes = std::fs::read(dir.path().join("image.qcow2")).unwrap();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    bytes.extend_from_slice(format!("{nonce}").as_bytes());
    bytes
}

#[tokio::test]
async fn images_naming_other_files_or_too_large_are_refused_and_leave_nothing() {
    let bed = bed_or_skip!();
    egress_proxies::tls::ensure_crypto_provider();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();
    let client = Downloader::new(DownloadLimits::default()).unwrap();
    let (server, served) = image_server().await;
    let url = |path: &str| format!("http://{server}{path}");

    let backed = qemu_img_image(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        "image.qcow2",
    ]);
    let data_file = qemu_img_image(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "data_file=data.raw",
        "image.qcow2",
        "1M",
    ]);
    let big = qcow2_image(5);
    for (path, bytes) in [
        ("/backed.qcow2", &backed),
        ("/data-file.qcow2", &data_file),
        ("/big.qcow2", &big),
        ("/huge/big.qcow2", &big),
    ] {
        served.lock().unwrap().insert(path.into(), bytes.clone());
    }
    let mut never_in_pool = Vec::new();
    let mut refused = |image: ImageSpec, client: Downloader| {
        if let Some(base) = image.configured_base() {
            never_in_pool.push(marker_name(&base));
            never_in_pool.push(base);
        }
        never_in_pool.push(pin_name(&image.url));
        let uri = uri.clone();
        async move {
            fetch_to_pool(&client, &image, &uri, "a", "default", &Progress::default())
                .await
                .expect_err("the image must be refused")
        }
    };

    // (a) A backing file: refused after the upload (digest known) or after the
    // digest read (no digest), naming the file.
    for sha256 in [Some(sha(&backed)), None] {
        let image = spec(url("/backed.qcow2"), sha256, Some(ImageFormat::Qcow2));
        let err = refused(image, client.clone()).await;
        assert!(
            matches!(&err, ImageError::Unsafe { problem: Qcow2HeaderError::BackingFile { name }, .. } if name == "base.raw"),
            "{err}"
        );
        assert_eq!(err.class(), ErrorClass::Permanent);
        assert!(err.to_string().contains("backing file (\"base.raw\")"), "{err}");
    }

    // (b) An external data file (incompatible feature bit and its name).
    let image = spec(
        url("/data-file.qcow2"),
        Some(sha(&data_file)),
        Some(ImageFormat::Qcow2),
    );
    let err = refused(image, client.clone()).await;
    assert!(
        matches!(&err, ImageError::Unsafe { problem: Qcow2HeaderError::ExternalDataFile { name: Some(n) }, .. } if n == "data.raw"),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Permanent);

    // (c) Larger than the configured maximum: refused before a byte is written.
    let small = Downloader::new(DownloadLimits {
        max_bytes: 1 << 20,
        ..DownloadLimits::default()
    })
    .unwrap();
    for sha256 in [Some(sha(&big)), None] {
        let image = spec(url("/big.qcow2"), sha256, Some(ImageFormat::Qcow2));
        let err = refused(image, small.clone()).await;
        assert!(
            matches!(err, ImageError::TooLarge { limit: 1048576, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("kvm.maxImageSizeGb"), "{err}");
    }
    // ... or than the pool's free space (the server announces a petabyte).
    let unbounded = Downloader::new(DownloadLimits {
        max_bytes: u64::MAX,
        ..DownloadLimits::default()
    })
    .unwrap();
    for sha256 in [Some(sha(&big)), None] {
        let image = spec(url("/huge/big.qcow2"), sha256, Some(ImageFormat::Qcow2));
        let err = refused(image, unbounded.clone()).await;
        assert!(
            matches!(err, ImageError::NoRoom { size, available, .. } if size == 1 << 50 && available < size),
            "{err}"
        );
        assert_eq!(
            err.class(),
            ErrorClass::QuotaExceeded,
            "retried slowly: space may be freed"
        );
        assert!(err.to_string().contains("bytes free"), "{err}");
    }

    let gone = never_in_pool.clone();
    with_session(&uri, move |s| {
        for v in gone {
            assert_eq!(s.volume_path(&v).unwrap(), None, "{v} left in the pool");
        }
    })
    .await;

    // A base already in the pool (say, from an earlier version) is inspected
    // before use too, by lookup and by a fetch that finds it complete.
    let digest = sha(&backed);
    let base = base_volume(&digest, ImageFormat::Qcow2);
    let (b, bytes, d) = (base.clone(), backed.clone(), digest.clone());
    with_session(&uri, move |s| {
        for (name, content) in [(b.clone(), bytes), (marker_name(&b), d.into_bytes())] {
            s.delete_volume(&name).unwrap();
            s.create_volume(&name, &plain_volume_xml(&name, "raw", content.len() as u64))
                .unwrap();
            s.upload(&name, &content).unwrap();
        }
    })
    .await;
    let cached = spec(url("/backed.qcow2"), Some(digest), Some(ImageFormat::Qcow2));
    let c = cached.clone();
    let err = with_session(&uri, move |s| lookup(s, &c).unwrap_err()).await;
    assert!(
        matches!(&err, OpError::UnsafeBase { volume, problem: Qcow2HeaderError::BackingFile { .. } } if *volume == base),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Permanent);
    let err = fetch_to_pool(&client, &cached, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::UnsafeBase { .. }), "{err}");
    with_session(&uri, move |s| {
        s.delete_volume(&marker_name(&base)).unwrap();
        s.delete_volume(&base).unwrap();
    })
    .await;
    link.close().await;
}
