//! The gcp wire log at trace level, captured from the real client against
//! the fake: long fields elided unless full payloads, cloud-init redacted
//! always, no token or `Bearer` anywhere, setLabels shown with its labels. Its own test binary: a scoped
//! subscriber races other tests' threads for the log callsites' interest.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use egress_proxies::domain::provider_contract::{CloudInitBytes, Provider};
use fake_compute::FakeCompute;
use support::gcp::{key_file, provider, request};

/// Collects what the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

const SECRET_CLOUD_INIT: &str = "#cloud-config\nchpasswd: {list: 'root:S3CRET-PASSW0RD'}\n";
/// Longer than the 1 KiB elision threshold.
const IMAGE_LEN: usize = 1125;

async fn wire_log(full_payloads: bool) -> (String, Vec<String>) {
    let fake = FakeCompute::start("crawl-test").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gcp = provider(&fake, key_file(dir.path(), &fake), full_payloads);
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // Other tests' threads may have cached "no interest" for the wire-log
    // callsites before this scoped subscriber existed.
    tracing::callsite::rebuild_interest_cache();
    let mut req = request("3f0c0c5e-0000-4000-8000-000000000030");
    req.cloud_init = Some(CloudInitBytes(SECRET_CLOUD_INIT.as_bytes().to_vec()));
    req.placement.image = Some(format!("projects/p/global/images/{}", "x".repeat(IMAGE_LEN - 25)));
    let id = gcp.create(&req).await.unwrap();
    gcp.get(&id).await.unwrap();
    gcp.list_by_tag().await.unwrap();
    gcp.release(&id).await.unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (text, fake.state().issued.clone())
}

#[tokio::test]
async fn the_wire_log_elides_redacts_and_never_shows_a_token() {
    let (text, tokens) = wire_log(false).await;
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("egress_proxies::providers::gcp::wire")
                && (l.contains("gcp request") || l.contains("gcp response"))
        })
        .collect();
    assert_eq!(
        lines.len(),
        12,
        "request + response for insert, get, list, and release's get, setLabels and confirming get:\n{text}"
    );
    // Labels are not secret: setLabels shows what it sends.
    assert!(
        lines.iter().any(|l| l.contains("POST")
            && l.contains("/setLabels")
            && l.contains("labelFingerprint")
            && l.contains("egress-proxies-released")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("POST") && l.contains(&format!("<{IMAGE_LEN} bytes elided>"))),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "<cloud-init, {} bytes, redacted>",
            SECRET_CLOUD_INIT.len()
        )),
        "{text}"
    );
    let (full, full_tokens) = wire_log(true).await;
    assert!(full.contains(&"x".repeat(1100)), "full payloads show long fields");
    for (log, tokens) in [(&text, &tokens), (&full, &full_tokens)] {
        assert!(!tokens.is_empty());
        for token in tokens.iter() {
            assert!(!log.contains(token.as_str()), "a token leaked into the log");
        }
        assert!(!log.contains("S3CRET-PASSW0RD"), "cloud-init leaked into the log");
        assert!(!log.contains("Bearer"), "an authorization header leaked");
    }
}
