//! Image streaming into a KVM host's pool: the operator's fetch (HTTP
//! download → libvirt stream over its SSH link) against `virsh vol-upload`
//! of the same file over the same link, in the same run. Needs the kvm test
//! bed (`tests/kvm-testbed.sh up`, as root).
//!
//!   cargo bench -p egress-proxies-operator --bench image_upload -- [--mib 256,1024] [--rounds 3] [--without-digest]
//!
//! For each size: a file of random bytes (incompressible) served over
//! loopback HTTP (`sendfile`, its own threads); per round, `virsh vol-upload` into a fresh volume and a
//! fetch with its sha256 configured (or, with `--without-digest`, without:
//! a URL base, its marker and pin; one read of the body either way), each timed; the
//! fetch's peak RSS growth is read from `VmHWM` after resetting it. Before
//! each timed upload dirty pages are written out (`sync`), and the two take
//! turns going first. All
//! traffic stays on 127.0.0.1.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies::adapters::providers::kvm::base_image::{base_volume, marker_name, pin_name};
use egress_proxies::adapters::providers::kvm::host::HostSession;
use egress_proxies::adapters::providers::kvm::host::{Downloader, Progress, fetch_to_pool};
use egress_proxies::adapters::providers::kvm::host::{LinkTarget, SshLink};
use egress_proxies::adapters::providers::kvm::image::{DownloadLimits, ImageSpec};
use egress_proxies::adapters::providers::kvm::libvirt::ensure_client_setup;
use egress_proxies::adapters::providers::kvm::ssh_key::load_private_key;
use egress_proxies::domain::config::{Firmware, ImageFormat};
use sha2::Digest;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn bed() -> HashMap<String, String> {
    let text = std::fs::read_to_string("/run/epo-kvm-testbed/env")
        .expect("the kvm test bed is not up: run `sudo tests/kvm-testbed.sh up`");
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A memory figure of this process from `/proc/self/status` (`VmHWM:` the
/// peak RSS, `VmRSS:` the current one), in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Resets `VmHWM` to the current RSS (Linux `clear_refs` value 5).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Serves `file` at every path from threads of its own, with `sendfile`
/// (what `std::io::copy` does from a file to a socket): in production the
/// image server is another machine, so it should cost this one little.
fn file_server(file: Arc<Path>) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let file = file.clone();
            std::thread::spawn(move || {
                let mut request = vec![0u8; 4096];
                let _ = std::io::Read::read(&mut s, &mut request);
                let mut f = std::fs::File::open(&*file).unwrap();
                let len = f.metadata().unwrap().len();
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
                if s.write_all(head.as_bytes()).is_ok() {
                    let _ = std::io::copy(&mut f, &mut s);
                }
            });
        }
    });
    addr
}

