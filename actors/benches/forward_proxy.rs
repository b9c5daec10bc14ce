//! The built-in forward proxy against Squid, in one run: `ab -k -c 64`
//! (Apache Bench, keep-alive clients) fetches a small and a 1 MiB response
//! from a local nginx directly, through Squid and through the built-in
//! proxy (`egress-proxies-operator forward-proxy`), both configured as the
//! local provider runs them: credentials demanded, loopback allowed. Rounds
//! interleave the targets, so load from elsewhere hits all of them alike;
//! it reports requests/s and MB/s (min/median/max), the ratios built-in /
//! Squid per round, and whether they meet the targets (≥ 1.5× Squid's
//! requests/s on small responses, ≥ 3× its throughput on 1 MiB ones).
//!
//!   cargo bench -p egress-proxies-operator --bench forward_proxy -- [--rounds 3]
//!       [--small-requests 20000] [--large-requests 1000] [--concurrency 64]
//!       [--binary PATH] [--check]
//!
//! `--binary` measures another build of the operator (default: the one
//! Cargo built with this bench); `--check` exits 1 when a target is missed.
//! Needs `ab` (Debian: `apt-get install apache2-utils`), nginx
//! (`apt-get install nginx-light`) and Squid (`apt-get install squid`).
//! Every process it starts is stopped when it ends, fails or is
//! interrupted (SIGINT, SIGTERM, SIGHUP). All traffic stays on 127.0.0.1.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use egress_proxies::adapters::stores::credentials_file::write_credentials_file;
use egress_proxies::domain::credentials::ProxyCredentials;
use egress_proxies::domain::destinations::{
    DestinationEntry, DestinationPolicy, DestinationRules, squid_rules,
};
use egress_proxies::domain::provider_contract::squid_auth::auth_section;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

mod common;
use common::{arg, cpu_seconds, free_addr, remove_squid_segments};

/// The small response's body, in bytes.
const SMALL_BYTES: usize = 128;
/// The large response's body: 1 MiB.
const LARGE_BYTES: usize = 1 << 20;
/// Targets: at least this × Squid with the built-in proxy.
const SMALL_TARGET: f64 = 1.5;
const LARGE_TARGET: f64 = 3.0;
/// How long a process may take to listen, and to stop once asked.
const START_DEADLINE: Duration = Duration::from_secs(20);
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// Processes and the directory this run made, for the signal handler.
static STARTED: Mutex<Started> = Mutex::new(Started {
    pids: Vec::new(),
    dir: None,
    squid_service: None,
});

struct Started {
    pids: Vec<u32>,
    dir: Option<PathBuf>,
    squid_service: Option<String>,
}

/// Kills what this run started, removes its directory and exits; the
/// handler of SIGINT, SIGTERM and SIGHUP (the default ones would leave them
/// behind). Exits holding the lock, so the main thread cannot end the
/// process meanwhile with an exit code of its own.
fn clean_up_after_signal() -> ! {
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    // Asked first, so Squid reaps its helpers; killed and reaped after the deadline.
    let pids: Vec<Pid> = started.pids.drain(..).map(|p| Pid::from_raw(p as i32)).collect();
    for pid in &pids {
        let _ = kill(*pid, Signal::SIGTERM);
    }
    let deadline = Instant::now() + STOP_DEADLINE;
    let mut running = pids;
    while !running.is_empty() && Instant::now() < deadline {
        running.retain(|pid| {
            matches!(
                waitpid(*pid, Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive)
            )
        });
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in running {
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
    if let Some(dir) = started.dir.take() {
        let _ = std::fs::remove_dir_all(dir);
    }
    if let Some(service) = started.squid_service.take() {
        remove_squid_segments(&service);
    }
    reap_orphans();
    std::process::exit(130)
}

/// Reaps Squid's helpers, left to this process (the subreaper) when Squid ends.
fn reap_orphans() {
    let deadline = Instant::now() + STOP_DEADLINE;
    while Instant::now() < deadline {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(50)),
            Ok(_) => {}
            // ECHILD: none left.
            Err(_) => return,
        }
    }
}

fn watch_signals() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
            eprintln!("\ninterrupted: stopping every process this benchmark started");
            clean_up_after_signal();
        });
    });
}

/// A process this run started: asked to stop (SIGTERM), then killed, when dropped.
struct Process {
    name: &'static str,
    child: Child,
}

