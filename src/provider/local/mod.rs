//! The `local` provider (standalone mode): each instance is a forward proxy
//! process on this machine — Squid when installed, the built-in proxy
//! otherwise.
//!
//! Instances live in `<state>/local/<provider>/instances/<name>/`: a record
//! (the tags: managed, owning UID, creation time, port), the generated config
//! and logs. Processes are found by the instance directory on their command
//! line, so they are re-adopted after an operator restart and can never be
//! started twice for one name. They run in their own process group and
//! outlive the operator, like VMs outlive a cloud controller.

mod process;
mod record;
mod squid;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use crate::config::{LocalConfig, LocalImplementation};
use crate::provider::{
    BuildContext, CreateRequest, ErrorClass, Instance, InstanceState, Op, Provider, ProviderError, ProviderId,
};

use record::InstanceRecord;

/// Prefix of local providerIDs: `instances/<name>`.
const ID_PREFIX: &str = "instances/";
/// Grace between SIGTERM and SIGKILL on delete.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Which program runs the instances of this provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launcher {
    Squid(PathBuf),
    Builtin(PathBuf),
}

/// Building the provider failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("implementation squid was requested but no squid binary was found ({0})")]
    NoSquid(String),
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
}

impl LocalProvider {
    pub fn new(name: &str, config: LocalConfig, ctx: &BuildContext) -> Result<Self, LocalError> {
        let squid = match &config.squid_binary {
            Some(path) => which::which(path).map_err(|e| format!("{}: {e}", path.display())),
            None => which::which("squid").map_err(|e| format!("squid on PATH: {e}")),
        };
        let launcher = match (config.implementation, squid) {
            (LocalImplementation::Builtin, _) | (LocalImplementation::Auto, Err(_)) => {
                Launcher::Builtin(ctx.operator_exe.clone())
            }
            (_, Ok(path)) => Launcher::Squid(path),
            (LocalImplementation::Squid, Err(why)) => return Err(LocalError::NoSquid(why)),
        };
        let instances_dir = ctx.state_dir.join("local").join(name).join("instances");
        let state_error = |source| LocalError::StateDir {
            path: instances_dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&instances_dir).map_err(state_error)?;
        // Processes are recognised by this path on their command line: make it canonical.
        let instances_dir = instances_dir.canonicalize().map_err(state_error)?;
        Ok(Self {
            name: name.to_owned(),
            listen: config.listen_address,
            instances_dir,
            launcher,
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
            .filter(|n| crate::config::is_identifier(n))
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
        let running = !process::find(dir).is_empty();
        let ip = self.client_ip(record.listen);
        let state = if !running {
            InstanceState::Stopped
        } else if accepts(SocketAddr::new(ip, record.port)).await {
            InstanceState::Running
        } else {
            InstanceState::Provisioning
        };
        Instance {
            id: id.clone(),
            state,
            ip: (state == InstanceState::Running).then_some(ip),
            port: Some(record.port),
            uid: Some(record.uid.clone()),
            created_at: Some(record.created_at),
        }
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

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let id = ProviderId(format!("{ID_PREFIX}{}", req.name));
        let dir = self.instances_dir.join(req.name.as_str());
        let io = |e: std::io::Error| self.error(ErrorClass::Transient, Op::Create, Some(id.as_str()), e);
        if dir.exists() {
            // Keyed on the name: a repeated create finds the instance it made.
            return Ok(id);
        }
        let port = free_port(self.listen).map_err(io)?;
        let record = InstanceRecord::new(req, port, self.listen, &self.launcher);
        record::materialize(&self.instances_dir, &dir, &record, &self.launcher).map_err(io)?;
        process::spawn(&dir, &record, &self.launcher).map_err(io)?;
        tracing::info!(
            provider = %self.name, providerID = %id, port,
            implementation = record.implementation.as_str(), "local proxy process started"
        );
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
        let (_, dir) = self.dir_of(id, Op::Delete)?;
        process::stop(&dir, STOP_GRACE)
            .await
            .map_err(|e| self.error(ErrorClass::Transient, Op::Delete, Some(id.as_str()), e))?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(provider = %self.name, providerID = %id, "local proxy deleted");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.error(ErrorClass::Transient, Op::Delete, Some(id.as_str()), e)),
        }
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
