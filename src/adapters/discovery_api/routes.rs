//! The API's routes, named once: the router registers these patterns and
//! the request span is named from [`route_of`], which matches a path
//! against them by segments — no regex and no allocation per request.

pub const PROXIES: &str = "/v1/proxies";
pub const LEASES: &str = "/v1/leases";
pub const LEASE: &str = "/v1/leases/{id}";
pub const LEASE_REPORT: &str = "/v1/leases/{id}/report";
pub const LEASE_RENEW: &str = "/v1/leases/{id}/renew";
pub const OPENAPI: &str = "/v1/openapi.json";

const TRACED: [&str; 6] = [PROXIES, LEASES, LEASE, LEASE_REPORT, LEASE_RENEW, OPENAPI];

/// The pattern `path` matches, if any. `{…}` matches one non-empty segment.
pub fn route_of(path: &str) -> Option<&'static str> {
    TRACED.into_iter().find(|pattern| {
        let mut wanted = pattern.split('/');
        let mut given = path.split('/');
        loop {
            match (wanted.next(), given.next()) {
                (None, None) => return true,
                (Some(w), Some(g)) if w.starts_with('{') && !g.is_empty() => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_route() {
        assert_eq!(route_of("/v1/leases"), Some(LEASES));
        assert_eq!(route_of("/v1/leases/8c1e"), Some(LEASE));
        assert_eq!(route_of("/v1/leases/8c1e/report"), Some(LEASE_REPORT));
        assert_eq!(route_of("/v1/leases/8c1e/renew"), Some(LEASE_RENEW));
        assert_eq!(route_of("/v1/proxies"), Some(PROXIES));
        assert_eq!(route_of("/v1/leases//report"), None);
        assert_eq!(route_of("/v1/leases/8c1e/other"), None);
        assert_eq!(route_of("/v1/leases/"), None);
        assert_eq!(route_of("/v1/proxies/x"), None);
    }
}
