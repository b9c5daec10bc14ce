//! Starting, finding and stopping instance processes. A process belongs to
//! an instance when the instance directory appears on its command line.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::Launcher;
use super::record::InstanceRecord;
use super::squid::CONFIG_FILE;

/// Starts the instance's proxy in its own process group (so a Ctrl-C on the
/// operator's terminal does not reach it), logging into the instance directory.
pub fn spawn(dir: &Path, record: &InstanceRecord, launcher: &Launcher) -> io::Result<()> {
    let log = std::fs::File::create(dir.join("process.log"))?;
    let mut cmd = match launcher {
        Launcher::Squid(squid) => {
            let mut cmd = tokio::process::Command::new(squid);
            cmd.arg("-N").arg("-f").arg(dir.join(CONFIG_FILE));
            cmd
        }
        Launcher::Builtin(exe) => {
            let mut cmd = tokio::process::Command::new(exe);
            cmd.arg("forward-proxy")
                .arg("--listen")
                .arg(std::net::SocketAddr::new(record.listen, record.port).to_string())
                .arg("--instance-dir")
                .arg(dir);
            cmd
        }
    };
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false);
    // Dropping the handle leaves the process running; tokio reaps it if it exits.
    cmd.spawn().map(drop)
}

/// Live (non-zombie) processes whose command line names `dir`.
pub fn find(dir: &Path) -> Vec<Pid> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| names(*pid, &needle) && !is_zombie(*pid))
        .map(Pid::from_raw)
        .collect()
}

fn names(pid: i32, dir: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|b| *b == 0).any(|arg| {
        let arg = String::from_utf8_lossy(arg);
        arg == dir || PathBuf::from(arg.as_ref()).starts_with(dir)
    })
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
}

/// Stops every process of the instance: SIGTERM, then SIGKILL after `grace`.
pub async fn stop(dir: &Path, grace: Duration) -> io::Result<()> {
    let deadline = Instant::now() + grace;
    let mut signal = Signal::SIGTERM;
    loop {
        let pids = find(dir);
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            signal = Signal::SIGKILL;
        }
        for pid in &pids {
            match kill(*pid, signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        if signal == Signal::SIGKILL && Instant::now() >= deadline + Duration::from_secs(5) {
            return Err(io::Error::other(format!("processes {pids:?} survived SIGKILL")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