impl Process {
    fn spawn(name: &'static str, cmd: &mut Command) -> Result<Self, String> {
        // Held across spawn, so a signal cannot clean up between start and registration.
        let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        started.pids.push(child.id());
        Ok(Self { name, child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has exited already.
    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited ({status})", self.name)),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    /// Waits until `addr` accepts connections.
    fn wait_listening(&mut self, addr: SocketAddr) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            self.alive()?;
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} does not listen on {addr} after {START_DEADLINE:?}",
                    self.name
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let pid = self.child.id();
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let deadline = Instant::now() + STOP_DEADLINE;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
        started.pids.retain(|p| *p != pid);
    }
}

/// The run's directory, removed when dropped.
struct RunDir(tempfile::TempDir);

impl RunDir {
    fn new() -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("epo-bench-forward-proxy-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        STARTED.lock().unwrap_or_else(|e| e.into_inner()).dir = Some(dir.path().to_owned());
        Ok(Self(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        STARTED.lock().unwrap_or_else(|e| e.into_inner()).dir = None;
    }
}

/// `name` on PATH, or in the sbin directories a non-root PATH lacks.
fn find_tool(name: &str, package: &str) -> Result<PathBuf, String> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "`{name}` not found on PATH: this benchmark needs it (Debian: `apt-get install {package}`)"
            )
        })
}

/// A single nginx process (no master, so nothing outlives a kill) serving
/// `/small` and `/large` from `dir/www` on `addr`.
fn start_nginx(nginx: &Path, dir: &Path, addr: SocketAddr) -> Result<Process, String> {
    let www = dir.join("www");
    let io = |e: std::io::Error| format!("writing nginx's files: {e}");
    std::fs::create_dir_all(&www).map_err(io)?;
    std::fs::write(www.join("small"), "s".repeat(SMALL_BYTES)).map_err(io)?;
    std::fs::write(www.join("large"), vec![b'l'; LARGE_BYTES]).map_err(io)?;
    let d = dir.display();
    let conf = format!(
        "daemon off;\n\
         master_process off;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         access_log off;\n\
         sendfile on;\n\
         tcp_nopush on;\n\
         keepalive_requests 1000000;\n\
         default_type application/octet-stream;\n\
         client_body_temp_path {d}/nginx-body;\n\
         proxy_temp_path {d}/nginx-proxy;\n\
         fastcgi_temp_path {d}/nginx-fastcgi;\n\
         uwsgi_temp_path {d}/nginx-uwsgi;\n\
         scgi_temp_path {d}/nginx-scgi;\n\
         server {{ listen {addr}; root {www}; location / {{ }} }}\n\
         }}\n",
        www = www.display(),
    );
    let conf_file = dir.join("nginx.conf");
    std::fs::write(&conf_file, conf).map_err(io)?;
    let mut process = Process::spawn(
        "nginx",
        Command::new(nginx)
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("nginx-error.log"))
            .arg("-c")
            .arg(&conf_file)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )?;
    process.wait_listening(addr)?;
    Ok(process)
}

/// Squid as the local provider configures it (src/adapters/providers/local/squid.rs):
/// credentials checked by `basic_ncsa_auth`, the destination rules with
/// loopback allowed, no cache, an access log. As root it switches to
/// Debian's `proxy` user, who must own its directory.
fn start_squid(
    squid: &Path,
    dir: &Path,
    addr: SocketAddr,
    credentials: &ProxyCredentials,
    destinations: &DestinationPolicy,
    service: &SquidService,
) -> Result<Process, String> {
    let run_dir = dir.join("squid");
    let io = |e: std::io::Error| format!("writing Squid's files: {e}");
    std::fs::create_dir(&run_dir).map_err(io)?;
    let passwd = run_dir.join("passwd");
    let line = egress_proxies::adapters::random::htpasswd_line(credentials).map_err(|e| e.to_string())?;
    std::fs::write(&passwd, format!("{line}\n")).map_err(io)?;
    let user = if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("proxy")
            .ok()
            .flatten()
            .ok_or("running as root, Squid needs the user `proxy` (made by Debian's squid package)")?;
        // The temporary directory is private to root; Squid's user must pass through it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
        for path in [&run_dir, &passwd] {
            nix::unistd::chown(path.as_path(), Some(user.uid), Some(user.gid))
                .map_err(|e| format!("chown {}: {e}", path.display()))?;
        }
        format!("cache_effective_user {}\n", user.name)
    } else {
        String::new()
    };
    let d = run_dir.display();
    let conf = format!(
        "http_port {addr}\n\
         {user}\
         {auth}\
         {rules}\
         http_access allow all\n\
         via off\n\
         forwarded_for delete\n\
         max_filedescriptors 4096\n\
         cache deny all\n\
         cache_mem 8 MB\n\
         pinger_enable off\n\
         shutdown_lifetime 1 seconds\n\
         pid_filename {d}/squid.pid\n\
         cache_log {d}/cache.log\n\
         access_log stdio:{d}/access.log\n\
         coredump_dir {d}\n",
        auth = auth_section(&passwd, &credentials.realm()),
        rules = squid_rules(destinations),
    );
    let conf_file = run_dir.join("squid.conf");
    std::fs::write(&conf_file, conf).map_err(io)?;
    let mut process = Process::spawn(
        "squid",
        Command::new(squid)
            .arg("-N")
            .arg("-n")
            .arg(&service.0)
            .arg("-f")
            .arg(&conf_file)
            .current_dir(&run_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )?;
    process.wait_listening(addr)?;
    Ok(process)
}

