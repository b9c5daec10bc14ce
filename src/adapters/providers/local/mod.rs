//! The `local` provider (standalone mode): each instance is a forward proxy
//! process on this machine — Squid when installed, the built-in proxy
//! otherwise.
//!
//! Instances live in `<state>/local/<provider>/instances/<name>/`: a record
//! (the tags: managed, owning UID, creation time, port, outgoing address), the identity of the
//! process (pid, start time, boot) recorded when it was spawned, and its
//! output. Squid's own files (config, logs, pid file) live there too, or —
//! when the operator runs as root — in a run directory Squid's unprivileged
//! user can reach (see [`squid`]). Processes run in their own process group
//! and outlive the operator, like VMs outlive a cloud controller; a
//! restarted operator finds them again by their recorded identity.

mod destinations;
mod outgoing;
mod process;
mod record;
mod squid;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use crate::adapters::stores::credentials_file::write_credentials_file;
use crate::domain::config::{
    DEFAULT_RUN_DIRECTORY, DEFAULT_SQUID_USER, LocalConfig, LocalImplementation, OutgoingNetwork,
};
use crate::domain::credentials::ProxyCredentials;
use crate::domain::destinations::IpNet;
use crate::domain::provider_contract::{
    CreateRequest, ErrorClass, Instance, InstanceState, Op, Ownership, Provider, ProviderError, ProviderId,
};

use destinations::Destinations;
use process::{Exits, ProcessIdentity};
use record::{Implementation, InstanceRecord};
pub use squid::SquidRuntime;

/// Prefix of local providerIDs: `instances/<name>`.
const ID_PREFIX: &str = "instances/";
/// Grace between SIGTERM and SIGKILL on delete.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Output of the proxy process (stdout and stderr), in the instance directory.
const PROCESS_LOG: &str = "process.log";
/// The built-in proxy's pid file, in the instance directory.
const BUILTIN_PID_FILE: &str = "proxy.pid";
/// The built-in proxy's credentials (mode 0600), in the instance directory.
const BUILTIN_CREDENTIALS_FILE: &str = "credentials";
/// Log lines quoted when an instance stops.
const TAIL_LINES: usize = 3;

/// Which program runs the instances of this provider.
#[derive(Clone, Debug)]
pub enum Launcher {
    Squid(SquidRuntime),
    Builtin(PathBuf),
}

/// Building the provider failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("implementation squid was requested but no squid binary was found ({0})")]
    NoSquid(String),
    #[error("squidUser {0:?} does not exist on this machine")]
    NoSquidUser(String),
    #[error("creating {path}: {source}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Proxy processes on this machine.
pub struct LocalProvider {
    name: String,
    listen: IpAddr,
    instances_dir: PathBuf,
    launcher: Launcher,
    exits: Exits,
    destinations: Destinations,
    /// `outgoingAddresses`: each instance connects from one of its own.
    outgoing: Vec<OutgoingNetwork>,
    /// Held while a create picks an outgoing address and records it, so
    /// two creates never pick the same one.
    picking: std::sync::Mutex<()>,
}

impl LocalProvider {
    /// Keeps its instances under `state_dir`; the built-in proxy is
    /// `operator_exe` run as a helper; `cluster_networks` are denied like
    /// the other internal ranges.
    pub fn new(
        name: &str,
        config: LocalConfig,
        state_dir: &Path,
        operator_exe: PathBuf,
        cluster_networks: &[IpNet],
    ) -> Result<Self, LocalError> {
        let squid = match &config.squid_binary {
            Some(path) => which::which(path).map_err(|e| format!("{}: {e}", path.display())),
            None => which::which("squid").map_err(|e| format!("squid on PATH: {e}")),
        };
        let instances_dir = state_dir.join("local").join(name).join("instances");
        let state_error = |source| LocalError::StateDir {
            path: instances_dir.display().to_string(),
            source,
        };
        crate::private_files::private_dir(&instances_dir).map_err(state_error)?;
        let instances_dir = instances_dir.canonicalize().map_err(state_error)?;
        let launcher = match (config.implementation, squid) {
            (LocalImplementation::Builtin, _) | (LocalImplementation::Auto, Err(_)) => {
                Launcher::Builtin(operator_exe)
            }
            (_, Ok(binary)) => Launcher::Squid(squid_runtime(name, &config, binary, &instances_dir)?),
            (LocalImplementation::Squid, Err(why)) => return Err(LocalError::NoSquid(why)),
        };
        Ok(Self {
            name: name.to_owned(),
            listen: config.listen_address,
            instances_dir,
            launcher,
            exits: Exits::default(),
            destinations: Destinations::new(&config.destinations, cluster_networks),
            outgoing: config.outgoing_addresses,
            picking: std::sync::Mutex::default(),
        })
    }

