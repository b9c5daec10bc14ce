//! One replicas test at a time: each `replicas_*` test runs three operator
//! processes and loads the machine for tens of seconds, and its timing
//! bounds (a takeover within the lease duration, a block seen elsewhere
//! within a second) assume the machine is not also running another such
//! bed. Each takes [`replicas_lock`] first: an exclusive `flock` on one
//! file in the temporary directory, held until the guard drops (at the
//! test's end, after its bed), and released by the kernel if the test
//! process dies.

use std::fs::{File, OpenOptions};
use std::time::Instant;

/// The lock file every replicas test shares.
const LOCK_FILE: &str = "egress-proxies-operator-replicas-tests.lock";

/// Holds the lock while alive.
pub struct ReplicasLock(#[allow(dead_code, reason = "held for its Drop")] File);

/// Waits until no other replicas test runs (in this process or another),
/// then holds the lock; keep the guard for the whole test: `let _one =
/// replicas_lock();` before the bed is started.
pub fn replicas_lock() -> ReplicasLock {
    let path = std::env::temp_dir().join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if file.try_lock().is_err() {
        let since = Instant::now();
        eprintln!("waiting for another replicas test to finish ({})", path.display());
        file.lock()
            .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
        eprintln!("waited {:?} for the replicas lock", since.elapsed());
    }
    ReplicasLock(file)
}
