//! ProxyPools through the real binary in standalone mode, with local
//! proxies: a crawler leasing from a pool and fetching through its proxies
//! the whole time sees no failed request and no refused lease while every
//! member is rotated (on blocks, on age); a template change rolls out within
//! maxSurge/maxUnavailable; replicas and autoscaling follow demand up and
//! down; removing the pool removes every member and its process.
//! `/metrics` follows a rotation: the pool's gauges once it settles, its
//! members made, retired (blocked) and deleted, and no series of it once it
//! is gone.

use std::collections::BTreeSet;
use std::time::Duration;

use egress_proxies::domain::resource::{Phase, Proxy, RETIRING_ANNOTATION};
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
    pool_with(health_url, replicas, "rotation: {afterBlockedTargets: 1}", "")
}

/// A pool `eu` of local proxies with `extra` spec lines and template `attributes`.
fn pool_with(health_url: &str, replicas: u32, extra: &str, attributes: &str) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: eu, namespace: crawl}}\n\
         spec:\n  replicas: {replicas}\n  {extra}\n  drainTimeout: 20s\n  template:\n    \
         spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health_url}\", interval: 1s}}, \
         attributes: {{{attributes}}}}}\n"
    )
}

fn retiring(p: &Proxy) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(RETIRING_ANNOTATION))
}

/// The pool's members not being deleted.
fn live(dir: &OperatorDir) -> Vec<Proxy> {
    dir.proxies()
        .into_iter()
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("eu-")))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Names of the pool's Ready members that are not retiring.
fn serving(dir: &OperatorDir) -> BTreeSet<String> {
    live(dir)
        .into_iter()
        .filter(|p| !retiring(p))
        .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready))
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// A crawler on the pool: each round holds one lease per member
/// (`--max-leases-per-proxy 1`: every serving member gets one, whatever
/// the tie-breaks prefer), fetches a page through each leased proxy, may
/// report, and releases them. A new target per round: a released proxy
/// rests for its target only. Every fetch must succeed.
struct Crawler {
    api: String,
    page: String,
    client: reqwest::Client,
    /// Leases held per round.
    width: usize,
    rounds: usize,
    fetched: usize,
    /// Acquires answered 503 (no member free this instant): not failed
    /// fetches, counted to be shown.
    refused: usize,
}

impl Crawler {
    async fn new(api: String, width: usize) -> Self {
        Self {
            api,
            page: format!("http://{}/page", http_target().await),
            client: reqwest::Client::new(),
            width,
            rounds: 0,
            fetched: 0,
            refused: 0,
        }
    }

