//! The configured providers, by name (built by the adapters' registry, or
//! given directly in tests and embeddings).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Provider;

/// Every configured provider, all built or none.
#[derive(Clone, Default)]
pub struct Providers {
    by_name: BTreeMap<String, Arc<dyn Provider>>,
}

impl Providers {
    /// A set of the given providers, as they are (the adapters' registry
    /// wraps each in the metrics and tracing decorators first).
    pub fn from_providers(providers: impl IntoIterator<Item = Arc<dyn Provider>>) -> Self {
        Self {
            by_name: providers.into_iter().map(|p| (p.name().to_owned(), p)).collect(),
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
