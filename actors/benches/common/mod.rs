//! What the benchmarks share: a keep-alive HTTP/1.1 client connection,
//! percentiles, a child process killed on drop, the local proxies an
//! operator leaves behind, its healthy proxies, and the fake API server
//! as a process ([`fake`]).
#![allow(
    dead_code,
    reason = "each test binary uses its own part of the shared support"
)]

pub mod fake;

use std::net::{IpAddr, SocketAddr};
use std::process::Child;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// One keep-alive connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Self {
        Self::wrap(TcpStream::connect(addr).await.unwrap(), addr)
    }

    /// From `source` (another loopback address: each counts as its own
    /// client for the API's per-client rate limit).
    pub async fn open_from(source: IpAddr, addr: SocketAddr) -> Self {
        Self::try_open_from(source, addr).await.unwrap()
    }

    /// [`Conn::open_from`], with a failure to connect as an error.
    pub async fn try_open_from(source: IpAddr, addr: SocketAddr) -> std::io::Result<Self> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(source, 0))?;
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream),
            addr,
        })
    }

    fn wrap(stream: TcpStream, addr: SocketAddr) -> Self {
        stream.set_nodelay(true).unwrap();
        Self {
            reader: BufReader::new(stream),
            addr,
        }
    }

    pub async fn call(&mut self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.try_call(method, path, body).await.unwrap()
    }

    /// [`Conn::call`], with the connection's failure as an error.
    pub async fn try_call(&mut self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        self.reader.get_mut().write_all(req.as_bytes()).await?;
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).await?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut payload = vec![0u8; length];
        self.reader.read_exact(&mut payload).await?;
        Ok((status, String::from_utf8_lossy(&payload).into_owned()))
    }
}

/// Seconds of CPU process `pid` has used so far, user and system (0 once
/// it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ")";
    // utime and stime are the 12th and 13th of them.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64);
    (ticks(11) + ticks(12)) / per_second
}

/// The `"id"` of a lease answer.
pub fn lease_id(body: &str) -> String {
    body.split("\"id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("")
        .to_owned()
}

/// The `p` quantile of sorted latencies, in ms.
pub fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// A child process, killed and reaped when dropped.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The load generator's runtime: one worker thread, leaving the other core
/// to the server under test.
pub fn load_generator_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The value after `--name` on the command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// A free port on 127.0.0.1.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// An HTTP server on loopback answering every request `204`: what health
/// probes and crawlers fetch.
pub async fn target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0
                        || s.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The local provider's instances' pids (`process.json`).
pub fn local_proxy_pids(state: &std::path::Path) -> Vec<i32> {
    let Ok(instances) = std::fs::read_dir(state.join("local/local/instances")) else {
        return Vec::new();
    };
    instances
        .flatten()
        .filter_map(|instance| {
            let record = std::fs::read_to_string(instance.path().join("process.json")).ok()?;
            let identity: serde_json::Value = serde_json::from_str(&record).ok()?;
            identity["pid"].as_i64().and_then(|p| i32::try_from(p).ok())
        })
        .collect()
}

/// Kills the local proxies an operator on `state` left running by design
/// (to adopt them at its next start), and what a killed Squid leaves.
pub fn reap_local_proxies(state: &std::path::Path) {
    for pid in local_proxy_pids(state) {
        // The process group of the proxy: it and anything it started.
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    // A killed Squid leaves its shared memory: its service is the instance's name without dashes.
    if let Ok(instances) = std::fs::read_dir(state.join("local/local/instances")) {
        for instance in instances.flatten() {
            remove_squid_segments(&instance.file_name().to_string_lossy().replace('-', ""));
        }
    }
}

/// Removes the shared memory segments a Squid service may leave behind.
pub fn remove_squid_segments(service: &str) {
    let prefix = format!("{service}-");
    if let Ok(entries) = std::fs::read_dir("/dev/shm") {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Proxies the discovery API at `api` lists as healthy (0 while it does not answer).
pub async fn healthy_proxies(client: &reqwest::Client, api: SocketAddr, token: &str) -> usize {
    match client
        .get(format!("http://{api}/v1/proxies?healthy=true"))
        .bearer_auth(token)
        .send()
        .await
    {
        Ok(r) => r.json::<Vec<serde_json::Value>>().await.map_or(0, |l| l.len()),
        Err(_) => 0,
    }
}
