//! What a request to the API server is, for metrics and for the retry and
//! budget decisions: its verb (as the API server's audit log names it) and
//! its resource (the plural name, with a subresource: `proxies/status`).
//! Label values stay bounded: names and namespaces are never kept, odd
//! resource names and unknown subresources become `other`.

use http::Method;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// HEAD, OPTIONS and the like.
    Other,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
            Self::Other => "other",
        }
    }

    /// Reads: repeating one changes nothing on the server.
    pub fn is_read(self) -> bool {
        matches!(self, Self::Get | Self::List)
    }
}

/// Subresources kept as they are in the `resource` label.
const SUBRESOURCES: &[&str] = &[
    "status",
    "scale",
    "log",
    "exec",
    "attach",
    "portforward",
    "proxy",
    "eviction",
    "binding",
    "token",
    "approval",
    "finalize",
    "ephemeralcontainers",
    "resize",
];

/// A request as the metrics and the retry rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRequest {
    pub verb: Verb,
    /// `proxies`, `proxies/status`, `leases`, …; `discovery` for the API
    /// discovery paths, `other` for anything else.
    pub resource: String,
}

impl ApiRequest {
    /// Classifies a request from its method and its path and query (kube's
    /// requests carry only those until its base-URI layer adds the server).
    pub fn of(method: &Method, path_and_query: &str) -> Self {
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        let watch_query = query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1");
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let rest: &[&str] = match segments.as_slice() {
            ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
            ["api" | "apis", ..] | ["version" | "openapi", ..] => {
                return Self::new(verb(method, false, false), "discovery");
            }
            _ => return Self::new(verb(method, false, false), "other"),
        };
        // The old `/watch/` path form.
        let (path_watch, rest) = match rest {
            ["watch", rest @ ..] => (true, rest),
            _ => (false, rest),
        };
        // `namespaces/{ns}/…` names a namespace, unless it is the
        // namespace's own subresource (`namespaces/{ns}/status`).
        let rest = match rest {
            ["namespaces", _ns, next, ..] if !SUBRESOURCES.contains(next) => &rest[2..],
            _ => rest,
        };
        let Some(resource) = rest.first() else {
            return Self::new(verb(method, false, false), "discovery");
        };
        let named = rest.len() > 1;
        let resource = if plausible(resource) { *resource } else { "other" };
        let resource = match rest.get(2) {
            None => resource.to_owned(),
            Some(sub) if SUBRESOURCES.contains(sub) => format!("{resource}/{sub}"),
            Some(_) => format!("{resource}/other"),
        };
        Self {
            verb: verb(method, named, path_watch || watch_query),
            resource,
        }
    }

    fn new(verb: Verb, resource: &str) -> Self {
        Self {
            verb,
            resource: resource.to_owned(),
        }
    }

    pub fn is_watch(&self) -> bool {
        self.verb == Verb::Watch
    }

    /// Waits its turn in the budget: all but watches (long-lived, opened
    /// rarely) and the leader Lease (`coordination.k8s.io` leases, which
    /// the operator uses for nothing else), whose renewal must not queue
    /// behind a start's bulk past its renew deadline. The Lease still
    /// takes its token.
    pub fn waits_for_budget(&self) -> bool {
        !self.is_watch() && self.resource != "leases"
    }
}

fn verb(method: &Method, named: bool, watch: bool) -> Verb {
    match *method {
        Method::GET if watch => Verb::Watch,
        Method::GET if named => Verb::Get,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE if named => Verb::Delete,
        Method::DELETE => Verb::DeleteCollection,
        _ => Verb::Other,
    }
}

/// A plural resource name as the API server defines them: short, lowercase.
fn plausible(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, path: &str) -> (&'static str, String) {
        let r = ApiRequest::of(&method, path);
        (r.verb.as_str(), r.resource)
    }

    #[test]
    fn verbs_and_resources_of_the_operators_requests() {
        let cases = [
            (
                Method::GET,
                "/apis/crawl.example.com/v1alpha1/namespaces/dev/proxies/p1",
                "get",
                "proxies",
            ),
            (
                Method::GET,
                "/apis/crawl.example.com/v1alpha1/proxies?labelSelector=a%3Db",
                "list",
                "proxies",
            ),
            (
                Method::GET,
                "/apis/crawl.example.com/v1alpha1/proxies?resourceVersion=5&watch=true&timeoutSeconds=290",
                "watch",
                "proxies",
            ),
            (
                Method::PATCH,
                "/apis/crawl.example.com/v1alpha1/namespaces/dev/proxies/p1/status?fieldManager=x",
                "patch",
                "proxies/status",
            ),
            (Method::POST, "/api/v1/namespaces/dev/events", "create", "events"),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op",
                "update",
                "leases",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/dev/pods/squid-1",
                "delete",
                "pods",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/dev/pods?labelSelector=x",
                "deletecollection",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/dev/pods/squid-1/log",
                "get",
                "pods/log",
            ),
            (
                Method::POST,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                "create",
                "tokenreviews",
            ),
            (Method::GET, "/api/v1/namespaces/dev", "get", "namespaces"),
            (
                Method::PUT,
                "/api/v1/namespaces/dev/finalize",
                "update",
                "namespaces/finalize",
            ),
            (Method::GET, "/api/v1/namespaces", "list", "namespaces"),
            (Method::GET, "/api/v1/watch/namespaces/dev/pods", "watch", "pods"),
            (Method::GET, "/apis", "list", "discovery"),
            (Method::GET, "/api/v1", "list", "discovery"),
            (Method::GET, "/version", "list", "discovery"),
            (Method::GET, "/healthz", "list", "other"),
        ];
        for (method, path, verb, resource) in cases {
            assert_eq!(of(method, path), (verb, resource.to_owned()), "{path}");
        }
    }

    #[test]
    fn watches_and_the_leader_lease_do_not_wait_for_the_budget() {
        let waits = |method: Method, path: &str| ApiRequest::of(&method, path).waits_for_budget();
        assert!(waits(Method::GET, "/apis/crawl.example.com/v1alpha1/proxies"));
        assert!(waits(Method::POST, "/api/v1/namespaces/d/events"));
        assert!(!waits(
            Method::GET,
            "/apis/crawl.example.com/v1alpha1/proxies?watch=true"
        ));
        assert!(!waits(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/o/leases/op"
        ));
    }

    #[test]
    fn label_values_stay_bounded() {
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/dev/pods/p/Weird%20Sub").1,
            "pods/other"
        );
        assert_eq!(of(Method::GET, "/api/v1/namespaces/dev/UPPER/x").1, "other");
        let long = format!("/api/v1/{}", "a".repeat(64));
        assert_eq!(of(Method::GET, &long).1, "other");
    }
}
