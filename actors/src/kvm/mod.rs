//! The kvm provider's hosts in the running system: the host actors, the
//! image cache, and the [`HostRouter`] over them that the library's
//! [`RoutedRunner`] makes the provider's [`HostRunner`]. The provider
//! (`egress_proxies::adapters::providers::kvm`) plans each request as data and
//! reaches this module through that one port; what runs on a host's link
//! (the SSH link, the libvirt thread and session, the requests, image
//! fetches, pool sweeps) is the library's
//! (`egress_proxies::adapters::providers::kvm::host`), which the actors drive.
//!
//! ```text
//!  KvmProvider ──HostRunner──► RoutedRunner ──HostRouter──► LazyKvmHosts → KvmHosts
//!  (src/adapters/providers/kvm)   │ Call<C> (typed)      │ Ensure       (this file)
//!                                 ▼                      ▼
//!                KvmHostActor (one per host,      ImageCacheActor
//!                each under a Supervisor)         (one fetch per host+image,
//!                  │ owns the SSH link              beside the actor)
//!                  ▼                                     │ LookupBase, LinkUri
//!                libvirt thread: one call at a time ◄────┘
//! ```
//!
//! - [`host_actor`]: one actor per host owns its SSH link and libvirt
//!   thread; a dead link, a transport error or a call past its deadline
//!   restarts only that host's actor.
//! - [`image_cache`]: one download per (host, image), shared by its waiters.
//! - Here, [`KvmHosts`] / [`LazyKvmHosts`], the [`HostRouter`]: each call
//!   goes, as a typed [`Call`], to the actor of the host it names; images
//!   go through the image cache, one download per (host, image).
//!
//! Each request is a [`HostCall`] answered with its own type: no caller
//! picks its answer out of a sum.

pub mod host_actor;
pub mod image_cache;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use egress_proxies::adapters::providers::KvmRunnerFactory;
use egress_proxies::adapters::providers::kvm::host::{
    CachedBase, DownloadLimits, Downloader, HostCall, HostRouter, HostRunner, ImageSpec, RoutedRunner,
    RunError, ensure_client_setup,
};
use egress_proxies::domain::config::{KvmConfig, KvmHost};

use crate::supervision::{self, Node};
use host_actor::{Call, JOB_DEADLINE, KeyCache, KvmHostActor};
use image_cache::{Ensure, FetchingVolumes, Forget, ImageCacheActor};

/// One supervised actor per host, and the image cache.
pub struct KvmHosts {
    hosts: HashMap<String, Addr<KvmHostActor>>,
    images: Addr<ImageCacheActor>,
}

impl KvmHosts {
    /// Starts one supervised actor per configured host (call inside the actix
    /// system); each lets a call run `job_deadline` once started.
    pub fn start(config: &KvmConfig, job_deadline: Duration) -> Result<Self, reqwest::Error> {
        ensure_client_setup();
        egress_proxies::tls::ensure_crypto_provider();
        let shared = Arc::new(config.clone());
        let keys = Arc::new(KeyCache::default());
        let hosts = config
            .hosts
            .iter()
            .map(|h| {
                let (host, cfg, keys) = (h.clone(), shared.clone(), keys.clone());
                (
                    h.name.clone(),
                    supervision::start(Node::member("kvm_host", h.name.clone(), "system"), move |_| {
                        KvmHostActor::new(host, cfg, keys, job_deadline)
                    }),
                )
            })
            .collect();
        let images = ImageCacheActor::new(Downloader::new(DownloadLimits::for_config(config))?);
        let images = supervision::start(Node::singleton("kvm_image_cache"), |_| images);
        Ok(Self { hosts, images })
    }

    fn addr(&self, host: &KvmHost) -> Result<&Addr<KvmHostActor>, RunError> {
        self.hosts
            .get(&host.name)
            .ok_or_else(|| RunError::UnknownHost(host.name.clone()))
    }

    /// Runs one call on `host`'s libvirt thread.
    pub async fn call<C: HostCall>(&self, host: &KvmHost, call: C) -> Result<C::Output, RunError> {
        self.addr(host)?
            .send(Call(call))
            .await
            .map_err(|_| RunError::LinkReset {
                host: host.name.clone(),
            })?
    }

    /// Makes sure `image` is in the host's pool (one download per host and image).
    pub async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError> {
        let host_actor = self.addr(host)?.clone();
        self.images
            .send(Ensure {
                host: host.clone(),
                image: image.clone(),
                host_actor,
            })
            .await
            .map_err(|_| RunError::ImageCacheRestarted)?
    }

    /// The volumes fetches are writing on `host` right now.
    pub async fn fetching_volumes(&self, host: &KvmHost) -> Result<Vec<String>, RunError> {
        // An unconfigured host fails before the image cache is asked.
        self.addr(host)?;
        self.images
            .send(FetchingVolumes(host.name.clone()))
            .await
            .map_err(|_| RunError::ImageCacheRestarted)
    }
}

/// Host actors started on first use, inside the actor system (providers are
/// built before it runs).
pub struct LazyKvmHosts {
    config: KvmConfig,
    job_deadline: Duration,
    hosts: OnceLock<Result<KvmHosts, Arc<reqwest::Error>>>,
}

impl LazyKvmHosts {
    fn started(&self) -> Result<&KvmHosts, RunError> {
        self.hosts
            .get_or_init(|| KvmHosts::start(&self.config, self.job_deadline).map_err(Arc::new))
            .as_ref()
            .map_err(|e| RunError::NotStarted(e.clone()))
    }
}

#[async_trait]
impl HostRouter for LazyKvmHosts {
    async fn call<C: HostCall>(&self, host: &KvmHost, call: C) -> Result<C::Output, RunError> {
        self.started()?.call(host, call).await
    }

    async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError> {
        self.started()?.ensure_image(host, image).await
    }

    async fn fetching_volumes(&self, host: &KvmHost) -> Result<Vec<String>, RunError> {
        self.started()?.fetching_volumes(host).await
    }

    fn forget_base(&self, host: &KvmHost, volume: String) {
        // Only after a call ran, so the hosts are started: never start them here.
        if let Some(Ok(hosts)) = self.hosts.get() {
            hosts.images.do_send(Forget {
                host: host.name.clone(),
                volume,
            });
        }
    }
}

/// The factory the providers registry uses for kvm instances.
pub fn runner_factory() -> KvmRunnerFactory {
    runner_factory_with_job_deadline(JOB_DEADLINE)
}

/// [`runner_factory`] with another deadline for calls (tests make hung calls fail fast).
pub fn runner_factory_with_job_deadline(job_deadline: Duration) -> KvmRunnerFactory {
    Arc::new(move |_name, config| {
        Ok(Arc::new(RoutedRunner(LazyKvmHosts {
            config: config.clone(),
            job_deadline,
            hosts: OnceLock::new(),
        })) as Arc<dyn HostRunner>)
    })
}
