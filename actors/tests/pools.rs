//! ProxyPools through the real binary in standalone mode, with local
//! proxies: a pool fills itself, a crawler leasing from it and fetching
//! through its proxies the whole time sees no failed request while blocked
//! members are rotated out, and removing the pool removes every member and
//! its process. `/metrics` follows along: the pool's gauges once it
//! settles, its members made, retired (blocked) and deleted, and no series
//! of it once it is gone.

use std::collections::BTreeSet;
use std::time::Duration;

use egress_proxies::resource::{Phase, RETIRING_ANNOTATION};
use serde_json::{Value, json};

mod support;

use support::eventually;
use support::operator::{LOCAL_PROVIDER, OperatorDir};
use support::process::{health_target, processes_under};
use support::target_server::http_target;

const CONVERGE: Duration = Duration::from_secs(60);

/// A scrape of the operator's `/metrics`.
async fn scrape(metrics: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of metric `name` for pool `crawl/eu` (and `extra` labels after it).
fn pool_value(scrape: &str, name: &str, extra: &str) -> Option<f64> {
    let series = format!("egress_proxies_{name}{{pool=\"crawl/eu\"{extra}}} ");
    scrape.lines().find_map(|l| l.strip_prefix(&series)?.parse().ok())
}

/// The pool's gauges: desired, members, ready, rotating, leases.
fn pool_gauges(scrape: &str) -> [Option<f64>; 5] {
    [
        "pool_desired_members",
        "pool_members",
        "pool_ready_members",
        "pool_rotating_members",
        "pool_leases_active",
    ]
    .map(|name| pool_value(scrape, name, ""))
}

fn pool_manifest(health_url: &str, replicas: u32) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: eu, namespace: crawl}}\n\
         spec:\n  replicas: {replicas}\n  rotation: {{afterBlockedTargets: 1}}\n  drainTimeout: 20s\n  template:\n    \
         spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health_url}\", interval: 1s}}}}\n"
    )
}

