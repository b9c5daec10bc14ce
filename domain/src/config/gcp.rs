//! `type: gcp` — Compute Engine VMs with an ephemeral external IP.

use serde::{Deserialize, Serialize};

use super::problems::Problems;

/// Default VPC network.
pub const DEFAULT_NETWORK: &str = "global/networks/default";
/// Default boot disk size; also Compute Engine's minimum for stock images.
pub const DEFAULT_DISK_SIZE_GB: u32 = 10;
/// The Compute Engine API root.
pub const DEFAULT_API_ENDPOINT: &str = "https://compute.googleapis.com/compute/v1/";

/// Settings of one gcp provider instance. Credentials come from Application
/// Default Credentials, not from this file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GcpConfig {
    /// Project the VMs are created in.
    pub project: String,
    /// VPC network of the VMs' interface.
    #[serde(default = "default_network")]
    pub network: String,
    /// Network tag added to every VM (for firewall rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_tag: Option<String>,
    /// Boot disk size.
    #[serde(default = "default_disk_size_gb")]
    pub disk_size_gb: u32,
    /// Compute Engine API root (a Private Service Connect endpoint, say).
    #[serde(default = "default_api_endpoint")]
    pub api_endpoint: String,
}

fn default_network() -> String {
    DEFAULT_NETWORK.to_owned()
}
fn default_disk_size_gb() -> u32 {
    DEFAULT_DISK_SIZE_GB
}
fn default_api_endpoint() -> String {
    DEFAULT_API_ENDPOINT.to_owned()
}

impl GcpConfig {
    pub(super) fn validate(&self, p: &mut Problems) {
        if self.project.trim().is_empty() {
            p.report("gcp.project", "is required (the project the VMs are created in)");
        } else if self.project.contains(['/', ' ']) {
            p.report("gcp.project", format!("{:?} is not a project ID", self.project));
        }
        match url::Url::parse(&self.api_endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && self.api_endpoint.ends_with('/') => {}
            _ => p.report(
                "gcp.apiEndpoint",
                format!(
                    "{:?} must be an http(s) URL ending in '/' (default {DEFAULT_API_ENDPOINT})",
                    self.api_endpoint
                ),
            ),
        }
        if self.network.trim().is_empty() {
            p.report("gcp.network", "must not be empty");
        }
        if let Some(tag) = &self.network_tag
            && !is_network_tag(tag)
        {
            p.report(
                "gcp.networkTag",
                format!("{tag:?} must be 1-63 lowercase letters, digits or '-', starting with a letter"),
            );
        }
        if self.disk_size_gb < DEFAULT_DISK_SIZE_GB {
            p.report(
                "gcp.diskSizeGb",
                format!(
                    "{} is below Compute Engine's minimum of {DEFAULT_DISK_SIZE_GB}",
                    self.disk_size_gb
                ),
            );
        }
    }
}

/// Compute Engine's rule for network tags (RFC 1035 labels).
fn is_network_tag(tag: &str) -> bool {
    (1..=63).contains(&tag.len())
        && tag.starts_with(|c: char| c.is_ascii_lowercase())
        && !tag.ends_with('-')
        && tag
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}
