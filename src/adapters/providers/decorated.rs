//! Every provider the operator calls is wrapped in two decorators: the
//! metrics one ([`Instrumented`]: a count and a duration per call) and,
//! outermost, the tracing one ([`Traced`]: a span per call).

use std::sync::Arc;

use super::instrumented::Instrumented;
use super::traced::Traced;
use crate::domain::provider_contract::{Provider, Providers};

/// The set of `providers`, each wrapped in the decorators.
pub fn decorated(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Providers {
    Providers::from_providers(providers.into_iter().map(|p| Traced::wrap(Instrumented::wrap(p))))
}
