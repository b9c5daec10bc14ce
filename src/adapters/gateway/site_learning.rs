//! What the gateway learns per site: for each (site, proxy) a recent
//! success rate, and which proxies to pass over for the site (pure; the
//! caller gives the time).
//!
//! The rule (docs/gateway.md, "Learning per site"):
//! - every try the judge learns from counts as a success or a failure of
//!   its (site, proxy) pair; counts decay with a half-life, so the rate is
//!   recent: `rate = (successes + 1) / (successes + failures + 2)`;
//! - a proxy is passed over for a site when it has at least
//!   `min_observations` and its rate is below `avoid_below` times the best
//!   rate among the site's proxies — relative, so a site that fails for
//!   every proxy the same way avoids none;
//! - a passed-over pair gets one trial request per `recheck`, so a proxy
//!   the site lets through again is noticed: a success raises its rate.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::domain::resource::ObjectKey;

pub use crate::domain::config::SiteLearningSettings;

/// How much the learning remembers (the least recently used go first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub max_sites: usize,
    pub max_proxies_per_site: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_sites: 4096,
            max_proxies_per_site: 512,
        }
    }
}

#[derive(Clone, Debug)]
struct Pair {
    successes: f64,
    failures: f64,
    updated: Instant,
    /// When it last had a trial while passed over (or first was).
    trial: Option<Instant>,
}

impl Pair {
    fn decayed(&self, half_life: Duration, now: Instant) -> (f64, f64) {
        let age = now.saturating_duration_since(self.updated).as_secs_f64();
        let keep = 0.5f64.powf(age / half_life.as_secs_f64().max(1e-3));
        (self.successes * keep, self.failures * keep)
    }
}

fn rate(successes: f64, failures: f64) -> f64 {
    (successes + 1.0) / (successes + failures + 2.0)
}

#[derive(Clone, Debug, Default)]
struct Site {
    pairs: HashMap<ObjectKey, Pair>,
    used: Option<Instant>,
    requests: u64,
    first_try_successes: u64,
}

/// What the learning asks of one request's lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choice {
    /// Proxies to pass over.
    pub avoid: Vec<ObjectKey>,
    /// A passed-over proxy to try again (asked for, if still eligible).
    pub trial: Option<ObjectKey>,
}

/// One proxy as a site's listing shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct PairView {
    pub proxy: ObjectKey,
    pub successes: f64,
    pub failures: f64,
    pub rate: f64,
    pub avoided: bool,
}

/// One site as listings show it.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteView {
    pub site: String,
    /// Requests to it the gateway finished since it was first seen.
    pub requests: u64,
    /// Of those, served on the first proxy tried.
    pub first_try_successes: u64,
    pub proxies: Vec<PairView>,
}

/// The per-site memory.
#[derive(Debug)]
pub struct SiteLearning {
    settings: SiteLearningSettings,
    bounds: Bounds,
    sites: HashMap<String, Site>,
}

impl SiteLearning {
    pub fn new(settings: SiteLearningSettings, bounds: Bounds) -> Self {
        Self {
            settings,
            bounds,
            sites: HashMap::new(),
        }
    }

    /// A try through `proxy` for `site` succeeded or failed.
    pub fn record(&mut self, site: &str, proxy: &ObjectKey, success: bool, now: Instant) {
        let half_life = self.settings.half_life;
        let max_pairs = self.bounds.max_proxies_per_site;
        let site = self.site_mut(site, now);
        if !site.pairs.contains_key(proxy) && site.pairs.len() >= max_pairs {
            // The least recently updated pair makes room.
            if let Some(oldest) = site
                .pairs
                .iter()
                .min_by_key(|(_, p)| p.updated)
                .map(|(k, _)| k.clone())
            {
                site.pairs.remove(&oldest);
            }
        }
        let pair = site.pairs.entry(proxy.clone()).or_insert(Pair {
            successes: 0.0,
            failures: 0.0,
            updated: now,
            trial: None,
        });
        let (successes, failures) = pair.decayed(half_life, now);
        pair.successes = successes + f64::from(u8::from(success));
        pair.failures = failures + f64::from(u8::from(!success));
        pair.updated = now;
        if success {
            pair.trial = None;
        }
    }

