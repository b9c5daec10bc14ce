//! The one way a test waits for something: [`eventually`]. Shared by the
//! library's tests and the operator's (`actors/tests/support/` includes
//! this file).

use std::time::{Duration, Instant};

/// What one look of [`eventually`] found: `Some(v)` or `Ok(v)` ends the
/// wait with `v`; `None`, or `Err(why)` saying what was seen instead (shown
/// if the wait times out), looks again.
pub trait Look {
    type Found;
    fn found(self) -> Result<Self::Found, Option<String>>;
}

impl<T> Look for Option<T> {
    type Found = T;
    fn found(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Display> Look for Result<T, E> {
    type Found = T;
    fn found(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// Polls `check` every 20 ms until it finds what it waits for, and returns
/// that; panics after `timeout`, naming `what` and the last thing `check`
/// saw instead. Every test that waits for something waits with this.
pub async fn eventually<L: Look>(what: &str, timeout: Duration, check: impl AsyncFnMut() -> L) -> L::Found {
    eventually_explained(what, timeout, String::new, check).await
}

/// [`eventually`], adding `explain()` — an operator's log, say — to the
/// message when it times out.
pub async fn eventually_explained<L: Look>(
    what: &str,
    timeout: Duration,
    explain: impl FnOnce() -> String,
    mut check: impl AsyncFnMut() -> L,
) -> L::Found {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match check().await.found() {
            Ok(found) => return found,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            let seen = seen.map(|s| format!("; last seen: {s}")).unwrap_or_default();
            let explained = explain();
            let explained = if explained.is_empty() {
                explained
            } else {
                format!("\n{explained}")
            };
            panic!("timed out after {timeout:?} waiting for {what}{seen}{explained}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