/// Squid's service name (`squid -n`): Squid names its shared memory after
/// it, so this run has one of its own, whose segments go when dropped.
struct SquidService(String);

impl SquidService {
    fn new() -> Self {
        let name = format!("epobench{}", std::process::id());
        STARTED.lock().unwrap_or_else(|e| e.into_inner()).squid_service = Some(name.clone());
        Self(name)
    }
}

impl Drop for SquidService {
    fn drop(&mut self) {
        remove_squid_segments(&self.0);
        STARTED.lock().unwrap_or_else(|e| e.into_inner()).squid_service = None;
    }
}

/// The built-in proxy as the local provider starts it, with credentials
/// and loopback allowed.
fn start_builtin(
    binary: &Path,
    dir: &Path,
    addr: SocketAddr,
    credentials: &ProxyCredentials,
) -> Result<Process, String> {
    let instance = dir.join("builtin");
    std::fs::create_dir(&instance).map_err(|e| format!("creating {}: {e}", instance.display()))?;
    let file = instance.join("credentials");
    write_credentials_file(&file, credentials).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let mut process = Process::spawn(
        "built-in proxy",
        Command::new(binary)
            .arg("forward-proxy")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--instance-dir")
            .arg(&instance)
            .arg("--credentials-file")
            .arg(&file)
            .args(["--allow", "127.0.0.0/8", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )?;
    process.wait_listening(addr)?;
    Ok(process)
}

/// What one `ab` run reports.
#[derive(Clone, Debug, Default)]
struct AbResult {
    seconds: f64,
    complete: u64,
    failed: u64,
    non_2xx: u64,
    keep_alive: u64,
    body_bytes: u64,
    requests_per_second: f64,
}

impl AbResult {
    fn parse(out: &str) -> Result<Self, String> {
        let field = |name: &str| -> Option<f64> {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        let required = |name: &str| field(name).ok_or_else(|| format!("ab printed no `{name}`:\n{out}"));
        Ok(Self {
            seconds: required("Time taken for tests")?,
            complete: required("Complete requests")? as u64,
            failed: required("Failed requests")? as u64,
            non_2xx: field("Non-2xx responses").unwrap_or(0.0) as u64,
            keep_alive: field("Keep-Alive requests").unwrap_or(0.0) as u64,
            body_bytes: required("HTML transferred")? as u64,
            requests_per_second: required("Requests per second")?,
        })
    }

    /// Response bodies moved, in MB (10^6 bytes) per second.
    fn megabytes_per_second(&self) -> f64 {
        self.body_bytes as f64 / self.seconds / 1e6
    }
}

/// How to reach nginx: directly, or through a proxy with its credentials.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    Direct,
    Squid,
    Builtin,
}

impl Via {
    const ALL: [Via; 3] = [Via::Direct, Via::Squid, Via::Builtin];

    fn name(self) -> &'static str {
        match self {
            Via::Direct => "nginx direct",
            Via::Squid => "Squid",
            Via::Builtin => "built-in",
        }
    }
}

struct Bench {
    ab: PathBuf,
    nginx: SocketAddr,
    squid: SocketAddr,
    builtin: SocketAddr,
    credentials: String,
    concurrency: usize,
}

impl Bench {
    /// Runs `ab -k` for `requests` of `path` via `via`; `with_credentials`
    /// false leaves out `-P` (to see the proxies refuse).
    fn ab(&self, via: Via, path: &str, requests: usize, with_credentials: bool) -> Result<AbResult, String> {
        let mut cmd = Command::new(&self.ab);
        // -q: no progress lines; -r: a socket error counts as a failed request instead of ending ab.
        cmd.arg("-k")
            .arg("-q")
            .arg("-r")
            .args(["-c", &self.concurrency.min(requests).to_string()])
            .args(["-n", &requests.to_string()])
            .args(["-s", "60"]);
        let proxy = match via {
            Via::Direct => None,
            Via::Squid => Some(self.squid),
            Via::Builtin => Some(self.builtin),
        };
        if let Some(proxy) = proxy {
            cmd.arg("-X").arg(proxy.to_string());
            if with_credentials {
                cmd.arg("-P").arg(&self.credentials);
            }
        }
        cmd.arg(format!("http://{}{path}", self.nginx))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let process = Process::spawn("ab", &mut cmd)?;
        let output = wait_output(process)?;
        let out = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "ab via {} failed ({}): {}{}",
                via.name(),
                output.status,
                String::from_utf8_lossy(&output.stderr),
                out
            ));
        }
        AbResult::parse(&out)
    }

    /// One measured `ab` run; fails on any failed or non-2xx answer.
    fn measure(&self, via: Via, path: &str, requests: usize, bytes: usize) -> Result<AbResult, String> {
        let result = self.ab(via, path, requests, true)?;
        if result.complete != requests as u64 || result.failed != 0 || result.non_2xx != 0 {
            return Err(format!(
                "via {}: {} of {requests} requests complete, {} failed, {} non-2xx",
                via.name(),
                result.complete,
                result.failed,
                result.non_2xx
            ));
        }
        if result.body_bytes != (requests * bytes) as u64 {
            return Err(format!(
                "via {}: {} body bytes for {requests} responses of {bytes}",
                via.name(),
                result.body_bytes
            ));
        }
        Ok(result)
    }
}

