//! `FileLeaseJournal`, standalone's adapter of the `LeaseJournal` port:
//! lease state kept in files, an append-only log of lease changes in
//! `<state>/leases/`, folded into a compact base in the background.
//!
//! ```text
//!   lease store ──record()──▶ log-0000000007.jsonl   one JSON line per change,
//!                              (one write per call)   appended before the answer
//!          rotation ─────────▶ log-0000000008.jsonl   the next log is started and
//!                                                     the compactor thread is asked
//!   compactor: base.json + logs ≤ 7 ──fold, drop what ended──▶ base.json (covers 7),
//!              then logs ≤ 7 are deleted
//! ```
//!
//! A change is in the kernel's page cache when `record` returns: it survives
//! the operator being killed at any point. Only a power loss or kernel
//! crash can take the last moments with it (no fsync per change, as with
//! SQLite's WAL at `synchronous=NORMAL`). The request path pays one JSON
//! line and one `write(2)`; folding runs on a thread of its own once the log
//! outgrows twice the base (at least [`MIN_FOLD_BYTES`]), so the files stay
//! within a small multiple of the live state.
//!
//! Crash safety of folding: the new base is written to a temporary file,
//! fsynced and renamed over the old one, and names the last log it covers.
//! Logs it covers are skipped (and deleted) at the next start, whichever
//! step a crash interrupted; a log's last line cut short by a crash is
//! ignored.

use std::borrow::Cow;
use std::fs::{self, File};
use std::io::BufWriter;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::domain::lease::journal::{
    Durable, EndedRecord, JournalError, JournalState, LeaseChange, LeaseJournal, LeaseRecord, LeaseSnapshot,
    key_string, parse_key, parse_ms,
};

/// The journal's directory inside the state directory.
pub const LEASES_DIR: &str = "leases";
const BASE_FILE: &str = "base.json";
const BASE_TEMP: &str = "base.json.tmp";
/// The log is folded once it is larger than this and than twice the base.
pub const MIN_FOLD_BYTES: u64 = 8 << 20;

/// The folded state and the last log it includes.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Base {
    covers: u64,
    state: JournalState,
}

/// One change as a log line. Proxies as `namespace/name`, times in Unix ms.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase")]
enum Line<'a> {
    Granted {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        proxy: Cow<'a, str>,
        #[serde(borrow)]
        target: Cow<'a, str>,
        expires_ms: i64,
        ttl_ms: u64,
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        client: Option<Cow<'a, str>>,
        /// Absent in lines written before leases had owners.
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        owner: Option<Cow<'a, str>>,
    },
    Extended {
        #[serde(borrow)]
        id: Cow<'a, str>,
        expires_ms: i64,
    },
    Ended {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        proxy: Cow<'a, str>,
        #[serde(borrow)]
        target: Cow<'a, str>,
        until_ms: i64,
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        owner: Option<Cow<'a, str>>,
    },
    TargetRest {
        #[serde(borrow)]
        target: Cow<'a, str>,
        #[serde(borrow)]
        proxy: Cow<'a, str>,
        until_ms: i64,
    },
    ProxyRest {
        #[serde(borrow)]
        proxy: Cow<'a, str>,
        until_ms: i64,
    },
    BlockedBy {
        #[serde(borrow)]
        proxy: Cow<'a, str>,
        target: u64,
    },
    Errors {
        #[serde(borrow)]
        proxy: Cow<'a, str>,
        count: u32,
    },
    ProxyRemoved {
        #[serde(borrow)]
        proxy: Cow<'a, str>,
    },
}

