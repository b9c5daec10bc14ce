//! Helpers for tests that run processes: a child killed on drop, a reaper
//! of every process that belongs to a directory, local instances' processes,
//! a free loopback port, a health target.

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

/// What a finished child printed, and how long it ran.
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub took: std::time::Duration,
}

/// Waits for `child` (spawned with piped stdout and stderr) to exit within
/// `deadline`, reading its output on threads so a full pipe cannot stall
/// it; polls, so the caller's runtime keeps serving meanwhile. A child
/// still running at the deadline fails the test and is killed.
pub async fn finish_within(mut child: Killed, what: &str, deadline: std::time::Duration) -> Finished {
    let started = std::time::Instant::now();
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.0.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.0.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let status = super::eventually(
        &format!("{what} to finish (killed if it does not)"),
        deadline,
        async || child.0.try_wait().unwrap(),
    )
    .await;
    Finished {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        took: started.elapsed(),
    }
}

/// A loopback port nothing listens on right now, below the kernel's
/// ephemeral range (32768 and up by default): a port the kernel hands out
/// for `:0` is also what it hands the next outgoing connection, so a
/// process started on it later (an operator restarted on fresh ports) could
/// find it taken by a proxy's connection in between.
pub fn free_port() -> u16 {
    loop {
        let port = 20_000 + fastrand::u16(..12_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
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

/// Kills, when dropped, every process that belongs to a directory (see
/// [`reap_under`]): a test that fails half-way leaves none behind.
pub struct Reaper(pub std::path::PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        reap_under(&self.0);
    }
}

/// SIGKILLs every process that belongs to `dir` and returns once they are
/// gone: each local-provider instance recorded under it (`dir` or a
/// directory in it being a state directory), with its process group; then
/// every process whose command line names a path in `dir`, that runs in it
/// or holds a file in it open — a proxy killed before its record was
/// written, an operator, a test's own Squid. Never the calling process.
pub fn reap_under(dir: &std::path::Path) {
    for pid in recorded_instances(dir) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    // Not `eventually`: this runs in `Drop`, outside any runtime.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = processes_under(dir);
        if left.is_empty() {
            return;
        }
        if std::time::Instant::now() > deadline {
            // A panic here, during a failing test's unwinding, would abort it.
            eprintln!("processes of {} outlived SIGKILL: {left:?}", dir.display());
            return;
        }
        for pid in left {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The live processes of the local-provider instances under `dir` or a
/// directory in it (`<state>/local/<provider>/instances/<instance>`).
fn recorded_instances(dir: &std::path::Path) -> Vec<i32> {
    let children = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    std::iter::once(dir.to_owned())
        .chain(children)
        .flat_map(|state| {
            std::fs::read_dir(state.join("local"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .flat_map(|provider| {
            std::fs::read_dir(provider.path().join("instances"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter_map(|instance| instance_pid(&instance.path()))
        .collect()
}

/// Live processes (not zombies, not this one) whose command line names a
/// path in `dir`, whose working directory is in it or that hold a file in
/// it open.
pub fn processes_under(dir: &std::path::Path) -> Vec<i32> {
    let dirs: Vec<std::path::PathBuf> = [Some(dir.to_owned()), dir.canonicalize().ok()]
        .into_iter()
        .flatten()
        .collect();
    let inside = |path: &std::path::Path| dirs.iter().any(|d| path.starts_with(d));
    // `dir` itself or a path in it, anywhere in an argument (`--flag=/dir/x`).
    let names = |arg: &str| {
        dirs.iter().any(|d| {
            let d = d.to_string_lossy();
            arg.match_indices(d.as_ref())
                .any(|(at, _)| matches!(arg[at + d.len()..].chars().next(), None | Some('/')))
        })
    };
    // A deleted directory reads as "<path> (deleted)".
    let link = |p: std::path::PathBuf| {
        std::fs::read_link(p).ok().map(|l| {
            let l = l.to_string_lossy().into_owned();
            std::path::PathBuf::from(l.strip_suffix(" (deleted)").unwrap_or(&l))
        })
    };
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(pid) = name.parse::<i32>() else {
            continue;
        };
        if name == me || is_gone(pid).0 {
            continue;
        }
        let proc = entry.path();
        let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
        let named = cmdline
            .split(|b| *b == 0)
            .any(|arg| names(&String::from_utf8_lossy(arg)));
        let runs_in = link(proc.join("cwd")).is_some_and(|cwd| inside(&cwd));
        let holds = || {
            std::fs::read_dir(proc.join("fd"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|fd| link(fd.path()))
                .any(|file| inside(&file))
        };
        if named || runs_in || holds() {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid` no longer runs (gone, or a zombie awaiting its reaper);
/// with its `/proc` stat line for assertion messages.
pub fn is_gone(pid: i32) -> (bool, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let gone = stat.is_empty() || stat.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'));
    (gone, stat)
}
