//! The configured providers, by name (built by the adapters' registry, or
//! given directly in tests and embeddings).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Instrumented, Provider, Traced};

/// Every provider is wrapped by the metrics and (outermost) tracing decorators.
fn wrap(provider: Arc<dyn Provider>) -> Arc<dyn Provider> {
    Traced::wrap(Instrumented::wrap(provider))
}

/// Every configured provider, all built or none.
#[derive(Clone, Default)]
pub struct Providers {
    by_name: BTreeMap<String, Arc<dyn Provider>>,
}

impl Providers {
    /// A set of the given providers, each wrapped in the decorators.
    pub fn from_providers(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        Self {
            by_name: providers
                .into_iter()
                .map(|p| (p.name().to_owned(), wrap(p)))
                .collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.by_name.values()
    }

    pub fn names(&self) -> Vec<&str> {
        self.by_name.keys().map(String::as_str).collect()
    }
}
