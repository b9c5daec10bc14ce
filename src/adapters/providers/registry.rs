//! Building the configured providers: the one file that knows every
//! provider implementation.

use std::path::PathBuf;
use std::sync::Arc;

use crate::domain::config::{ProviderSettings, ProvidersConfig};

use crate::domain::provider_contract::{Provider, Providers};

use super::gcp::{GcpOptions, GcpProvider, api::AdcTokens};
use super::kubernetes::KubernetesProvider;
use super::kvm::host_runner::HostRunner;
use super::kvm::provider::KvmProvider;
use super::local::LocalProvider;

/// What building providers needs besides their configuration.
#[derive(Clone)]
pub struct BuildContext {
    /// Where providers keep local state (the local provider's instances).
    pub state_dir: PathBuf,
    /// This program, for providers that run it as a helper process.
    pub operator_exe: PathBuf,
    /// The cluster, in Kubernetes mode (the kubernetes provider needs it).
    pub kube_client: Option<kube::Client>,
    /// Starts the host links of a kvm provider instance (the running system's host actors).
    pub kvm_runner: Option<KvmRunnerFactory>,
    /// Command-line settings of gcp providers.
    pub gcp: GcpOptions,
    /// The cluster's pod and service ranges (Kubernetes mode): proxies deny
    /// them like the other internal networks.
    pub cluster_networks: Vec<crate::domain::destinations::IpNet>,
}

/// Makes the [`HostRunner`] of one kvm provider instance.
pub type KvmRunnerFactory =
    Arc<dyn Fn(&str, &crate::domain::config::KvmConfig) -> Result<Arc<dyn HostRunner>, String> + Send + Sync>;

/// A provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("provider {name}: type {kind} is not available in this build of the operator")]
    Unavailable { name: String, kind: &'static str },
    #[error("provider {name}: {reason}")]
    Invalid { name: String, reason: String },
}

/// Builds every configured provider, all or none, each wrapped in the
/// metrics and tracing decorators.
pub fn build(config: &ProvidersConfig, ctx: &BuildContext) -> Result<Providers, BuildError> {
    let mut built = Vec::new();
    for instance in &config.providers {
        let provider: Arc<dyn Provider> = match &instance.settings {
            ProviderSettings::Local(local) => Arc::new(
                LocalProvider::new(
                    &instance.name,
                    local.clone(),
                    &ctx.state_dir,
                    ctx.operator_exe.clone(),
                    &ctx.cluster_networks,
                )
                .map_err(|e| BuildError::Invalid {
                    name: instance.name.clone(),
                    reason: e.to_string(),
                })?,
            ),
            ProviderSettings::Kubernetes(k8s) => match &ctx.kube_client {
                Some(client) => Arc::new(
                    KubernetesProvider::new(&instance.name, k8s.clone(), client.clone())
                        .with_cluster_networks(&ctx.cluster_networks),
                ),
                None => {
                    return Err(BuildError::Invalid {
                        name: instance.name.clone(),
                        reason: "the kubernetes provider needs Kubernetes mode (`run`), not standalone"
                            .into(),
                    });
                }
            },
            ProviderSettings::Kvm(kvm) => {
                let factory = ctx.kvm_runner.as_ref().ok_or_else(|| BuildError::Unavailable {
                    name: instance.name.clone(),
                    kind: "kvm",
                })?;
                let runner = factory(&instance.name, kvm).map_err(|reason| BuildError::Invalid {
                    name: instance.name.clone(),
                    reason,
                })?;
                Arc::new(KvmProvider::new(&instance.name, kvm.clone(), runner))
            }
            ProviderSettings::Gcp(gcp) => {
                let tokens = Arc::new(AdcTokens::discover());
                Arc::new(
                    GcpProvider::new(&instance.name, gcp.clone(), tokens, &ctx.gcp).map_err(|reason| {
                        BuildError::Invalid {
                            name: instance.name.clone(),
                            reason,
                        }
                    })?,
                )
            }
        };
        built.push(provider);
    }
    Ok(super::decorated(built))
}
