//! Real headless Chromium driven over WebDriver (chromedriver), for the
//! dashboard's tests: a minimal W3C WebDriver client and a browser whose
//! every process is reaped by its profile directory when it is dropped.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::eventually;
use super::process::{Killed, Reaper, free_port};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether chromedriver is installed; when it is not, a test says SKIPPED
/// (and fails in CI, which must install it).
pub fn available() -> bool {
    if Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install chromium and chromium-driver"
    );
    eprintln!("SKIPPED: no {CHROMEDRIVER} (tests/system-packages.sh test installs it)");
    false
}

/// A minimal W3C WebDriver client (the calls the dashboard's tests need).
pub struct Driver {
    http: reqwest::Client,
    base: String,
    session: String,
}

impl Driver {
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let post = method == reqwest::Method::POST;
        let mut request = self.http.request(method, url);
        if post {
            request = request.json(&body);
        }
        let r = request.send().await.unwrap();
        let v: Value = r.json().await.unwrap();
        assert!(v["value"].get("error").is_none(), "webdriver {path}: {v}");
        v["value"].clone()
    }

    pub async fn script(&self, js: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": js, "args": []}),
        )
        .await
    }

    /// Opens `url` in the session's window.
    pub async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }
}

/// Waits (30 s at most) until `js` returns what `ok` accepts; returns it.
pub async fn wait_js(driver: &Driver, what: &str, js: &str, ok: impl Fn(&Value) -> bool) -> Value {
    eventually(what, Duration::from_secs(30), async || {
        let v = driver.script(js).await;
        if ok(&v) { Ok(v) } else { Err(v) }
    })
    .await
}

/// Headless Chromium with one WebDriver session.
pub struct Browser {
    pub driver: Driver,
    // Dropped in this order: chromedriver, then every process left under
    // the profile, then the profile.
    _chromedriver: Killed,
    _processes: Reaper,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Self {
        // Every process of it is reaped by its profile directory
        // (chromedriver runs in it, the browser names it).
        let profile = tempfile::tempdir().unwrap();
        let processes = Reaper(profile.path().to_owned());
        let port = free_port();
        let chromedriver = Killed(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .current_dir(profile.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        eventually("chromedriver to start", Duration::from_secs(20), async || {
            http.get(format!("{base}/status")).send().await
        })
        .await;
        let created: Value = http
            .post(format!("{base}/session"))
            .json(
                &json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage", "--window-size=1400,1100",
                         format!("--user-data-dir={}", profile.path().display())]}}}}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{created}"))
            .to_owned();
        Self {
            driver: Driver { http, base, session },
            _chromedriver: chromedriver,
            _processes: processes,
            _profile: profile,
        }
    }
}
