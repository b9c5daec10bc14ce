//! `type: kubernetes` — a Squid pod in the Proxy's namespace.

use serde::{Deserialize, Serialize};

use super::problems::Problems;
use crate::destinations::DestinationRules;

/// Squid image run by default.
pub const DEFAULT_SQUID_IMAGE: &str = "ubuntu/squid:6.6-24.04_edge";

/// Settings of one kubernetes provider instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesConfig {
    /// Container image running Squid.
    #[serde(default = "default_image")]
    pub image: String,
    /// Which destinations the proxies may reach (docs/security.md).
    #[serde(default, skip_serializing_if = "DestinationRules::is_empty")]
    pub destinations: DestinationRules,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            image: default_image(),
            destinations: DestinationRules::default(),
        }
    }
}

fn default_image() -> String {
    DEFAULT_SQUID_IMAGE.to_owned()
}

impl KubernetesConfig {
    pub(super) fn validate(&self, p: &mut Problems) {
        if self.image.trim().is_empty() || self.image.contains(char::is_whitespace) {
            p.report(
                "kubernetes.image",
                format!("{:?} is not a container image reference", self.image),
            );
        }
    }
}