fn virsh(uri: &str, args: &[&str]) {
    let out = std::process::Command::new("virsh")
        .args(["-q", "-c", uri])
        .args(args)
        .output()
        .expect("virsh");
    assert!(
        out.status.success(),
        "virsh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Dirty pages of earlier uploads written out, so each upload starts from
/// the same state (the source file stays in the page cache for both).
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

fn main() {
    let sizes: Vec<u64> = arg("--mib")
        .unwrap_or_else(|| "256,1024".into())
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    let rounds: usize = arg("--rounds").map_or(3, |n| n.parse().unwrap());
    let with_digest = !std::env::args().any(|a| a == "--without-digest");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(sizes, rounds, with_digest));
}

async fn run(sizes: Vec<u64>, rounds: usize, with_digest: bool) {
    let bed = bed();
    ensure_client_setup();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let target = LinkTarget {
        address: bed["EPO_KVM_HOST_A"].clone(),
        user: bed["EPO_KVM_USER"].clone(),
        remote_socket: "/var/run/libvirt/libvirt-sock".into(),
        known_hosts: Some(bed["EPO_KVM_KNOWN_HOSTS"].clone().into()),
    };
    let link = SshLink::dial(&target, key, Duration::from_secs(10))
        .await
        .unwrap();
    let uri = link.libvirt_uri();
    let client = Downloader::new(DownloadLimits {
        connect_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_redirects: 3,
        max_bytes: 64 << 30,
    })
    .unwrap();
    println!("| image | round | virsh vol-upload | operator fetch | fetch / virsh | fetch peak RSS growth |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for mib in sizes {
        let dir = tempfile::tempdir().unwrap();
        let path: Arc<Path> = dir.path().join("image.raw").into();
        let mut hasher = sha2::Sha256::new();
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&*path).unwrap());
            let mut block = vec![0u8; 1 << 20];
            for _ in 0..mib {
                fastrand::fill(&mut block);
                hasher.update(&block);
                f.write_all(&block).unwrap();
            }
        }
        let digest = hex::encode(hasher.finalize());
        let bytes = mib << 20;
        let server = file_server(path.clone());
        let spec = ImageSpec {
            url: format!("http://{server}/image.raw"),
            sha256: with_digest.then(|| digest.clone()),
            format: with_digest.then_some(ImageFormat::Raw),
            firmware: Firmware::Bios,
        };
        let base = base_volume(&digest, ImageFormat::Raw);
        let scratch = format!("bench-upload-{}.raw", &digest[..12]);
        // Everything a fetch or an upload may leave: `fetched` is the base a fetch wrote.
        let clean = |fetched: Option<String>| {
            let (uri, base, scratch) = (uri.clone(), base.clone(), scratch.clone());
            let pin = pin_name(&spec.url);
            move || {
                let s = HostSession::open(&uri, "a", "default").unwrap();
                let fetched = fetched.into_iter().flat_map(|f| [marker_name(&f), f]);
                for v in [base.clone(), marker_name(&base), scratch.clone(), pin]
                    .into_iter()
                    .chain(fetched)
                {
                    s.delete_volume(&v).unwrap();
                }
            }
        };
        blocking(clean(None)).await;
        // The download side alone (HTTP body read and hashed, nothing uploaded).
        let started = Instant::now();
        let mut body = reqwest::get(&spec.url).await.unwrap();
        let (mut hasher, mut chunks) = (sha2::Sha256::new(), 0u64);
        while let Some(chunk) = body.chunk().await.unwrap() {
            hasher.update(&chunk);
            chunks += 1;
        }
        assert_eq!(hex::encode(hasher.finalize()), digest);
        let secs = started.elapsed().as_secs_f64();
        println!(
            "<!-- {mib} MiB: download and hash alone {:.0} MiB/s, {chunks} chunks of {:.0} KiB on average -->",
            mib as f64 / secs,
            (bytes / chunks.max(1)) as f64 / 1024.0
        );
        for round in 1..=rounds {
            let virsh_upload = || {
                let (u, p, sc) = (uri.clone(), path.clone(), scratch.clone());
                blocking(move || {
                    virsh(
                        &u,
                        &[
                            "vol-create-as",
                            "default",
                            &sc,
                            &bytes.to_string(),
                            "--format",
                            "raw",
                        ],
                    );
                    settle();
                    let started = Instant::now();
                    virsh(&u, &["vol-upload", "--pool", "default", &sc, p.to_str().unwrap()]);
                    let secs = started.elapsed().as_secs_f64();
                    virsh(&u, &["vol-delete", "--pool", "default", &sc]);
                    secs
                })
            };
            let fetch = async || {
                blocking(settle).await;
                let rss_before = status_mib("VmRSS:");
                reset_peak_rss();
                let started = Instant::now();
                let fetched = fetch_to_pool(&client, &spec, &uri, "a", "default", &Progress::default())
                    .await
                    .unwrap();
                let secs = started.elapsed().as_secs_f64();
                let growth = status_mib("VmHWM:") - rss_before;
                assert_eq!(fetched.bytes, bytes, "the whole image was uploaded");
                assert_eq!(fetched.base.digest, digest);
                blocking(clean(Some(fetched.base.volume))).await;
                (secs, growth)
            };
            // Alternating which goes first, so neither always meets the
            // other's writeback.
            let (virsh_secs, (fetch_secs, growth)) = if round % 2 == 1 {
                let v = virsh_upload().await;
                (v, fetch().await)
            } else {
                let f = fetch().await;
                (virsh_upload().await, f)
            };

            let rate = |secs: f64| mib as f64 / secs;
            println!(
                "| {mib} MiB | {round} | {:.0} MiB/s ({virsh_secs:.2} s) | {:.0} MiB/s ({fetch_secs:.2} s) | {:.0} % | {growth:.1} MiB |",
                rate(virsh_secs),
                rate(fetch_secs),
                virsh_secs / fetch_secs * 100.0,
            );
        }
    }
    link.close().await;
}