    /// Crawls until `done` or `CONVERGE` has passed; `report` says what to
    /// report on a proxy after a fetch through it.
    async fn crawl_until(
        &mut self,
        dir: &OperatorDir,
        mut report: impl FnMut(&str) -> Option<&'static str>,
        mut done: impl FnMut() -> bool,
    ) {
        let deadline = std::time::Instant::now() + CONVERGE;
        while std::time::Instant::now() < deadline && !done() {
            self.rounds += 1;
            let mut grants = Vec::new();
            for _ in 0..self.width {
                let response = self
                    .client
                    .post(format!("{}/v1/leases", self.api))
                    .json(&json!({"target": format!("t{}.example", self.rounds), "pool": "eu", "ttlSeconds": 30}))
                    .send()
                    .await
                    .unwrap();
                if response.status() == 503 {
                    self.refused += 1;
                    break;
                }
                grants.push(
                    response
                        .error_for_status()
                        .unwrap()
                        .json::<Value>()
                        .await
                        .unwrap(),
                );
            }
            for grant in &grants {
                let id = grant["id"].as_str().unwrap();
                let name = grant["proxy"]["name"].as_str().unwrap();
                let via = reqwest::Client::builder()
                    .proxy(reqwest::Proxy::http(grant["proxy"]["url"].as_str().unwrap()).unwrap())
                    .build()
                    .unwrap();
                let page = via
                    .get(&self.page)
                    .send()
                    .await
                    .and_then(|r| r.error_for_status());
                assert!(
                    page.is_ok(),
                    "fetch {} through {name} failed: {page:?}\n{}",
                    self.fetched,
                    dir.logs()
                );
                self.fetched += 1;
                if let Some(outcome) = report(name) {
                    self.client
                        .post(format!("{}/v1/leases/{id}/report", self.api))
                        .json(&json!({"outcome": outcome}))
                        .send()
                        .await
                        .unwrap()
                        .error_for_status()
                        .unwrap();
                }
                self.client
                    .delete(format!("{}/v1/leases/{id}", self.api))
                    .send()
                    .await
                    .unwrap();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_rotates_blocked_members_without_a_failed_request_and_goes_with_its_manifest() {
    egress_proxies::tls::ensure_crypto_provider();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest("pool", &pool_manifest(&health_target(), 2));
    let operator = dir
        .standalone()
        .setting("maxLeasesPerProxy", "1")
        .discovery()
        .metrics()
        .log_level("info")
        .start()
        .await;
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

    // Report each original member blocked once; both must be replaced.
    let mut crawler = Crawler::new(format!("http://{}", operator.discovery()), 2).await;
    let mut blocked = BTreeSet::new();
    crawler
        .crawl_until(
            &dir,
            |name| (first.contains(name) && blocked.insert(name.to_owned())).then_some("blocked"),
            || {
                let now = serving(&dir);
                now.len() == 2 && now.is_disjoint(&first)
            },
        )
        .await;
    let now = serving(&dir);
    assert!(
        now.len() == 2 && now.is_disjoint(&first),
        "both blocked members replaced: first {first:?}, serving {now:?}\n{}",
        dir.logs()
    );
    eprintln!(
        "blocked rotation: {} rounds, {} fetched, {} refused",
        crawler.rounds, crawler.fetched, crawler.refused
    );
    assert!(crawler.fetched > 0);
    assert_eq!(
        crawler.refused, 0,
        "with maxUnavailable 0 both leases of every round were granted"
    );
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
async fn members_older_than_max_age_are_rotated_while_a_crawler_keeps_fetching() {
    egress_proxies::tls::ensure_crypto_provider();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest(
        "pool",
        &pool_with(&health_target(), 2, "rotation: {maxAge: 8s}", ""),
    );
    let operator = dir
        .standalone()
        .setting("maxLeasesPerProxy", "1")
        .discovery()
        .log_level("info")
        .start()
        .await;
    let first = eventually("two Ready members", CONVERGE, async || {
        let ready = serving(&dir);
        (ready.len() == 2).then_some(ready)
    })
    .await;
    let mut crawler = Crawler::new(format!("http://{}", operator.discovery()), 2).await;
    let seen = std::cell::RefCell::new(BTreeSet::new());
    crawler
        .crawl_until(
            &dir,
            |name| {
                seen.borrow_mut().insert(name.to_owned());
                None
            },
            || {
                let now = serving(&dir);
                now.len() == 2 && now.is_disjoint(&first) && now.is_subset(&seen.borrow())
            },
        )
        .await;
    let seen = seen.into_inner();
    let now = serving(&dir);
    assert!(
        now.len() == 2 && now.is_disjoint(&first),
        "both members aged out: first {first:?}, serving {now:?}\n{}",
        dir.logs()
    );
    eprintln!(
        "age rotation: {} rounds, {} fetched, {} refused, proxies {seen:?}",
        crawler.rounds, crawler.fetched, crawler.refused
    );
    assert_eq!(crawler.refused, 0, "maxUnavailable 0: the pool was never short");
    assert!(
        now.is_subset(&seen),
        "the crawler was served by the successors: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_rolls_out_within_max_unavailable() {
    let health = health_target();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let spec = "maxSurge: 0\n  maxUnavailable: 1";
    dir.write_manifest("pool", &pool_with(&health, 3, spec, "geo: eu"));
    let _operator = dir.standalone().log_level("info").start().await;
    let first = eventually("three Ready members", CONVERGE, async || {
        let ready = serving(&dir);
        (ready.len() == 3).then_some(ready)
    })
    .await;

    dir.write_manifest("pool", &pool_with(&health, 3, spec, "geo: de"));
    // Watch the rollout: never fewer than 3 - maxUnavailable serving, never
    // more than 3 + maxSurge members.
    let (mut fewest, mut most) = ((usize::MAX, String::new()), (0, String::new()));
    let deadline = std::time::Instant::now() + CONVERGE;
    loop {
        let members = live(&dir);
        let now = serving(&dir);
        let shown = || {
            let of = |p: &Proxy| {
                let phase = p.status.as_ref().and_then(|s| s.phase);
                (p.metadata.name.clone(), phase, retiring(p))
            };
            format!("{:?}", members.iter().map(of).collect::<Vec<_>>())
        };
        if now.len() < fewest.0 {
            fewest = (now.len(), shown());
        }
        if members.len() > most.0 {
            most = (members.len(), shown());
        }
        let rolled = members.len() == 3
            && now.len() == 3
            && members
                .iter()
                .all(|p| p.spec.attributes.get("geo").map(String::as_str) == Some("de"));
        if rolled {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not rolled out: {:?}\n{}",
            members
                .iter()
                .map(|p| (p.metadata.name.clone(), p.spec.attributes.clone(), retiring(p)))
                .collect::<Vec<_>>(),
            dir.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(serving(&dir).is_disjoint(&first), "every member replaced");
    assert_eq!(
        fewest.0,
        2,
        "one member unavailable at a time, as maxUnavailable says: {}\n{}",
        fewest.1,
        dir.logs()
    );
    assert_eq!(
        most.0,
        3,
        "no member above replicas with maxSurge 0: {}\n{}",
        most.1,
        dir.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaled_pool_follows_a_step_in_demand_and_back() {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest(
        "pool",
        &pool_with(
            &health_target(),
            1,
            "autoscaling: {minReplicas: 1, maxReplicas: 3, targetUtilization: 100}",
            "",
        ),
    );
    let operator = dir
        .standalone()
        .setting("maxLeasesPerProxy", "1")
        .setting("poolScaleDownDelay", "3s")
        .discovery()
        .log_level("info")
        .start()
        .await;
    let api = format!("http://{}", operator.discovery());
    eventually("one Ready member", CONVERGE, async || {
        (serving(&dir).len() == 1).then_some(())
    })
    .await;
    // Demand steps up to three leases held at once: refused acquires grow
    // the pool until all three are granted.
    let client = reqwest::Client::new();
    let mut held = Vec::new();
    for target in ["a.example", "b.example", "c.example"] {
        let id = eventually(&format!("a lease for {target}"), CONVERGE, async || {
            let response = client
                .post(format!("{api}/v1/leases"))
                .json(&json!({"target": target, "pool": "eu", "ttlSeconds": 300}))
                .send()
                .await
                .unwrap();
            if response.status() == 503 {
                return None;
            }
            let grant: Value = response.error_for_status().unwrap().json().await.unwrap();
            Some(grant["id"].as_str().unwrap().to_owned())
        })
        .await;
        held.push(id);
    }
    assert_eq!(serving(&dir).len(), 3);
    let desired = || {
        let pool: Value = serde_json::from_slice(
            &std::process::Command::new(support::operator::BIN)
                .args(["get", "pools", "-o", "json", "--config"])
                .arg(dir.path().join("operator.yaml"))
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        pool["items"][0]["status"]["desiredReplicas"].as_u64()
    };
    assert_eq!(desired(), Some(3));

    // Demand goes: after the scale-down delay the pool is back to one.
    for id in &held {
        client
            .delete(format!("{api}/v1/leases/{id}"))
            .send()
            .await
            .unwrap();
    }
    eventually("back to one member", CONVERGE, async || {
        (live(&dir).len() == 1 && desired() == Some(1)).then_some(())
    })
    .await;
    let instances = dir.state().join("local");
    eventually("one proxy process", CONVERGE, async || {
        (processes_under(&instances).len() == 1).then_some(())
    })
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_standalone_pool_sample_fills_itself() {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/standalone/proxies/pool.yaml"
    ))
    .unwrap();
    let own_healthz = "http://127.0.0.1:8081/healthz";
    assert!(shipped.contains(own_healthz), "{shipped}");
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest("pool", &shipped.replace(own_healthz, &health_target()));
    let _operator = dir.standalone().start().await;
    eventually("the sample's two members Ready", CONVERGE, async || {
        let ready = dir
            .proxies()
            .into_iter()
            .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("demo-")))
            .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready))
            .count();
        (ready == 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_rollout_resumes_it_and_leaks_no_process() {
    let health = health_target();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let spec = "maxSurge: 1\n  maxUnavailable: 0";
    dir.write_manifest("pool", &pool_with(&health, 3, spec, "geo: eu"));
    let operator = dir.standalone().log_level("info").start().await;
    eventually("three Ready members", CONVERGE, async || {
        (serving(&dir).len() == 3).then_some(())
    })
    .await;
    dir.write_manifest("pool", &pool_with(&health, 3, spec, "geo: de"));
    let of_new = || {
        live(&dir)
            .into_iter()
            .filter(|p| p.spec.attributes.get("geo").map(String::as_str) == Some("de"))
            .count()
    };
    eventually("the rollout under way", CONVERGE, async || {
        (of_new() >= 1).then_some(())
    })
    .await;
    drop(operator); // SIGKILL, mid-rollout

    let _operator = dir.standalone().log_level("info").start().await;
    eventually(
        "the rollout finished by the next operator",
        CONVERGE,
        async || {
            let members = live(&dir);
            (members.len() == 3 && of_new() == 3 && serving(&dir).len() == 3).then_some(())
        },
    )
    .await;
    let instances = dir.state().join("local");
    eventually(
        "one proxy process per member, none left over",
        CONVERGE,
        async || (processes_under(&instances).len() == 3 && dir.proxies().len() == 3).then_some(()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_reports_count_across_an_operator_restart() {
    egress_proxies::tls::ensure_crypto_provider();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let manifest = pool_with(&health_target(), 1, "rotation: {afterBlockedTargets: 2}", "");
    dir.write_manifest("pool", &manifest);
    let client = reqwest::Client::new();
    // Leases the one member for `target` and reports it blocked.
    let block = async |operator: &support::operator::OperatorProcess, target: &str| -> String {
        let api = format!("http://{}", operator.discovery());
        let grant: Value = client
            .post(format!("{api}/v1/leases"))
            .json(&json!({"target": target, "pool": "eu"}))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = grant["id"].as_str().unwrap();
        for call in ["report", "release"] {
            let request = match call {
                "report" => client
                    .post(format!("{api}/v1/leases/{id}/report"))
                    .json(&json!({"outcome": "blocked"})),
                _ => client.delete(format!("{api}/v1/leases/{id}")),
            };
            request.send().await.unwrap().error_for_status().unwrap();
        }
        grant["proxy"]["name"].as_str().unwrap().to_owned()
    };

    let operator = dir.standalone().discovery().log_level("info").start().await;
    let member = eventually("one Ready member", CONVERGE, async || {
        let ready = serving(&dir);
        (ready.len() == 1).then(|| ready.into_iter().next()).flatten()
    })
    .await;
    assert_eq!(block(&operator, "a.example").await, member);
    // One target of two: not due. Give the pool a few turns to prove it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        serving(&dir),
        BTreeSet::from([member.clone()]),
        "one block is not enough"
    );
    drop(operator); // SIGKILL: the tally lives only in the lease journal now

    let operator = dir.standalone().discovery().log_level("info").start().await;
    eventually("the member back after the restart", CONVERGE, async || {
        (serving(&dir) == BTreeSet::from([member.clone()])).then_some(())
    })
    .await;
    eventually("the member leasable again", CONVERGE, async || {
        // The lease store learns the member's availability a moment after start.
        let api = format!("http://{}", operator.discovery());
        let listed: Value = client
            .get(format!("{api}/v1/proxies"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (listed[0]["healthy"] == true).then_some(())
    })
    .await;
    assert_eq!(block(&operator, "b.example").await, member);
    // The second distinct target since the member was made: replaced.
    eventually("the member replaced", CONVERGE, async || {
        let now = serving(&dir);
        (now.len() == 1 && !now.contains(&member)).then_some(())
    })
    .await;
}
