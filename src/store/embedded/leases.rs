//! The standalone lease journal: `leases.db` beside the state database,
//! written through on every change before the API answers. WAL with
//! `synchronous=NORMAL`: a committed change survives the operator being
//! killed (the WAL is in the page cache, written by the kernel); only a
//! power loss or kernel crash can take the last moments with it, which
//! costs no fsync per lease.

use std::path::{Path, PathBuf};

use jiff::Timestamp;
use rusqlite::{Connection, params};

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

/// Lease state in SQLite.
pub struct SqliteLeaseJournal {
    conn: Connection,
    path: PathBuf,
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
        Ok(Self { conn, path })
    }

    fn wrap(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.display().to_string(),
            source,
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
        self.prune(now)?;
        let key = |ns: String, name: String| ObjectKey::new(&ns, &name);
        let mut snapshot = LeaseSnapshot::default();
        let read = || -> rusqlite::Result<_> {
            let mut leases = Vec::new();
            let mut stmt = self
                .conn
                .prepare("SELECT id, namespace, name, target, expires_ms, ttl_ms, client FROM leases")?;
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
            let mut stmt = self
                .conn
                .prepare("SELECT id, namespace, name, target, until_ms FROM ended")?;
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
            let mut stmt = self
                .conn
                .prepare("SELECT target, namespace, name, until_ms FROM target_rests")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                target_rests.push((
                    r.get::<_, String>(0)?,
                    key(r.get(1)?, r.get(2)?),
                    r.get::<_, i64>(3)?,
                ));
            }
            let mut proxy_rests = Vec::new();
            let mut stmt = self
                .conn
                .prepare("SELECT namespace, name, until_ms FROM proxy_rests")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                proxy_rests.push((key(r.get(0)?, r.get(1)?), r.get::<_, i64>(2)?));
            }
            Ok((leases, ended, target_rests, proxy_rests))
        };
        let (leases, ended, target_rests, proxy_rests) = read().map_err(|e| self.wrap(e))?;
        for (id, proxy, target, expires, ttl, client) in leases {
            snapshot.leases.push(LeaseRecord {
                id,
                proxy,
                target,
                expires: at(expires)?,
                ttl_ms: u64::try_from(ttl).unwrap_or(0),
                client,
            });
        }
        for (id, proxy, target, until) in ended {
            snapshot.ended.push(EndedRecord {
                id,
                proxy,
                target,
                until: at(until)?,
            });
        }
        for (target, proxy, until) in target_rests {
            snapshot.target_rests.push((target, proxy, at(until)?));
        }
        for (proxy, until) in proxy_rests {
            snapshot.proxy_rests.push((proxy, at(until)?));
        }
        Ok(snapshot)
    }

    fn record(&mut self, changes: &[LeaseChange]) -> Result<Durable, JournalError> {
        if changes.is_empty() {
            return Ok(Durable::Now);
        }
        let tx = self.conn.transaction().map_err(|e| JournalError::Sqlite {
            path: self.path.display().to_string(),
            source: e,
        })?;
        for change in changes {
            Self::apply(&tx, change).map_err(|e| JournalError::Sqlite {
                path: self.path.display().to_string(),
                source: e,
            })?;
        }
        tx.commit().map_err(|e| self.wrap(e))?;
        Ok(Durable::Now)
    }

    fn prune(&mut self, now: Timestamp) -> Result<(), JournalError> {
        let now = ms(now);
        self.conn
            .execute_batch(&format!(
                "DELETE FROM leases WHERE expires_ms <= {now};
                 DELETE FROM ended WHERE until_ms <= {now};
                 DELETE FROM target_rests WHERE until_ms <= {now};
                 DELETE FROM proxy_rests WHERE until_ms <= {now};"
            ))
            .map_err(|e| self.wrap(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("crawl", name)
    }

    #[test]
    fn changes_survive_a_reopen_and_expired_state_is_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let now = Timestamp::from_second(2_000_000_000).unwrap();
        let later = |s: i64| now.checked_add(jiff::SignedDuration::from_secs(s)).unwrap();
        let mut journal = SqliteLeaseJournal::open(dir.path()).unwrap();
        journal
            .record(&[
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
            ])
            .map(drop)
            .unwrap();
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

        journal
            .record(&[LeaseChange::ProxyRemoved(key("b"))])
            .map(drop)
            .unwrap();
        let snapshot = journal.load(later(10)).unwrap();
        assert!(snapshot.ended.is_empty() && snapshot.target_rests.is_empty());
        assert_eq!(snapshot.leases.len(), 1, "other proxies are untouched");
    }
}
