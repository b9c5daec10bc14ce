//! What a generated Squid tells the crawlers and the sites it serves about
//! itself: nothing that names it. Shared by every provider that generates a
//! squid.conf. Left alone, Squid adds `Via: 1.1 <host> (squid/<version>)`
//! to requests and responses, `X-Forwarded-For` to requests, `X-Cache: MISS
//! from <host>` and `X-Cache-Lookup: MISS from <host>:<port>` to responses,
//! and signs its error pages and `Server` header with its version.
//!
//! Its error pages keep `X-Squid-Error`: the gateway knows a page Squid
//! wrote by it and answers in its place (a crawler with a lease of its own
//! sees the page, which names Squid but neither its host nor its version).

/// The host name Squid's own pages and headers give instead of the
/// machine's (`visible_hostname`).
pub const VISIBLE_HOSTNAME: &str = "egress-proxy";

/// The squid.conf lines. `forwarded_for delete`: `off` would still send
/// `X-Forwarded-For: unknown`, which tells every site a proxy is in the path.
pub fn identity_section() -> String {
    format!(
        "via off\n\
         forwarded_for delete\n\
         httpd_suppress_version_string on\n\
         visible_hostname {VISIBLE_HOSTNAME}\n\
         reply_header_access X-Cache deny all\n\
         reply_header_access X-Cache-Lookup deny all\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squid_names_neither_its_host_nor_its_version() {
        let lines: Vec<String> = identity_section().lines().map(str::to_owned).collect();
        assert_eq!(
            lines,
            [
                "via off",
                "forwarded_for delete",
                "httpd_suppress_version_string on",
                "visible_hostname egress-proxy",
                "reply_header_access X-Cache deny all",
                "reply_header_access X-Cache-Lookup deny all",
            ]
        );
        // The gateway tells Squid's own pages by this header: it stays.
        assert!(!identity_section().contains("X-Squid-Error"));
    }

    #[test]
    fn the_vm_cloud_init_sample_hides_the_proxy_too() {
        // The sample is static: this keeps it in step.
        let sample = include_str!("../../../deploy/samples/cloud-init-secret.yaml");
        let lines: Vec<&str> = sample.lines().map(str::trim).collect();
        for line in identity_section().lines() {
            assert!(lines.contains(&line), "{line:?} missing from the sample");
        }
    }
}