/// `process`'s output once it ends (it stays registered for the signal handler until then).
fn wait_output(mut process: Process) -> Result<std::process::Output, String> {
    use std::io::Read;
    // stderr on a thread of its own, so neither pipe can fill up and stall the process.
    let stderr = process.child.stderr.take().map(|mut err| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            buf
        })
    });
    let mut stdout = Vec::new();
    if let Some(mut out) = process.child.stdout.take() {
        let _ = out.read_to_end(&mut stdout);
    }
    let stderr = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    let status = process
        .child
        .wait()
        .map_err(|e| format!("waiting for {}: {e}", process.name))?;
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// min / median / max.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (values[0], median, values[n - 1])
}

/// One measured run of one target.
struct Sample {
    round: usize,
    via: Via,
    large: bool,
    result: AbResult,
    server_cores: f64,
}

fn run() -> Result<bool, String> {
    let rounds: usize = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(3);
    let small_requests: usize = arg("--small-requests")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let large_requests: usize = arg("--large-requests")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let concurrency: usize = arg("--concurrency").and_then(|v| v.parse().ok()).unwrap_or(64);
    let binary = arg("--binary")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_egress-proxies-operator")));
    if !binary.is_file() {
        return Err(format!("--binary {}: no such file", binary.display()));
    }

    let ab = find_tool("ab", "apache2-utils")?;
    let nginx_bin = find_tool("nginx", "nginx-light")?;
    let squid_bin = find_tool("squid", "squid")?;

    let dir = RunDir::new()?;
    let credentials = ProxyCredentials::generate(&egress_proxies::adapters::random::SystemRandom)
        .map_err(|e| e.to_string())?;
    let rules = DestinationRules {
        allow: vec![
            "127.0.0.0/8"
                .parse::<DestinationEntry>()
                .map_err(|e| e.to_string())?,
        ],
        deny: Vec::new(),
    };
    let destinations = DestinationPolicy::new(&rules, &[]);
    let (nginx_addr, squid_addr, builtin_addr) = (free_addr(), free_addr(), free_addr());

    // Dropped in reverse: the proxies stop first, then nginx, then the files go.
    let service = SquidService::new();
    let mut nginx = start_nginx(&nginx_bin, dir.path(), nginx_addr)?;
    let mut squid = start_squid(
        &squid_bin,
        dir.path(),
        squid_addr,
        &credentials,
        &destinations,
        &service,
    )?;
    let mut builtin = start_builtin(&binary, dir.path(), builtin_addr, &credentials)?;

    let bench = Bench {
        ab,
        nginx: nginx_addr,
        squid: squid_addr,
        builtin: builtin_addr,
        credentials: format!("{}:{}", credentials.username, credentials.password),
        concurrency,
    };
    println!(
        "forward proxy benchmark: {} ({rounds} rounds; ab -k -c {concurrency}; small {SMALL_BYTES} B x {small_requests}, \
         1 MiB x {large_requests}); load average {}",
        binary.display(),
        load_average()
    );

    // Both proxies must refuse a request without credentials, so both pay for checking them.
    for via in [Via::Squid, Via::Builtin] {
        let refused = bench.ab(via, "/small", 1, false)?;
        if refused.non_2xx != 1 {
            return Err(format!("{} answered a request without credentials", via.name()));
        }
    }
    // Warm up: connections, Squid's credential cache, page cache.
    for via in Via::ALL {
        bench.measure(via, "/small", 2_000.min(small_requests), SMALL_BYTES)?;
        bench.measure(via, "/large", 64.min(large_requests), LARGE_BYTES)?;
    }

    let mut samples = Vec::new();
    for round in 0..rounds {
        for (large, path, requests, bytes) in [
            (false, "/small", small_requests, SMALL_BYTES),
            (true, "/large", large_requests, LARGE_BYTES),
        ] {
            // Rotate the order, so no target always runs after the same one.
            for i in 0..Via::ALL.len() {
                let via = Via::ALL[(i + round) % Via::ALL.len()];
                let server = match via {
                    Via::Direct => &mut nginx,
                    Via::Squid => &mut squid,
                    Via::Builtin => &mut builtin,
                };
                server.alive()?;
                let cpu_before = cpu_seconds(server.pid());
                let result = bench.measure(via, path, requests, bytes)?;
                let server_cores = (cpu_seconds(server.pid()) - cpu_before) / result.seconds;
                println!(
                    "round {} {:5} {:12}: {:>9.0} req/s {:>8.1} MB/s  keep-alive {:>3.0}%  server CPU {:.2} cores",
                    round + 1,
                    if large { "1MiB" } else { "small" },
                    via.name(),
                    result.requests_per_second,
                    result.megabytes_per_second(),
                    100.0 * result.keep_alive as f64 / result.complete as f64,
                    server_cores,
                );
                samples.push(Sample {
                    round,
                    via,
                    large,
                    result,
                    server_cores,
                });
            }
        }
    }
    println!("load average at the end: {}", load_average());
    let report = summary(&samples, rounds);
    print!("{}", report.text);

    Ok(report.met)
}

