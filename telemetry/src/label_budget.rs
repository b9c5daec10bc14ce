//! Bounded label values for metrics that name proxies (the gateway's
//! per-proxy failures and blocks): the first [`MAX_PROXY_LABELS`] proxies
//! seen are named, any more are counted as `other`, and a proxy that goes
//! frees its place (its series are removed with it), so Managed proxies
//! and pool members replaced all day do not grow the scrape for ever.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex, PoisonError};

pub use super::metrics::MAX_PROXY_LABELS;

/// The label of proxies past the budget.
pub const OTHER: &str = "other";

/// The proxies named in labels now.
pub struct LabelBudget {
    max: usize,
    named: Mutex<HashSet<String>>,
}

impl LabelBudget {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            named: Mutex::new(HashSet::new()),
        }
    }

    /// The label for `proxy`: its name while the budget lasts, else `other`.
    pub fn label(&self, proxy: &str) -> String {
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if named.contains(proxy) {
            return proxy.to_owned();
        }
        if named.len() < self.max && proxy != OTHER {
            named.insert(proxy.to_owned());
            return proxy.to_owned();
        }
        OTHER.to_owned()
    }

    /// Frees `proxy`'s place; whether it had one (its series exist).
    pub fn forget(&self, proxy: &str) -> bool {
        self.named
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(proxy)
    }
}

static PROXY_LABELS: LazyLock<LabelBudget> = LazyLock::new(|| LabelBudget::new(MAX_PROXY_LABELS));

/// The process's budget of proxy labels.
pub fn proxy_labels() -> &'static LabelBudget {
    &PROXY_LABELS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_proxies_are_other_until_one_goes() {
        let budget = LabelBudget::new(2);
        assert_eq!(budget.label("ns/a"), "ns/a");
        assert_eq!(budget.label("ns/b"), "ns/b");
        assert_eq!(budget.label("ns/c"), OTHER);
        assert_eq!(budget.label("ns/a"), "ns/a", "a named proxy keeps its name");
        assert!(budget.forget("ns/a"));
        assert!(!budget.forget("ns/c"), "never named");
        assert_eq!(budget.label("ns/c"), "ns/c", "a freed place is taken");
        assert_eq!(budget.label(OTHER), OTHER);
    }
}
