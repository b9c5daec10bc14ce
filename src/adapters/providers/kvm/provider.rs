//! The kvm provider: VMs on libvirt hosts reached over SSH
//! (docs/kvm-provider.md). It resolves placement, builds the seed and the
//! plan, and hands the libvirt work to a [`HostRunner`] — in the running
//! system, one supervised actor per host that owns the SSH link and runs the
//! blocking calls on its own thread.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jiff::Timestamp;

use super::base_image::pin_name;
use super::domain_xml::DomainSpec;
use super::host_runner::{HostRunner, RunError};
pub use super::image::{CachedBase, ImageSpec};
use super::metadata::InstanceMetadata;
use super::ops::DomainRunState;
use super::ops::{CreatePlan, Observed, Released};
use super::placement_image;
use super::pool_gc::{PoolSweep, SweepPlan};
use super::provider_id::{parse, provider_id};
use super::seed::{SeedFiles, build_iso, meta_data, vendor_data};
use crate::domain::config::{Firmware, KvmConfig, KvmHost};
use crate::domain::provider_contract::{
    CreateRequest, ErrorClass, Instance, InstanceState, LeftoverSweep, Op, Provider, ProviderError,
    ProviderId,
};

/// How long a create waits for its image before handing back with a retry hint.
const IMAGE_WAIT: Duration = Duration::from_secs(10);
const IMAGE_RECHECK: Duration = Duration::from_secs(1);

pub struct KvmProvider {
    name: String,
    config: KvmConfig,
    runner: Arc<dyn HostRunner>,
    /// Since when each (host, volume) has been a leftover, as seen by this
    /// process (a restart starts the grace period over: the safe direction).
    leftover_since: Mutex<HashMap<(String, String), Instant>>,
}

impl KvmProvider {
    pub fn new(name: &str, config: KvmConfig, runner: Arc<dyn HostRunner>) -> Self {
        Self {
            name: name.to_owned(),
            config,
            runner,
            leftover_since: Mutex::new(HashMap::new()),
        }
    }

    fn err(
        &self,
        class: ErrorClass,
        op: Op,
        id: Option<&str>,
        cause: impl std::fmt::Display,
    ) -> ProviderError {
        ProviderError::new(class, op, &self.name, id, cause.to_string())
    }

    /// A host request failed: classed by its cause, which stays the error's source.
    fn run_failed(&self, op: Op, id: Option<&str>, e: RunError) -> ProviderError {
        ProviderError::new(e.class(), op, &self.name, id, e)
    }

    fn host_named(&self, name: &str) -> Option<&KvmHost> {
        self.config.hosts.iter().find(|h| h.name == name)
    }

    /// `placement.image`, resolved as [`placement_image::resolve`] says.
    pub fn resolve_image(&self, image: Option<&str>) -> Result<ImageSpec, String> {
        placement_image::resolve(&self.config, &self.name, image)
    }

    fn plan(
        &self,
        req: &CreateRequest,
        host: &KvmHost,
        base: &CachedBase,
        firmware: Firmware,
    ) -> Result<CreatePlan, ProviderError> {
        let permanent = |m: String| self.err(ErrorClass::Permanent, Op::Create, Some(req.name.as_str()), m);
        let key = req
            .placement
            .machine_type
            .as_deref()
            .ok_or_else(|| permanent("placement.machineType is required".into()))?;
        let machine = self.config.machine_types.get(key).ok_or_else(|| {
            let known: Vec<&str> = self.config.machine_types.keys().map(String::as_str).collect();
            permanent(format!(
                "placement.machineType {key:?} is not configured (configured: {})",
                known.join(", ")
            ))
        })?;
        let name = req.name.to_string();
        let seed_iso = build_iso(&SeedFiles {
            user_data: req.cloud_init.as_ref().map(|c| c.0.clone()).unwrap_or_default(),
            meta_data: meta_data(&name),
            vendor_data: vendor_data(
                self.config.install_guest_agent,
                self.config.vendor_data.as_deref(),
            ),
        })
        .map_err(|e| permanent(format!("building the seed ISO: {e}")))?;
        Ok(CreatePlan {
            domain: DomainSpec {
                name,
                domain_type: host.domain_type,
                firmware,
                vcpus: machine.vcpus,
                memory_mib: machine.memory_mib,
                disk_path: String::new(),
                seed_path: String::new(),
                bridge: host.bridge.clone(),
                metadata: InstanceMetadata {
                    managed: true,
                    uid: req.uid.clone(),
                    created_at: Timestamp::now(),
                    namespace: Some(req.namespace.clone()),
                    installation: Some(req.installation.to_string()),
                    released: false,
                },
            },
            base_volume: base.volume.clone(),
            base_format: base.format.as_str().to_owned(),
            disk_bytes: u64::from(self.config.disk_size_gb) << 30,
            seed_iso,
        })
    }

