//! The operator's Kubernetes client as a good citizen of a shared API
//! server (docs/kubernetes.md, "API budget"): a request the server refuses
//! with `429` (or `503`) is retried no sooner than its `Retry-After` and
//! only a few times; an optional client-side budget (`--kube-api-qps`,
//! `--kube-api-burst`) spaces requests out; every request is counted by
//! verb, resource and code, and every wait is measured. The decisions are
//! pure ([`budget`], [`retry`], [`request`]); [`layer`] applies them to
//! kube's service stack.

pub mod budget;
pub mod layer;
pub mod request;
pub mod retry;
pub mod watch_cache;
pub mod watch_retry;

pub use budget::{ApiBudget, TokenBucket};
pub use layer::{KubeApiLayer, client};
pub use request::{ApiRequest, Verb};
pub use retry::{RetryRules, RetryWait, WaitSource};
