//! Collecting every validation problem, each with the path of its field.

use std::fmt;

/// One thing wrong with the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where: `providers[2] (kvm-home): kvm.hosts[0].name`.
    pub path: String,
    /// What: `"dc1/rack2" must contain only ...`.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, self.message)
    }
}

/// Problems found under one path prefix (a provider entry).
#[derive(Debug, Default)]
pub struct Problems {
    prefix: String,
    found: Vec<Problem>,
}

impl Problems {
    pub fn under(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            found: Vec::new(),
        }
    }

    /// Records a problem at `field` (relative to the prefix).
    pub fn report(&mut self, field: impl fmt::Display, message: impl Into<String>) {
        let field = field.to_string();
        let path = match (self.prefix.is_empty(), field.is_empty()) {
            (true, _) => field,
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}: {field}", self.prefix),
        };
        self.found.push(Problem {
            path,
            message: message.into(),
        });
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.found
    }
}

/// The rule for names that become parts of identifiers and file names on a
/// host: letters, digits, `.`, `-`, `_`, starting with a letter or digit.
pub fn is_identifier(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// The wording shared by every identifier-rule message.
pub const IDENTIFIER_RULE: &str =
    "must be 1-63 characters of letters, digits, '.', '-' and '_', starting with a letter or digit";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["a", "dc1", "rack-2.b_c", "0host", &"x".repeat(63)] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in [
            "",
            "dc1/rack2",
            "../x",
            ".hidden",
            "-x",
            "_x",
            "sp ace",
            "ü",
            &"x".repeat(64),
        ] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn paths_join_prefix_and_field() {
        let mut p = Problems::under("providers[0] (a)");
        p.report("kvm.hosts", "must list at least one host");
        p.report("", "whole entry is wrong");
        let v: Vec<String> = p.into_vec().iter().map(ToString::to_string).collect();
        assert_eq!(
            v,
            [
                "providers[0] (a): kvm.hosts must list at least one host",
                "providers[0] (a) whole entry is wrong"
            ]
        );
    }
}
