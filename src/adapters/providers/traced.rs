//! The provider tracing decorator, outermost: one client span per call
//! (`provider.create|get|delete|list`) with `provider.name`, `provider.id`
//! and `provider.result`. NotFound is an answer, not a failure (status Ok);
//! other errors set the span's status to Error and pass through unchanged.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument;
use tracing::field::Empty;

use egress_proxies_telemetry::otel::record_ids;

use crate::domain::provider_contract::{
    CreateRequest, ErrorClass, Instance, LeftoverSweep, Provider, ProviderError, ProviderId,
};

pub struct Traced {
    inner: Arc<dyn Provider>,
}

impl Traced {
    pub fn wrap(inner: Arc<dyn Provider>) -> Arc<dyn Provider> {
        Arc::new(Self { inner })
    }
}

macro_rules! provider_span {
    ($name:literal, $provider:expr, $id:expr) => {
        tracing::info_span!(
            $name,
            otel.kind = "client",
            provider.name = %$provider,
            provider.id = $id,
            provider.result = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
            traceID = Empty,
            spanID = Empty,
        )
    };
}

/// Records the outcome on the span.
fn finish<T>(span: &tracing::Span, result: &Result<T, ProviderError>) {
    match result {
        Ok(_) => {
            span.record("provider.result", "ok");
        }
        Err(e) => {
            span.record("provider.result", e.class.as_str());
            if e.class != ErrorClass::NotFound {
                span.record("otel.status_code", "error");
                span.record("otel.status_description", e.to_string());
            }
        }
    }
}

#[async_trait]
impl Provider for Traced {
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
        let span = provider_span!("provider.create", self.inner.name(), Empty);
        record_ids(&span);
        let result = self.inner.create(req).instrument(span.clone()).await;
        if let Ok(id) = &result {
            span.record("provider.id", id.as_str());
        }
        finish(&span, &result);
        result
    }

    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError> {
        let span = provider_span!("provider.get", self.inner.name(), id.as_str());
        record_ids(&span);
        let result = self.inner.get(id).instrument(span.clone()).await;
        finish(&span, &result);
        result
    }

    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let span = provider_span!("provider.delete", self.inner.name(), id.as_str());
        record_ids(&span);
        let result = self.inner.delete(id).instrument(span.clone()).await;
        finish(&span, &result);
        result
    }

    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError> {
        let span = provider_span!("provider.release", self.inner.name(), id.as_str());
        record_ids(&span);
        let result = self.inner.release(id).instrument(span.clone()).await;
        finish(&span, &result);
        result
    }

    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError> {
        let span = provider_span!("provider.list", self.inner.name(), Empty);
        record_ids(&span);
        let result = self.inner.list_by_tag().instrument(span.clone()).await;
        finish(&span, &result);
        result
    }

    async fn sweep_leftovers(&self, grace: Duration) -> Result<LeftoverSweep, ProviderError> {
        self.inner.sweep_leftovers(grace).await
    }
}
