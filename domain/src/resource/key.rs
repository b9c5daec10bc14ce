//! Addressing an object: namespace and name.

use std::fmt;

use super::Proxy;

/// `namespace/name` of a Proxy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a Proxy (namespace `default` when unset).
    pub fn of(proxy: &Proxy) -> Self {
        Self::new(
            proxy.metadata.namespace.as_deref().unwrap_or("default"),
            proxy.metadata.name.as_deref().unwrap_or_default(),
        )
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
