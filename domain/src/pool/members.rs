//! A pool's members as Proxy objects: made from the template (name, labels,
//! owner, the pool attribute leases select by) and read back for the planner.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use sha2::{Digest, Sha256};

use super::plan::{Member, RetireReason, Retiring};
use crate::resource::{
    POOL_LABEL, POOL_TEMPLATE_HASH_ANNOTATION, Phase, Proxy, ProxyPool, ProxyTemplate, RETIRING_ANNOTATION,
};

/// Characters of a member's name suffix: no vowels (no words), no look-alikes.
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Length of a member's name suffix.
const SUFFIX_LEN: usize = crate::resource::MEMBER_SUFFIX_LEN;

/// The template's hash, as the members' annotation carries it: a change of
/// anything in the template replaces the members.
pub fn template_hash(template: &ProxyTemplate) -> String {
    // The types serialise deterministically (struct order, sorted maps).
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    hex::encode(&digest[..5])
}

/// Suffixes for members' names, drawn from `seed`: the caller draws the
/// seed from its own random source (a fixed one in tests), so the decision
/// that names members stays a function of its inputs.
pub fn name_suffixes(seed: u64) -> impl Iterator<Item = String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    std::iter::repeat_with(move || {
        (0..SUFFIX_LEN)
            .map(|_| SUFFIX_ALPHABET[rng.usize(..SUFFIX_ALPHABET.len())] as char)
            .collect()
    })
}

/// The Proxy for a new member `<pool>-<suffix>`, owned by the pool.
pub fn new_member(pool: &ProxyPool, suffix: &str, template_hash: &str) -> Proxy {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let mut spec = pool.spec.template.spec.clone();
    spec.attributes.insert(POOL_LABEL.to_owned(), name.clone());
    let mut proxy = Proxy::new(&format!("{name}-{suffix}"), spec);
    proxy.metadata.namespace = pool.metadata.namespace.clone();
    let mut labels = pool.spec.template.labels.clone();
    labels.insert(POOL_LABEL.to_owned(), name.clone());
    proxy.metadata.labels = Some(labels);
    proxy.metadata.annotations = Some(
        [(POOL_TEMPLATE_HASH_ANNOTATION.to_owned(), template_hash.to_owned())]
            .into_iter()
            .collect(),
    );
    proxy.metadata.owner_references = Some(vec![OwnerReference {
        api_version: ProxyPool::api_version(&()).into_owned(),
        kind: ProxyPool::kind(&()).into_owned(),
        name,
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    proxy
}

/// Whether `proxy` belongs to `pool` (its controller is that incarnation).
pub fn is_member(proxy: &Proxy, pool: &ProxyPool) -> bool {
    proxy.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && Some(&o.uid) == pool.metadata.uid.as_ref() && o.kind == "ProxyPool"
    })
}

/// The retiring annotation's value: `<time> <reason>`.
pub fn retiring_value(since: Timestamp, reason: RetireReason) -> String {
    format!("{since} {}", reason.as_str())
}

/// Reads a retiring annotation back; an unreadable one counts as retiring
/// since `fallback` for `ScaleDown` (it was retiring; keep it so).
pub fn parse_retiring(value: &str, fallback: Timestamp) -> Retiring {
    let mut parts = value.split_whitespace();
    let since = parts.next().and_then(|t| t.parse().ok()).unwrap_or(fallback);
    let reason = parts
        .next()
        .and_then(RetireReason::parse)
        .unwrap_or(RetireReason::ScaleDown);
    Retiring { since, reason }
}

/// Lease figures of one member, from the lease store. The default is a
/// member the lease store does not know (yet): nothing about its leases is
/// known, so it is neither drained nor idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseFigures {
    /// The lease store holds the member's availability (not merely leases
    /// restored for it before its actor reported after a restart).
    pub known: bool,
    /// The lease store already refuses new leases on it.
    pub retiring: bool,
    pub leases: u32,
    pub blocked_targets: u32,
    pub errors: u32,
}

impl LeaseFigures {
    /// No lease can be on it or granted on it any more: it may be deleted.
    pub fn drained(&self) -> bool {
        self.known && self.retiring && self.leases == 0
    }
}

/// When `proxy`, not Ready now, stopped being Ready: its Ready condition's
/// last flip to False, or its creation when it never was Ready.
fn unready_since(proxy: &Proxy, created: Timestamp) -> Timestamp {
    proxy
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "False")
        })
        .map_or(created, |c| c.last_transition_time.0.max(created))
}

