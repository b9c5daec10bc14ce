//! An instance that always exits at start, run by the real operator binary
//! in standalone mode: it is replaced with growing delays (not in a hot
//! loop), the Proxy says why and until when, the metric counts each
//! replacement, and a spec change starts afresh.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use egress_proxies::domain::resource::{Phase, Proxy};
use support::operator::{OperatorBuilder, OperatorDir};
use support::process::{free_port, health_target};
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

fn proxy(dir: &OperatorDir) -> Option<Proxy> {
    dir.proxy("crashing")
}

fn starts(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("starts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn write_manifest(dir: &OperatorDir, port: u16, health: &str) {
    dir.write_manifest(
        "crashing",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: crashing, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, port: {port}, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
}

#[tokio::test]
async fn an_always_exiting_instance_is_replaced_with_growing_delays_and_a_reason() {
    let dir = OperatorDir::new("providers: []\n");
    let script = crashing_squid(dir.path());
    dir.write(
        "providers.yaml",
        format!(
            "providers:\n  - {{name: local, type: local, local: {{implementation: squid, squidBinary: {}, destinations: {{allow: [127.0.0.0/8]}}}}}}\n",
            script.display()
        ),
    );
    let metrics = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let health = health_target();
    write_manifest(&dir, 3128, &health);
    // Every process on the same metrics address, as a restarted one would.
    let operator = || -> OperatorBuilder { dir.standalone().metrics_at(metrics) };
    let first = operator().start().await;
    let operator_log = || dir.logs();

    // Watch the crash loop for a minute — a fixed window, not a wait: it
    // must back off (few starts in it), and say so.
    let started = Instant::now();
    let mut saw_backoff = None;
    while started.elapsed() < WATCH {
        if let Some(status) = proxy(&dir).and_then(|p| p.status)
            && status.phase == Some(Phase::BackOff)
        {
            saw_backoff.get_or_insert(status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let n = starts(dir.path());
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
    let current = proxy(&dir).unwrap().status.unwrap();
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
    let (status_code, scrape) = support::http::request(metrics, "GET", "/metrics", &[], None).await;
    assert_eq!(status_code, 200);
    let counted =
        format!("egress_proxies_instance_replacements_total{{provider=\"local\",reason=\"stopped\"}} {n}");
    assert!(scrape.contains(&counted), "missing {counted:?} in\n{scrape}");

    // Killed and restarted mid-backoff: the wait is kept (it is in the
    // status), not restarted from zero, and no loss is counted twice.
    drop(first);
    let waiting = proxy(&dir).unwrap().status.unwrap().replacement.unwrap();
    let second = operator().start().await;
    second
        .eventually("a start after the restart", Duration::from_secs(60), async || {
            (starts(dir.path()) > n).then_some(())
        })
        .await;
    let restarted_at = jiff::Timestamp::now();
    assert!(
        restarted_at >= waiting.retry_at.0,
        "the restarted operator created at {restarted_at}, before the backoff's {}",
        waiting.retry_at.0
    );
    let after = second
        .eventually(
            "the next loss to be counted",
            Duration::from_secs(20),
            async || {
                proxy(&dir)?
                    .status?
                    .replacement
                    .filter(|r| r.count > waiting.count)
            },
        )
        .await;
    assert_eq!(after.count, waiting.count + 1, "{after:?}");

    // Fixed and re-specified: the backoff no longer applies, the proxy comes up at once.
    if support::squid::binary().is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI has Squid");
        return;
    }
    std::fs::write(dir.path().join("healed"), "").unwrap();
    write_manifest(&dir, 3129, &health);
    let status = second
        .eventually("Ready after the fix", Duration::from_secs(20), async || {
            let status = proxy(&dir).and_then(|p| p.status).unwrap_or_default();
            if status.phase == Some(Phase::Ready) {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await;
    assert_eq!(status.replacement, None, "a new spec starts afresh");
    drop(second);

    // The manifest goes, and with it the healed instance.
    dir.remove_manifest("crashing");
    let third = operator().start().await;
    third
        .eventually("the Proxy deleted", Duration::from_secs(20), async || {
            proxy(&dir).is_none().then_some(())
        })
        .await;
}
