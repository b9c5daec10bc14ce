//! The health engine's decisions: what a check is, and the verdict state
//! machine (thresholds, transition-only output). The probe itself, a real
//! request through the proxy, is an adapter (`egress_proxies::adapters::probe`);
//! scheduling and the worker pool are the `HealthProber` actor's.

mod check;
mod verdict;

pub use check::{CheckError, CheckSpec, ProbeTarget};
pub use verdict::{HealthState, LatencyRule, RecordedVerdict, Sample, Thresholds, Verdict};
