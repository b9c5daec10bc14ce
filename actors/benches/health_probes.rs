//! Health-probe throughput: N registered proxies probed at 1/s each by the
//! HealthProber, through one built-in forward proxy (its own process) to a
//! loopback target (its own process), so this process's CPU time is the
//! prober's alone. Reports probes/s, CPU seconds per 1,000 probes and RSS.
//!
//!   cargo bench -p egress-proxies-operator --bench health_probes -- [--proxies 500,2000,5000] [--seconds 20]
//!       [--scheme http|https] [--threads N] [--no-resumption]
//!
//! Probes run on the operator's probe threads (one per core unless
//! `--threads`). The https target issues session tickets, as public sites
//! do; `--no-resumption` makes it refuse to resume, so every probe pays a
//! full handshake.
//!
//! All traffic stays on 127.0.0.1.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::adapters::probe::Prober;
use egress_proxies::domain::health::{CheckSpec, ProbeTarget, Thresholds};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies_operator::health_prober::HealthVerdict;
use egress_proxies_operator::health_prober::{GetProberStats, HealthProber, ProbeThreads, Watch};

const TARGET_ROLE: &str = "EPO_BENCH_TARGET";

/// Counts the verdicts of every registration.
struct Sink(Arc<AtomicU64>);
impl Actor for Sink {
    type Context = Context<Self>;
}
impl Handler<HealthVerdict> for Sink {
    type Result = ();
    fn handle(&mut self, _: HealthVerdict, _: &mut Self::Context) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cpu_seconds() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).unwrap();
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(usage.user_time()) + t(usage.system_time())
}

fn rss_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// The target process: answers 204 to every request, over TLS when given a certificate.
fn serve_target(port: u16, tls: Option<(String, String)>, resumption: bool) {
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let config = tls.map(|(cert, key)| {
        use rustls::pki_types::pem::PemObject;
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .unwrap();
        if resumption {
            config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
        } else {
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
        Arc::new(config)
    });
    let threads = 2;
    let listener = Arc::new(listener);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (listener, config) = (listener.clone(), config.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let _ = stream.set_nodelay(true);
                    let answer = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
                    match &config {
                        None => {
                            let mut s = stream;
                            let mut buf = [0u8; 2048];
                            let _ = s.read(&mut buf);
                            let _ = s.write_all(answer);
                        }
                        Some(cfg) => {
                            let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) else {
                                continue;
                            };
                            let mut s = rustls::StreamOwned::new(conn, stream);
                            let mut buf = [0u8; 2048];
                            if s.read(&mut buf).is_ok() {
                                let _ = s.write_all(answer);
                                s.conn.send_close_notify();
                                let _ = s.flush();
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}

/// TLS handshakes of probes so far, (full, resumed), from the operator's own metric.
fn handshakes() -> (u64, u64) {
    let text = egress_proxies::telemetry::metrics().encode();
    let count = |kind: &str| {
        let prefix = format!("egress_proxies_health_probe_tls_handshakes_total{{kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (count("full"), count("resumed"))
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    if let Ok(port) = std::env::var(TARGET_ROLE) {
        let tls = std::env::var("EPO_BENCH_CERT")
            .ok()
            .zip(std::env::var("EPO_BENCH_KEY").ok());
        serve_target(
            port.parse().unwrap(),
            tls,
            std::env::var("EPO_BENCH_NO_RESUMPTION").is_err(),
        );
        return;
    }
    let sizes: Vec<usize> = arg("--proxies")
        .unwrap_or_else(|| "500,2000,5000".into())
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    let seconds: u64 = arg("--seconds").map(|s| s.parse().unwrap()).unwrap_or(20);
    let scheme = arg("--scheme").unwrap_or_else(|| "http".into());
    let resumption = !std::env::args().any(|a| a == "--no-resumption");
    let threads = match arg("--threads") {
        Some(n) => ProbeThreads::new(n.parse().unwrap()).unwrap(),
        None => ProbeThreads::per_core().unwrap(),
    };

    // The target, in its own process.
    let target_port = free_port();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let mut target = Command::new(std::env::current_exe().unwrap());
    target
        .env(TARGET_ROLE, target_port.to_string())
        .stdout(Stdio::null());
    if scheme == "https" {
        target
            .env("EPO_BENCH_CERT", cert.cert.pem())
            .env("EPO_BENCH_KEY", cert.signing_key.serialize_pem());
        if !resumption {
            target.env("EPO_BENCH_NO_RESUMPTION", "1");
        }
    }
    let _target = Kill(target.spawn().unwrap());
    // The built-in forward proxy, in its own process.
    let proxy_port = free_port();
    let _proxy = Kill(
        Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
            .args([
                "forward-proxy",
                "--listen",
                &format!("127.0.0.1:{proxy_port}"),
                // The target is on loopback, which the proxy refuses by default.
                "--allow",
                "127.0.0.0/8",
                "--allow",
                "1-65535",
                "--instance-dir",
                "/tmp",
            ])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(cert.cert.der().to_vec()))
        .unwrap();
    let url = match scheme.as_str() {
        "https" => format!("https://localhost:{target_port}/generate_204"),
        _ => format!("http://127.0.0.1:{target_port}/generate_204"),
    };

    println!(
        "scheme={scheme} resumption={resumption} duration={seconds}s interval=1s health-workers=64 cores={}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!(
        "| proxies | probes/s | failures | CPU s / 1,000 probes | CPU (cores) | RSS MiB (peak) | resumed |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let system = System::new();
    for n in sizes {
        let (url, roots, threads) = (url.clone(), roots.clone(), &threads);
        system.block_on(async move {
            let prober = HealthProber::new(Prober::with_roots(roots).unwrap(), 64, false)
                .on(threads)
                .start();
            let verdicts = Arc::new(AtomicU64::new(0));
            let sink = Sink(verdicts.clone()).start();
            let check = CheckSpec {
                url: url.parse().unwrap(),
                expected_status: None,
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(5),
                thresholds: Thresholds {
                    healthy: 2,
                    unhealthy: 3,
                },
            };
            for i in 0..n {
                prober.do_send(Watch {
                    key: ObjectKey::new("bench", format!("p{i}")),
                    target: std::sync::Arc::new(ProbeTarget {
                        uid: format!("uid-{i}"),
                        endpoint: format!("127.0.0.1:{proxy_port}"),
                        check: check.clone(),
                        credentials: None,
                        realm: None,
                        endpoint_policy: None,
                    }),
                    owner: sink.downgrade().recipient(),
                    recorded: None,
                });
            }
            // One interval to spread the start times, then measure.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let before = prober.send(GetProberStats).await.unwrap();
            let (cpu0, t0, tls0) = (cpu_seconds(), Instant::now(), handshakes());
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let after = prober.send(GetProberStats).await.unwrap();
            let (cpu, wall) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
            let probes = after.probes - before.probes;
            let failures = after.failures - before.failures;
            let tls = handshakes();
            let (full, resumed) = (tls.0 - tls0.0, tls.1 - tls0.1);
            println!(
                "| {n} | {:.0} | {failures} | {:.3} | {:.2} | {:.1} | {} |",
                probes as f64 / wall,
                cpu / (probes.max(1) as f64 / 1000.0),
                cpu / wall,
                rss_mib("VmHWM:"),
                match full + resumed {
                    0 => "-".to_owned(),
                    all => format!("{:.0} %", resumed as f64 * 100.0 / all as f64),
                },
            );
            System::current().stop();
        });
    }
}