/// `proxy` as the planner sees it.
pub fn planned(proxy: &Proxy, figures: LeaseFigures, now: Timestamp) -> Member {
    let annotation = |name: &str| proxy.metadata.annotations.as_ref().and_then(|a| a.get(name));
    let created = proxy.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let ready = proxy.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready);
    Member {
        name: proxy.metadata.name.clone().unwrap_or_default(),
        created,
        template_hash: annotation(POOL_TEMPLATE_HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        ready,
        unready_since: (!ready).then(|| unready_since(proxy, created)),
        retiring: annotation(RETIRING_ANNOTATION).map(|v| parse_retiring(v, now)),
        leases: figures.leases,
        drained: figures.drained(),
        blocked_targets: figures.blocked_targets,
        errors: figures.errors,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool() -> ProxyPool {
        serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "eu", "namespace": "crawlers", "uid": "pool-uid-1"},
            "spec": {"replicas": 2, "template": {"labels": {"team": "shop"},
                "spec": {"mode": "Managed", "provider": "local", "attributes": {"geo": "eu"}}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_member_carries_the_pool_in_name_labels_attributes_and_owner() {
        let pool = pool();
        let hash = template_hash(&pool.spec.template);
        let m = new_member(&pool, "x7k2b", &hash);
        assert_eq!(m.metadata.name.as_deref(), Some("eu-x7k2b"));
        assert_eq!(m.metadata.namespace.as_deref(), Some("crawlers"));
        let labels = m.metadata.labels.clone().unwrap();
        assert_eq!(
            (labels["team"].as_str(), labels[POOL_LABEL].as_str()),
            ("shop", "eu")
        );
        assert_eq!(m.spec.attributes[POOL_LABEL], "eu");
        assert_eq!(m.spec.attributes["geo"], "eu");
        assert_eq!(
            m.metadata.annotations.clone().unwrap()[POOL_TEMPLATE_HASH_ANNOTATION],
            hash
        );
        assert!(is_member(&m, &pool));
        let mut other = pool.clone();
        other.metadata.uid = Some("pool-uid-2".into());
        assert!(
            !is_member(&m, &other),
            "another incarnation of the pool owns nothing of this one"
        );
        m.spec.validate().unwrap();
    }

    #[test]
    fn the_template_hash_follows_every_field_and_only_them() {
        let pool = pool();
        let hash = template_hash(&pool.spec.template);
        assert_eq!(hash.len(), 10);
        assert_eq!(template_hash(&pool.clone().spec.template), hash);
        let mut changed = pool.spec.template.clone();
        changed.spec.port = 3129;
        assert_ne!(template_hash(&changed), hash);
        let mut relabelled = pool.spec.template.clone();
        relabelled.labels.insert("team".into(), "news".into());
        assert_ne!(template_hash(&relabelled), hash);
    }

    #[test]
    fn suffixes_are_names_and_rarely_collide() {
        let suffixes: std::collections::HashSet<String> = name_suffixes(7).take(1000).collect();
        assert!(suffixes.len() > 990);
        let again: Vec<String> = name_suffixes(7).take(3).collect();
        assert_eq!(
            again,
            name_suffixes(7).take(3).collect::<Vec<_>>(),
            "one seed, one draw"
        );
        assert_ne!(again, name_suffixes(8).take(3).collect::<Vec<_>>());
        assert!(suffixes.iter().all(
            |s| s.len() == SUFFIX_LEN && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        ));
    }

    #[test]
    fn a_member_is_read_back_for_the_planner() {
        let pool = pool();
        let mut m = new_member(&pool, "aaaaa", "h1");
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let since = Timestamp::from_second(1_799_999_000).unwrap();
        m.metadata.annotations.get_or_insert_default().insert(
            RETIRING_ANNOTATION.into(),
            retiring_value(since, RetireReason::Blocked),
        );
        let figures = LeaseFigures {
            known: true,
            retiring: true,
            leases: 2,
            blocked_targets: 5,
            errors: 1,
        };
        let planned = planned(&m, figures, now);
        assert!(!planned.drained, "still leased");
        let idle = LeaseFigures { leases: 0, ..figures };
        assert!(super::planned(&m, idle, now).drained);
        let unaware = LeaseFigures {
            retiring: false,
            ..idle
        };
        assert!(
            !super::planned(&m, unaware, now).drained,
            "the lease store may still grant it"
        );
        assert_eq!(planned.name, "eu-aaaaa");
        assert_eq!(planned.template_hash, "h1");
        assert!(!planned.ready);
        assert_eq!(
            planned.retiring,
            Some(Retiring {
                since,
                reason: RetireReason::Blocked
            })
        );
        assert_eq!(
            (planned.leases, planned.blocked_targets, planned.errors),
            (2, 5, 1)
        );
        assert_eq!(parse_retiring("garbage", now).since, now);
    }
}
