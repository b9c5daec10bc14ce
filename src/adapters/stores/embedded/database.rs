//! The state file: every Proxy and ProxyPool object (metadata the store owns, spec, status)
//! in SQLite, so a restart resumes exactly where the operator stopped. WAL
//! mode lets `get proxies` read while the operator writes.

use std::path::Path;

use rusqlite::{Connection, OpenFlags, params};

use crate::domain::credentials::ProxyCredentials;
use crate::domain::installation::InstallationId;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::domain::resource::ObjectKey;
use crate::domain::resource::{Proxy, ProxyPool};

/// Persistence failed.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error("state database {path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("state database holds an invalid {key}: {message}")]
    Setting { key: &'static str, message: String },
    #[error("state database holds an unreadable object {key}: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The SQLite file with one row per Proxy.
pub struct Database {
    conn: Connection,
    path: String,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS proxies (
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    object    TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE IF NOT EXISTS pools (
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    object    TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE IF NOT EXISTS credentials (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    uid        TEXT NOT NULL,
    generation TEXT NOT NULL,
    username   TEXT NOT NULL,
    password   TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);";

const INSTALLATION_KEY: &str = "installationId";

/// sqlite's page cache for the state file, in KiB.
const PAGE_CACHE_KIB: i64 = 256;

impl Database {
    /// Opens (creating when missing) the state file for writing.
    pub fn open(path: &Path) -> Result<Self, DatabaseError> {
        let shown = path.display().to_string();
        let wrap = |source| DatabaseError::Sqlite {
            path: shown.clone(),
            source,
        };
        let conn = Connection::open(path).map_err(wrap)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(wrap)?;
        // Durable commits, except observed state's (`put_unsynced`).
        conn.pragma_update(None, "synchronous", "FULL").map_err(wrap)?;
        // Reads come from the operator's own copy, not from here: a small
        // page cache (the interior pages a write walks) is enough, and the
        // kernel caches the file anyway. The default 2 MiB stayed resident.
        conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)
            .map_err(wrap)?;
        conn.execute_batch(SCHEMA).map_err(wrap)?;
        Ok(Self { conn, path: shown })
    }

    /// Opens an existing state file read-only (safe while the operator runs).
    pub fn open_read_only(path: &Path) -> Result<Self, DatabaseError> {
        let shown = path.display().to_string();
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|source| {
            DatabaseError::Sqlite {
                path: shown.clone(),
                source,
            }
        })?;
        Ok(Self { conn, path: shown })
    }

    fn wrap(&self, source: rusqlite::Error) -> DatabaseError {
        DatabaseError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Every stored Proxy (none while a new state file is still being set up).
    pub fn load_all(&self) -> Result<Vec<Proxy>, DatabaseError> {
        self.load_table("proxies")
    }

    /// Every stored ProxyPool.
    pub fn load_pools(&self) -> Result<Vec<ProxyPool>, DatabaseError> {
        self.load_table("pools")
    }

    fn load_table<T: DeserializeOwned>(&self, table: &'static str) -> Result<Vec<T>, DatabaseError> {
        let tables: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                params![table],
                |r| r.get(0),
            )
            .map_err(|e| self.wrap(e))?;
        if tables == 0 {
            return Ok(Vec::new());
        }
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT namespace, name, object FROM {table} ORDER BY namespace, name"
            ))
            .map_err(|e| self.wrap(e))?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| self.wrap(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (namespace, name, object) = row.map_err(|e| self.wrap(e))?;
            let parsed = serde_json::from_str(&object).map_err(|source| DatabaseError::Corrupt {
                key: format!("{namespace}/{name}"),
                source,
            })?;
            out.push(parsed);
        }
        Ok(out)
    }

    /// Inserts or replaces one Proxy (durable when this returns).
    pub fn put(&self, proxy: &Proxy) -> Result<(), DatabaseError> {
        self.put_row("proxies", &ObjectKey::of(proxy), proxy)
    }

    /// Inserts or replaces one ProxyPool (durable when this returns).
    pub fn put_pool(&self, pool: &ProxyPool) -> Result<(), DatabaseError> {
        self.put_row("pools", &crate::domain::resource_store::pool_key(pool), pool)
    }

    /// [`Self::put`] without waiting for the disk: for observed state
    /// (status), which every start probes and reconciles afresh. The commit
    /// is in the WAL when this returns, so a killed process loses nothing;
    /// the next synced commit syncs it too. A status write per proxy per
    /// transition would otherwise cost a fleet one sync each.
    pub fn put_unsynced(&self, proxy: &Proxy) -> Result<(), DatabaseError> {
        self.unsynced(|db| db.put(proxy))
    }

    /// [`Self::put_pool`] without waiting for the disk (see [`Self::put_unsynced`]).
    pub fn put_pool_unsynced(&self, pool: &ProxyPool) -> Result<(), DatabaseError> {
        self.unsynced(|db| db.put_pool(pool))
    }

    fn unsynced(&self, write: impl FnOnce(&Self) -> Result<(), DatabaseError>) -> Result<(), DatabaseError> {
        self.set_synchronous("NORMAL")?;
        let written = write(self);
        // Every other write stays synced, whatever became of this one.
        let restored = self.set_synchronous("FULL");
        written.and(restored)
    }

    fn set_synchronous(&self, level: &str) -> Result<(), DatabaseError> {
        self.conn
            .pragma_update(None, "synchronous", level)
            .map_err(|e| self.wrap(e))
    }

    /// Starts a transaction: the writes until [`Self::commit`] reach the
    /// disk together, with one sync, or not at all.
    pub fn begin(&self) -> Result<(), DatabaseError> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| self.wrap(e))
    }

    pub fn commit(&self) -> Result<(), DatabaseError> {
        self.conn.execute_batch("COMMIT").map_err(|e| self.wrap(e))
    }

    /// Undoes the writes since [`Self::begin`]. SQLite may have rolled
    /// back already (after some errors it does), so there may be nothing
    /// left to undo: not an error.
    pub fn rollback(&self) {
        if self.conn.is_autocommit() {
            return;
        }
        if let Err(e) = self.conn.execute_batch("ROLLBACK") {
            tracing::warn!(path = %self.path, error = %e, "rolling back the state database failed");
        }
    }

    /// The `synchronous` level in force (2 is FULL).
    #[cfg(test)]
    pub fn synchronous(&self) -> i64 {
        self.conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap()
    }

    /// Forgets one ProxyPool.
    pub fn delete_pool(&self, key: &ObjectKey) -> Result<(), DatabaseError> {
        self.conn
            .execute(
                "DELETE FROM pools WHERE namespace = ?1 AND name = ?2",
                params![key.namespace, key.name],
            )
            .map_err(|e| self.wrap(e))?;
        Ok(())
    }

    fn put_row<T: Serialize>(
        &self,
        table: &'static str,
        key: &ObjectKey,
        object: &T,
    ) -> Result<(), DatabaseError> {
        let object = serde_json::to_string(object).map_err(|source| DatabaseError::Corrupt {
            key: key.to_string(),
            source,
        })?;
        self.conn
            .execute(
                &format!(
                    "INSERT INTO {table} (namespace, name, object) VALUES (?1, ?2, ?3)
                     ON CONFLICT (namespace, name) DO UPDATE SET object = excluded.object"
                ),
                params![key.namespace, key.name, object],
            )
            .map_err(|e| self.wrap(e))?;
        Ok(())
    }

    /// This installation's id: `configured` when given (and kept from then
    /// on), else the one kept, else a new one (kept).
    pub fn installation_id(
        &self,
        configured: Option<&InstallationId>,
    ) -> Result<InstallationId, DatabaseError> {
        if let Some(id) = configured {
            self.conn
                .execute(
                    "INSERT INTO settings (key, value) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    params![INSTALLATION_KEY, id.as_str()],
                )
                .map_err(|e| self.wrap(e))?;
            return Ok(id.clone());
        }
        let generated = InstallationId::generate();
        self.conn
            .execute(
                "INSERT OR IGNORE INTO settings (key, value) VALUES (?1, ?2)",
                params![INSTALLATION_KEY, generated.as_str()],
            )
            .map_err(|e| self.wrap(e))?;
        let kept: String = self
            .conn
            .query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![INSTALLATION_KEY],
                |r| r.get(0),
            )
            .map_err(|e| self.wrap(e))?;
        InstallationId::parse(&kept).map_err(|e| DatabaseError::Setting {
            key: INSTALLATION_KEY,
            message: e.to_string(),
        })
    }

    /// Forgets one object, and its proxy credentials.
    pub fn delete(&self, key: &ObjectKey) -> Result<(), DatabaseError> {
        for table in ["proxies", "credentials"] {
            self.conn
                .execute(
                    &format!("DELETE FROM {table} WHERE namespace = ?1 AND name = ?2"),
                    params![key.namespace, key.name],
                )
                .map_err(|e| self.wrap(e))?;
        }
        Ok(())
    }

    /// The proxy credentials kept for incarnation `uid` of `key` and spec
    /// generation `generation`, if those are the ones kept.
    pub fn credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
    ) -> Result<Option<ProxyCredentials>, DatabaseError> {
        let found = self
            .conn
            .query_row(
                "SELECT username, password FROM credentials
                 WHERE namespace = ?1 AND name = ?2 AND uid = ?3 AND generation = ?4",
                params![key.namespace, key.name, uid, generation],
                |r| {
                    Ok(ProxyCredentials {
                        username: r.get(0)?,
                        password: r.get(1)?,
                    })
                },
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                other => Err(other),
            })
            .map_err(|e| self.wrap(e))?;
        Ok(found)
    }

    /// Keeps `credentials` for `uid` and `generation`, replacing earlier ones.
    pub fn put_credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
        credentials: &ProxyCredentials,
    ) -> Result<(), DatabaseError> {
        self.conn
            .execute(
                "INSERT INTO credentials (namespace, name, uid, generation, username, password)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (namespace, name) DO UPDATE SET uid = excluded.uid,
                   generation = excluded.generation, username = excluded.username,
                   password = excluded.password",
                params![
                    key.namespace,
                    key.name,
                    uid,
                    generation,
                    credentials.username,
                    credentials.password
                ],
            )
            .map_err(|e| self.wrap(e))?;
        Ok(())
    }
}
