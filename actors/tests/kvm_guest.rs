//! A Managed kvm Proxy end to end with a real booting guest, all on this
//! machine: the operator binary in standalone mode drives the test bed's
//! libvirt (`domainType: qemu`) over its sshd. The guest image
//! (tests/guest-image.sh) is served over HTTP on the bridge address and
//! fetched into the pool; the domain boots under UEFI, runs the Proxy's
//! user-data (which starts tinyproxy), reports its address through the guest
//! agent; the health engine probes through it to a target on the bridge
//! address; a lease hands it out and requests through it succeed; deleting
//! the Proxy leaves only the cached base on the host.
//!
//! Traffic stays on loopback and the test bed's bridge.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use egress_proxies::adapters::providers::kvm::base_image::{base_volume, marker_name};
use egress_proxies::domain::resource::Phase;
use sha2::Digest;
use support::operator::OperatorDir;

const BOOT_DEADLINE: Duration = Duration::from_secs(240);
const TARGET_BODY: &str = "hello from the bridge";

/// Serves `GET` of one file (the guest image) on `addr`, on its own thread.
fn file_server(bind: &str, file: PathBuf) -> String {
    let listener = TcpListener::bind((bind, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let file = file.clone();
            std::thread::spawn(move || {
                let _ = read_head(&mut stream);
                let body = std::fs::read(&file).unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
            });
        }
    });
    format!("http://{addr}/epo-guest.qcow2")
}

