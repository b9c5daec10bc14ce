//! The operator binary as a process, the way every whole-binary test runs
//! it: an [`OperatorDir`] holds its configuration, manifests, state and
//! logs; an [`OperatorBuilder`] starts an [`OperatorProcess`] on it in
//! standalone mode or in Kubernetes mode against a (fake) API server.
//!
//! Nothing outlives a test: a process is SIGKILLed when dropped, and when
//! the directory goes — after the last process started on it — so does
//! every process that belongs to it, the proxies the operators left running
//! included (the operator leaves them running on purpose, to adopt them at
//! its next start).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_proxies::adapters::stores::embedded::read_snapshot;
use egress_proxies::domain::resource::{Phase, Proxy};

use super::process::{free_port, reap_under};
use super::{Look, eventually, eventually_explained};

pub const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");

/// The local provider running the built-in proxy, allowed to reach the
/// tests' targets on loopback.
pub const LOCAL_PROVIDER: &str = "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8]}}}\n";

/// How long an operator may take to answer `/healthz`, or to exit after SIGTERM.
const PATIENCE: Duration = Duration::from_secs(30);

/// A temporary directory operators run on: `providers.yaml`, manifests in
/// `proxies/`, state in `state/`, one log per process name. Clones share it.
#[derive(Clone)]
pub struct OperatorDir(Arc<Reaped>);

/// The directory, reaped of its processes before it is removed.
struct Reaped(tempfile::TempDir);

impl Drop for Reaped {
    fn drop(&mut self) {
        reap_under(self.0.path());
    }
}

impl OperatorDir {
    /// A fresh directory with `providers` as `providers.yaml` and an empty `proxies/`.
    pub fn new(providers: &str) -> Self {
        let dir = Self(Arc::new(Reaped(tempfile::tempdir().unwrap())));
        dir.write("providers.yaml", providers);
        std::fs::create_dir(dir.path().join("proxies")).unwrap();
        dir
    }

    pub fn path(&self) -> &Path {
        self.0.0.path()
    }

    /// The standalone state directory (and the default one in Kubernetes mode).
    pub fn state(&self) -> PathBuf {
        self.path().join("state")
    }

    /// Writes `contents` to `relative` in the directory, making its parents.
    pub fn write(&self, relative: &str, contents: impl AsRef<[u8]>) {
        let path = self.path().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    /// Declares a Proxy (standalone mode): `proxies/<file>.yaml`.
    pub fn write_manifest(&self, file: &str, yaml: &str) {
        self.write(&format!("proxies/{file}.yaml"), yaml);
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.path().join(format!("proxies/{file}.yaml"))).unwrap();
    }

    /// The stored Proxies (standalone mode); none before the state exists.
    pub fn proxies(&self) -> Vec<Proxy> {
        if !self.state().join("state.db").exists() {
            return Vec::new();
        }
        read_snapshot(&self.state()).unwrap_or_default()
    }

    pub fn proxy(&self, name: &str) -> Option<Proxy> {
        self.proxies()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    }