struct Report {
    text: String,
    met: bool,
}

fn summary(samples: &[Sample], rounds: usize) -> Report {
    let mut text = String::from(
        "\n| target | small: req/s (min / median / max) | server CPU | 1 MiB: MB/s (min / median / max) | server CPU |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let of = |via: Via, large: bool| samples.iter().filter(move |s| s.via == via && s.large == large);
    for via in Via::ALL {
        let small = spread(of(via, false).map(|s| s.result.requests_per_second).collect());
        let small_cpu = spread(of(via, false).map(|s| s.server_cores).collect());
        let large = spread(of(via, true).map(|s| s.result.megabytes_per_second()).collect());
        let large_cpu = spread(of(via, true).map(|s| s.server_cores).collect());
        let _ = writeln!(
            text,
            "| {} | {:.0} / {:.0} / {:.0} | {:.2} | {:.0} / {:.0} / {:.0} | {:.2} |",
            via.name(),
            small.0,
            small.1,
            small.2,
            small_cpu.1,
            large.0,
            large.1,
            large.2,
            large_cpu.1,
        );
    }
    let _ = writeln!(
        text,
        "\n(server CPU: median cores used by nginx, or by the proxy, during its runs)\n"
    );
    let mut met = true;
    for (large, target, what) in [
        (false, SMALL_TARGET, "small requests/s"),
        (true, LARGE_TARGET, "1 MiB MB/s"),
    ] {
        // Paired by round: both proxies ran back to back, under the same load.
        let ratios: Vec<f64> = (0..rounds)
            .filter_map(|round| {
                let value = |via: Via| {
                    of(via, large)
                        .find(|s| s.round == round)
                        .map(|s| s.result.requests_per_second)
                };
                Some(value(Via::Builtin)? / value(Via::Squid)?)
            })
            .collect();
        let (min, median, max) = spread(ratios);
        let pass = median >= target;
        met &= pass;
        let _ = writeln!(
            text,
            "built-in / Squid, {what}: {min:.2} / {median:.2} / {max:.2} (min / median / max of rounds); target >= {target}x: {}",
            if pass { "MET" } else { "MISSED" }
        );
    }
    Report { text, met }
}

fn main() -> ExitCode {
    // Squid's helpers outlive Squid briefly; as their subreaper this process reaps them.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    watch_signals();
    let check = std::env::args().any(|a| a == "--check");
    let outcome = run();
    reap_orphans();
    match outcome {
        Ok(met) if met || !check => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("--check: a target was missed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
