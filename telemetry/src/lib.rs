//! Logs, metrics and (issue 11) traces. Internal events ([`events`]) are
//! the one place a notable happening is reported: each writes its log line
//! and records its metrics, so the two never drift apart.
#![warn(clippy::unwrap_used, clippy::expect_used)]
// Dependencies the crate does not use (dev-dependencies only count for tests).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

pub mod events;
pub mod gateway_stats;
pub mod history;
pub mod label_budget;
mod log_bursts;
mod logging;
pub mod metrics;
pub mod otel;
mod process;

pub use logging::{LogFormat, LoggingError, TelemetryGuard, init_logging};
pub use metrics::metrics;
