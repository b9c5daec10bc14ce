//! Helpers for tests that run the operator binary and its neighbours as
//! processes: a child killed on drop, a free loopback port, a health target.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Child;

/// A child process, SIGKILLed and reaped when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback HTTP target answering `204 No Content` to anything, on its own
/// thread; returns its `/generate_204` URL.
pub fn health_target() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 2048];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
        }
    });
    format!("http://{addr}/generate_204")
}

/// The operator binary's built-in forward proxy on `127.0.0.1:port` — a
/// proxy "someone else" runs (External proxies, a fake cloud VM's proxy),
/// open to this machine's loopback targets on any port.
pub fn forward_proxy(bin: &str, port: u16, dir: &std::path::Path) -> Killed {
    Killed(
        std::process::Command::new(bin)
            .args([
                "forward-proxy",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--allow",
                "127.0.0.0/8",
                "--allow",
                "1-65535",
                "--instance-dir",
            ])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The live process a local-provider instance recorded at spawn
/// (`process.json` in its directory); `None` once it is gone.
pub fn instance_pid(instance_dir: &std::path::Path) -> Option<i32> {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(instance_dir.join("process.json")).ok()?).ok()?;
    let pid = i32::try_from(record["pid"].as_i64()?).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let start: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let alive = !rest.starts_with('Z') && Some(start) == record["startTicks"].as_u64();
    alive.then_some(pid)
}

/// The pid a local instance's proxy wrote into its pid file (the built-in
/// proxy's `proxy.pid`, or Squid's where the record names it): the process
/// an operator killed right after spawning it never recorded.
fn pid_file_pid(instance_dir: &std::path::Path) -> Option<i32> {
    if instance_dir.join("process.json").exists() {
        return None;
    }
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(instance_dir.join("instance.json")).ok()?).ok()?;
    let file = record["pidFile"].as_str()?;
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// SIGKILLs the process of the one local-provider instance under `state`,
/// found by the pid it recorded.
pub fn kill_local_instance(state: &std::path::Path) {
    let instance = std::fs::read_dir(state.join("local/local/instances"))
        .unwrap()
        .flatten()
        .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .unwrap()
        .path();
    let pid = instance_pid(&instance).expect("the instance's proxy process runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("killed the proxy process");
}

/// SIGKILLs, when dropped, every local-provider instance process recorded
/// under `state` (and its process group): a failing test leaves none behind.
pub struct InstanceReaper(pub std::path::PathBuf);

impl Drop for InstanceReaper {
    fn drop(&mut self) {
        let Ok(providers) = std::fs::read_dir(self.0.join("local")) else {
            return;
        };
        for provider in providers.flatten() {
            for instance in std::fs::read_dir(provider.path().join("instances"))
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Some(pid) = instance_pid(&instance.path()).or_else(|| pid_file_pid(&instance.path())) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

/// The operator binary (`bin`) in standalone mode on `dir/standalone.yaml`,
/// appending its text log to `dir/operator.log`; killed when dropped.
pub fn standalone(bin: &str, dir: &std::path::Path) -> Killed {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("operator.log"))
        .unwrap();
    Killed(
        std::process::Command::new(bin)
            .args(["standalone", "--log-format", "text", "--config"])
            .arg(dir.join("standalone.yaml"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Whether `pid` no longer runs (gone, or a zombie awaiting its reaper);
/// with its `/proc` stat line for assertion messages.
pub fn is_gone(pid: i32) -> (bool, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let gone = stat.is_empty() || stat.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'));
    (gone, stat)
}
