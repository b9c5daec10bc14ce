//! An instance that always exits at start, run by the real operator binary
//! in standalone mode: it is replaced with growing delays (not in a hot
//! loop), the Proxy says why and until when, the metric counts each
//! replacement, and a spec change starts afresh.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use egress_proxies::resource::{Phase, Proxy};
use egress_proxies::store::embedded::read_snapshot;
use support::process::{InstanceReaper, free_port, health_target, standalone};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
/// How long the crash loop is watched.
const WATCH: Duration = Duration::from_secs(60);

/// A "Squid" that passes `squid -k parse`, then fails at start like a
/// misconfigured one — until `healed` exists, when it runs the real Squid.
fn crashing_squid(dir: &Path) -> PathBuf {
    let script = dir.join("crashing-squid");
    let starts = dir.join("starts");
    let healed = dir.join("healed");
    let real = support::squid::binary()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             case \" $* \" in *' -k parse '*) exit 0 ;; esac\n\
             if [ -e {healed} ] && [ -n '{real}' ]; then exec '{real}' \"$@\"; fi\n\
             echo start >> {starts}\n\
             echo 'FATAL: the test proxy always exits at start' >&2\n\
             exit 3\n",
            healed = healed.display(),
            starts = starts.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn proxy(dir: &Path) -> Option<Proxy> {
    let state = dir.join("state");
    if !state.join("state.db").exists() {
        return None;
    }
    read_snapshot(&state).unwrap().into_iter().next()
}

/// Waits until the Proxy has counted `count` losses in a row.
async fn eventually_replacement(dir: &Path, count: u32) -> egress_proxies::resource::ReplacementStatus {
    support::eventually(
        "the next loss to be counted",
        Duration::from_secs(20),
        async || proxy(dir)?.status?.replacement.filter(|r| r.count >= count),
    )
    .await
}

fn starts(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("starts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn write_manifest(dir: &Path, port: u16, health: &str) {
    std::fs::write(
        dir.join("proxies/crashing.yaml"),
        format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: crashing, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, port: {port}, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    )
    .unwrap();
}

#[tokio::test]
async fn an_always_exiting_instance_is_replaced_with_growing_delays_and_a_reason() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let _reaper = InstanceReaper(dir.join("state"));
    let script = crashing_squid(dir);
    std::fs::create_dir(dir.join("proxies")).unwrap();
    std::fs::write(
        dir.join("providers.yaml"),
        format!(
            "providers:\n  - {{name: local, type: local, local: {{implementation: squid, squidBinary: {}, destinations: {{allow: [127.0.0.0/8]}}}}}}\n",
            script.display()
        ),
    )
    .unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        dir.join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\ndiscoveryBindAddress: \"0\"\nmetricsBindAddress: {metrics}\n\
             manifestPollInterval: 100ms\n"
        ),
    )
    .unwrap();
    let health = health_target();
    write_manifest(dir, 3128, &health);
    let operator = standalone(BIN, dir);
    let operator_log = || std::fs::read_to_string(dir.join("operator.log")).unwrap_or_default();

    // Watch the crash loop for a minute: it must back off, and say so.
    let started = Instant::now();
    let mut saw_backoff = None;
    while started.elapsed() < WATCH {
        if let Some(status) = proxy(dir).and_then(|p| p.status)
            && status.phase == Some(Phase::BackOff)
        {
            saw_backoff.get_or_insert(status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let n = starts(dir);
    // First create, one immediate replacement, then 10 s, 20 s, 40 s apart:
    // four starts in a minute (a hot loop made dozens).
    assert!(
        (3..=5).contains(&n),
        "{n} starts in {WATCH:?}: the replacement backoff must bound them\n{}",
        operator_log()
    );
    let status = saw_backoff.unwrap_or_else(|| panic!("never in phase BackOff\n{}", operator_log()));
    let message = status.message.clone().unwrap_or_default();
    for part in [
        "instance stopped: the proxy process exited with status 3",
        "FATAL: the test proxy always exits at start",
        "backing off",
    ] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
    let replacement = status.replacement.expect("status.replacement during the backoff");
    assert!(replacement.count >= 2, "{replacement:?}");
    assert!(replacement.retry_at.0 > replacement.lost_at.0, "{replacement:?}");
    let current = proxy(dir).unwrap().status.unwrap();
    assert_eq!(
        current.replacement.as_ref().map(|r| r.count),
        Some(u32::try_from(n).unwrap()),
        "one loss counted per start: {current:?}"
    );

    // Each loss is logged with its reason and counted once.
    let log_text = operator_log();
    assert!(
        log_text.contains("instance lost; replacing it") && log_text.contains("exited with status 3"),
        "{log_text}"
    );
    let (status_code, scrape) =
        support::http::request(metrics.parse().unwrap(), "GET", "/metrics", &[], None).await;
    assert_eq!(status_code, 200);
    let counted =
        format!("egress_proxies_instance_replacements_total{{provider=\"local\",reason=\"stopped\"}} {n}");
    assert!(scrape.contains(&counted), "missing {counted:?} in\n{scrape}");

    // Killed and restarted mid-backoff: the wait is kept (it is in the
    // status), not restarted from zero, and no loss is counted twice.
    drop(operator);
    let waiting = proxy(dir).unwrap().status.unwrap().replacement.unwrap();
    let operator = standalone(BIN, dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    while starts(dir) == n {
        assert!(
            Instant::now() < deadline,
            "no start after the restart\n{}",
            operator_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let restarted_at = jiff::Timestamp::now();
    assert!(
        restarted_at >= waiting.retry_at.0,
        "the restarted operator created at {restarted_at}, before the backoff's {}",
        waiting.retry_at.0
    );
    let after = eventually_replacement(dir, waiting.count + 1).await;
    assert_eq!(after.count, waiting.count + 1, "{after:?}");

    // Fixed and re-specified: the backoff no longer applies, the proxy comes up at once.
    if support::squid::binary().is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI has Squid");
        return;
    }
    std::fs::write(dir.join("healed"), "").unwrap();
    let changed = Instant::now();
    write_manifest(dir, 3129, &health);
    loop {
        let status = proxy(dir).and_then(|p| p.status).unwrap_or_default();
        if status.phase == Some(Phase::Ready) {
            assert_eq!(status.replacement, None, "a new spec starts afresh");
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(20),
            "not Ready after the fix: {status:?}\n{}",
            operator_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(operator);

    // The manifest goes, and with it the healed instance.
    std::fs::remove_file(dir.join("proxies/crashing.yaml")).unwrap();
    let _operator = standalone(BIN, dir);
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy(dir).is_some() {
        assert!(Instant::now() < deadline, "not deleted\n{}", operator_log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
