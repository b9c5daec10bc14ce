//! Image fetches into the real daemon's pool over the SSH link, from a local
//! HTTP server: content-addressed bases, URL bases and pins for digest-less
//! URLs (each read once), format
//! from the magic bytes, no base ever replaced under an overlay, and bad
//! digests, HTTP errors and cut-off downloads leaving nothing behind;
//! images naming a backing or external data file, or too large for the
//! limit or the pool, refused before use with nothing left in the pool.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use egress_proxies::adapters::providers::kvm::base_image::{
    PoolName, base_volume, marker_name, pin_name, pin_of_url_base,
};
use egress_proxies::adapters::providers::kvm::host::HostSession;
use egress_proxies::adapters::providers::kvm::host::image_fetch::{
    Downloader, Progress, fetch_to_pool, lookup,
};
use egress_proxies::adapters::providers::kvm::image::{DownloadLimits, ImageError, ImageSpec};
use egress_proxies::adapters::providers::kvm::ops::OpError;
use egress_proxies::adapters::providers::kvm::qcow2_header::Qcow2HeaderError;
use egress_proxies::adapters::providers::kvm::volume_xml::overlay_volume_xml;
use egress_proxies::adapters::providers::kvm::volume_xml::plain_volume_xml;
use egress_proxies::domain::config::{Firmware, ImageFormat};
use egress_proxies::domain::provider_contract::ErrorClass;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Served = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// How many times each path was requested.
type Requests = Arc<Mutex<HashMap<String, usize>>>;

