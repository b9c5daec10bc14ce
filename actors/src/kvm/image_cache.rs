//! `ImageCacheActor`: one fetch per (host, image) at a time; callers that
//! arrive meanwhile wait for its result. The fetch itself runs beside the
//! actor, on a libvirt connection of its own, so neither a ProxyActor nor the
//! host's other callers wait on it. Where each image stands is reported to
//! the image table the dashboard shows
//! ([`image_status`](egress_proxies::adapters::providers::kvm::host::image_status)).

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use egress_proxies::adapters::providers::kvm::host::{
    CachedBase, Downloader, ImageSpec, LookupBase, Progress, RunError, fetch_to_pool, report_fetched,
    report_fetching,
};
use egress_proxies::domain::config::KvmHost;
use tokio::sync::oneshot;

use super::host_actor::{Call, KvmHostActor, LinkUri};

/// Have an image in a host's pool.
#[derive(Message)]
#[rtype(result = "Result<CachedBase, RunError>")]
pub struct Ensure {
    pub host: KvmHost,
    pub image: ImageSpec,
    pub host_actor: Addr<KvmHostActor>,
}

/// A host's pool no longer has this base volume (a create found it
/// missing): the next create looks for it, or fetches it, again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget {
    pub host: String,
    pub volume: String,
}

/// The volumes fetches are writing on a host right now (the pool sweep spares them).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct FetchingVolumes(pub String);

#[derive(Message)]
#[rtype(result = "()")]
struct Finished {
    key: DownloadKey,
    result: Result<CachedBase, RunError>,
}

/// (host, image).
type DownloadKey = (String, ImageSpec);

type Waiter = oneshot::Sender<Result<CachedBase, RunError>>;

pub struct ImageCacheActor {
    http: Downloader,
    waiters: HashMap<DownloadKey, Vec<Waiter>>,
    /// Bases found complete and sound (or fetched) in a host's pool: a
    /// create needs no pool reads to learn it again (a verified lookup
    /// reads three volumes, about thirty libvirt calls). Forgotten when a
    /// create finds the volume gone.
    known: HashMap<DownloadKey, CachedBase>,
}

impl ImageCacheActor {
    pub fn new(http: Downloader) -> Self {
        Self {
            http,
            waiters: HashMap::new(),
            known: HashMap::new(),
        }
    }
}

impl Actor for ImageCacheActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::supervision::beat_while_running::<Self>("kvm_image_cache", ctx);
        ctx.run_interval(std::time::Duration::from_secs(1), |cache, _| {
            crate::supervision::report_singleton(
                "kvm_image_cache",
                &format!("fetching {}", cache.waiters.len()),
                0,
            );
        });
    }
}

/// Fetches run beside the actor and report to its address, and waiters are
/// kept: a restarted cache carries on with both.
impl Supervised for ImageCacheActor {}

impl Handler<Ensure> for ImageCacheActor {
    type Result = ResponseFuture<Result<CachedBase, RunError>>;

    fn handle(&mut self, msg: Ensure, ctx: &mut Self::Context) -> Self::Result {
        let key = (msg.host.name.clone(), msg.image.clone());
        if let Some(base) = self.known.get(&key) {
            let base = base.clone();
            return Box::pin(async move { Ok(base) });
        }
        let (tx, rx) = oneshot::channel();
        let queue = self.waiters.entry(key.clone()).or_default();
        queue.push(tx);
        if queue.len() == 1 {
            let progress = Arc::new(Progress::default());
            report_fetching(&key.0, &key.1, progress.clone());
            let (http, me) = (self.http.clone(), ctx.address());
            actix::spawn(async move {
                let fetch = ensure(&http, &msg.host, &msg.image, &msg.host_actor, &progress);
                // A panic must not leave the image "being fetched" for ever:
                // its waiters get an error and the next create fetches again.
                let result = match futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(fetch)).await
                {
                    Ok(result) => result,
                    Err(panic) => {
                        let what = crate::supervision::panic_message(panic.as_ref());
                        tracing::error!(host = %key.0, url = %key.1.url, panic = %what, "image fetch panicked");
                        Err(RunError::FetchPanicked(what))
                    }
                };
                me.do_send(Finished { key, result });
            });
        }
        Box::pin(async move { rx.await.unwrap_or(Err(RunError::ImageCacheRestarted)) })
    }
}

impl Handler<Finished> for ImageCacheActor {
    type Result = ();

    fn handle(&mut self, msg: Finished, _: &mut Self::Context) {
        report_fetched(&msg.key.0, &msg.key.1.url, msg.result.as_ref());
        if let Ok(base) = &msg.result {
            self.known.insert(msg.key.clone(), base.clone());
        }
        for waiter in self.waiters.remove(&msg.key).unwrap_or_default() {
            let _ = waiter.send(msg.result.clone());
        }
    }
}

impl Handler<Forget> for ImageCacheActor {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        self.known
            .retain(|(host, _), base| *host != msg.host || base.volume != msg.volume);
    }
}

impl Handler<FetchingVolumes> for ImageCacheActor {
    type Result = Vec<String>;

    fn handle(&mut self, FetchingVolumes(host): FetchingVolumes, _: &mut Self::Context) -> Vec<String> {
        self.waiters
            .keys()
            .filter(|(h, _)| *h == host)
            .flat_map(|(_, image)| image.fetch_volumes())
            .collect()
    }
}

/// Finds the image's complete base in the pool, or fetches it.
async fn ensure(
    http: &Downloader,
    host: &KvmHost,
    image: &ImageSpec,
    addr: &Addr<KvmHostActor>,
    progress: &Progress,
) -> Result<CachedBase, RunError> {
    let reset = |_| RunError::LinkReset {
        host: host.name.clone(),
    };
    if let Some(base) = addr
        .send(Call(LookupBase(image.clone())))
        .await
        .map_err(reset)??
    {
        return Ok(base);
    }
    let uri = addr
        .send(LinkUri)
        .await
        .map_err(reset)?
        .ok_or_else(|| RunError::LinkDown {
            host: host.name.clone(),
            why: "no link to stream the image over".into(),
        })?;
    fetch_to_pool(http, image, &uri, &host.name, &host.pool, progress)
        .await
        .map(|fetched| fetched.base)
        .map_err(RunError::from)
}
