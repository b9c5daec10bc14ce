//! The gcp provider (docs/gcp-provider.md): Compute Engine VMs over five
//! REST calls, authenticated with Application Default Credentials.
//!
//! ```text
//!   GcpProvider ── placement, providerID, states ──┐
//!        │ instance_body (body.rs, pure)           │
//!        ▼                                         ▼
//!   ComputeApi (api.rs) ── reqwest ──▶ compute.googleapis.com/compute/v1
//!        │  wire log (wire_log.rs: elided, cloud-init redacted)
//!        └─ TokenSource ── gcp_auth (ADC: key file, gcloud, metadata server)
//! ```

pub mod api;
pub mod body;
pub mod provider;
pub mod wire_log;

pub use provider::{GcpOptions, GcpProvider};
