//! The instance record: the tags GC needs (managed, owning UID and
//! namespace, installation, creation time), the chosen port and where the
//! process keeps its files, written before the process starts.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::Launcher;
use crate::domain::provider_contract::CreateRequest;

const RECORD_FILE: &str = "instance.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Implementation {
    Squid,
    Builtin,
}

impl Implementation {
    pub fn as_str(self) -> &'static str {
        match self {
            Implementation::Squid => "squid",
            Implementation::Builtin => "builtin",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    pub name: String,
    pub managed: bool,
    pub uid: String,
    /// The owning Proxy's namespace (absent in records of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The installation that made it (absent in records of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation: Option<String>,
    /// Released with skip-cleanup (then `managed` is false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    pub created_at: Timestamp,
    pub listen: IpAddr,
    pub port: u16,
    pub implementation: Implementation,
    /// Where Squid keeps its config, logs and pid file when that is not the
    /// instance directory (the operator runs as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<PathBuf>,
    /// The pid file the proxy writes. Absent in records made before
    /// processes were tracked by pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_file: Option<PathBuf>,
    /// The source address the proxy connects to destinations from (one of
    /// `outgoingAddresses`, taken by no other instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outgoing_address: Option<IpAddr>,
}

impl InstanceRecord {
    pub fn new(
        req: &CreateRequest,
        port: u16,
        listen: IpAddr,
        launcher: &Launcher,
        run_dir: Option<PathBuf>,
        pid_file: PathBuf,
        outgoing_address: Option<IpAddr>,
    ) -> Self {
        Self {
            name: req.name.to_string(),
            managed: true,
            uid: req.uid.clone(),
            namespace: Some(req.namespace.clone()),
            installation: Some(req.installation.to_string()),
            released: false,
            created_at: Timestamp::now(),
            listen,
            port,
            implementation: match launcher {
                Launcher::Squid(_) => Implementation::Squid,
                Launcher::Builtin(_) => Implementation::Builtin,
            },
            run_dir,
            pid_file: Some(pid_file),
            outgoing_address,
        }
    }
}

/// Creates the instance directory atomically: built under a temporary name,
/// then renamed, so a crash never leaves a half-written instance behind.
pub fn materialize(parent: &Path, dir: &Path, record: &InstanceRecord) -> io::Result<()> {
    let tmp = parent.join(format!(".{}.tmp-{}", record.name, uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&tmp)?;
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    std::fs::write(tmp.join(RECORD_FILE), json)?;
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Replaces the record of an instance directory.
pub fn rewrite(dir: &Path, record: &InstanceRecord) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    write_atomically(dir, RECORD_FILE, &json)
}

/// The record of an instance directory; `None` when there is none.
pub fn read(dir: &Path) -> io::Result<Option<InstanceRecord>> {
    match std::fs::read(dir.join(RECORD_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces `dir/name` with `bytes` in one step (readers see the old or
/// the new file, never half of one).
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
