//! The discovery API against its own OpenAPI document, fuzzed by
//! Schemathesis (installed by `tests/openapi-fuzz-setup.sh`, which
//! `tests/run.sh` runs): the real server on loopback with a token and a
//! fleet of Ready proxies; every check on (no 5xx but the documented 503,
//! schema-valid requests accepted, schema-invalid ones refused with a 4xx,
//! every response matching its schema, 405 with `Allow` for other methods,
//! 401 without the token), then the server's bookkeeping is still bounded.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::lease_store::LeaseStore;
use egress_proxies::domain::lease::{Availability, LeaseSettings};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies_operator::discovery;
use egress_proxies_operator::lease_store_actor::{GetLeaseFootprint, LeaseStoreActor, UpdateAvailability};
use support::process::Killed;

const TOKEN: &str = "fuzz-token-0123456789";
/// The whole run stops (and fails) after this.
const DEADLINE: Duration = Duration::from_secs(300);

fn schemathesis() -> Option<PathBuf> {
    let path = std::env::var_os("EPO_SCHEMATHESIS").map_or_else(
        || PathBuf::from("/var/cache/egress-proxies-operator/venv/bin/schemathesis"),
        PathBuf::from,
    );
    path.exists().then_some(path)
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[actix_rt::test]
async fn schemathesis_finds_nothing() {
    let Some(st) = schemathesis() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install Schemathesis (tests/openapi-fuzz-setup.sh)"
        );
        eprintln!("SKIP: Schemathesis is not installed; run tests/openapi-fuzz-setup.sh");
        return;
    };
    let store = LeaseStoreActor::new(LeaseStore::new(LeaseSettings {
        capacity: 0,
        cooldown: Duration::from_secs(1),
        ..LeaseSettings::default()
    }))
    .start();
    for i in 0..8 {
        store.do_send(UpdateAvailability(Availability {
            key: ObjectKey::new("crawl", format!("p{i}")),
            ready: true,
            phase: "Ready".into(),
            healthy: Some(true),
            url: Some(format!("http://127.0.0.1:{}", 41000 + i)),
            attributes: BTreeMap::from([("geo".to_owned(), ["eu", "us"][i % 2].to_owned())]),
            latency: Some(Duration::from_millis(5 + i as u64)),
            credentials: None,
            realm: None,
            retiring: false,
        }));
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    actix::spawn(
        discovery::start(
            listener,
            store.clone(),
            discovery::Tokens::crawler(Some(TOKEN.to_owned())),
        )
        .unwrap(),
    );

    let seed = std::env::var("EPO_FUZZ_SEED").unwrap_or_else(|_| "20261130".to_owned());
    let examples = std::env::var("EPO_FUZZ_EXAMPLES").unwrap_or_else(|_| "300".to_owned());
    let out = tempfile::tempdir().unwrap();
    // In a fresh directory: Schemathesis keeps an example database in its
    // working directory, which would leave files in the repository.
    let child = Command::new(&st)
        .current_dir(out.path())
        .arg("--no-color")
        .arg(format!(
            "--config-file={}",
            repo().join("tests/openapi-fuzz/schemathesis.toml").display()
        ))
        .arg("run")
        .arg(format!("http://{addr}/v1/openapi.json"))
        .args([
            "--checks",
            "all",
            "--workers",
            "1",
            "--max-examples",
            &examples,
            "--seed",
            &seed,
        ])
        .args(["--suppress-health-check", "all", "--request-timeout", "10"])
        .arg(format!("--header=Authorization: Bearer {TOKEN}"))
        .arg(format!("--report-dir={}", out.path().display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = support::process::finish_within(Killed(child), "Schemathesis", DEADLINE).await;
    let (status, stdout, stderr) = (done.status, done.stdout, done.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        status.success(),
        "Schemathesis found problems ({status}) after {:?}:\n{stdout}\n{stderr}",
        done.took
    );
    let summary = stdout
        .lines()
        .find(|l| l.contains("generated"))
        .unwrap_or("no summary line");
    eprintln!("fuzzed for {:?}: {summary}", done.took);

    let size = store.send(GetLeaseFootprint).await.unwrap();
    assert!(
        size.recent_reports <= 256 && size.detail_bytes <= 256 * 4096,
        "{size:?}"
    );
}
