//! The Python client (`clients/python`) against the real operator binary:
//! its pytest suite — a real Scrapy crawl through leased proxies that a
//! loopback site tells apart by their outgoing addresses, the asyncio
//! client under concurrency, retries, the requests and httpx helpers, the
//! models against the served OpenAPI document — run with the virtual
//! environment `tests/python-clients-setup.sh` makes (`tests/run.sh` runs
//! it). Afterwards no process the suite started is left.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::process::{Killed, Reaper};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
/// The whole suite stops (and fails) after this.
const DEADLINE: Duration = Duration::from_secs(300);

fn python() -> Option<PathBuf> {
    let path = std::env::var_os("EPO_CLIENTS_PYTHON").map_or_else(
        || PathBuf::from("/var/cache/egress-proxies-operator/venv-clients/bin/python"),
        PathBuf::from,
    );
    path.exists().then_some(path)
}

fn package() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../clients/python"))
        .canonicalize()
        .unwrap()
}

#[tokio::test]
async fn the_python_client_suite_passes_against_the_real_operator() {
    let Some(python) = python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the Python client's test dependencies (tests/python-clients-setup.sh)"
        );
        eprintln!("SKIP: the Python client's venv is missing; run tests/python-clients-setup.sh");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    let operator_root = root_path.join("operator");
    // Should the suite die before its own clean-up, the local proxies still go.
    let _reaper = Reaper(operator_root.join("state"));
    let child = Command::new(&python)
        .current_dir(package())
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .arg(format!("--basetemp={}", root_path.join("pytest").display()))
        .env("EPO_OPERATOR_BIN", BIN)
        .env("EPO_TEST_ROOT", &operator_root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = support::process::finish_within(Killed(child), "the Python client suite", DEADLINE).await;
    let (status, stdout, stderr) = (done.status, done.stdout, done.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        status.success(),
        "the Python client suite failed ({status}) after {:?}:\n{stdout}\n{stderr}",
        done.took
    );
    assert!(
        stdout.contains(" passed") && !stdout.contains(" skipped"),
        "every test ran:\n{stdout}"
    );
    let left = support::process::processes_under(&root_path);
    assert!(
        left.is_empty(),
        "processes the suite started are still running: {left:#?}"
    );
}
