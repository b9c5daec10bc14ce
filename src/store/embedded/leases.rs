//! The standalone lease journal: `leases.db` beside the state database.
//! A writer thread commits changes in groups — everything that arrived
//! while the previous commit ran goes into the next transaction — and the
//! API answers once the commit holding its change is done, so throughput
//! does not pay one transaction per request. WAL with `synchronous=NORMAL`:
//! a committed change survives the operator being killed (the WAL is in the
//! page cache, written by the kernel); only a power loss or kernel crash can
//! take the last moments with it, which costs no fsync per commit.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use jiff::Timestamp;
use rusqlite::{Connection, params};
use tokio::sync::watch;

use crate::lease::journal::{
    Durable, EndedRecord, JournalError, LeaseChange, LeaseJournal, LeaseRecord, LeaseSnapshot,
};
use crate::store::ObjectKey;

pub const LEASES_FILE: &str = "leases.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, target TEXT NOT NULL,
    expires_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL, client TEXT);
CREATE TABLE IF NOT EXISTS ended (
    id TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, target TEXT NOT NULL,
    until_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS target_rests (
    target TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL, until_ms INTEGER NOT NULL,
    PRIMARY KEY (target, namespace, name));
CREATE TABLE IF NOT EXISTS proxy_rests (
    namespace TEXT NOT NULL, name TEXT NOT NULL, until_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, name));
";

/// A failed commit is retried after this long (its changes are kept, in order).
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Lease state in SQLite, written by a thread of its own.
pub struct SqliteLeaseJournal {
    path: PathBuf,
    jobs: mpsc::Sender<Job>,
    committed: watch::Receiver<Committed>,
    generation: u64,
}

enum Job {
    Record(u64, Vec<LeaseChange>),
    Prune(i64),
}

/// What the writer has committed, and whether its last attempt failed.
#[derive(Clone, Debug, Default)]
struct Committed {
    upto: u64,
    failing: Option<String>,
}

fn ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

fn at(ms: i64) -> Result<Timestamp, JournalError> {
    Timestamp::from_millisecond(ms).map_err(|_| JournalError::Corrupt {
        what: "time",
        value: ms.to_string(),
    })
}

impl SqliteLeaseJournal {
    /// Opens (creating) `leases.db` in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Self, JournalError> {
        let path = state_dir.join(LEASES_FILE);
        let wrap = |source| JournalError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(&path).map_err(wrap)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(wrap)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(wrap)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(wrap)?;
        conn.execute_batch(SCHEMA).map_err(wrap)?;
        let (jobs, queue) = mpsc::channel();
        let (done, committed) = watch::channel(Committed::default());
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("lease-journal".into())
            .spawn(move || writer(conn, queue, done, shown))
            .map_err(|source| JournalError::Io {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self {
            path,
            jobs,
            committed,
            generation: 0,
        })
    }

    fn wrap(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn stopped(&self) -> JournalError {
        JournalError::Io {
            path: self.path.display().to_string(),
            source: std::io::Error::other("the lease journal's writer thread stopped"),
        }
    }

    fn apply(tx: &rusqlite::Transaction<'_>, change: &LeaseChange) -> rusqlite::Result<()> {
        match change {
            LeaseChange::Granted(l) => {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO leases (id, namespace, name, target, expires_ms, ttl_ms, client)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    l.id,
                    l.proxy.namespace,
                    l.proxy.name,
                    l.target,
                    ms(l.expires),
                    i64::try_from(l.ttl_ms).unwrap_or(i64::MAX),
                    l.client
                ])?;
            }
            LeaseChange::Extended { id, expires } => {
                tx.prepare_cached("UPDATE leases SET expires_ms = ?2 WHERE id = ?1")?
                    .execute(params![id, ms(*expires)])?;
            }
            LeaseChange::Ended(e) => {
                tx.prepare_cached("DELETE FROM leases WHERE id = ?1")?
                    .execute(params![e.id])?;
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO ended (id, namespace, name, target, until_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![e.id, e.proxy.namespace, e.proxy.name, e.target, ms(e.until)])?;
            }
            LeaseChange::TargetRest { target, proxy, until } => {
                tx.prepare_cached(
                    "INSERT INTO target_rests (target, namespace, name, until_ms) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (target, namespace, name) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms)",
                )?
                .execute(params![target, proxy.namespace, proxy.name, ms(*until)])?;
            }
            LeaseChange::ProxyRest { proxy, until } => {
                tx.prepare_cached(
                    "INSERT INTO proxy_rests (namespace, name, until_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT (namespace, name) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms)",
                )?
                .execute(params![proxy.namespace, proxy.name, ms(*until)])?;
            }
            LeaseChange::ProxyRemoved(proxy) => {
                for table in ["leases", "ended", "target_rests", "proxy_rests"] {
                    tx.prepare_cached(&format!("DELETE FROM {table} WHERE namespace = ?1 AND name = ?2"))?
                        .execute(params![proxy.namespace, proxy.name])?;
                }
            }
        }
        Ok(())
    }
}

