//! The instance record: the tags GC needs (managed, owning UID, creation
//! time) and the chosen port, written before the process starts.

use std::io;
use std::net::IpAddr;
use std::path::Path;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{Launcher, squid};
use crate::provider::CreateRequest;

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
    pub created_at: Timestamp,
    pub listen: IpAddr,
    pub port: u16,
    pub implementation: Implementation,
}

impl InstanceRecord {
    pub fn new(req: &CreateRequest, port: u16, listen: IpAddr, launcher: &Launcher) -> Self {
        Self {
            name: req.name.to_string(),
            managed: true,
            uid: req.uid.clone(),
            created_at: Timestamp::now(),
            listen,
            port,
            implementation: match launcher {
                Launcher::Squid(_) => Implementation::Squid,
                Launcher::Builtin(_) => Implementation::Builtin,
            },
        }
    }
}

/// Creates the instance directory atomically: built under a temporary name,
/// then renamed, so a crash never leaves a half-written instance behind.
pub fn materialize(
    parent: &Path,
    dir: &Path,
    record: &InstanceRecord,
    launcher: &Launcher,
) -> io::Result<()> {
    let tmp = parent.join(format!(".{}.tmp-{}", record.name, uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&tmp)?;
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    std::fs::write(tmp.join(RECORD_FILE), json)?;
    if let Launcher::Squid(_) = launcher {
        squid::prepare(&tmp, dir, record)?;
    }
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The record of an instance directory; `None` when there is none.
pub fn read(dir: &Path) -> io::Result<Option<InstanceRecord>> {
    match std::fs::read(dir.join(RECORD_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
