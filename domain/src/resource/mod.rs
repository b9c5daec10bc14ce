//! The `Proxy` custom resource (`crawl.example.com/v1alpha1`, short name `px`).
//!
//! The Rust types are the single source of truth: the CRD in `deploy/crd/` is
//! generated from them (`egress-proxies-operator crd`) and a test guards drift.

mod conditions;
mod crd;
mod key;
mod listing;
mod metadata;
mod pool;
mod probe_duration;
mod spec;
mod status;
mod table;

pub use conditions::set_condition;
pub use crd::{CrdError, CrdKind, crd_yaml, crd_yaml_of};
pub use key::ObjectKey;
pub use listing::{ListFormat, ListingError, pool_list, proxy_list};
pub use metadata::*;
pub use pool::*;
pub use probe_duration::DurationError;
pub use spec::*;
pub use status::*;
pub use table::{aligned, pool_table, proxy_table, site_table};