impl<'a> From<&'a LeaseChange> for Line<'a> {
    fn from(change: &'a LeaseChange) -> Self {
        let key = |k| Cow::Owned(key_string(k));
        match change {
            LeaseChange::Granted(l) => Line::Granted {
                id: Cow::Borrowed(&l.id),
                proxy: key(&l.proxy),
                target: Cow::Borrowed(&l.target),
                expires_ms: l.expires.as_millisecond(),
                ttl_ms: l.ttl_ms,
                client: l.client.as_deref().map(Cow::Borrowed),
                owner: l.owner.as_deref().map(Cow::Borrowed),
            },
            LeaseChange::Extended { id, expires } => Line::Extended {
                id: Cow::Borrowed(id),
                expires_ms: expires.as_millisecond(),
            },
            LeaseChange::Ended(e) => Line::Ended {
                id: Cow::Borrowed(&e.id),
                proxy: key(&e.proxy),
                target: Cow::Borrowed(&e.target),
                until_ms: e.until.as_millisecond(),
                owner: e.owner.as_deref().map(Cow::Borrowed),
            },
            LeaseChange::TargetRest { target, proxy, until } => Line::TargetRest {
                target: Cow::Borrowed(target),
                proxy: key(proxy),
                until_ms: until.as_millisecond(),
            },
            LeaseChange::ProxyRest { proxy, until } => Line::ProxyRest {
                proxy: key(proxy),
                until_ms: until.as_millisecond(),
            },
            LeaseChange::BlockedBy { proxy, target } => Line::BlockedBy {
                proxy: key(proxy),
                target: *target,
            },
            LeaseChange::Errors { proxy, count } => Line::Errors {
                proxy: key(proxy),
                count: *count,
            },
            LeaseChange::ProxyRemoved(proxy) => Line::ProxyRemoved { proxy: key(proxy) },
        }
    }
}

