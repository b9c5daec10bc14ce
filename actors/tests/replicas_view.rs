//! Every replica serving: each replica's dashboard shows its own view of
//! the replicas — its member tag, the leader it syncs with, its capacity
//! share, what it probes, the proxies it knows and the member table the
//! leader relays — and its metrics say the same. Three replicas as
//! processes; the figures are checked against each other and against the
//! fleet (the shares add up to no more than the proxies' capacity, each
//! proxy is probed by one replica). With `--every-replica-serves=false` the
//! dashboard has no replicas section.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use support::browser::{self, Browser, Driver};
use support::replicas::{LEASE_DURATION, ReplicaBed};

const WAIT: Duration = Duration::from_secs(60);
const PROXIES: [&str; 3] = ["p0", "p1", "p2"];
const CAPACITY: u64 = 2;

fn serving_bed(n: usize) -> support::replicas::ReplicaBedBuilder {
    ReplicaBed::builder(n).args(["--lease-cooldown", "0s", "--max-leases-per-proxy", "2"])
}

fn number(v: &Value, what: &str) -> Result<u64, String> {
    v.as_u64().ok_or(format!("{what} is no number: {v}"))
}

/// Every replica's `replicas` section, or why not yet.
async fn views_of(bed: &ReplicaBed) -> Result<Vec<Value>, String> {
    let mut views = Vec::new();
    for i in 0..bed.len() {
        let dashboard = bed
            .dashboard(i)
            .await
            .ok_or(format!("replica {i}: no dashboard"))?;
        let view = dashboard["replicas"].clone();
        if !view.is_object() {
            return Err(format!("replica {i}: no replicas section: {dashboard}"));
        }
        views.push(view);
    }
    Ok(views)
}