    /// Squid or the built-in proxy, and where.
    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    fn error(
        &self,
        class: ErrorClass,
        op: Op,
        id: Option<&str>,
        cause: impl std::fmt::Display,
    ) -> ProviderError {
        ProviderError::new(class, op, &self.name, id, cause.to_string())
    }

    fn dir_of(&self, id: &ProviderId, op: Op) -> Result<(String, PathBuf), ProviderError> {
        let name = id
            .as_str()
            .strip_prefix(ID_PREFIX)
            .filter(|n| crate::domain::config::is_identifier(n))
            .ok_or_else(|| {
                self.error(
                    ErrorClass::Permanent,
                    op,
                    Some(id.as_str()),
                    "not a providerID of a local instance",
                )
            })?;
        Ok((name.to_owned(), self.instances_dir.join(name)))
    }

    /// The address clients use: the listen address, or loopback for a wildcard.
    fn client_ip(&self, listen: IpAddr) -> IpAddr {
        if listen.is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            listen
        }
    }

    async fn observe(&self, id: &ProviderId, dir: &Path, record: &InstanceRecord) -> Instance {
        let identity = identity(dir, record);
        let ip = self.client_ip(record.listen);
        let (state, reason) = match &identity {
            Some(p) if p.is_alive() => {
                if accepts(SocketAddr::new(ip, record.port)).await {
                    (InstanceState::Running, None)
                } else {
                    (InstanceState::Provisioning, None)
                }
            }
            _ => (
                InstanceState::Stopped,
                Some(self.stop_reason(dir, record, identity.as_ref()).await),
            ),
        };
        Instance {
            id: id.clone(),
            state,
            ip: (state == InstanceState::Running).then_some(ip),
            port: Some(record.port),
            outgoing_address: record.outgoing_address,
            owner: Ownership {
                uid: Some(record.uid.clone()),
                namespace: record.namespace.clone(),
                installation: record.installation.clone(),
                released: record.released,
            },
            created_at: Some(record.created_at),
            reason,
        }
    }

    /// Why an instance's process is not running: its exit status when this
    /// operator started it, and the last lines of its log.
    async fn stop_reason(
        &self,
        dir: &Path,
        record: &InstanceRecord,
        identity: Option<&ProcessIdentity>,
    ) -> String {
        let how = match identity {
            None => "no proxy process was ever recorded for the instance".to_owned(),
            Some(p) => match self.exits.of(p).await {
                Some(exit) => format!("the proxy process {exit}"),
                None => "the proxy process is gone (its exit status is unknown: it was started by an earlier run of the operator)".to_owned(),
            },
        };
        let mut tail = Vec::new();
        if record.implementation == Implementation::Squid {
            let run_dir = record.run_dir.as_deref().unwrap_or(dir);
            tail = process::log_tail(&run_dir.join(squid::CACHE_LOG), TAIL_LINES);
        }
        if tail.is_empty() {
            tail = process::log_tail(&dir.join(PROCESS_LOG), TAIL_LINES);
        }
        if tail.is_empty() {
            how
        } else {
            format!("{how}; its log ends: {}", tail.join(" | "))
        }
    }

    /// Lays out and starts the proxy of a new instance; with `credentials`
    /// it demands them.
    async fn start(
        &self,
        id: &ProviderId,
        dir: &Path,
        name: &str,
        credentials: Option<&ProxyCredentials>,
    ) -> Result<(), ProviderError> {
        let io = |e: std::io::Error| self.error(ErrorClass::Transient, Op::Create, Some(id.as_str()), e);
        let record = record::read(dir).map_err(io)?.ok_or_else(|| {
            self.error(
                ErrorClass::Transient,
                Op::Create,
                Some(id.as_str()),
                "record vanished",
            )
        })?;
        let cmd = match &self.launcher {
            Launcher::Squid(squid) => {
                let run_dir = squid.run_dir(dir, name);
                let service = squid::service_name(name);
                squid
                    .prepare(&run_dir, &record, credentials, &self.destinations.policy)
                    .map_err(io)?;
                // No Squid of this instance runs (it is being created): leftovers of a killed one go.
                squid::remove_segments(&service).map_err(io)?;
                if let Err(why) = squid.check(&run_dir, &service).await {
                    // Nothing was started: leave nothing behind, and say why.
                    if let Err(e) = remove_instance(dir, &record) {
                        tracing::warn!(providerID = %id, error = %e, "removing a never-started instance failed");
                    }
                    return Err(self.error(ErrorClass::Permanent, Op::Create, Some(id.as_str()), why));
                }
                let mut cmd = tokio::process::Command::new(&squid.binary);
                cmd.arg("-N")
                    .arg("-n")
                    .arg(&service)
                    .arg("-f")
                    .arg(run_dir.join(squid::CONFIG_FILE));
                cmd
            }
            Launcher::Builtin(exe) => {
                let mut cmd = tokio::process::Command::new(exe);
                cmd.arg("forward-proxy")
                    .arg("--listen")
                    .arg(SocketAddr::new(record.listen, record.port).to_string())
                    .arg("--instance-dir")
                    .arg(dir)
                    .arg("--pid-file")
                    .arg(dir.join(BUILTIN_PID_FILE))
                    .args(&self.destinations.builtin_args);
                if let Some(address) = record.outgoing_address {
                    cmd.arg("--outgoing-address").arg(address.to_string());
                }
                if let Some(credentials) = credentials {
                    let file = dir.join(BUILTIN_CREDENTIALS_FILE);
                    write_credentials_file(&file, credentials).map_err(io)?;
                    cmd.arg("--credentials-file").arg(file);
                }
                cmd
            }
        };
        let identity = process::spawn(cmd, dir, &dir.join(PROCESS_LOG), &self.exits).map_err(io)?;
        tracing::info!(
            provider = %self.name, providerID = %id, port = record.port, pid = identity.pid,
            implementation = record.implementation.as_str(),
            outgoing_address = record.outgoing_address.map(tracing::field::display), "local proxy process started"
        );
        Ok(())
    }
}

