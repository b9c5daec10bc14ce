//! What the lease book must not forget across a restart: held leases,
//! recently ended ones (they still accept reports), rests, and each proxy's
//! tally of blocked targets and errors. The book
//! describes each change it makes as a [`LeaseChange`]; a [`LeaseJournal`]
//! makes them durable and hands them back as a [`LeaseSnapshot`] at start.
//! Times are wall-clock: they outlive the process whose monotonic clock
//! measured them.

mod state;

use jiff::Timestamp;

pub use state::{JournalState, key_string, parse_key, parse_ms};

use crate::resource::ObjectKey;

/// A held lease as remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    pub id: String,
    pub proxy: ObjectKey,
    pub target: String,
    pub expires: Timestamp,
    /// The TTL it was granted with (a renewal's default).
    pub ttl_ms: u64,
    pub client: Option<String>,
    /// The identity that took it. None in records written before leases
    /// had owners: any identity may act on such a lease.
    pub owner: Option<String>,
}

/// An ended lease that still accepts reports until `until`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedRecord {
    pub id: String,
    pub proxy: ObjectKey,
    pub target: String,
    pub until: Timestamp,
    /// The identity that took it (reports in the grace are its only); None
    /// as in [`LeaseRecord::owner`].
    pub owner: Option<String>,
}

/// One change to the lease state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseChange {
    Granted(LeaseRecord),
    /// A held lease now expires later (renewal).
    Extended {
        id: String,
        expires: Timestamp,
    },
    /// A lease ended (released, expired, or its proxy went away).
    Ended(EndedRecord),
    /// `proxy` rests for `target` until then (after a release or a `blocked` report).
    TargetRest {
        target: String,
        proxy: ObjectKey,
        until: Timestamp,
    },
    /// `proxy` rests for every target until then (after an `error` report).
    ProxyRest {
        proxy: ObjectKey,
        until: Timestamp,
    },
    /// A target (by [`crate::lease::target_digest`]) reported `proxy`
    /// blocked (counted once per target).
    BlockedBy {
        proxy: ObjectKey,
        target: u64,
    },
    /// `proxy`'s leases have reported this many errors in all.
    Errors {
        proxy: ObjectKey,
        count: u32,
    },
    /// The proxy is gone: nothing about it matters any more.
    ProxyRemoved(ObjectKey),
}

/// What a proxy's reports added up to: a pool rotates a member on these, so
/// they outlive a restart like the rests do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyTally {
    pub proxy: ObjectKey,
    /// Distinct targets that reported it blocked, as digests.
    pub blocked_targets: Vec<u64>,
    pub errors: u32,
}

/// Everything a journal remembers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseSnapshot {
    pub leases: Vec<LeaseRecord>,
    pub ended: Vec<EndedRecord>,
    pub target_rests: Vec<(String, ObjectKey, Timestamp)>,
    pub proxy_rests: Vec<(ObjectKey, Timestamp)>,
    pub tallies: Vec<ProxyTally>,
}

/// Keeping lease state failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("lease journal {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("lease journal: a stored {what} is invalid: {value}")]
    Corrupt { what: &'static str, value: String },
    #[error("lease checkpoint {name}: {message}")]
    Checkpoint { name: String, message: String },
    #[error("lease checkpoint not written within {0:?}")]
    Timeout(std::time::Duration),
    /// This replica's leadership ended: it writes nothing more.
    #[error("this replica no longer leads; the lease checkpoint is not written")]
    NotLeading,
}

/// When recorded changes are durable.
pub enum Durable {
    /// Already, when `record` returns.
    Now,
    /// Once this resolves (a checkpoint written behind).
    Later(futures::future::BoxFuture<'static, Result<(), JournalError>>),
}

/// Durable lease state.
pub trait LeaseJournal: Send {
    /// What was remembered (expired entries may be left out).
    fn load(&mut self, now: Timestamp) -> Result<LeaseSnapshot, JournalError>;

    /// Takes `changes`, in order; says when they are durable.
    fn record(&mut self, changes: &[LeaseChange]) -> Result<Durable, JournalError>;

    /// Drops what ended before `now` (expired rests, ended leases past their grace).
    fn prune(&mut self, now: Timestamp) -> Result<(), JournalError>;
}
