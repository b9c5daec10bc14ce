//! Instance processes: started here, known afterwards by their identity —
//! pid, start time and boot — recorded at spawn, never by scanning command
//! lines. A recycled pid has another start time, so a stale record can
//! never make us signal a stranger.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::domain::provider_contract::reason::{clip, telling_lines};

/// The identity file in the instance directory, written right after spawn.
pub const PROCESS_FILE: &str = "process.json";

/// Which process an instance runs: stable across operator restarts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessIdentity {
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot.
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id`: pids and ticks restart with the machine.
    pub boot_id: String,
}

/// What `/proc/<pid>/stat` says about a process.
struct Stat {
    state: char,
    start_ticks: u64,
}

fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    let (_, rest) = text.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); starttime is field 22.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

impl ProcessIdentity {
    /// The identity of the live process `pid`.
    pub fn of(pid: i32) -> io::Result<Self> {
        let stat = stat(pid).ok_or_else(|| io::Error::other(format!("process {pid} is not running")))?;
        Ok(Self {
            pid,
            start_ticks: stat.start_ticks,
            boot_id: boot_id()?,
        })
    }

    /// Whether this very process still runs (a zombie does not).
    pub fn is_alive(&self) -> bool {
        if boot_id().ok().as_deref() != Some(self.boot_id.as_str()) {
            return false;
        }
        stat(self.pid).is_some_and(|s| s.start_ticks == self.start_ticks && !matches!(s.state, 'Z' | 'X'))
    }

    /// When the process started, by the wall clock.
    pub fn started_at(&self) -> Option<Timestamp> {
        let btime: i64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
        let millis = i64::try_from(self.start_ticks).ok()?.checked_mul(1000)? / ticks;
        Timestamp::from_millisecond(btime.checked_mul(1000)?.checked_add(millis)?).ok()
    }

    pub fn read(dir: &Path) -> io::Result<Option<Self>> {
        match std::fs::read(dir.join(PROCESS_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn write(&self, dir: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        super::record::write_atomically(dir, PROCESS_FILE, &json)
    }

    /// The pid written in `pid_file`, if it names a process that started no
    /// earlier than `not_before` (the instance's creation): the fallback when
    /// the operator died between spawning and recording the process.
    pub fn from_pid_file(pid_file: &Path, not_before: Timestamp) -> Option<Self> {
        let pid: i32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
        let identity = Self::of(pid).ok()?;
        let slack = jiff::SignedDuration::from_secs(2);
        (identity.started_at()? >= not_before.checked_sub(slack).ok()?).then_some(identity)
    }
}

/// How a process this operator started ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit(pub ExitStatus);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::os::unix::process::ExitStatusExt;
        match (self.0.code(), self.0.signal()) {
            (Some(code), _) => write!(f, "exited with status {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(s) => write!(f, "was killed by signal {sig} ({})", s.as_str()),
                Err(_) => write!(f, "was killed by signal {sig}"),
            },
            (None, None) => write!(f, "ended ({})", self.0),
        }
    }
}

/// Exit statuses of processes this operator started, by identity (`None`
/// while running). A process that exits is reaped by the task that spawned
/// it, which records the status here; entries go when their instance is
/// deleted.
#[derive(Clone, Default)]
pub struct Exits(Arc<Mutex<HashMap<ProcessIdentity, Option<Exit>>>>);

/// How long a gone process's exit status may take to be reaped and recorded.
const REAP_WAIT: Duration = Duration::from_millis(500);

/// The only environment a proxy process gets. The operator's own holds
/// secrets (`DISCOVERY_TOKEN`, cloud credential paths, OTLP headers) that
/// are none of a proxy's business.
const PROXY_ENVIRONMENT: [(&str, &str); 2] = [("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), ("LC_ALL", "C")];

/// Replaces `cmd`'s environment with [`PROXY_ENVIRONMENT`].
pub fn clean_environment(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    cmd.env_clear().envs(PROXY_ENVIRONMENT)
}

impl Exits {
    /// How a process this operator started ended; `None` for one it did not
    /// start (its status is unknowable). A process that just died may still
    /// be a zombie for its reaper: waits briefly for the status.
    pub async fn of(&self, identity: &ProcessIdentity) -> Option<Exit> {
        let deadline = Instant::now() + REAP_WAIT;
        loop {
            match self.lock().get(identity) {
                None => return None,
                Some(Some(exit)) => return Some(*exit),
                Some(None) if Instant::now() >= deadline => return None,
                Some(None) => {}
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProcessIdentity, Option<Exit>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn forget(&self, identity: &ProcessIdentity) {
        self.lock().remove(identity);
    }

    fn started(&self, identity: ProcessIdentity) {
        self.lock().insert(identity, None);
    }

    fn record(&self, identity: ProcessIdentity, exit: Exit) {
        self.lock().insert(identity, Some(exit));
    }
}

/// Starts `cmd` in its own process group (so a Ctrl-C on the operator's
/// terminal does not reach it) with stdout and stderr in `log` and nothing of
/// the operator's environment ([`PROXY_ENVIRONMENT`]), records its
/// identity in `dir`, and reaps it in the background when it exits.
pub fn spawn(
    mut cmd: tokio::process::Command,
    dir: &Path,
    log: &Path,
    exits: &Exits,
) -> io::Result<ProcessIdentity> {
    let log = std::fs::File::create(log)?;
    clean_environment(&mut cmd)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false);
    let mut child = cmd.spawn()?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| io::Error::other("the spawned process has no pid"))?;
    // The child cannot be reaped before `wait` below, so /proc still has it.
    let identity = ProcessIdentity::of(pid)?;
    let recorded = identity.write(dir);
    exits.started(identity.clone());
    let exits = exits.clone();
    let waited = identity.clone();
    tokio::spawn(async move {
        if let Ok(status) = child.wait().await {
            exits.record(waited, Exit(status));
        }
    });
    recorded.map(|()| identity)
}

/// Stops the process (and its group): SIGTERM, then SIGKILL after `grace`.
/// Returns only once the process is gone.
pub async fn stop(identity: &ProcessIdentity, grace: Duration) -> io::Result<()> {
    let deadline = Instant::now() + grace;
    let mut signal = Signal::SIGTERM;
    loop {
        // Checked before every signal: a recycled pid is never signalled.
        if !identity.is_alive() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            signal = Signal::SIGKILL;
        }
        match killpg(Pid::from_raw(identity.pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
        if signal == Signal::SIGKILL && Instant::now() >= deadline + Duration::from_secs(5) {
            return Err(io::Error::other(format!(
                "process {} survived SIGKILL",
                identity.pid
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The built-in proxy of an instance made before processes were tracked by
/// pid: found once by `--instance-dir <dir>` on its command line, then
/// recorded like any other.
pub fn legacy_builtin(dir: &Path) -> Option<ProcessIdentity> {
    let wanted = [b"--instance-dir".as_slice(), dir.as_os_str().as_encoded_bytes()];
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| w == wanted)
            })
        })
        .and_then(|pid| ProcessIdentity::of(pid).ok())
        .filter(ProcessIdentity::is_alive)
}

/// What a log says about why its process ended: its last `lines` lines
/// that report an error (`FATAL`, `ERROR`, `error:`, a panic), else its
/// last `lines` lines, each cut to a readable length; empty without a log.
pub fn log_tail(path: &Path, lines: usize) -> Vec<String> {
    const MAX_LINE: usize = 240;
    // Only the end of a long log matters.
    const TAIL_BYTES: u64 = 16 * 1024;
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .is_err()
    {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    telling_lines(&all, lines)
        .into_iter()
        .map(|l| clip(l, MAX_LINE))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_not() {
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        let started = me.started_at().unwrap();
        assert!(started <= Timestamp::now());
        let recycled = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(
            !recycled.is_alive(),
            "same pid, other start time: another process"
        );
        let other_boot = ProcessIdentity {
            boot_id: "not-this-boot".into(),
            ..me
        };
        assert!(!other_boot.is_alive());
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_parses() {
        // The real parser on a real process whose comm holds ") (".
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("odd) (name");
        std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
        let mut child = std::process::Command::new(&exe).arg("5").spawn().unwrap();
        let identity = ProcessIdentity::of(child.id() as i32).unwrap();
        assert!(identity.is_alive());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!identity.is_alive());
    }

    #[tokio::test]
    async fn a_proxy_process_gets_none_of_the_operators_environment() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = tokio::process::Command::new("/bin/sleep");
        // As if inherited from the operator (or set by a careless caller).
        cmd.arg("5")
            .env("DISCOVERY_TOKEN", "s3cret")
            .env("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
            .env("GOOGLE_APPLICATION_CREDENTIALS", "/secrets/key.json");
        let exits = Exits::default();
        let identity = spawn(cmd, dir.path(), &dir.path().join("log"), &exits).unwrap();
        // Until the child has exec'd, /proc shows the forked copy's
        // environment; during exec the new image's `exe` is set before its
        // stack (and so its environment) exists, and `environ` reads empty.
        let sleep = std::fs::canonicalize("/bin/sleep").unwrap();
        let exe = format!("/proc/{}/exe", identity.pid);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let environ = loop {
            // `exe` first: once it names sleep, `environ` is the new image's.
            if std::fs::read_link(&exe).ok().as_ref() == Some(&sleep) {
                let environ = std::fs::read(format!("/proc/{}/environ", identity.pid)).unwrap();
                if !environ.is_empty() {
                    break environ;
                }
            }
            if std::time::Instant::now() >= deadline {
                break Vec::new();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // Stop it before asserting, so a failure leaves no process behind.
        stop(&identity, Duration::from_secs(2)).await.unwrap();
        assert!(!identity.is_alive());
        let mut seen: Vec<String> = environ
            .split(|b| *b == 0)
            .filter(|v| !v.is_empty())
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        seen.sort();
        assert_eq!(seen, ["LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
    }

    #[test]
    fn exit_statuses_read_as_sentences() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            Exit(ExitStatus::from_raw(1 << 8)).to_string(),
            "exited with status 1"
        );
        assert_eq!(
            Exit(ExitStatus::from_raw(9)).to_string(),
            "was killed by signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn log_tails_keep_the_last_lines_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let long = "y".repeat(1000);
        std::fs::write(&log, format!("one\n\ntwo\n{long}\nthree\n\n")).unwrap();
        let tail = log_tail(&log, 2);
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0].chars().count(), 241);
        assert_eq!(tail[1], "three");
        std::fs::write(
            &log,
            "start\nFATAL: Ipc::Mem::Segment::create failed\nTerminated abnormally.\nRemoving PID file\n",
        )
        .unwrap();
        assert_eq!(
            log_tail(&log, 3),
            ["FATAL: Ipc::Mem::Segment::create failed"],
            "error lines win over the last lines"
        );
        assert!(log_tail(&dir.path().join("missing"), 3).is_empty());
    }
}