/// An image download that stalls after its first bytes until `release` is set.
fn stalled_server(bind: &str, release: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind((bind, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let release = release.clone();
            std::thread::spawn(move || {
                let _ = read_head(&mut stream);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\nQFI\xfb");
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    format!("http://{addr}/huge.qcow2")
}

/// The probe and request target: answers every request with `TARGET_BODY`.
fn target_server(bind: &str) -> std::net::SocketAddr {
    let listener = TcpListener::bind((bind, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                // Keep-alive through a CONNECT tunnel: answer each request.
                while read_head(&mut stream).is_some() {
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{TARGET_BODY}",
                        TARGET_BODY.len()
                    );
                    if stream.write_all(reply.as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Reads one request or response head.
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn virsh(args: &[&str]) -> String {
    let out = Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pool_volumes() -> Vec<String> {
    virsh(&["vol-list", "default"])
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn build_guest_image(out: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/guest-image.sh");
    let built = Command::new("bash")
        .arg(script)
        .arg(out)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(built.status.success(), "tests/guest-image.sh failed");
    PathBuf::from(String::from_utf8(built.stdout).unwrap().trim())
}

/// Minimal HTTP/1.1 exchange over one connection (answers with `Connection: close`).
fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn user_data(target_port: u16) -> String {
    format!(
        "#!/bin/sh\n\
         # The guest's proxy: tinyproxy on 3128, open to the bridge only.\n\
         cat > /run/tinyproxy.conf <<EOF\n\
         Port 3128\nListen 0.0.0.0\nTimeout 60\nMaxClients 50\n\
         Allow 10.213.77.0/24\nConnectPort {target_port}\nDisableViaHeader Yes\n\
         EOF\n\
         exec tinyproxy -d -c /run/tinyproxy.conf\n"
    )
}

#[tokio::test]
async fn a_kvm_proxy_boots_becomes_ready_is_leased_and_leaves_only_its_base() {
    let bed = bed_or_skip!();
    let work = tempfile::tempdir().unwrap();
    let image = build_guest_image(&work.path().join("image"));
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&image).unwrap()));
    let bridge_ip = bed["EPO_KVM_BRIDGE_ADDRESS"].clone();
    let image_url = file_server(&bridge_ip, image);
    let target = target_server(&bridge_ip);
    let release = Arc::new(AtomicBool::new(false));
    let stalled_url = stalled_server(&bridge_ip, release.clone());
    let base = base_volume(&digest, egress_proxies::domain::config::ImageFormat::Qcow2);
    // Fetched for real: no base from an earlier run.
    virsh(&["vol-delete", "--pool", "default", &marker_name(&base)]);
    virsh(&["vol-delete", "--pool", "default", &base]);

    let (host, user) = (&bed["EPO_KVM_HOST_A"], &bed["EPO_KVM_USER"]);
    let dir = OperatorDir::new(&format!(
        "providers:\n\
         - name: kvm-bed\n  type: kvm\n  kvm:\n\
         \x20   sshKeyFile: {key}\n    knownHostsFile: {known}\n    diskSizeGb: 1\n\
         \x20   images:\n      guest: {{url: \"{image_url}\", sha256: \"{digest}\", format: qcow2}}\n\
         \x20     stalled: {{url: \"{stalled_url}\"}}\n\
         \x20   machineTypes:\n      tiny: {{vcpus: 1, memoryMiB: 256}}\n\
         \x20   hosts:\n      - {{name: a, address: \"{host}\", user: {user}, bridge: {bridge}, \
         pool: default, domainType: qemu}}\n",
        key = bed["EPO_KVM_SSH_KEY"],
        known = bed["EPO_KVM_KNOWN_HOSTS"],
        bridge = bed["EPO_KVM_BRIDGE"],
    ));
    let op = dir
        .standalone()
        .discovery()
        .setting("manifestPollInterval", "200ms")
        .setting("leaseCooldown", "0s")
        .log_level("info")
        .start()
        .await;
    let api = op.discovery().to_string();

    // A proxy whose image download stalls: it must not hold up guest-1.
    dir.write_manifest(
        "stalled",
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: stalled-1, namespace: crawl}\n\
         spec:\n  mode: Managed\n  provider: kvm-bed\n  placement: {zone: a, machineType: tiny, image: stalled}\n\
         \x20 cloudInit: {inline: \"#!/bin/sh\\n\"}\n",
    );
    let cloud_init = user_data(target.port()).replace('\n', "\\n");
    let applied = Instant::now();
    dir.write_manifest(
        "guest",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: guest-1, namespace: crawl}}\n\
             spec:\n  mode: Managed\n  provider: kvm-bed\n  port: 3128\n\
             \x20 placement: {{zone: a, machineType: tiny, image: guest}}\n\
             \x20 cloudInit: {{inline: \"{cloud_init}\"}}\n\
             \x20 attributes: {{site: bridge}}\n\
             \x20 healthCheck: {{url: \"http://{target}/generate_204\", expectedStatus: 200, interval: 1s, timeout: 5s}}\n"
        ),
    );

    let named = |name: &str| dir.proxy(name);
    let proxy = || named("guest-1");
    let mut phases = Vec::new();
    let ready = op
        .eventually("guest-1 Ready", BOOT_DEADLINE, async || {
            let p = proxy()?;
            let status = p.status.clone()?;
            let phase = status.phase?;
            if phases.last() != Some(&phase) {
                eprintln!(
                    "{:>6.1}s guest-1 {phase:?} {}",
                    applied.elapsed().as_secs_f64(),
                    status.message.clone().unwrap_or_default()
                );
                phases.push(phase);
            }
            assert_ne!(phase, Phase::Failed, "{:?}\n{}", status.message, op.logs());
            (phase == Phase::Ready).then_some(p)
        })
        .await;
    let to_ready = applied.elapsed();
    eprintln!(
        "apply → Ready: {:.1} s (phases {phases:?})",
        to_ready.as_secs_f64()
    );

    // Meanwhile the stalled download kept stalled-1 waiting, saying why, and
    // nothing else; deleting it is served at once.
    let stalled = named("stalled-1").and_then(|p| p.status).unwrap_or_default();
    assert_eq!(stalled.phase, Some(Phase::Pending), "{stalled:?}");
    assert!(
        stalled
            .message
            .as_deref()
            .is_some_and(|m| m.contains("still being fetched")),
        "{stalled:?}"
    );
    // The dashboard's data sees the same: the host connected, the guest image
    // cached with its digest, the stalled one downloading with its progress.
    let answer = http(
        &api,
        "GET /v1/dashboard HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        dashboard["kvmHosts"],
        serde_json::json!([{"host": "a", "state": "connected", "connected": true, "restarts": 0}])
    );
    let images = dashboard["images"].as_array().unwrap();
    let image = |url: &str| {
        images
            .iter()
            .find(|i| i["url"] == url)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(image(&image_url)["state"], "cached", "{dashboard}");
    assert_eq!(image(&image_url)["digest"], digest.as_str());
    let stalled_image = image(&stalled_url);
    assert_eq!(stalled_image["state"], "fetching", "{dashboard}");
    assert_eq!(
        (&stalled_image["bytesDone"], &stalled_image["bytesTotal"]),
        (&serde_json::json!(4), &serde_json::json!(100000000))
    );

    dir.remove_manifest("stalled");
    op.eventually("stalled-1 deleted", Duration::from_secs(15), async || {
        named("stalled-1").is_none().then_some(())
    })
    .await;
    release.store(true, Ordering::SeqCst);
    let status = ready.status.unwrap();
    let provider_id = status.provider_id.clone().expect("providerID");
    let instance = provider_id.rsplit('/').next().unwrap().to_owned();
    assert_eq!(provider_id, format!("hosts/a/domains/{instance}"));
    let ip = status.ip.clone().expect("instance IP");
    assert!(
        ip.starts_with("10.213.77."),
        "address from the bridge's DHCP via the guest agent: {ip}"
    );
    assert!(
        pool_volumes().contains(&base) && pool_volumes().contains(&marker_name(&base)),
        "the image was fetched into the pool as {base}"
    );

    // A lease hands it out; a request through it reaches the target (absolute-URI and CONNECT).
    let body =
        r#"{"target":"bridge.test","selector":{"site":"bridge"},"ttlSeconds":60,"client":"kvm-guest-test"}"#;
    let answer = http(
        &api,
        &format!(
            "POST /v1/leases HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let lease: serde_json::Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    // The lease carries the instance's credentials, in the URL and apart.
    // (This guest's tinyproxy, from the test's own cloud-init, does not check
    // them; Squid configured from the sample cloud-init does.)
    let (user, password) = (
        lease["proxy"]["username"].as_str().unwrap(),
        lease["proxy"]["password"].as_str().unwrap(),
    );
    assert!(!user.is_empty() && !password.is_empty(), "{lease}");
    let proxy_url = lease["proxy"]["url"].as_str().unwrap().to_owned();
    assert_eq!(proxy_url, format!("http://{user}:{password}@{ip}:3128"));
    let proxy_addr = format!("{ip}:3128");
    let got = http(
        &proxy_addr,
        &format!("GET http://{target}/page HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n"),
    );
    assert!(
        got.starts_with("HTTP/1.") && got.ends_with(TARGET_BODY),
        "through the guest's proxy: {got}"
    );
    let mut tunnel = TcpStream::connect(&proxy_addr).unwrap();
    tunnel.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(tunnel, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let established = read_head(&mut tunnel).unwrap();
    assert!(established.contains(" 200 "), "{established}");
    write!(tunnel, "GET /tunnelled HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let mut reader = BufReader::new(tunnel);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "through the tunnel: {line}");

    // Deleting the Proxy removes the domain, its overlay and seed; the base stays cached.
    dir.remove_manifest("guest");
    op.eventually("guest-1 gone", Duration::from_secs(60), async || {
        proxy().is_none().then_some(())
    })
    .await;
    let domains = virsh(&["list", "--all", "--name"]);
    assert!(!domains.contains(&instance), "domain {instance} left: {domains}");
    let volumes = pool_volumes();
    let left: Vec<&String> = volumes.iter().filter(|v| v.contains(&instance)).collect();
    assert!(left.is_empty(), "instance volumes left: {left:?}");
    assert!(
        volumes.contains(&base) && volumes.contains(&marker_name(&base)),
        "the cached base stays: {volumes:?}"
    );

    let record = HashMap::from([("apply_to_ready_s", to_ready.as_secs_f64())]);
    eprintln!("KVM_GUEST_RESULT {record:?}");
}