/// Names of the pool's Ready members that are not retiring.
fn serving(dir: &OperatorDir) -> BTreeSet<String> {
    dir.proxies()
        .into_iter()
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("eu-")))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key(RETIRING_ANNOTATION))
        })
        .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready))
        .filter_map(|p| p.metadata.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_rotates_blocked_members_without_a_failed_request_and_goes_with_its_manifest() {
    egress_proxies::tls::ensure_crypto_provider();
    let target = http_target().await;
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest("pool", &pool_manifest(&health_target(), 2));
    let operator = dir
        .standalone()
        .setting("maxLeasesPerProxy", "0")
        .discovery()
        .metrics()
        .log_level("info")
        .start()
        .await;
    let api = format!("http://{}", operator.discovery());
    let metrics = operator.metrics();
    let first = eventually("two Ready members", CONVERGE, async || {
        let ready = serving(&dir);
        (ready.len() == 2).then_some(ready)
    })
    .await;
    // Settled: two wanted, two made, both Ready, none rotating, no lease.
    operator
        .eventually("the pool's gauges settled", CONVERGE, async || {
            let text = scrape(metrics).await;
            let two = Some(2.0);
            if pool_gauges(&text) == [two, two, two, Some(0.0), Some(0.0)] {
                Ok(text)
            } else {
                Err(format!("{:?}", pool_gauges(&text)))
            }
        })
        .await;
    let settled = scrape(metrics).await;
    assert_eq!(
        pool_value(&settled, "pool_member_creations_total", ""),
        Some(2.0),
        "{settled}"
    );
    assert_eq!(
        pool_value(&settled, "pool_leases_denied_total", ""),
        Some(0.0),
        "{settled}"
    );

    // A crawler: lease from the pool, fetch through the proxy, report one
    // proxy blocked per round, release. Every fetch must succeed. Leases on
    // successors are kept until the end: the book prefers proxies with
    // fewer leases, so the next round gets a member not yet blocked (by
    // latency alone a successor can win every round, and the other member
    // is never leased).
    let client = reqwest::Client::new();
    let mut blocked = BTreeSet::new();
    let mut kept = Vec::new();
    let mut fetched = 0;
    let deadline = std::time::Instant::now() + CONVERGE;
    let mut round = 0;
    while std::time::Instant::now() < deadline {
        round += 1;
        let grant: Value = match client
            .post(format!("{api}/v1/leases"))
            // A target per round: a released proxy rests for its target only.
            .json(&json!({"target": format!("t{round}.example"), "pool": "eu", "ttlSeconds": 30}))
            .send()
            .await
            .unwrap()
        {
            r if r.status() == 503 => {
                // Nothing free this instant (all members retiring or starting): not a failed fetch.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            r => r.error_for_status().unwrap().json().await.unwrap(),
        };
        let id = grant["id"].as_str().unwrap().to_owned();
        let name = grant["proxy"]["name"].as_str().unwrap().to_owned();
        let url = grant["proxy"]["url"].as_str().unwrap();
        let via = reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(url).unwrap())
            .build()
            .unwrap();
        let page = via
            .get(format!("http://{target}/page"))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        assert!(page.is_ok(), "fetch {fetched} through {name} failed: {page:?}");
        fetched += 1;
        if first.contains(&name) && blocked.insert(name.clone()) {
            client
                .post(format!("{api}/v1/leases/{id}/report"))
                .json(&json!({"outcome": "blocked"}))
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
        }
        if first.contains(&name) {
            client
                .delete(format!("{api}/v1/leases/{id}"))
                .send()
                .await
                .unwrap();
        } else {
            kept.push(id);
        }
        let now = serving(&dir);
        if blocked.len() == first.len() && now.len() == 2 && now.is_disjoint(&first) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = serving(&dir);
    assert!(
        now.len() == 2 && now.is_disjoint(&first),
        "both blocked members replaced: first {first:?}, serving {now:?}\n{}",
        dir.logs()
    );
    assert!(fetched > 0);
    for id in kept {
        client
            .delete(format!("{api}/v1/leases/{id}"))
            .send()
            .await
            .unwrap();
    }
    eventually("the rotated members deleted", CONVERGE, async || {
        dir.proxies()
            .iter()
            .all(|p| !first.contains(p.metadata.name.as_deref().unwrap_or_default()))
            .then_some(())
    })
    .await;
    // Both blocked members retired for that reason, each replaced and deleted.
    let rotated = scrape(metrics).await;
    let counted = |name: &str, extra: &str| pool_value(&rotated, name, extra);
    assert_eq!(
        counted("pool_member_retirements_total", ",reason=\"blocked\""),
        Some(2.0),
        "{rotated}"
    );
    assert_eq!(counted("pool_member_creations_total", ""), Some(4.0), "{rotated}");
    assert_eq!(counted("pool_member_deletions_total", ""), Some(2.0), "{rotated}");
    for reason in ["errors", "template", "age", "scale-down"] {
        assert_eq!(
            counted("pool_member_retirements_total", &format!(",reason=\"{reason}\"")),
            None,
            "no retirement for {reason}: {rotated}"
        );
    }
    let logs = dir.logs();
    assert_eq!(
        logs.lines()
            .filter(|l| l.contains("pool member retiring") && l.contains("blocked"))
            .count(),
        2,
        "each retirement logged with its reason:\n{logs}"
    );

    // The pool leaves: every member and its process go.
    let instances = dir.state().join("local");
    assert_eq!(
        processes_under(&instances).len(),
        2,
        "one proxy process per member before the pool goes"
    );
    dir.remove_manifest("pool");
    eventually("no member left", CONVERGE, async || {
        dir.proxies().is_empty().then_some(())
    })
    .await;
    eventually("no proxy process left", CONVERGE, async || {
        processes_under(&instances).is_empty().then_some(())
    })
    .await;
    // Gone with its pool: not one series names it.
    operator
        .eventually("the pool's series removed", CONVERGE, async || {
            let text = scrape(metrics).await;
            let left: Vec<&str> = text.lines().filter(|l| l.contains("pool=\"crawl/eu\"")).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(left.join("\n"))
            }
        })
        .await;
    drop(operator);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_scales_up_and_down_with_its_replicas() {
    let health = health_target();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest("pool", &pool_manifest(&health, 1));
    let _operator = dir.standalone().log_level("info").start().await;
    let members = || {
        dir.proxies()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count()
    };
    eventually("one Ready member", CONVERGE, async || {
        (serving(&dir).len() == 1).then_some(())
    })
    .await;
    dir.write_manifest("pool", &pool_manifest(&health, 3));
    eventually("three Ready members", CONVERGE, async || {
        (serving(&dir).len() == 3).then_some(())
    })
    .await;
    dir.write_manifest("pool", &pool_manifest(&health, 1));
    eventually("back to one member", CONVERGE, async || {
        (members() == 1 && dir.proxies().len() == 1).then_some(())
    })
    .await;
    assert_eq!(serving(&dir).len(), 1, "the one kept is still serving");
    let table = eventually("get pools to show the pool settled", CONVERGE, async || {
        let out = std::process::Command::new(support::operator::BIN)
            .args(["get", "pools", "--config"])
            .arg(dir.path().join("operator.yaml"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let table = String::from_utf8(out.stdout).unwrap();
        let row: Vec<&str> = table.lines().nth(1)?.split_whitespace().collect();
        // NAME DESIRED REPLICAS READY LEASED ROTATING AGE
        (row[..6] == ["eu", "1", "1", "1", "0", "0"]).then_some(table)
    })
    .await;
    assert!(table.starts_with("NAME   DESIRED   REPLICAS   READY"), "{table}");
    let instances = dir.state().join("local");
    eventually("one proxy process", CONVERGE, async || {
        (processes_under(&instances).len() == 1).then_some(())
    })
    .await;
}
