//! Choose: the lease for one try. A sticky session's proxy while it stays
//! eligible; otherwise any proxy the site learning does not pass over for
//! the site and this request has not tried, waiting for one to free up
//! until `capacityWait`. The lease is [`Held`] for the try and given back
//! when dropped: a plain request's proxy then rests for the site only for
//! the gateway's `pacing`; a sticky session's lease ends like an API
//! lease, with the lease cooldown.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::RequestContext;
use crate::adapters::gateway::sessions::Sessions;
use crate::adapters::gateway::site_learning::{Bounds, SiteLearning, SiteView};
use crate::adapters::gateway::{GatewayError, Leases, Upstream, locked};
use crate::domain::config::GatewaySettings;
use crate::domain::lease::rendezvous::session_digest;
use crate::domain::resource::ObjectKey;
use crate::telemetry::events::{GatewayFirstTryServed, GatewayLearnt, GatewayLeaseTaken};
use crate::telemetry::gateway_stats::{SITES_SHOWN, SiteProxy, SiteSummary};

/// The choose phase's state: where leases come from, the sticky sessions
/// and what was learnt per site.
pub(in crate::adapters::gateway) struct Chooser {
    leases: Arc<dyn Leases>,
    sessions: Mutex<Sessions>,
    learning: Mutex<SiteLearning>,
    capacity_wait: Duration,
    pacing: Duration,
    /// When what was learnt was last published.
    published: Mutex<Option<Instant>>,
}

/// A lease held for one try, given back when dropped; a tunnel's is
/// renewed meanwhile.
pub(super) struct Held {
    lease_id: String,
    leases: Arc<dyn Leases>,
    /// The site rest on release: the pacing, or none for the cooldown.
    rest: Option<Duration>,
    renewal: Option<tokio::task::JoinHandle<()>>,
}

impl Held {
    /// Renews the lease at half its TTL for as long as it is held: a
    /// tunnel lasts as long as its crawler keeps it open.
    pub fn renewed(mut self, ttl: Duration) -> Self {
        let (id, leases) = (self.lease_id.clone(), self.leases.clone());
        let every = (ttl / 2).max(Duration::from_secs(1));
        self.renewal = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = leases.renew(id.clone()) {
                    tracing::warn!(error = %e, "a tunnel's lease could not be renewed; its proxy may be leased again");
                }
            }
        }));
        self
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        self.leases.release(std::mem::take(&mut self.lease_id), self.rest);
    }
}

impl Chooser {
    pub fn new(settings: &GatewaySettings, leases: Arc<dyn Leases>) -> Self {
        Self {
            leases,
            sessions: Mutex::new(Sessions::new(settings.max_sessions)),
            learning: Mutex::new(SiteLearning::new(settings.learning, Bounds::default())),
            capacity_wait: settings.capacity_wait,
            pacing: settings.pacing,
            published: Mutex::new(None),
        }
    }

    /// A lease for the next try of `context`'s request.
    pub async fn lease(&self, context: &mut RequestContext) -> Result<(Upstream, Held), GatewayError> {
        let asked = Instant::now();
        let until = context.deadline.min(asked + self.capacity_wait);
        let admitted = &mut context.admitted;
        let mut ask = admitted.ask.clone();
        let choice = locked(&self.learning).choice(&ask.target, asked);
        ask.avoid = choice.avoid;
        ask.avoid.extend(context.tried.iter().cloned());
        ask.prefer = choice.trial.filter(|trial| !context.tried.contains(trial));
        if let Some((key, _)) = &admitted.session {
            ask.prefer = locked(&self.sessions).proxy_of(key, asked);
            ask.session = Some(session_digest(&key.0, &key.1));
        }
        // In turn at the lease store until a proxy frees (fair shares).
        let upstream = self.leases.acquire_within(ask, until).await?;
        let exchange = &mut context.exchange;
        let mut sessions = None;
        if let Some((key, lifetime)) = &admitted.session {
            let mut held = locked(&self.sessions);
            let moved = held.left_through(key, &upstream.proxy, *lifetime, Instant::now());
            exchange.session_moved |= moved.is_some();
            sessions = Some(held.len());
        }
        exchange.tries += 1;
        GatewayLeaseTaken {
            span: &exchange.span,
            tunnel: exchange.tunnel,
            proxy: &upstream.proxy.to_string(),
            attempt: exchange.tries,
            waited: asked.elapsed(),
            sessions,
        }
        .emit();
        exchange.proxy = Some(upstream.proxy.clone());
        context.tried.push(upstream.proxy.clone());
        let held = Held {
            lease_id: upstream.lease_id.clone(),
            leases: self.leases.clone(),
            // A sticky session keeps its proxy: its lease ends like an API lease.
            rest: admitted.session.is_none().then_some(self.pacing),
            renewal: None,
        };
        Ok((upstream, held))
    }

    /// A try through `proxy` for `site` taught the learning something.
    pub fn learn(&self, site: &str, proxy: &ObjectKey, success: bool) {
        locked(&self.learning).record(site, proxy, success, Instant::now());
    }

    /// A request to `site` ended, served on its first try or not. About
    /// once a second, what was learnt is published (metrics, dashboard,
    /// `GET /v1/sites`).
    pub fn finished(&self, site: &str, first_try: bool) {
        let now = Instant::now();
        if first_try {
            GatewayFirstTryServed.emit();
        }
        let mut learning = locked(&self.learning);
        learning.finished(site, first_try, now);
        let mut published = locked(&self.published);
        if published.is_some_and(|at| now.saturating_duration_since(at) < PUBLISH_EVERY) {
            return;
        }
        *published = Some(now);
        let all = learning.sites(usize::MAX, now);
        let avoided = all
            .iter()
            .map(|s| s.proxies.iter().filter(|p| p.avoided).count())
            .sum();
        GatewayLearnt {
            remembered: all.len(),
            avoided,
            sites: all.into_iter().take(SITES_SHOWN).map(summary).collect(),
        }
        .emit();
    }
}

/// How often what was learnt is published.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

fn summary(site: SiteView) -> SiteSummary {
    SiteSummary {
        site: site.site,
        requests: site.requests,
        first_try_served: site.first_try_successes,
        proxies: site
            .proxies
            .into_iter()
            .map(|p| SiteProxy {
                proxy: p.proxy.to_string(),
                success_rate: p.rate,
                successes: p.successes,
                failures: p.failures,
                avoided: p.avoided,
            })
            .collect(),
    }
}