    /// A request to `site` ended; `first_try` it was served by the first
    /// proxy tried.
    pub fn finished(&mut self, site: &str, first_try: bool, now: Instant) {
        let site = self.site_mut(site, now);
        site.requests += 1;
        site.first_try_successes += u64::from(first_try);
    }

    fn site_mut(&mut self, name: &str, now: Instant) -> &mut Site {
        if !self.sites.contains_key(name) && self.sites.len() >= self.bounds.max_sites {
            self.forget_least_used();
        }
        let site = self.sites.entry(name.to_owned()).or_default();
        site.used = Some(now);
        site
    }

    fn forget_least_used(&mut self) {
        // A tenth at once: one scan pays for many new sites.
        let mut by_use: Vec<(Option<Instant>, String)> =
            self.sites.iter().map(|(k, s)| (s.used, k.clone())).collect();
        let n = (self.bounds.max_sites / 10).clamp(1, by_use.len().max(1));
        if by_use.is_empty() {
            return;
        }
        by_use.select_nth_unstable(n - 1);
        for (_, name) in by_use.into_iter().take(n) {
            self.sites.remove(&name);
        }
    }

    /// The proxies to pass over for `site` now, and a passed-over one
    /// whose trial is due (this request is its trial: it is asked for).
    pub fn choice(&mut self, site: &str, now: Instant) -> Choice {
        let s = self.settings;
        let mut choice = Choice::default();
        if !s.enabled {
            return choice;
        }
        let Some(entry) = self.sites.get_mut(site) else {
            return choice;
        };
        let rates: Vec<(ObjectKey, f64, f64)> = entry
            .pairs
            .iter()
            .map(|(k, p)| {
                let (succ, fail) = p.decayed(s.half_life, now);
                (k.clone(), succ + fail, rate(succ, fail))
            })
            .collect();
        let best = rates.iter().map(|(_, _, r)| *r).fold(0.0, f64::max);
        for (key, seen, r) in rates {
            if seen < s.min_observations || r >= s.avoid_below * best {
                continue;
            }
            let Some(pair) = entry.pairs.get_mut(&key) else {
                continue;
            };
            let due = pair
                .trial
                .is_some_and(|at| now.saturating_duration_since(at) >= s.recheck);
            if due && choice.trial.is_none() {
                pair.trial = Some(now);
                choice.trial = Some(key);
                continue;
            }
            pair.trial.get_or_insert(now);
            choice.avoid.push(key);
        }
        choice.avoid.sort();
        choice
    }