    /// Volumes the configured images keep in every pool: bases of configured
    /// digests, pins of configured URLs (and through them their bases).
    fn configured_volumes(&self) -> BTreeSet<String> {
        self.config
            .images
            .values()
            .map(|cfg| match &cfg.sha256 {
                Some(d) => super::base_image::base_volume(&d.to_ascii_lowercase(), cfg.format),
                None => pin_name(&cfg.url),
            })
            .collect()
    }

    /// One host's pool sweep, with the grace bookkeeping.
    async fn sweep_host(&self, host: &KvmHost, grace: Duration) -> Result<PoolSweep, RunError> {
        let now = Instant::now();
        let due = {
            let since = self.leftover_since.lock().unwrap_or_else(|p| p.into_inner());
            since
                .iter()
                .filter(|((h, _), at)| *h == host.name && now.duration_since(**at) >= grace)
                .map(|((_, v), _)| v.clone())
                .collect()
        };
        let plan = SweepPlan {
            keep: self.configured_volumes(),
            protect: BTreeSet::new(),
            due,
        };
        let swept = self.runner.sweep_pool(host, plan).await?;
        let mut since = self.leftover_since.lock().unwrap_or_else(|p| p.into_inner());
        since.retain(|(h, v), _| *h != host.name || swept.leftovers.contains(v));
        for v in &swept.leftovers {
            if !swept.deleted.contains(v) {
                since.entry((host.name.clone(), v.clone())).or_insert(now);
            }
        }
        for v in &swept.deleted {
            since.remove(&(host.name.clone(), v.clone()));
        }
        Ok(swept)
    }

    fn instance(&self, id: &ProviderId, observed: Observed) -> Instance {
        Instance {
            id: id.clone(),
            state: observed.state,
            reason: observed.reason,
            ip: observed.ip,
            port: None,
            outgoing_address: None,
            owner: observed
                .metadata
                .as_ref()
                .map(InstanceMetadata::ownership)
                .unwrap_or_default(),
            created_at: observed.metadata.map(|m| m.created_at),
        }
    }
}

