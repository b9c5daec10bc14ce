//! The requests served, counted by verb, resource and status code (what
//! the API server's `apiserver_request_total` counts), for tests and for a
//! benchmark that reads them over HTTP (`GET /debug/requests`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// What one counter counts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// get, list, watch, create, update, patch, delete.
    pub verb: String,
    pub group: String,
    /// The resource with its subresource (`proxies/status`); empty for
    /// paths that name no resource (discovery, `/version`, unknown paths).
    pub resource: String,
    /// The status code answered (a watch counts its first answer).
    pub code: u16,
}

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts(pub BTreeMap<RequestKey, u64>);

impl RequestCounts {
    pub(crate) fn add(&mut self, key: RequestKey) {
        *self.0.entry(key).or_default() += 1;
    }

    /// Requests with this verb, resource and code, in any group.
    pub fn count(&self, verb: &str, resource: &str, code: u16) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb && k.resource == resource && k.code == code)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests on a resource, any verb and code.
    pub fn on(&self, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.resource == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests answered with this code.
    pub fn with_code(&self, code: u16) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.code == code)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// `{"total": N, "requests": [{"verb", "group", "resource", "code", "count"}]}`.
    pub fn to_json(&self) -> Value {
        let requests: Vec<Value> = self
            .0
            .iter()
            .map(|(k, n)| {
                json!({"verb": k.verb, "group": k.group, "resource": k.resource, "code": k.code, "count": n})
            })
            .collect();
        json!({"total": self.total(), "requests": requests})
    }

    /// Reads what [`to_json`](Self::to_json) wrote (the benchmark's side).
    pub fn from_json(value: &Value) -> Option<Self> {
        let mut counts = Self::default();
        for r in value.get("requests")?.as_array()? {
            let key = RequestKey {
                verb: r.get("verb")?.as_str()?.to_owned(),
                group: r.get("group")?.as_str()?.to_owned(),
                resource: r.get("resource")?.as_str()?.to_owned(),
                code: u16::try_from(r.get("code")?.as_u64()?).ok()?,
            };
            counts.0.insert(key, r.get("count")?.as_u64()?);
        }
        Some(counts)
    }
}
