//! Squid's proxy authentication, shared by every provider that generates a
//! squid.conf: Basic, checked by Debian's `basic_ncsa_auth` helper against
//! a passwd file of `user:<crypt(3) hash>` lines.

use std::path::Path;

/// Squid's Basic helper that checks a passwd file (Debian's and Ubuntu's squid package).
pub const BASIC_NCSA_AUTH: &str = "/usr/lib/squid/basic_ncsa_auth";

/// The auth lines: nothing is relayed without valid credentials. They must
/// come before any `http_access allow`. `realm` is the proxy's own
/// ([`crate::credentials::realm_of`]), named by its 407.
pub fn auth_section(passwd: &Path, realm: &str) -> String {
    format!(
        "auth_param basic program {BASIC_NCSA_AUTH} {passwd}\n\
         auth_param basic children 5 startup=1 idle=1\n\
         auth_param basic realm {realm}\n\
         acl authenticated proxy_auth REQUIRED\n\
         http_access deny !authenticated\n",
        passwd = passwd.display(),
    )
}

/// `conf` with the auth lines for `passwd` ahead of its first access rule.
pub fn with_auth(conf: &str, passwd: &Path, realm: &str) -> String {
    match conf.find("http_access") {
        Some(at) => format!("{}{}{}", &conf[..at], auth_section(passwd, realm), &conf[at..]),
        None => format!("{conf}{}", auth_section(passwd, realm)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_comes_before_every_access_rule() {
        let conf = "http_port 3128\nhttp_access allow all\nvia off\n";
        let out = with_auth(conf, Path::new("/etc/squid-auth/passwd"), "egress-proxies-0123");
        let deny = out.find("http_access deny !authenticated").unwrap();
        assert!(deny < out.find("http_access allow all").unwrap(), "{out}");
        assert!(
            out.contains("auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid-auth/passwd\n")
        );
        assert!(
            out.contains("auth_param basic realm egress-proxies-0123\n"),
            "{out}"
        );
        assert!(out.starts_with("http_port 3128\n"));
    }
}