impl Line<'_> {
    fn into_change(self) -> Result<LeaseChange, JournalError> {
        Ok(match self {
            Line::Granted {
                id,
                proxy,
                target,
                expires_ms,
                ttl_ms,
                client,
                owner,
            } => LeaseChange::Granted(LeaseRecord {
                id: id.into_owned(),
                proxy: parse_key(&proxy)?,
                target: target.into_owned(),
                expires: parse_ms(expires_ms)?,
                ttl_ms,
                client: client.map(Cow::into_owned),
                owner: owner.map(Cow::into_owned),
            }),
            Line::Extended { id, expires_ms } => LeaseChange::Extended {
                id: id.into_owned(),
                expires: parse_ms(expires_ms)?,
            },
            Line::Ended {
                id,
                proxy,
                target,
                until_ms,
                owner,
            } => LeaseChange::Ended(EndedRecord {
                id: id.into_owned(),
                proxy: parse_key(&proxy)?,
                target: target.into_owned(),
                until: parse_ms(until_ms)?,
                owner: owner.map(Cow::into_owned),
            }),
            Line::TargetRest {
                target,
                proxy,
                until_ms,
            } => LeaseChange::TargetRest {
                target: target.into_owned(),
                proxy: parse_key(&proxy)?,
                until: parse_ms(until_ms)?,
            },
            Line::ProxyRest { proxy, until_ms } => LeaseChange::ProxyRest {
                proxy: parse_key(&proxy)?,
                until: parse_ms(until_ms)?,
            },
            Line::BlockedBy { proxy, target } => LeaseChange::BlockedBy {
                proxy: parse_key(&proxy)?,
                target,
            },
            Line::Errors { proxy, count } => LeaseChange::Errors {
                proxy: parse_key(&proxy)?,
                count,
            },
            Line::ProxyRemoved { proxy } => LeaseChange::ProxyRemoved(parse_key(&proxy)?),
        })
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn log_name(number: u64) -> String {
    format!("log-{number:010}.jsonl")
}

/// The logs in `dir`, oldest first.
fn logs(dir: &Path) -> Result<Vec<(u64, PathBuf)>, JournalError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let number = name
            .to_str()
            .and_then(|n| n.strip_prefix("log-"))
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|n| n.parse().ok());
        if let Some(number) = number {
            found.push((number, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

fn read_base(dir: &Path) -> Result<Base, JournalError> {
    let path = dir.join(BASE_FILE);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| JournalError::Corrupt {
            what: "base",
            value: format!("{}: {e}", path.display()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Base::default()),
        Err(e) => Err(io_error(&path)(e)),
    }
}

/// Applies every line of one log to `state`. A last line without its
/// newline was cut short by a crash: its write never completed, so no
/// answer depended on it.
fn replay(path: &Path, state: &mut JournalState) -> Result<(), JournalError> {
    let bytes = fs::read(path).map_err(io_error(path))?;
    for (index, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        let Some(line) = line.strip_suffix(b"\n") else {
            tracing::warn!(log = %path.display(), line = index + 1, "ignoring a lease log line cut short by a crash");
            break;
        };
        let change = serde_json::from_slice::<Line<'_>>(line)
            .map_err(|e| JournalError::Corrupt {
                what: "lease log line",
                value: format!("{}:{}: {e}", path.display(), index + 1),
            })?
            .into_change()?;
        state.apply(&change);
    }
    Ok(())
}

/// The state as written: the base with the logs after it, up to `upto`.
struct Written {
    state: JournalState,
    /// The last log the base covers.
    covers: u64,
    /// Every log in the directory, oldest first.
    logs: Vec<(u64, PathBuf)>,
}

fn read_written(dir: &Path, upto: u64) -> Result<Written, JournalError> {
    let base = read_base(dir)?;
    let mut state = base.state;
    let all = logs(dir)?;
    for (_, path) in all.iter().filter(|(n, _)| *n > base.covers && *n <= upto) {
        replay(path, &mut state)?;
    }
    Ok(Written {
        state,
        covers: base.covers,
        logs: all,
    })
}

/// Folds the base and the logs up to `upto` into a new base; returns its size.
fn fold(dir: &Path, upto: u64) -> Result<u64, JournalError> {
    let Written {
        mut state,
        logs: covered,
        ..
    } = read_written(dir, upto)?;
    state.prune(Timestamp::now().as_millisecond());
    let temp = dir.join(BASE_TEMP);
    let file = crate::private_files::create_private(&temp).map_err(io_error(&temp))?;
    let mut out = BufWriter::new(file);
    serde_json::to_writer(&mut out, &Base { covers: upto, state }).map_err(|e| io_error(&temp)(e.into()))?;
    let file = out.into_inner().map_err(|e| io_error(&temp)(e.into_error()))?;
    file.sync_all().map_err(io_error(&temp))?;
    let size = file.metadata().map_err(io_error(&temp))?.len();
    let path = dir.join(BASE_FILE);
    fs::rename(&temp, &path).map_err(io_error(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))?;
    for (_, path) in covered.iter().filter(|(n, _)| *n <= upto) {
        fs::remove_file(path).map_err(io_error(path))?;
    }
    Ok(size)
}

/// What the journal and its compactor thread share.
#[derive(Default)]
struct Folding {
    running: AtomicBool,
    base_bytes: AtomicU64,
}

/// Lease state as an append-only log with a background-folded base.
pub struct FileLeaseJournal {
    dir: PathBuf,
    file: File,
    number: u64,
    /// Bytes of the current log that are whole lines.
    len: u64,
    /// A failed write may have left part of a line past `len`.
    dirty_tail: bool,
    line: Vec<u8>,
    loaded: Option<JournalState>,
    folds: mpsc::Sender<u64>,
    folding: Arc<Folding>,
}

impl FileLeaseJournal {
    /// Opens (creating) `leases/` in `state_dir` and reads what it holds.
    pub fn open(state_dir: &Path) -> Result<Self, JournalError> {
        let dir = state_dir.join(LEASES_DIR);
        crate::private_files::private_dir(&dir).map_err(io_error(&dir))?;
        // A fold interrupted before its rename: the old base still stands.
        let _ = fs::remove_file(dir.join(BASE_TEMP));
        let Written {
            state,
            covers,
            logs: all,
        } = read_written(&dir, u64::MAX)?;
        for (_, path) in all.iter().filter(|(n, _)| *n <= covers) {
            fs::remove_file(path).map_err(io_error(path))?;
        }
        let newest = all.last().map_or(covers, |(n, _)| (*n).max(covers));
        let number = newest + 1;
        let path = dir.join(log_name(number));
        let file = crate::private_files::private_options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_error(&path))?;
        let base_bytes = fs::metadata(dir.join(BASE_FILE)).map_or(0, |m| m.len());
        let folding = Arc::new(Folding {
            running: AtomicBool::new(false),
            base_bytes: AtomicU64::new(base_bytes),
        });
        let (folds, queue) = mpsc::channel();
        let (worker_dir, shared) = (dir.clone(), folding.clone());
        std::thread::Builder::new()
            .name("lease-log-fold".into())
            .spawn(move || compactor(worker_dir, queue, shared))
            .map_err(io_error(&dir))?;
        let log = Self {
            dir,
            file,
            number,
            len: 0,
            dirty_tail: false,
            line: Vec::new(),
            loaded: Some(state),
            folds,
            folding,
        };
        // Logs left by the previous run are folded right away.
        if newest > covers {
            log.folding.running.store(true, Ordering::SeqCst);
            let _ = log.folds.send(newest);
        }
        Ok(log)
    }

    /// The directory holding the log and its base.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn append(&mut self) -> std::io::Result<()> {
        self.file.write_all_at(&self.line, self.len)?;
        let len = self.len + self.line.len() as u64;
        if self.dirty_tail {
            self.file.set_len(len)?;
            self.dirty_tail = false;
        }
        self.len = len;
        Ok(())
    }

    /// Starts the next log and has the compactor fold the current one, once
    /// it has outgrown the base (and no fold is running).
    fn rotate_if_due(&mut self) {
        let due = MIN_FOLD_BYTES.max(2 * self.folding.base_bytes.load(Ordering::Relaxed));
        if self.len < due || self.folding.running.swap(true, Ordering::SeqCst) {
            return;
        }
        let next = self.number + 1;
        let path = self.dir.join(log_name(next));
        match crate::private_files::private_options()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => {
                let sealed = self.number;
                (self.file, self.number, self.len, self.dirty_tail) = (file, next, 0, false);
                if self.folds.send(sealed).is_err() {
                    self.folding.running.store(false, Ordering::SeqCst);
                }
            }
            Err(e) => {
                tracing::warn!(log = %path.display(), error = %e, "starting a new lease log failed; appending to the current one");
                self.folding.running.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// Folds logs as asked until the journal is dropped.
fn compactor(dir: PathBuf, queue: mpsc::Receiver<u64>, folding: Arc<Folding>) {
    while let Ok(mut upto) = queue.recv() {
        upto = queue.try_iter().fold(upto, u64::max);
        match fold(&dir, upto) {
            Ok(size) => {
                folding.base_bytes.store(size, Ordering::Relaxed);
                tracing::debug!(dir = %dir.display(), covers = upto, base_bytes = size, "lease log folded");
            }
            Err(e) => {
                tracing::error!(error = %e, "folding the lease log failed; it is retried at the next rotation")
            }
        }
        folding.running.store(false, Ordering::SeqCst);
    }
}

impl LeaseJournal for FileLeaseJournal {
    fn load(&mut self, now: Timestamp) -> Result<LeaseSnapshot, JournalError> {
        let mut state = self.loaded.take().unwrap_or_default();
        state.prune(now.as_millisecond());
        let mut snapshot = LeaseSnapshot::default();
        state.into_snapshot(&mut snapshot)?;
        Ok(snapshot)
    }

    fn record(&mut self, changes: &[LeaseChange]) -> Result<Durable, JournalError> {
        if changes.is_empty() {
            return Ok(Durable::Now);
        }
        self.line.clear();
        for change in changes {
            serde_json::to_writer(&mut self.line, &Line::from(change)).map_err(|e| {
                JournalError::Corrupt {
                    what: "lease change",
                    value: e.to_string(),
                }
            })?;
            self.line.push(b'\n');
        }
        if let Err(e) = self.append() {
            // Whatever part landed is overwritten by the next write (at `len`).
            self.dirty_tail = true;
            let path = self.dir.join(log_name(self.number));
            return Err(io_error(&path)(e));
        }
        self.rotate_if_due();
        Ok(Durable::Now)
    }

    /// Nothing to do: folding drops what has ended.
    fn prune(&mut self, _now: Timestamp) -> Result<(), JournalError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
