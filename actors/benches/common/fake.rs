//! The project's fake API server as a process of its own, for benchmarks
//! that must not share the operator's process with it.
//!
//! The binary: `EPO_FAKE_APISERVER` if set, else built here with `cargo
//! build --release -p fake-apiserver --bin fake-apiserver` and its path
//! read from cargo's JSON messages (so `CARGO_TARGET_DIR` and the
//! workspace's settings hold). `CARGO_BIN_EXE_*` names only the bench's own
//! package's binaries, and the fake is another package.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Kill;

/// The fake-apiserver binary: `EPO_FAKE_APISERVER`, else built now.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("EPO_FAKE_APISERVER") {
        return path.into();
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "fake-apiserver",
            "--bin",
            "fake-apiserver",
        ])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "building fake-apiserver failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "fake-apiserver")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the fake-apiserver executable")
}

/// Starts the fake (`--cluster`, its kubeconfigs' namespace `namespace`)
/// and waits for the kubeconfig it writes once serving: `dir/kubeconfig`,
/// and with `links` > 0 one per link first, `dir/kubeconfig.link-<i>`,
/// each counting its own requests. Returns the process and the main
/// address (`http://…`).
pub async fn start(dir: &Path, namespace: &str, links: usize) -> (Kill, String) {
    let kubeconfig = dir.join("kubeconfig");
    let log = std::fs::File::create(dir.join("fake-apiserver.log")).unwrap();
    let mut command = Command::new(binary());
    command
        .args(["--listen", "127.0.0.1:0", "--cluster", "--namespace", namespace])
        .args(["--links", &links.to_string()])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig);
    let mut fake = Kill(
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let began = Instant::now();
    let text = loop {
        if let Ok(text) = std::fs::read_to_string(&kubeconfig) {
            break text;
        }
        if let Some(status) = fake.0.try_wait().unwrap() {
            panic!("fake-apiserver exited: {status}");
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "no kubeconfig within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    (fake, server_of(&text))
}

/// The `server:` a kubeconfig names.
pub fn server_of(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("the kubeconfig names its server")
        .to_owned()
}