    /// The local provider's instance names, sorted.
    pub fn local_instances(&self) -> Vec<String> {
        let dir = self.state().join("local/local/instances");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// Every process's log, each headed by its file name.
    pub fn logs(&self) -> String {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        logs.iter()
            .map(|p| {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                format!("--- {}\n{text}", p.file_name().unwrap().to_string_lossy())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `egress-proxies-operator standalone` on this directory.
    pub fn standalone(&self) -> OperatorBuilder {
        OperatorBuilder::new(self.clone(), Mode::Standalone { config: None })
    }

    /// `egress-proxies-operator run` against the API server `kubeconfig` names.
    pub fn kubernetes(&self, kubeconfig: &str) -> OperatorBuilder {
        OperatorBuilder::new(
            self.clone(),
            Mode::Kubernetes {
                kubeconfig: kubeconfig.to_owned(),
            },
        )
    }
}

enum Mode {
    /// `config`: a configuration file to use as it is; by default one is written.
    Standalone {
        config: Option<PathBuf>,
    },
    Kubernetes {
        kubeconfig: String,
    },
}

/// How to start one operator process. Its listeners are on free loopback
/// ports: `/healthz` always (it is how [`OperatorBuilder::start`] knows the
/// process is up), discovery and metrics when asked for.
pub struct OperatorBuilder {
    dir: OperatorDir,
    mode: Mode,
    name: String,
    state: String,
    health: SocketAddr,
    discovery: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    gateway: Option<SocketAddr>,
    settings: Vec<(String, String)>,
    log_format: String,
    log_level: Option<String>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    user: Option<nix::unistd::User>,
    file_limit: Option<(u64, u64)>,
    /// Files of the test's bound over the machine's in a mount namespace of the process's own.
    private_files: Vec<(PathBuf, &'static str)>,
}

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

impl OperatorBuilder {
    fn new(dir: OperatorDir, mode: Mode) -> Self {
        Self {
            dir,
            mode,
            name: "operator".into(),
            state: "state".into(),
            health: free_addr(),
            discovery: None,
            metrics: None,
            gateway: None,
            settings: vec![("manifestPollInterval".into(), "100ms".into())],
            log_format: "text".into(),
            log_level: None,
            args: Vec::new(),
            env: Vec::new(),
            user: None,
            file_limit: None,
            private_files: Vec::new(),
        }
    }

    /// Names the process's files: `<name>.log` (appended to across
    /// restarts), `<name>.yaml` or `<name>.kubeconfig`. Default `operator`.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The state directory, relative to the directory (Kubernetes mode; default `state`).
    pub fn state(mut self, relative: &str) -> Self {
        self.state = relative.to_owned();
        self
    }

    /// Serves the discovery API on a free port.
    pub fn discovery(self) -> Self {
        self.discovery_at(free_addr())
    }

    pub fn discovery_at(mut self, addr: SocketAddr) -> Self {
        self.discovery = Some(addr);
        self
    }

    /// Serves metrics on a free port.
    pub fn metrics(self) -> Self {
        self.metrics_at(free_addr())
    }

    pub fn metrics_at(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// Serves the gateway on `addr` (`--gateway-bind-address`; in
    /// standalone mode the `gatewayBindAddress` setting).
    pub fn gateway_at(mut self, addr: SocketAddr) -> Self {
        self.gateway = Some(addr);
        if matches!(self.mode, Mode::Standalone { .. }) {
            self = self.setting("gatewayBindAddress", &format!("\"{addr}\""));
        }
        self
    }

    /// Where `/healthz` is (for a configuration file given as it is).
    pub fn health_at(mut self, addr: SocketAddr) -> Self {
        self.health = addr;
        self
    }

    /// A line of the standalone configuration (`key: value`), replacing the default one.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        self.settings.retain(|(k, _)| k != key);
        self.settings.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Standalone mode on this configuration file, used as it is (its
    /// addresses must be told with the `_at` methods).
    pub fn config(mut self, relative: &str) -> Self {
        self.mode = Mode::Standalone {
            config: Some(self.dir.path().join(relative)),
        };
        self
    }

    /// `text` (the default) or `json`.
    pub fn log_format(mut self, format: &str) -> Self {
        self.log_format = format.to_owned();
        self
    }

    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = Some(level.to_owned());
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable. The operator gets no other of the test
    /// runner's than `PATH` and `TMPDIR`.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs as `user` (with `HOME` the directory).
    pub fn run_as(mut self, user: &nix::unistd::User) -> Self {
        self.user = Some(user.clone());
        self
    }

    /// Starts it under `prlimit --nofile=<soft>:<hard>` (the operator may
    /// raise the soft limit up to the hard one).
    pub fn file_limit(mut self, soft: u64, hard: u64) -> Self {
        self.file_limit = Some((soft, hard));
        self
    }

    /// Runs it (and the proxies it starts) with `file` in place of
    /// `target` (`/etc/hosts`, `/etc/resolv.conf`), in a mount namespace of
    /// its own: names of the test's choosing resolve to loopback addresses
    /// of its choosing, the machine's files untouched. Root only (see
    /// [`can_replace_etc_files`]).
    pub fn private_file(mut self, file: &Path, target: &'static str) -> Self {
        self.private_files.push((file.to_owned(), target));
        self
    }

    fn address(addr: Option<SocketAddr>) -> String {
        addr.map_or_else(|| "0".to_owned(), |a| a.to_string())
    }

    fn command(&self) -> Command {
        let dir = self.dir.path();
        let mut cmd = match (self.file_limit, self.private_files.is_empty()) {
            // prlimit execs the binary: the pid stays the operator's.
            (Some((soft, hard)), _) => {
                let mut cmd = Command::new("prlimit");
                cmd.arg(format!("--nofile={soft}:{hard}")).arg("--").arg(BIN);
                cmd
            }
            // unshare and sh exec too: the pid stays the operator's.
            (None, false) => {
                let mut script = String::new();
                for (file, target) in &self.private_files {
                    script.push_str(&format!("mount --bind '{}' '{target}' && ", file.display()));
                }
                script.push_str(r#"exec "$0" "$@""#);
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                    .arg(script)
                    .arg(BIN);
                cmd
            }
            (None, true) => Command::new(BIN),
        };
        match &self.mode {
            Mode::Standalone { config } => {
                let config = config.clone().unwrap_or_else(|| {
                    let mut text = format!(
                        "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: {}\n\
                         healthProbeBindAddress: \"{}\"\ndiscoveryBindAddress: \"{}\"\nmetricsBindAddress: \"{}\"\n",
                        self.state,
                        self.health,
                        Self::address(self.discovery),
                        Self::address(self.metrics),
                    );
                    for (key, value) in &self.settings {
                        text.push_str(&format!("{key}: {value}\n"));
                    }
                    let file = dir.join(format!("{}.yaml", self.name));
                    std::fs::write(&file, text).unwrap();
                    file
                });
                cmd.arg("standalone").arg("--config").arg(config);
            }
            Mode::Kubernetes { kubeconfig } => {
                std::fs::write(dir.join(format!("{}.kubeconfig", self.name)), kubeconfig).unwrap();
                cmd.arg("run")
                    .arg("--providers-config")
                    .arg(dir.join("providers.yaml"))
                    .arg("--state-dir")
                    .arg(dir.join(&self.state))
                    .arg("--health-probe-bind-address")
                    .arg(self.health.to_string())
                    .arg("--discovery-bind-address")
                    .arg(Self::address(self.discovery))
                    .arg("--metrics-bind-address")
                    .arg(Self::address(self.metrics));
                if let Some(gateway) = self.gateway {
                    cmd.arg("--gateway-bind-address").arg(gateway.to_string());
                }
            }
        }
        cmd.args(["--log-format", &self.log_format]);
        if let Some(level) = &self.log_level {
            cmd.args(["--log-level", level]);
        }
        cmd.args(&self.args);
        // Nothing of the runner's environment (a DISCOVERY_TOKEN, OTEL_*,
        // POD_NAME...) changes what the test runs.
        cmd.env_clear();
        for key in ["PATH", "TMPDIR"] {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
        if let Mode::Kubernetes { .. } = self.mode {
            cmd.env("KUBECONFIG", dir.join(format!("{}.kubeconfig", self.name)));
        }
        if let Some(user) = &self.user {
            use std::os::unix::process::CommandExt;
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw()).env("HOME", dir);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.current_dir(dir);
        cmd
    }

    /// Starts the process and returns at once.
    pub fn spawn(self) -> OperatorProcess {
        let log = self.dir.path().join(format!("{}.log", self.name));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        OperatorProcess {
            child: Mutex::new(child),
            log,
            health: self.health,
            discovery: self.discovery,
            metrics: self.metrics,
            gateway: self.gateway,
            dir: self.dir,
        }
    }

    /// Starts the process and returns once it answers `/healthz`.
    pub async fn start(self) -> OperatorProcess {
        let operator = self.spawn();
        operator.wait_healthy().await;
        operator
    }
}

/// Whether [`OperatorBuilder::private_file`] works here: as root, with
/// `unshare` installed.
pub fn can_replace_etc_files() -> bool {
    nix::unistd::geteuid().is_root()
        && Command::new("unshare")
            .args(["--mount", "--", "true"])
            .status()
            .is_ok_and(|s| s.success())
}

/// One running operator; SIGKILLed when dropped. Keeps its directory.
pub struct OperatorProcess {
    child: Mutex<Child>,
    log: PathBuf,
    health: SocketAddr,
    discovery: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    gateway: Option<SocketAddr>,
    /// Dropped after the process is killed: the directory goes last.
    dir: OperatorDir,
}

impl OperatorProcess {
    /// `/healthz` and `/readyz`.
    pub fn health(&self) -> SocketAddr {
        self.health
    }

    /// The operator's pid.
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).id()
    }

    pub fn discovery(&self) -> SocketAddr {
        self.discovery.expect("started without .discovery()")
    }

    pub fn metrics(&self) -> SocketAddr {
        self.metrics.expect("started without .metrics()")
    }

    pub fn gateway(&self) -> SocketAddr {
        self.gateway.expect("started without .gateway_at()")
    }

    /// Its log: everything every process of its name wrote.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How it ended, once it has.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.child.lock().unwrap().try_wait().unwrap()
    }

    /// The end of its log, and how it ended if it did: for failure messages.
    fn explain(&self) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        let shown = &lines[lines.len().saturating_sub(200)..];
        let exited = self
            .exited()
            .map(|s| format!("the operator exited: {s}\n"))
            .unwrap_or_default();
        format!(
            "{exited}--- {} (last {} of {} lines)\n{}",
            self.log.display(),
            shown.len(),
            lines.len(),
            shown.join("\n")
        )
    }

    /// [`eventually`](super::eventually), with this operator's log in the
    /// message when it times out.
    pub async fn eventually<L: Look>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl AsyncFnMut() -> L,
    ) -> L::Found {
        eventually_explained(what, timeout, || self.explain(), check).await
    }

    /// Waits until the standalone state holds `count` Proxies, all Ready.
    pub async fn wait_ready(&self, count: usize) {
        let what = format!("{count} proxies Ready");
        self.eventually(&what, PATIENCE, async || {
            let phases: Vec<Option<Phase>> = self
                .dir
                .proxies()
                .into_iter()
                .map(|p| p.status.and_then(|s| s.phase))
                .collect();
            if phases.len() == count && phases.iter().all(|p| *p == Some(Phase::Ready)) {
                Ok(())
            } else {
                Err(format!("{phases:?}"))
            }
        })
        .await;
    }

    /// Waits until `/healthz` answers 200.
    pub async fn wait_healthy(&self) {
        self.eventually("/healthz to answer 200", PATIENCE, async || {
            if let Some(status) = self.exited() {
                panic!(
                    "the operator exited before it answered /healthz: {status}\n{}",
                    self.explain()
                );
            }
            let answer = tokio::time::timeout(
                Duration::from_secs(2),
                super::http::try_request(self.health, "GET", "/healthz"),
            )
            .await;
            match answer {
                Ok(Ok(200)) => Ok(()),
                Ok(Ok(status)) => Err(format!("status {status}")),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer within 2 s".to_owned()),
            }
        })
        .await;
    }

    /// SIGKILL (a crash: nothing flushed), then waits for the exit.
    pub async fn kill(&self) -> ExitStatus {
        if let Some(status) = self.exited() {
            return status;
        }
        let pid = self.pid();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        );
        eventually("the operator to exit after SIGKILL", PATIENCE, async || {
            self.exited()
        })
        .await
    }

    /// SIGTERM (a graceful stop: the operator flushes what it holds), then
    /// waits for the exit.
    pub async fn stop(&self) -> ExitStatus {
        if let Some(status) = self.exited() {
            return status;
        }
        let pid = self.child.lock().unwrap().id();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        );
        eventually("the operator to exit after SIGTERM", PATIENCE, async || {
            self.exited()
        })
        .await
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}