/// The Squid runtime of a provider: as root, a run directory per state
/// directory (two operators on one machine never share one) and Squid's user.
fn squid_runtime(
    name: &str,
    config: &LocalConfig,
    binary: PathBuf,
    instances_dir: &Path,
) -> Result<SquidRuntime, LocalError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(SquidRuntime {
            binary,
            user: None,
            run_root: None,
        });
    }
    let user_name = config.squid_user.as_deref().unwrap_or(DEFAULT_SQUID_USER);
    let user = nix::unistd::User::from_name(user_name)
        .ok()
        .flatten()
        .ok_or_else(|| LocalError::NoSquidUser(user_name.to_owned()))?;
    let base = config
        .run_directory
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIRECTORY));
    use sha2::Digest;
    let digest = hex::encode(&sha2::Sha256::digest(instances_dir.as_os_str().as_encoded_bytes())[..6]);
    Ok(SquidRuntime {
        binary,
        user: Some(user),
        run_root: Some(base.join(format!("{name}-{digest}"))),
    })
}

/// Which process serves the instance: the identity recorded at spawn; else
/// (the operator died between spawning and recording) the pid file the
/// proxy wrote, which is then recorded.
fn identity(dir: &Path, record: &InstanceRecord) -> Option<ProcessIdentity> {
    if let Ok(Some(identity)) = ProcessIdentity::read(dir) {
        return Some(identity);
    }
    let pid_file = match &record.pid_file {
        Some(file) => file.clone(),
        // Made before pid tracking: Squid wrote its pid file in the instance directory.
        None => dir.join(squid::PID_FILE),
    };
    let found = ProcessIdentity::from_pid_file(&pid_file, record.created_at).or_else(|| {
        // A built-in proxy made before pid tracking wrote no pid file.
        (record.pid_file.is_none() && record.implementation == Implementation::Builtin)
            .then(|| process::legacy_builtin(dir))
            .flatten()
    })?;
    if let Err(e) = found.write(dir) {
        tracing::warn!(instance = %dir.display(), error = %e, "recording an adopted proxy process failed");
    }
    Some(found)
}

/// Removes an instance's directories; a missing one is fine.
fn remove_instance(dir: &Path, record: &InstanceRecord) -> std::io::Result<()> {
    if let Some(run_dir) = &record.run_dir
        && run_dir != dir
    {
        remove_dir(run_dir)?;
        // The provider's run root goes with its last instance (a create
        // racing this re-creates it, or fails transiently and is retried).
        if let Some(root) = run_dir.parent() {
            let _ = std::fs::remove_dir(root);
        }
    }
    remove_dir(dir)
}

fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether the proxy accepts connections yet (it is Provisioning until then).
async fn accepts(addr: SocketAddr) -> bool {
    let connect = tokio::net::TcpStream::connect(addr);
    matches!(
        tokio::time::timeout(Duration::from_millis(500), connect).await,
        Ok(Ok(_))
    )
}

