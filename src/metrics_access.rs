//! Who may read `/metrics` in Kubernetes mode: the request's bearer token is
//! authenticated by the API server (`TokenReview`) and its user authorized
//! for `get` on the non-resource URL `/metrics` (`SubjectAccessReview`) —
//! what controller-runtime's metrics filter does, so a Prometheus set up for
//! other operators scrapes this one the same way. Decisions are cached for a
//! minute per token (by its SHA-256, never the token itself), at most
//! [`MAX_CACHED`] tokens: a scrape every few seconds does not become two API
//! calls each.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest, Sha256};

/// The path and verb a scraper must be allowed.
pub const METRICS_PATH: &str = "/metrics";
/// How long a decision is reused.
const CACHE_FOR: Duration = Duration::from_secs(60);
/// Tokens remembered at most (each a few dozen bytes).
pub const MAX_CACHED: usize = 1024;

/// What the API server said about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Authenticated and allowed: who.
    Allowed(String),
    /// Not a token the API server knows (401).
    Unauthenticated,
    /// Authenticated, not allowed `get /metrics` (403): who.
    Forbidden(String),
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsAccessError {
    #[error("asking the API server to review the token failed: {0}")]
    Api(#[from] kube::Error),
}

pub struct MetricsAccess {
    client: kube::Client,
    cache: Mutex<HashMap<[u8; 32], (Instant, Decision)>>,
}

impl MetricsAccess {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::default(),
        }
    }

    /// Whether `token` may read the metrics.
    pub async fn check(&self, token: &str) -> Result<Decision, MetricsAccessError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(decision) = self.cached(&key) {
            return Ok(decision);
        }
        let decision = self.review(token).await?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        cache.retain(|_, (at, _)| now.duration_since(*at) < CACHE_FOR);
        if cache.len() >= MAX_CACHED {
            // Full of live entries: a flood of distinct tokens. Start over
            // rather than grow; genuine scrapers are reviewed again.
            cache.clear();
        }
        cache.insert(key, (now, decision.clone()));
        Ok(decision)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Decision> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|(at, _)| at.elapsed() < CACHE_FOR)
            .map(|(_, d)| d.clone())
    }

    async fn review(&self, token: &str) -> Result<Decision, MetricsAccessError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(Decision::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await?;
        Ok(if answered.status.is_some_and(|s| s.allowed) {
            Decision::Allowed(name)
        } else {
            Decision::Forbidden(name)
        })
    }
}