impl LeaseJournal for SqliteLeaseJournal {
    fn load(&mut self, now: Timestamp) -> Result<LeaseSnapshot, JournalError> {
        let conn = Connection::open(&self.path).map_err(|e| self.wrap(e))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(|e| self.wrap(e))?;
        let key = |ns: String, name: String| ObjectKey::new(&ns, &name);
        let mut snapshot = LeaseSnapshot::default();
        let read = || -> rusqlite::Result<_> {
            let mut leases = Vec::new();
            let mut stmt =
                conn.prepare("SELECT id, namespace, name, target, expires_ms, ttl_ms, client FROM leases")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                leases.push((
                    r.get::<_, String>(0)?,
                    key(r.get(1)?, r.get(2)?),
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, Option<String>>(6)?,
                ));
            }
            let mut ended = Vec::new();
            let mut stmt = conn.prepare("SELECT id, namespace, name, target, until_ms FROM ended")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                ended.push((
                    r.get::<_, String>(0)?,
                    key(r.get(1)?, r.get(2)?),
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                ));
            }
            let mut target_rests = Vec::new();
            let mut stmt = conn.prepare("SELECT target, namespace, name, until_ms FROM target_rests")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                target_rests.push((
                    r.get::<_, String>(0)?,
                    key(r.get(1)?, r.get(2)?),
                    r.get::<_, i64>(3)?,
                ));
            }
            let mut proxy_rests = Vec::new();
            let mut stmt = conn.prepare("SELECT namespace, name, until_ms FROM proxy_rests")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                proxy_rests.push((key(r.get(0)?, r.get(1)?), r.get::<_, i64>(2)?));
            }
            Ok((leases, ended, target_rests, proxy_rests))
        };
        let (leases, ended, target_rests, proxy_rests) = read().map_err(|e| self.wrap(e))?;
        // What has ended by now is left out (the next prune deletes it).
        let now = ms(now);
        for (id, proxy, target, expires, ttl, client) in leases {
            if expires <= now {
                continue;
            }
            snapshot.leases.push(LeaseRecord {
                id,
                proxy,
                target,
                expires: at(expires)?,
                ttl_ms: u64::try_from(ttl).unwrap_or(0),
                client,
            });
        }
        for (id, proxy, target, until) in ended.into_iter().filter(|e| e.3 > now) {
            snapshot.ended.push(EndedRecord {
                id,
                proxy,
                target,
                until: at(until)?,
            });
        }
        for (target, proxy, until) in target_rests.into_iter().filter(|r| r.2 > now) {
            snapshot.target_rests.push((target, proxy, at(until)?));
        }
        for (proxy, until) in proxy_rests.into_iter().filter(|r| r.1 > now) {
            snapshot.proxy_rests.push((proxy, at(until)?));
        }
        Ok(snapshot)
    }

    fn record(&mut self, changes: &[LeaseChange]) -> Result<Durable, JournalError> {
        if changes.is_empty() {
            return Ok(Durable::Now);
        }
        self.generation += 1;
        let generation = self.generation;
        self.jobs
            .send(Job::Record(generation, changes.to_vec()))
            .map_err(|_| self.stopped())?;
        let mut committed = self.committed.clone();
        let path = self.path.display().to_string();
        Ok(Durable::Later(Box::pin(async move {
            let seen = committed
                .wait_for(|c| c.upto >= generation || c.failing.is_some())
                .await
                .map(|c| c.clone());
            match seen {
                Ok(c) if c.upto >= generation => Ok(()),
                Ok(c) => Err(JournalError::Io {
                    path,
                    source: std::io::Error::other(c.failing.unwrap_or_default()),
                }),
                Err(_) => Err(JournalError::Io {
                    path,
                    source: std::io::Error::other("the lease journal's writer thread stopped"),
                }),
            }
        })))
    }

    fn prune(&mut self, now: Timestamp) -> Result<(), JournalError> {
        self.jobs.send(Job::Prune(ms(now))).map_err(|_| self.stopped())
    }
}

