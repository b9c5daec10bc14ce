//! Lines that come in bursts, logged once per burst. actix-server logs
//! `Error accepting connection: Too many open files` each time its accept
//! loop retries (every 0.5 s) while the process is out of files; a flood of
//! connections would fill the log with it. The first line of a burst is
//! written; the same source is then quiet until [`QUIET`] has passed.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// Targets (also those of `log` records) whose warnings and errors repeat in bursts.
const BURSTY: [&str; 1] = ["actix_server::accept"];

/// After a line from a bursty source, how long its next ones are dropped.
pub const QUIET: Duration = Duration::from_secs(60);

/// The filter: passes everything but a bursty source's repeats.
#[derive(Debug, Default)]
pub struct OncePerBurst {
    /// When a bursty line was last let through.
    last: Mutex<Option<Instant>>,
}

/// Whether `now` may log a line of a burst whose last line went out at `last`.
fn due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= QUIET)
}

/// The target of an event, or of the `log` record it carries (`log.target`).
struct LogTarget(Option<String>);

impl Visit for LogTarget {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn Debug) {}
}

fn bursty(event: &Event<'_>) -> bool {
    let meta = event.metadata();
    if *meta.level() > Level::WARN {
        return false;
    }
    if BURSTY.contains(&meta.target()) {
        return true;
    }
    if meta.target() != "log" {
        return false;
    }
    let mut target = LogTarget(None);
    event.record(&mut target);
    target.0.is_some_and(|t| BURSTY.contains(&t.as_str()))
}

impl<S> Filter<S> for OncePerBurst {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    // Called once per event, after `enabled` (which may be asked more than once).
    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        if !bursty(event) {
            return true;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if due(*last, now) {
            *last = Some(now);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_one_line_and_the_next_burst_another() {
        let t0 = Instant::now();
        assert!(due(None, t0));
        assert!(!due(Some(t0), t0 + Duration::from_millis(500)));
        assert!(!due(Some(t0), t0 + QUIET - Duration::from_millis(1)));
        assert!(due(Some(t0), t0 + QUIET));
    }
}