#[async_trait]
impl Provider for KvmProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "kvm"
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let id_name = Some(req.name.as_str());
        let host = self.config.host(req.placement.zone.as_deref()).ok_or_else(|| {
            let hosts: Vec<&str> = self.config.hosts.iter().map(|h| h.name.as_str()).collect();
            let why = match &req.placement.zone {
                Some(z) => format!(
                    "placement.zone {z:?} is not a configured host ({})",
                    hosts.join(", ")
                ),
                None => format!(
                    "placement.zone is required with several hosts ({})",
                    hosts.join(", ")
                ),
            };
            self.err(ErrorClass::Permanent, Op::Create, id_name, why)
        })?;
        let image = self
            .resolve_image(req.placement.image.as_deref())
            .map_err(|m| self.err(ErrorClass::Permanent, Op::Create, id_name, m))?;
        // A long download goes on beside the reconcile: this one waits a
        // while, then lets the Proxy's actor go (deletions stay responsive)
        // and comes back to join the same download.
        let base = match tokio::time::timeout(IMAGE_WAIT, self.runner.ensure_image(host, &image)).await {
            Ok(ensured) => ensured.map_err(|e| self.run_failed(Op::Create, id_name, e))?,
            Err(_) => {
                let why = format!(
                    "image {} is still being fetched onto host {}",
                    image.url, host.name
                );
                return Err(self
                    .err(ErrorClass::Transient, Op::Create, id_name, why)
                    .retry_after(IMAGE_RECHECK));
            }
        };
        let plan = self.plan(req, host, &base, image.firmware)?;
        self.runner
            .create(host, plan)
            .await
            .map_err(|e| self.run_failed(Op::Create, id_name, e))?;
        Ok(provider_id(&host.name, req.name.as_str()))
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let (host_name, domain) = parse(id).ok_or_else(|| {
            self.err(
                ErrorClass::Permanent,
                Op::Get,
                Some(id.as_str()),
                "not a kvm providerID",
            )
        })?;
        // A typo in `hosts` must never look like a missing VM (that would rebuild it elsewhere).
        let host = self.host_named(host_name).ok_or_else(|| {
            self.err(
                ErrorClass::Permanent,
                Op::Get,
                Some(id.as_str()),
                format!("host {host_name:?} is not configured"),
            )
        })?;
        match self.runner.get(host, domain).await {
            Ok(Some(observed)) => Ok(self.instance(id, observed)),
            Ok(None) => Err(self.err(ErrorClass::NotFound, Op::Get, Some(id.as_str()), "no such domain")),
            Err(e) => Err(self.run_failed(Op::Get, Some(id.as_str()), e)),
        }
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let (host_name, domain) = parse(id).ok_or_else(|| {
            self.err(
                ErrorClass::Permanent,
                Op::Delete,
                Some(id.as_str()),
                "not a kvm providerID",
            )
        })?;
        let Some(host) = self.host_named(host_name) else {
            // Else the finalizer would be pinned forever.
            tracing::warn!(provider = %self.name, providerID = %id, "host not configured; nothing to delete");
            return Ok(());
        };
        self.runner
            .delete(host, domain)
            .await
            .map_err(|e| self.run_failed(Op::Delete, Some(id.as_str()), e))
    }

    async fn sweep_leftovers(&self, grace: Duration) -> Result<LeftoverSweep, ProviderError> {
        let mut out = LeftoverSweep::default();
        for host in &self.config.hosts {
            // Each pool is judged on its own: one unreachable host does not stop the others.
            let swept = match self.sweep_host(host, grace).await {
                Ok(swept) => swept,
                Err(e) => {
                    out.errors.push(format!("host {}: {e}", host.name));
                    continue;
                }
            };
            for (volume, why) in &swept.failed {
                tracing::warn!(provider = %self.name, host = %host.name, volume, error = %why, "GC: deleting a leftover volume failed");
            }
            for volume in &swept.deleted {
                tracing::info!(provider = %self.name, host = %host.name, volume, "GC: leftover volume deleted");
            }
            out.failed += swept.failed.len();
            out.waiting += swept.leftovers.len() - swept.deleted.len() - swept.failed.len();
            out.deleted
                .extend(swept.deleted.iter().map(|v| format!("{}/{v}", host.name)));
        }
        Ok(out)
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let failed = |class, why: String| self.err(class, Op::Release, Some(id.as_str()), why);
        let (host_name, domain) =
            parse(id).ok_or_else(|| failed(ErrorClass::Permanent, "not a kvm providerID".into()))?;
        // Unlike delete, not a silent success: the domain would stay markable as managed.
        let host = self.host_named(host_name).ok_or_else(|| {
            failed(
                ErrorClass::Permanent,
                format!("host {host_name:?} is not configured; the domain cannot be marked released"),
            )
        })?;
        let how = self
            .runner
            .release(host, domain)
            .await
            .map_err(|e| self.run_failed(Op::Release, Some(id.as_str()), e))?;
        match how {
            Released::Marked => {
                tracing::info!(provider = %self.name, providerID = %id, "domain released: left running, no longer managed")
            }
            Released::Gone => {
                tracing::debug!(provider = %self.name, providerID = %id, "release: no such domain")
            }
            Released::Unmarked => {
                tracing::warn!(provider = %self.name, providerID = %id, "release: the domain carries no operator metadata; left untouched")
            }
        }
        Ok(())
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let mut out = Vec::new();
        for host in &self.config.hosts {
            // One unreachable host fails the sweep: GC must not act on a partial view.
            let listed = self
                .runner
                .list_managed(host)
                .await
                .map_err(|e| self.err(e.class(), Op::List, None, format!("host {}: {e}", host.name)))?;
            for (name, state, meta) in listed {
                let (state, reason) = match state {
                    DomainRunState::Running | DomainRunState::Transitional => {
                        (InstanceState::Provisioning, None)
                    }
                    DomainRunState::Stopped { reason } => (InstanceState::Stopped, Some(reason.to_owned())),
                };
                out.push(Instance {
                    reason,
                    id: provider_id(&host.name, &name),
                    state,
                    ip: None,
                    port: None,
                    outgoing_address: None,
                    owner: meta.ownership(),
                    created_at: Some(meta.created_at),
                });
            }
        }
        Ok(out)
    }
}