/// Serves the bytes registered for each path; unknown paths are 404,
/// `/cut/...` stops half-way through, `/huge/...` announces a petabyte.
async fn image_server() -> (SocketAddr, Served, Requests) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served: Served = Arc::default();
    let requests: Requests = Arc::default();
    let (files, counts) = (served.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (files, counts) = (files.clone(), counts.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
                *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
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
    (addr, served, requests)
}

/// Every volume in the pool a fetch of `url` without a digest may write:
/// its pin, its URL bases and their markers.
fn volumes_of_url(s: &HostSession, url: &str) -> Vec<String> {
    let pin = pin_name(url);
    s.volumes()
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .filter(|n| *n == pin || pin_of_url_base(n.trim_end_matches(".sha256")).as_ref() == Some(&pin))
        .collect()
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
async fn bases_are_written_once_read_once_and_never_replaced_under_an_overlay() {
    let bed = bed_or_skip!();
    egress_proxies::tls::ensure_crypto_provider();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();
    let client = Downloader::new(DownloadLimits::default()).unwrap();
    let (server, served, requests) = image_server().await;
    let serve = |path: &str, bytes: &Vec<u8>| {
        served.lock().unwrap().insert(path.into(), bytes.clone());
    };
    let reads = |path: &str| requests.lock().unwrap().get(path).copied().unwrap_or(0);

    // A `latest` URL without a digest: read once, straight into a base named
    // by the URL and this fetch, whose marker holds the digest; pinned.
    let first = qcow2_image(1);
    let first_digest = sha(&first);
    serve("/latest.qcow2", &first);
    let latest_url = format!("http://{server}/latest.qcow2");
    let latest = spec(latest_url.clone(), None, None);
    let progress = Progress::default();
    let fetched = fetch_to_pool(&client, &latest, &uri, "a", "default", &progress)
        .await
        .unwrap();
    assert_eq!(reads("/latest.qcow2"), 1, "the image is read once");
    let first_base = fetched.base.volume.clone();
    assert_eq!(PoolName::of(&first_base), PoolName::Base, "{first_base}");
    assert_eq!(pin_of_url_base(&first_base), Some(pin_name(&latest_url)));
    assert!(first_base.ends_with(".qcow2"), "{first_base}");
    assert_eq!(
        (fetched.base.digest.as_str(), fetched.base.format, fetched.bytes),
        (first_digest.as_str(), ImageFormat::Qcow2, first.len() as u64)
    );
    let read = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (read(&progress.done), read(&progress.total)),
        (first.len() as u64, first.len() as u64),
        "progress counts every byte once"
    );
    let (b, d, bytes) = (first_base.clone(), first_digest.clone(), first.clone());
    with_session(&uri, move |s| {
        let marker = s.read_small(&marker_name(&b), 128).unwrap().unwrap();
        assert_eq!(String::from_utf8(marker).unwrap(), d);
        let head = s.read_small(&b, 4096).unwrap().unwrap();
        assert_eq!(head, bytes[..4096], "the base holds the image's bytes");
    })
    .await;

    // A VM on it: an overlay backed by the base.
    let overlay = format!("proxy-imagetest{}.qcow2", &first_digest[..2]);
    let (b, o) = (first_base.clone(), overlay.clone());
    with_session(&uri, move |s| {
        let path = s.volume_path(&b).unwrap().unwrap();
        s.delete_volume(&o).unwrap();
        s.create_volume(&o, &overlay_volume_xml(&o, 1 << 30, &path, "qcow2"))
            .unwrap();
    })
    .await;

    // The URL now serves other bytes: the host stays pinned to what it first got.
    let second = qcow2_image(2);
    serve("/latest.qcow2", &second);
    let l = latest.clone();
    let pinned = with_session(&uri, move |s| lookup(s, &l).unwrap()).await;
    assert_eq!(
        pinned.map(|b| (b.volume, b.digest)),
        Some((first_base.clone(), first_digest.clone())),
        "pinned per host"
    );

    // The pin deleted by hand: the next fetch takes what the URL serves now,
    // into a base of its own beside the one the VM sits on.
    let p = pin_name(&latest_url);
    with_session(&uri, move |s| s.delete_volume(&p).unwrap()).await;
    let refetched = fetch_to_pool(&client, &latest, &uri, "a", "default", &Progress::default())
        .await
        .unwrap();
    assert_eq!(reads("/latest.qcow2"), 2);
    assert_ne!(refetched.base.volume, first_base);
    assert_eq!(refetched.base.digest, sha(&second));
    let l = latest.clone();
    let pinned = with_session(&uri, move |s| lookup(s, &l).unwrap()).await;
    assert_eq!(pinned.as_ref(), Some(&refetched.base));

    // A configured digest for the same bytes is a content-named base,
    // fetched straight into place.
    let second_digest = sha(&second);
    let configured = spec(
        latest_url.clone(),
        Some(second_digest.clone()),
        Some(ImageFormat::Qcow2),
    );
    let fetched = fetch_to_pool(&client, &configured, &uri, "a", "default", &Progress::default())
        .await
        .unwrap();
    let second_base = base_volume(&second_digest, ImageFormat::Qcow2);
    assert_eq!(fetched.base.volume, second_base);
    assert_eq!(reads("/latest.qcow2"), 3);

    // Another digest-less URL serving bytes already in the pool under their
    // content's name: read once, and the pin names that base (no second copy).
    serve("/copy.qcow2", &second);
    let copy_url = format!("http://{server}/copy.qcow2");
    let copy = spec(copy_url.clone(), None, None);
    let fetched = fetch_to_pool(&client, &copy, &uri, "a", "default", &Progress::default())
        .await
        .unwrap();
    assert_eq!(reads("/copy.qcow2"), 1);
    assert_eq!(fetched.base.volume, second_base);
    let (c, u) = (copy.clone(), copy_url.clone());
    let (looked_up, left) =
        with_session(&uri, move |s| (lookup(s, &c).unwrap(), volumes_of_url(s, &u))).await;
    assert_eq!(looked_up.map(|b| b.volume), Some(second_base.clone()));
    assert_eq!(
        left,
        vec![pin_name(&copy_url)],
        "only the pin: the copy was not kept"
    );

    // A pin of an earlier version (digest and format only) names the content's base.
    let legacy = spec(format!("http://{server}/legacy.qcow2"), None, None);
    let (l, d) = (legacy.clone(), second_digest.clone());
    let found = with_session(&uri, move |s| {
        let pin = pin_name(&l.url);
        let content = format!("{d} qcow2\n");
        s.delete_volume(&pin).unwrap();
        s.create_volume(&pin, &plain_volume_xml(&pin, "raw", content.len() as u64))
            .unwrap();
        s.upload(&pin, content.as_bytes()).unwrap();
        let found = lookup(s, &l).unwrap();
        s.delete_volume(&pin).unwrap();
        found
    })
    .await;
    assert_eq!(found.map(|b| b.volume), Some(second_base.clone()));
    assert_eq!(reads("/legacy.qcow2"), 0);

    // A base's marker lost (say, by hand) while an overlay uses it: a fetch
    // that would rewrite it refuses, naming the overlay, and leaves the base alone.
    let second_overlay = format!("proxy-imagetest{}.qcow2", &second_digest[..2]);
    let (b, o) = (second_base.clone(), second_overlay.clone());
    let second_path = with_session(&uri, move |s| {
        let path = s.volume_path(&b).unwrap().unwrap();
        s.delete_volume(&o).unwrap();
        s.create_volume(&o, &overlay_volume_xml(&o, 1 << 30, &path, "qcow2"))
            .unwrap();
        s.delete_volume(&marker_name(&b)).unwrap();
        path
    })
    .await;
    let err = fetch_to_pool(&client, &configured, &uri, "a", "default", &Progress::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ImageError::InUse { users, .. } if users == &vec![second_overlay.clone()])
            && err.class() == ErrorClass::Permanent,
        "{err}"
    );
    let (b, p) = (second_base.clone(), second_path.clone());
    let refetched_base = refetched.base.volume.clone();
    with_session(&uri, move |s| {
        assert_eq!(
            s.volume_path(&b).unwrap(),
            Some(p),
            "the base in use is still there"
        );
        let head = s.read_small(&b, 4).unwrap().unwrap();
        assert_eq!(head, b"QFI\xfb", "and still holds its image");
        for v in [
            overlay,
            second_overlay,
            first_base.clone(),
            marker_name(&first_base),
            refetched_base.clone(),
            marker_name(&refetched_base),
            b.clone(),
            marker_name(&b),
            pin_name(&latest_url),
            pin_name(&copy_url),
        ] {
            s.delete_volume(&v).unwrap();
        }
        assert_eq!(volumes_of_url(s, &latest_url), Vec::<String>::new());
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
    let (server, served, _) = image_server().await;

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
    let raw_base = fetched.base.volume.clone();
    assert_eq!(
        (fetched.base.format, fetched.base.digest.as_str()),
        (ImageFormat::Raw, raw_digest.as_str())
    );
    assert!(
        raw_base.ends_with(".raw") && pin_of_url_base(&raw_base) == Some(pin_name(&url_image.url)),
        "{raw_base}"
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

    with_session(&uri, move |s| {
        for gone in [
            base_volume(&wrong, ImageFormat::Qcow2),
            base_volume(&digest, ImageFormat::Qcow2),
            base_volume(&raw_digest, ImageFormat::Qcow2),
        ] {
            assert_eq!(s.volume_path(&gone).unwrap(), None, "{gone} left behind");
            assert_eq!(s.volume_path(&marker_name(&gone)).unwrap(), None);
        }
        let cut = volumes_of_url(s, &format!("http://{server}/cut/img.qcow2"));
        assert_eq!(cut, Vec::<String>::new(), "a cut-off download leaves nothing");
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
    let (server, served, requests) = image_server().await;
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
    let mut urls = Vec::new();
    let mut refused = |image: ImageSpec, client: Downloader| {
        if let Some(base) = image.configured_base() {
            never_in_pool.push(marker_name(&base));
            never_in_pool.push(base);
        }
        urls.push(image.url.clone());
        let uri = uri.clone();
        async move {
            fetch_to_pool(&client, &image, &uri, "a", "default", &Progress::default())
                .await
                .expect_err("the image must be refused")
        }
    };

    // (a) A backing file: refused from the image's first bytes, before
    // anything is written, naming the file.
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
        for url in urls {
            assert_eq!(volumes_of_url(s, &url), Vec::<String>::new(), "{url}");
        }
    })
    .await;
    assert_eq!(
        requests.lock().unwrap().get("/backed.qcow2").copied(),
        Some(2),
        "each fetch read the refused image once"
    );

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
