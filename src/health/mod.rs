//! The health engine's parts: the probe (a real request through the proxy)
//! and the verdict state machine (thresholds, transition-only output).
//! Scheduling and the worker pool are the `HealthProber` actor's.

mod check;
mod probe;
mod verdict;

pub use check::{CheckError, CheckSpec, ProbeTarget};
pub use probe::{ProbeFailure, ProbeResult, Prober, ProberError};
pub use verdict::{HealthState, LatencyRule, RecordedVerdict, Sample, Thresholds, Verdict};
