//! The provider metrics decorator: every call of every provider is counted
//! by provider, operation and result, and timed. Errors pass through
//! unchanged. (The tracing decorator goes outside this one.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::domain::provider_contract::{
    CreateRequest, Instance, LeftoverSweep, Provider, ProviderError, ProviderId,
};
use egress_proxies_telemetry::events::ProviderCallCompleted;

pub struct Instrumented {
    inner: Arc<dyn Provider>,
}

impl Instrumented {
    pub fn wrap(inner: Arc<dyn Provider>) -> Arc<dyn Provider> {
        Arc::new(Self { inner })
    }

    fn record<T>(&self, op: &str, started: Instant, result: &Result<T, ProviderError>) {
        ProviderCallCompleted {
            provider: self.inner.name(),
            kind: self.inner.kind(),
            op,
            result: match result {
                Ok(_) => "ok",
                Err(e) => e.class.as_str(),
            },
            duration: started.elapsed(),
        }
        .emit();
    }
}

#[async_trait]
impl Provider for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn names_own_realm(&self) -> bool {
        self.inner.names_own_realm()
    }

    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let started = Instant::now();
        let result = self.inner.create(req).await;
        self.record("create", started, &result);
        result
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let started = Instant::now();
        let result = self.inner.get(id).await;
        self.record("get", started, &result);
        result
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let started = Instant::now();
        let result = self.inner.delete(id).await;
        self.record("delete", started, &result);
        result
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let started = Instant::now();
        let result = self.inner.release(id).await;
        self.record("release", started, &result);
        result
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let started = Instant::now();
        let result = self.inner.list_by_tag().await;
        self.record("list", started, &result);
        result
    }

    async fn sweep_leftovers(&self, grace: Duration) -> Result<LeftoverSweep, ProviderError> {
        let started = Instant::now();
        let result = self.inner.sweep_leftovers(grace).await;
        self.record("sweep_leftovers", started, &result);
        result
    }
}