    /// Sites by recent use, at most `limit`, with their pairs (best first).
    pub fn sites(&self, limit: usize, now: Instant) -> Vec<SiteView> {
        let s = self.settings;
        let mut sites: Vec<(&String, &Site)> = self.sites.iter().collect();
        sites.sort_by(|a, b| b.1.used.cmp(&a.1.used).then_with(|| a.0.cmp(b.0)));
        sites
            .into_iter()
            .take(limit)
            .map(|(name, site)| {
                let mut proxies: Vec<PairView> = site
                    .pairs
                    .iter()
                    .map(|(proxy, p)| {
                        let (successes, failures) = p.decayed(s.half_life, now);
                        PairView {
                            proxy: proxy.clone(),
                            successes,
                            failures,
                            rate: rate(successes, failures),
                            avoided: false,
                        }
                    })
                    .collect();
                let best = proxies.iter().map(|p| p.rate).fold(0.0, f64::max);
                for p in &mut proxies {
                    p.avoided =
                        p.successes + p.failures >= s.min_observations && p.rate < s.avoid_below * best;
                }
                proxies.sort_by(|a, b| b.rate.total_cmp(&a.rate).then_with(|| a.proxy.cmp(&b.proxy)));
                SiteView {
                    site: name.clone(),
                    requests: site.requests,
                    first_try_successes: site.first_try_successes,
                    proxies,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    #[test]
    fn a_proxy_failing_for_one_site_is_passed_over_there_only() {
        let mut l = SiteLearning::new(SiteLearningSettings::default(), Bounds::default());
        let t = Instant::now();
        for p in ["a", "b", "c"] {
            for _ in 0..3 {
                l.record("a.example", &key(p), true, t);
                l.record("b.example", &key(p), true, t);
            }
        }
        l.record("a.example", &key("d"), false, t);
        assert!(
            l.choice("a.example", t).avoid.is_empty(),
            "one failure is not enough"
        );
        l.record("a.example", &key("d"), false, t);
        l.record("b.example", &key("d"), true, t);
        assert_eq!(l.choice("a.example", t).avoid, vec![key("d")]);
        assert_eq!(l.choice("b.example", t), Choice::default());
        assert_eq!(
            l.choice("c.example", t),
            Choice::default(),
            "an unknown site avoids nothing"
        );
    }

    #[test]
    fn a_site_failing_everywhere_avoids_nobody() {
        let mut l = SiteLearning::new(SiteLearningSettings::default(), Bounds::default());
        let t = Instant::now();
        for p in ["a", "b", "c", "d"] {
            for _ in 0..5 {
                l.record("down.example", &key(p), false, t);
            }
        }
        assert_eq!(l.choice("down.example", t), Choice::default());
    }

    #[test]
    fn a_passed_over_proxy_gets_one_trial_per_recheck_and_recovers() {
        let settings = SiteLearningSettings::default();
        let mut l = SiteLearning::new(settings, Bounds::default());
        let t = Instant::now();
        for _ in 0..5 {
            l.record("s", &key("good"), true, t);
            l.record("s", &key("bad"), false, t);
        }
        assert_eq!(l.choice("s", t).avoid, vec![key("bad")]);
        assert_eq!(l.choice("s", t + Duration::from_secs(1)).avoid, vec![key("bad")]);
        let due = t + settings.recheck;
        let trial = l.choice("s", due);
        assert_eq!(
            (trial.avoid.len(), trial.trial),
            (0, Some(key("bad"))),
            "its trial"
        );
        assert_eq!(
            l.choice("s", due).avoid,
            vec![key("bad")],
            "one trial per recheck"
        );
        // The site lets it through again: a few successes bring it back.
        for _ in 0..6 {
            l.record("s", &key("bad"), true, due);
        }
        assert_eq!(l.choice("s", due), Choice::default());
    }

    #[test]
    fn counts_decay_with_the_half_life() {
        let settings = SiteLearningSettings::default();
        let mut l = SiteLearning::new(settings, Bounds::default());
        let t = Instant::now();
        for _ in 0..4 {
            l.record("s", &key("p"), false, t);
        }
        let later = t + settings.half_life;
        let view = &l.sites(1, later)[0].proxies[0];
        assert!((view.failures - 2.0).abs() < 1e-9, "{view:?}");
    }

    #[test]
    fn memory_is_bounded() {
        let bounds = Bounds {
            max_sites: 10,
            max_proxies_per_site: 3,
        };
        let mut l = SiteLearning::new(SiteLearningSettings::default(), bounds);
        let t = Instant::now();
        for i in 0..100u32 {
            let at = t + Duration::from_millis(u64::from(i));
            l.record(&format!("s{i}"), &key("p"), true, at);
            l.record("kept", &key(&format!("p{i}")), true, at);
        }
        assert!(l.sites(usize::MAX, t).len() <= 10);
        let kept = l.sites(usize::MAX, t + Duration::from_secs(1));
        let kept = kept
            .iter()
            .find(|s| s.site == "kept")
            .expect("the busiest site stays");
        assert_eq!(kept.proxies.len(), 3);
    }
}