/// A free TCP port on `ip`, chosen by the kernel.
fn free_port(ip: IpAddr) -> std::io::Result<u16> {
    Ok(TcpListener::bind(SocketAddr::new(ip, 0))?.local_addr()?.port())
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "local"
    }

    // Its Squid's (or built-in proxy's) configuration is written here, with
    // the credentials' realm.
    fn names_own_realm(&self) -> bool {
        true
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let id = ProviderId(format!("{ID_PREFIX}{}", req.name));
        let dir = self.instances_dir.join(req.name.as_str());
        let io = |e: std::io::Error| self.error(ErrorClass::Transient, Op::Create, Some(id.as_str()), e);
        if dir.exists() {
            // Keyed on the name: a repeated create finds the instance it made.
            return Ok(id);
        }
        let port = free_port(self.listen).map_err(io)?;
        let (run_dir, pid_file) = match &self.launcher {
            Launcher::Squid(squid) => {
                let run_dir = squid.run_dir(&dir, req.name.as_str());
                let pid_file = run_dir.join(squid::PID_FILE);
                ((run_dir != dir).then_some(run_dir), pid_file)
            }
            Launcher::Builtin(_) => (None, dir.join(BUILTIN_PID_FILE)),
        };
        {
            let _picking = self.picking.lock().unwrap_or_else(|p| p.into_inner());
            let now = jiff::Timestamp::now();
            let picked =
                outgoing::pick(&self.outgoing, &self.instances_dir, &req.quarantined, now).map_err(|e| {
                    let class = match e {
                        outgoing::OutgoingError::Exhausted { .. } => ErrorClass::QuotaExceeded,
                        outgoing::OutgoingError::NotLocal { .. } => ErrorClass::Permanent,
                        outgoing::OutgoingError::Read { .. } => ErrorClass::Transient,
                    };
                    self.error(class, Op::Create, Some(id.as_str()), e)
                })?;
            if let Some(until) = picked.and_then(|p| p.quarantined_until) {
                tracing::warn!(
                    provider = %self.name, providerID = %id,
                    outgoing_address = picked.map(|p| tracing::field::display(p.address)),
                    quarantined_until = %until, quarantined = req.quarantined.len(),
                    "every free outgoing address is quarantined; giving the one blocked longest ago"
                );
            }
            let outgoing = picked.map(|p| p.address);
            let record = InstanceRecord::new(
                req,
                port,
                self.listen,
                &self.launcher,
                run_dir,
                pid_file,
                outgoing,
            );
            record::materialize(&self.instances_dir, &dir, &record).map_err(io)?;
        }
        self.start(&id, &dir, req.name.as_str(), req.credentials.as_ref())
            .await?;
        Ok(id)
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let (_, dir) = self.dir_of(id, Op::Get)?;
        match record::read(&dir) {
            Ok(Some(record)) => Ok(self.observe(id, &dir, &record).await),
            Ok(None) => Err(self.error(
                ErrorClass::NotFound,
                Op::Get,
                Some(id.as_str()),
                "no such instance",
            )),
            Err(e) => Err(self.error(ErrorClass::Transient, Op::Get, Some(id.as_str()), e)),
        }
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (name, dir) = self.dir_of(id, Op::Delete)?;
        let failed = |e: std::io::Error| self.error(ErrorClass::Transient, Op::Delete, Some(id.as_str()), e);
        let Some(record) = record::read(&dir).map_err(failed)? else {
            return remove_dir(&dir).map_err(failed);
        };
        if let Some(identity) = identity(&dir, &record) {
            // Returns only once the process is gone: its files go after it.
            process::stop(&identity, STOP_GRACE).await.map_err(failed)?;
            self.exits.forget(&identity);
        }
        if record.implementation == Implementation::Squid {
            squid::remove_segments(&squid::service_name(&name)).map_err(failed)?;
        }
        remove_instance(&dir, &record).map_err(failed)?;
        tracing::info!(provider = %self.name, providerID = %id, "local proxy deleted");
        Ok(())
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (_, dir) = self.dir_of(id, Op::Release)?;
        let failed = |e: std::io::Error| self.error(ErrorClass::Transient, Op::Release, Some(id.as_str()), e);
        let Some(mut record) = record::read(&dir).map_err(failed)? else {
            return Ok(());
        };
        (record.managed, record.released) = (false, true);
        record::rewrite(&dir, &record).map_err(failed)?;
        tracing::info!(provider = %self.name, providerID = %id, "local proxy released: left running, no longer managed");
        Ok(())
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let entries = std::fs::read_dir(&self.instances_dir)
            .map_err(|e| self.error(ErrorClass::Transient, Op::List, None, e))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let dir = entry.path();
            let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            // Half-built directories (`.<name>.tmp-*`) are not instances.
            if name.starts_with('.') {
                continue;
            }
            if let Ok(Some(record)) = record::read(&dir)
                && record.managed
            {
                out.push(
                    self.observe(&ProviderId(format!("{ID_PREFIX}{name}")), &dir, &record)
                        .await,
                );
            }
        }
        Ok(out)
    }
}
