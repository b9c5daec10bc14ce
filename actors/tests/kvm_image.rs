//! Image fetch into the real daemon's pool over the SSH link, from a local
//! HTTP server: streamed with its digest, marker last; bad digests, HTTP
//! errors and cut-off downloads leave nothing behind.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use egress_proxies::config::ImageFormat;
use egress_proxies::kvm::image::{ImageError, fetch_to_pool, marker_name};
use egress_proxies::kvm::session::HostSession;
use egress_proxies::provider::ErrorClass;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves `body` at every path; `/missing` is 404, `/cut` stops half-way.
async fn image_server(body: Vec<u8>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Arc::new(body);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                if request.starts_with("GET /missing") {
                    let _ = s
                        .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let part = if request.starts_with("GET /cut") {
                    body.len() / 2
                } else {
                    body.len()
                };
                let _ = s.write_all(&body[..part]).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn images_stream_into_the_pool_with_their_digest() {
    let bed = bed_or_skip!();
    egress_proxies::tls::ensure_crypto_provider();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();

    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img.qcow2");
    assert!(
        std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&image)
            .arg("1G")
            .status()
            .unwrap()
            .success()
    );
    let mut bytes = std::fs::read(&image).unwrap();
    bytes.resize(bytes.len() + 3 * 1024 * 1024 + 17, 0xab); // a few MiB, several chunks
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    let server = image_server(bytes.clone()).await;
    let client = reqwest::Client::builder().build().unwrap();
    let volume = "base-imagetest.qcow2";

    let fetched = fetch_to_pool(
        &client,
        &format!("http://{server}/img.qcow2"),
        Some(&digest.to_uppercase()),
        &uri,
        "a",
        "default",
        volume,
    )
    .await
    .unwrap();
    assert_eq!(
        (fetched.digest.as_str(), fetched.bytes, fetched.format),
        (digest.as_str(), bytes.len() as u64, ImageFormat::Qcow2)
    );

    // Bad digest: an error naming both, and no base left.
    let wrong = "0".repeat(64);
    let err = fetch_to_pool(
        &client,
        &format!("http://{server}/img.qcow2"),
        Some(&wrong),
        &uri,
        "a",
        "default",
        "base-imagetest-bad.qcow2",
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Permanent);
    assert!(
        err.to_string().contains(&wrong) && err.to_string().contains(&digest),
        "{err}"
    );
    let err = fetch_to_pool(
        &client,
        &format!("http://{server}/missing"),
        None,
        &uri,
        "a",
        "default",
        "base-imagetest-404.qcow2",
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, ImageError::Http { status: 404, .. }) && err.class() == ErrorClass::Permanent,
        "{err}"
    );
    let err = fetch_to_pool(
        &client,
        &format!("http://{server}/cut"),
        None,
        &uri,
        "a",
        "default",
        "base-imagetest-cut.qcow2",
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");

    let uri2 = uri.clone();
    tokio::task::spawn_blocking(move || {
        let s = HostSession::open(&uri2, "a", "default").unwrap();
        assert!(s.volume_path(volume).unwrap().is_some());
        assert!(
            s.volume_path(&marker_name(volume)).unwrap().is_some(),
            "marker written"
        );
        for gone in [
            "base-imagetest-bad.qcow2",
            "base-imagetest-404.qcow2",
            "base-imagetest-cut.qcow2",
        ] {
            assert_eq!(s.volume_path(gone).unwrap(), None, "{gone} left behind");
            assert_eq!(s.volume_path(&marker_name(gone)).unwrap(), None);
        }
        s.delete_volume(volume).unwrap();
        s.delete_volume(&marker_name(volume)).unwrap();
    })
    .await
    .unwrap();
    link.close().await;
}