/// What every replica's view must say once the replicas have settled.
fn settled(bed: &ReplicaBed, leader: usize, held: &[usize], views: &[Value]) -> Result<(), String> {
    let tags: Vec<String> = views
        .iter()
        .map(|v| v["member"].as_str().unwrap_or_default().to_owned())
        .collect();
    let distinct: BTreeSet<&String> = tags.iter().collect();
    if distinct.len() != views.len() || tags.iter().any(|t| t.len() != 8) {
        return Err(format!("member tags: {tags:?}"));
    }
    let mut slots = 0;
    let mut probing = 0;
    for (i, v) in views.iter().enumerate() {
        let share = &v["share"];
        let leads = i == leader;
        if v["leading"] != json!(leads) {
            return Err(format!(
                "replica {i} (leader {leader}) says leading {}",
                v["leading"]
            ));
        }
        if v["leader"] != json!(bed.addrs(leader).internal.to_string()) {
            return Err(format!(
                "replica {i} syncs with {} not replica {leader}",
                v["leader"]
            ));
        }
        let holder = v["leaderHolder"].as_str().unwrap_or_default();
        if holder != format!("{}/{}", ReplicaBed::pod_name(leader), tags[leader]) {
            return Err(format!("replica {i}: the leader's term names {holder}"));
        }
        let age = number(&v["syncAgeMs"], "syncAgeMs")?;
        if age >= LEASE_DURATION.as_millis() as u64 {
            return Err(format!("replica {i}: last answer {age} ms ago"));
        }
        let left = share["secondsLeft"].as_f64().unwrap_or(0.0);
        if share["valid"] != json!(true) || left <= 0.0 || left > 3.0 * LEASE_DURATION.as_secs_f64() {
            return Err(format!("replica {i}: share {share}"));
        }
        let (held_here, in_use) = (
            number(&share["slots"], "slots")?,
            number(&share["inUse"], "inUse")?,
        );
        let leased_here = held.iter().filter(|&&h| h == i).count() as u64;
        if in_use != leased_here || held_here < in_use {
            return Err(format!(
                "replica {i}: {in_use} slots in use, {held_here} held; it granted {leased_here} leases: {share}"
            ));
        }
        slots += held_here;
        probing += number(&v["probing"], "probing")?;
        if v["proxiesKnown"] != json!(PROXIES.len()) || v["proxiesReady"] != json!(PROXIES.len()) {
            return Err(format!(
                "replica {i} knows {} proxies, {} ready",
                v["proxiesKnown"], v["proxiesReady"]
            ));
        }
        // The member table the leader relays: every replica, where it listens, what it holds.
        let members = v["members"].as_array().cloned().unwrap_or_default();
        let listed: BTreeSet<(String, String)> = members
            .iter()
            .map(|m| {
                (
                    m["tag"].as_str().unwrap_or_default().to_owned(),
                    m["address"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let expected: BTreeSet<(String, String)> = (0..views.len())
            .map(|j| (tags[j].clone(), bed.addrs(j).internal.to_string()))
            .collect();
        if listed != expected {
            return Err(format!("replica {i}'s member table: {members:?}"));
        }
        let own = members.iter().find(|m| m["tag"] == json!(tags[i]));
        if own.map(|m| m["slots"].clone()) != Some(json!(held_here)) {
            return Err(format!(
                "replica {i} holds {held_here} slots; the leader's table says {own:?}"
            ));
        }
        let relayed: u64 = members.iter().filter_map(|m| m["slots"].as_u64()).sum();
        if relayed > PROXIES.len() as u64 * CAPACITY {
            return Err(format!("replica {i}'s member table holds {relayed} slots in all"));
        }
        // The desk's own counts, on the leader only.
        let desk = v["desk"].as_array().cloned().unwrap_or_default();
        let desk_ok = if leads {
            desk.len() == views.len()
                && desk
                    .iter()
                    .all(|m| m["live"] == json!(true) && m["reported"] == json!(true))
        } else {
            desk.is_empty()
        };
        if !desk_ok {
            return Err(format!("replica {i} (leader {leader})'s desk members: {desk:?}"));
        }
    }
    if slots > PROXIES.len() as u64 * CAPACITY || slots == 0 {
        return Err(format!("the replicas hold {slots} slots in all"));
    }
    if probing != PROXIES.len() as u64 {
        return Err(format!("{probing} probe assignments over the replicas"));
    }
    Ok(())
}

/// What replica `i`'s metrics must say, given its dashboard view.
async fn metrics_agree(bed: &ReplicaBed, i: usize, leads: bool, view: &Value) -> Result<(), String> {
    let metric = async |name: &str, labels: &str| {
        bed.metric(i, name, labels)
            .await
            .ok_or(format!("replica {i}: no {name}{labels}"))
    };
    let share = &view["share"];
    for (name, want) in [
        ("egress_proxies_share_slots", &share["slots"]),
        ("egress_proxies_share_slots_in_use", &share["inUse"]),
        ("egress_proxies_probes_assigned", &view["probing"]),
    ] {
        let got = metric(name, "").await?;
        if Some(got) != want.as_f64() {
            return Err(format!("replica {i}: {name} {got}, the dashboard {want}"));
        }
    }
    let left = metric("egress_proxies_share_seconds_left", "").await?;
    if left <= 0.0 {
        return Err(format!("replica {i}: share_seconds_left {left}"));
    }
    let age = metric("egress_proxies_replica_sync_age_seconds", "").await?;
    if age >= LEASE_DURATION.as_secs_f64() {
        return Err(format!("replica {i}: replica_sync_age_seconds {age}"));
    }
    let conflicts = metric("egress_proxies_share_conflicts_total", "").await?;
    if conflicts != 0.0 {
        return Err(format!("replica {i}: share_conflicts_total {conflicts}"));
    }
    if leads {
        let live = metric("egress_proxies_share_members", r#"{state="live"}"#).await?;
        if live != bed.len() as f64 {
            return Err(format!("the leader's share desk counts {live} live members"));
        }
    }
    Ok(())
}

#[actix_rt::test]
async fn each_replica_shows_its_share_and_its_view_of_the_replicas() {
    let bed = serving_bed(3).start().await;
    let target = support::process::health_target();
    for name in PROXIES {
        bed.apply_proxy(
            name,
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
        )
        .await;
    }
    bed.wait_phase(&PROXIES, "Ready").await;
    // Each ready once it holds a share.
    support::crawlers::wait_every_replica_ready(&bed).await;
    let leader = bed.wait_leader().await;
    // A lease held through each replica's own API, where its share has a
    // slot (the rendezvous ranking may leave a replica none): its slots in use.
    let http = reqwest::Client::new();
    let mut held = Vec::new();
    for i in 0..bed.len() {
        let url = format!("http://{}/v1/leases", bed.addrs(i).discovery);
        for _ in 0..10 {
            let answer = http
                .post(&url)
                .json(&json!({"target": format!("view-{i}.test"), "ttlSeconds": 120}))
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap_or_default();
            if status == 201 || status == 200 {
                assert!(body["id"].is_string(), "{body}");
                held.push(i);
                break;
            }
            assert_eq!(body["error"], "no_capacity", "replica {i}: {status} {body}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    assert!(!held.is_empty(), "no replica granted a lease");
    let views = support::eventually_explained(
        "every replica's view settled and consistent with the others'",
        WAIT,
        || bed.logs(),
        async || {
            let views = views_of(&bed).await?;
            settled(&bed, leader, &held, &views).map(|()| views)
        },
    )
    .await;
    eprintln!("the leader's view: {}", views[leader]);
    // The page draws the same: the leader's and a follower's, in a real browser.
    if browser::available() {
        let browser = Browser::start().await;
        let follower = (leader + 1) % bed.len();
        for i in [follower, leader] {
            the_page_shows_the_view(&browser.driver, &bed, i, leader).await;
        }
        // The leader's page, kept as a test artifact.
        let png = browser
            .driver
            .call(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .unwrap();
        let artifact = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-replicas.png");
        std::fs::write(&artifact, &bytes).unwrap();
        eprintln!("screenshot: {}", artifact.display());
    }
    support::eventually_explained(
        "every replica's metrics agree with its dashboard",
        WAIT,
        || bed.logs(),
        async || {
            let views = views_of(&bed).await?;
            settled(&bed, leader, &held, &views)?;
            for (i, view) in views.iter().enumerate() {
                metrics_agree(&bed, i, i == leader, view).await?;
            }
            Ok::<(), String>(())
        },
    )
    .await;
}

/// The Replicas section as replica `i`'s page shows it, in a real browser,
/// against its `GET /v1/dashboard` at the same moment.
async fn the_page_shows_the_view(driver: &Driver, bed: &ReplicaBed, i: usize, leader: usize) {
    driver
        .open(&format!("http://{}/dashboard", bed.addrs(i).discovery))
        .await;
    let page = "const kpi = k => document.querySelector(`#replica-kpis [data-kpi=\"${k}\"] .big`)?.textContent;\
        return {rows: [...document.querySelectorAll('#replica-members tbody tr[data-member]')]\
          .map(r => [r.dataset.member, r.querySelector('[data-key=slots]').textContent, r.textContent.includes('this replica')])\
          .sort(), share: kpi('share'), known: kpi('known'), ready: kpi('ready'), probing: kpi('probing'),\
          slots: kpi('slots'), inUse: kpi('inUse'),\
          me: document.getElementById('replica-me').textContent,\
          sync: document.getElementById('replica-sync').textContent}";
    support::eventually_explained(
        &format!("replica {i}'s page showing its view"),
        WAIT,
        || bed.logs(),
        async || {
            let shown = driver.script(page).await;
            let view = bed.dashboard(i).await.ok_or("no dashboard")?["replicas"].clone();
            let mut rows: Vec<Value> = view["members"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|m| json!([m["tag"], m["slots"].to_string(), m["tag"] == view["member"]]))
                .collect();
            rows.sort_by_key(|v| v.to_string());
            let want = json!({
                "rows": rows,
                "share": "valid",
                "known": PROXIES.len().to_string(),
                "ready": PROXIES.len().to_string(),
                "probing": view["probing"].to_string(),
                "slots": view["share"]["slots"].to_string(),
                "inUse": view["share"]["inUse"].to_string(),
            });
            let me = shown["me"].as_str().unwrap_or_default();
            let names_itself = me.contains(view["member"].as_str().unwrap_or("?"))
                && me.contains("(leader)") == (i == leader);
            let names_leader = shown["sync"]
                .as_str()
                .is_some_and(|t| t.contains(&bed.addrs(leader).internal.to_string()));
            let mut figures = shown.clone();
            if let Some(o) = figures.as_object_mut() {
                o.remove("me");
                o.remove("sync");
            }
            (figures == want && names_itself && names_leader)
                .then_some(())
                .ok_or(format!("the page shows {shown}; the JSON says {want}"))
        },
    )
    .await;
}

#[actix_rt::test]
async fn when_only_the_leader_serves_the_dashboard_has_no_replicas_section() {
    let bed = ReplicaBed::start_leader_only(1, &[]).await;
    bed.wait_leader().await;
    let dashboard = support::eventually_explained(
        "the leader's dashboard",
        WAIT,
        || bed.logs(),
        async || bed.dashboard(0).await.ok_or("no dashboard yet".to_owned()),
    )
    .await;
    assert!(
        dashboard.as_object().is_some_and(|d| d.contains_key("replicas")) && dashboard["replicas"].is_null(),
        "replicas is null with --every-replica-serves=false: {dashboard}"
    );
    assert_eq!(
        bed.metric(0, "egress_proxies_share_seconds_left", "").await,
        Some(0.0),
        "no share with --every-replica-serves=false"
    );
}
