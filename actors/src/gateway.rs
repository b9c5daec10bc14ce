//! The gateway's wiring (docs/gateway.md): its listener
//! (`egress_proxies::gateway`) leases from the [`LeaseStore`] in process,
//! through the same `Acquire`/`Release` messages as the discovery API, so
//! both share one book.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix::Addr;
use egress_proxies::config::GatewaySettings;
use egress_proxies::destinations::DestinationPolicy;
use egress_proxies::gateway::{self, GatewayError, LEASE_CLIENT, Leases, Options, Upstream};
use egress_proxies::guarded_listener::ListenerSettings;
use egress_proxies::lease::{AcquireError, AcquireRequest};

use crate::discovery::Tokens;
use crate::lease_store::{Acquire, LeaseStore, Release};

/// Asked for every gateway lease; the book caps it at `maxLeaseTtl`. A
/// tunnel lasts as long as the crawler keeps it open, and its lease must
/// not lapse under it (that would overbook the proxy); the gateway
/// releases it the moment the request or tunnel ends.
const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The lease store as the gateway sees it.
struct StoreLeases(Addr<LeaseStore>);

impl Leases for StoreLeases {
    fn acquire(
        &self,
        target: String,
    ) -> Pin<Box<dyn Future<Output = Result<Upstream, GatewayError>> + Send>> {
        let request = AcquireRequest {
            target,
            selector: Default::default(),
            ttl: Some(LEASE_TTL),
            client: Some(LEASE_CLIENT.to_owned()),
        };
        let asked = self.0.send(Acquire(request));
        Box::pin(async move {
            let grant = asked
                .await
                .map_err(|e| GatewayError::LeaseStore(format!("the lease store is restarting ({e})")))?
                .map_err(|e| match e {
                    AcquireError::NoCapacity { target } => GatewayError::NoProxy { target },
                    other => GatewayError::LeaseStore(other.to_string()),
                })?;
            Ok(Upstream {
                lease_id: grant.id,
                proxy: grant.proxy.to_string(),
                url: grant.url,
                credentials: grant.credentials,
            })
        })
    }

    fn release(&self, lease_id: String) {
        self.0.do_send(Release(lease_id));
    }
}

/// Starts the gateway on `listener` (call inside the actix system): with a
/// crawler token it demands it; without one it refuses any address but
/// loopback.
pub fn start(
    listener: std::net::TcpListener,
    store: Addr<LeaseStore>,
    tokens: &Tokens,
    settings: &GatewaySettings,
) -> Result<(), GatewayError> {
    let addr = listener.local_addr()?;
    let token = tokens.crawler_token();
    gateway::check_exposure(addr, token.is_some())?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    if token.is_some() {
        tracing::info!(%addr, "gateway listening; crawlers present DISCOVERY_TOKEN as the proxy password");
    } else {
        tracing::info!(
            %addr,
            "gateway listening WITHOUT authentication (DISCOVERY_TOKEN is not set), on loopback only"
        );
    }
    let options = Options {
        destinations: Arc::new(DestinationPolicy::new(&settings.destinations, &[])),
        token,
        leases: Arc::new(StoreLeases(store)),
    };
    let settings = ListenerSettings::for_file_limit(gateway::FDS_PER_CONNECTION);
    actix::spawn(async move {
        if let Err(e) = gateway::serve(listener, options, settings).await {
            tracing::error!(error = %e, "gateway stopped");
        }
    });
    Ok(())
}