/// Commits jobs in groups until the journal is dropped.
fn writer(mut conn: Connection, queue: mpsc::Receiver<Job>, done: watch::Sender<Committed>, path: String) {
    let mut batch = Vec::new();
    while let Ok(job) = queue.recv() {
        batch.push(job);
        batch.extend(queue.try_iter());
        loop {
            match commit(&mut conn, &batch) {
                Ok(upto) => {
                    done.send_modify(|c| {
                        c.upto = c.upto.max(upto);
                        c.failing = None;
                    });
                    batch.clear();
                    break;
                }
                Err(e) => {
                    tracing::error!(journal = %path, error = %e, "committing lease state failed; retrying");
                    done.send_modify(|c| c.failing = Some(e.to_string()));
                    std::thread::sleep(RETRY_AFTER);
                    // Changes that came meanwhile join the retry, in order.
                    batch.extend(queue.try_iter());
                }
            }
        }
    }
}

/// One transaction for a group of jobs; the newest generation it holds.
fn commit(conn: &mut Connection, batch: &[Job]) -> rusqlite::Result<u64> {
    let tx = conn.transaction()?;
    let mut upto = 0;
    for job in batch {
        match job {
            Job::Record(generation, changes) => {
                for change in changes {
                    SqliteLeaseJournal::apply(&tx, change)?;
                }
                upto = upto.max(*generation);
            }
            Job::Prune(now) => {
                tx.execute_batch(&format!(
                    "DELETE FROM leases WHERE expires_ms <= {now};
                     DELETE FROM ended WHERE until_ms <= {now};
                     DELETE FROM target_rests WHERE until_ms <= {now};
                     DELETE FROM proxy_rests WHERE until_ms <= {now};"
                ))?;
            }
        }
    }
    tx.commit()?;
    Ok(upto)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("crawl", name)
    }

    /// Records and waits until committed.
    fn write(journal: &mut SqliteLeaseJournal, changes: &[LeaseChange]) {
        match journal.record(changes).unwrap() {
            Durable::Now => {}
            Durable::Later(committed) => futures::executor::block_on(committed).unwrap(),
        }
    }

    #[test]
    fn changes_survive_a_reopen_and_expired_state_is_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let now = Timestamp::from_second(2_000_000_000).unwrap();
        let later = |s: i64| now.checked_add(jiff::SignedDuration::from_secs(s)).unwrap();
        let mut journal = SqliteLeaseJournal::open(dir.path()).unwrap();
        write(
            &mut journal,
            &[
                LeaseChange::Granted(LeaseRecord {
                    id: "held".into(),
                    proxy: key("a"),
                    target: "example.org".into(),
                    expires: later(600),
                    ttl_ms: 600_000,
                    client: Some("crawler-7".into()),
                }),
                LeaseChange::Granted(LeaseRecord {
                    id: "done".into(),
                    proxy: key("b"),
                    target: "example.org".into(),
                    expires: later(60),
                    ttl_ms: 60_000,
                    client: None,
                }),
                LeaseChange::Ended(EndedRecord {
                    id: "done".into(),
                    proxy: key("b"),
                    target: "example.org".into(),
                    until: later(600),
                }),
                LeaseChange::TargetRest {
                    target: "example.org".into(),
                    proxy: key("b"),
                    until: later(30),
                },
                // A shorter rest never shortens a longer one.
                LeaseChange::TargetRest {
                    target: "example.org".into(),
                    proxy: key("b"),
                    until: later(10),
                },
                LeaseChange::ProxyRest {
                    proxy: key("c"),
                    until: later(5),
                },
                LeaseChange::Extended {
                    id: "held".into(),
                    expires: later(700),
                },
            ],
        );
        drop(journal);

        let mut journal = SqliteLeaseJournal::open(dir.path()).unwrap();
        let snapshot = journal.load(now).unwrap();
        assert_eq!(snapshot.leases.len(), 1);
        assert_eq!(snapshot.leases[0].id, "held");
        assert_eq!(snapshot.leases[0].expires, later(700));
        assert_eq!(snapshot.leases[0].client.as_deref(), Some("crawler-7"));
        assert_eq!(snapshot.ended.len(), 1);
        assert_eq!(
            snapshot.target_rests,
            [("example.org".to_owned(), key("b"), later(30))]
        );
        assert_eq!(snapshot.proxy_rests, [(key("c"), later(5))]);

        // Ten seconds on: c's rest is over and is not handed back.
        let snapshot = journal.load(later(10)).unwrap();
        assert!(snapshot.proxy_rests.is_empty());
        assert_eq!(snapshot.target_rests.len(), 1);

        write(&mut journal, &[LeaseChange::ProxyRemoved(key("b"))]);
        let snapshot = journal.load(later(10)).unwrap();
        assert!(snapshot.ended.is_empty() && snapshot.target_rests.is_empty());
        assert_eq!(snapshot.leases.len(), 1, "other proxies are untouched");
    }
}
