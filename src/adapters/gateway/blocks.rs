//! Blocks learnt from plain-HTTP responses: the configured rules say which
//! status codes (and body markers) of which targets mean "this proxy is
//! blocked here".

use crate::domain::config::BlockRule;

/// What a response's head says about a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadVerdict {
    NotBlocked,
    Blocked,
    /// A rule with body markers matches the status: look at the body.
    LookAtBody,
}

/// The rules, in the order configured.
#[derive(Clone, Debug, Default)]
pub struct BlockRules(Vec<BlockRule>);

impl BlockRules {
    pub fn new(mut rules: Vec<BlockRule>) -> Self {
        // Targets are compared with lease targets, which are lowercase.
        for rule in &mut rules {
            for target in &mut rule.targets {
                target.make_ascii_lowercase();
            }
        }
        Self(rules)
    }

    fn applying(&self, target: &str, status: u16) -> impl Iterator<Item = &BlockRule> {
        self.0
            .iter()
            .filter(move |r| r.status.contains(&status) && applies_to(r, target))
    }

    /// The verdict on a response head of `status` for `target`.
    pub fn on_head(&self, target: &str, status: u16) -> HeadVerdict {
        let mut verdict = HeadVerdict::NotBlocked;
        for rule in self.applying(target, status) {
            if rule.body_contains.is_empty() {
                return HeadVerdict::Blocked;
            }
            verdict = HeadVerdict::LookAtBody;
        }
        verdict
    }

    /// Whether `body` (its beginning) carries a marker of a rule for this
    /// status and target.
    pub fn on_body(&self, target: &str, status: u16, body: &[u8]) -> bool {
        self.applying(target, status).any(|rule| {
            rule.body_contains
                .iter()
                .any(|marker| contains(body, marker.as_bytes()))
        })
    }
}

/// Whether `rule` applies to `target`: every target when it names none; a
/// host exactly, or `*.example.com` for the names under example.com.
fn applies_to(rule: &BlockRule, target: &str) -> bool {
    rule.targets.is_empty()
        || rule
            .targets
            .iter()
            .any(|pattern| match pattern.strip_prefix("*.") {
                Some(domain) => target
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
                None => pattern.eq_ignore_ascii_case(target),
            })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(status: &[u16], markers: &[&str], targets: &[&str]) -> BlockRule {
        BlockRule {
            status: status.to_vec(),
            body_contains: markers.iter().map(|s| (*s).to_owned()).collect(),
            targets: targets.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn status_alone_or_with_markers_per_target() {
        let rules = BlockRules::new(vec![
            rule(&[403], &[], &["shop.example"]),
            rule(&[200, 403], &["captcha"], &["*.example.com"]),
        ]);
        assert_eq!(rules.on_head("shop.example", 403), HeadVerdict::Blocked);
        assert_eq!(rules.on_head("other.example", 403), HeadVerdict::NotBlocked);
        assert_eq!(rules.on_head("www.example.com", 200), HeadVerdict::LookAtBody);
        assert_eq!(rules.on_head("example.com", 200), HeadVerdict::NotBlocked);
        assert_eq!(rules.on_head("badexample.com", 200), HeadVerdict::NotBlocked);
        assert!(rules.on_body("www.example.com", 200, b"<p>solve the captcha</p>"));
        assert!(!rules.on_body("www.example.com", 200, b"<p>welcome</p>"));
        assert!(!rules.on_body("www.example.com", 404, b"captcha"));
        assert_eq!(BlockRules::default().on_head("a", 403), HeadVerdict::NotBlocked);
    }
}
