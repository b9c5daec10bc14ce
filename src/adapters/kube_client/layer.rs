//! The tower layer on kube's client that applies [`super::retry`] and
//! [`super::budget`] to every request and records the
//! `kube_api_requests_total` and `kube_api_wait_seconds_total` metrics.
//! It sits outside kube's own stack (which adds the server's address and
//! credentials), so every try is counted, budgeted and authenticated anew.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use tower::buffer::Buffer;
use tower::{BoxError, ServiceExt as _};
use tower_layer::Layer;
use tower_service::Service;

use super::budget::{ApiBudget, TokenBucket};
use super::request::ApiRequest;
use super::retry::{RetryRules, WaitSource};
use crate::telemetry::metrics::{KubeApiLabels, KubeWaitLabel, metrics};

/// Queue of kube's (single-owner) service, so that a request's retries can
/// reach it again. Its size is kube's own.
const BUFFER: usize = 1024;

/// Requests in flight at once, watches aside (they stay open). Over plain
/// HTTP/1.1 each one is a connection of its own with its buffers: a start
/// of 10,000 Proxies would otherwise open thousands at once and hold their
/// memory. Over HTTP/2 an API server lets a connection carry 100 to 250
/// streams; 64 keeps well inside that and still writes thousands of
/// statuses a second.
pub const MAX_IN_FLIGHT: usize = 64;

/// A client for `config` with the layer: retries by [`RetryRules::default`],
/// the budget when one is given. kube's own retry (which would retry
/// watches too and sleep through any `Retry-After`) is switched off. Call
/// within a Tokio runtime.
pub fn client(mut config: kube::Config, budget: Option<ApiBudget>) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    let layer = KubeApiLayer::new(budget, RetryRules::default());
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

#[derive(Clone)]
pub struct KubeApiLayer {
    shared: Arc<Shared>,
}

struct Shared {
    rules: RetryRules,
    /// One bucket for every request of the client.
    bucket: Option<Mutex<TokenBucket>>,
    in_flight: tokio::sync::Semaphore,
}

impl KubeApiLayer {
    pub fn new(budget: Option<ApiBudget>, rules: RetryRules) -> Self {
        let bucket = budget.map(|b| Mutex::new(TokenBucket::new(b, Instant::now())));
        Self {
            shared: Arc::new(Shared {
                rules,
                bucket,
                in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
            }),
        }
    }
}

impl<S> Layer<S> for KubeApiLayer
where
    S: Service<Request<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = KubeApi<Buffer<Request<Body>, S::Future>>;

    fn layer(&self, inner: S) -> Self::Service {
        KubeApi {
            inner: Buffer::new(inner, BUFFER),
            shared: self.shared.clone(),
        }
    }
}

#[derive(Clone)]
pub struct KubeApi<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B> Service<Request<Body>> for KubeApi<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is awaited per try, inside the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(send(inner, shared, request))
    }
}

async fn send<S, B>(
    mut inner: S,
    shared: Arc<Shared>,
    mut request: Request<Body>,
) -> Result<Response<B>, BoxError>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError>,
{
    let what = ApiRequest::of(
        request.method(),
        request.uri().path_and_query().map_or("/", |p| p.as_str()),
    );
    let mut retries = 0;
    let mut waited = Duration::ZERO;
    loop {
        // A streamed body cannot be sent twice: such a request gets one try.
        let again = if what.is_watch() { None } else { copy(&request) };
        if let Some(bucket) = shared.bucket.as_ref().filter(|_| !what.is_watch()) {
            let wait = bucket
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .reserve(Instant::now());
            if !wait.is_zero() && what.waits_for_budget() {
                record_wait(WaitSource::Budget, wait);
                tokio::time::sleep(wait).await;
            }
        }
        let permit = match what.is_watch() {
            true => None,
            // Never closed: the semaphore lives as long as the layer.
            false => shared.in_flight.acquire().await.ok(),
        };
        let answer = match inner.ready().await?.call(request).await {
            Ok(answer) => answer,
            Err(error) => {
                count(&what, "error");
                return Err(error);
            }
        };
        drop(permit);
        let status = answer.status();
        count(&what, status.as_str());
        let retry_after = answer
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok());
        let Some(next) = again else { return Ok(answer) };
        let Some(wait) = shared
            .rules
            .decide(&what, status, retry_after, retries, waited, fastrand::f64())
        else {
            return Ok(answer);
        };
        tracing::debug!(
            verb = what.verb.as_str(), resource = %what.resource, status = status.as_u16(),
            wait_ms = wait.delay.as_millis(), retry = retries + 1,
            "Kubernetes API refused a request; sending it again after the wait"
        );
        drop(answer);
        record_wait(wait.source, wait.delay);
        tokio::time::sleep(wait.delay).await;
        retries += 1;
        waited += wait.delay;
        request = next;
    }
}

/// The request again, when its body can be sent twice (kube's bodies
/// are whole buffers except for streamed uploads).
fn copy(request: &Request<Body>) -> Option<Request<Body>> {
    let body = request.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

fn count(what: &ApiRequest, code: &str) {
    metrics()
        .kube_api_requests
        .get_or_create(&KubeApiLabels {
            verb: what.verb.as_str(),
            resource: what.resource.clone(),
            code: code.to_owned(),
        })
        .inc();
}

fn record_wait(source: WaitSource, wait: Duration) {
    metrics()
        .kube_api_wait
        .get_or_create(&KubeWaitLabel {
            reason: source.as_str(),
        })
        .inc_by(wait.as_secs_f64());
}
