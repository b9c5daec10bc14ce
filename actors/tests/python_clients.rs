//! The Python client (`clients/python`) against the real operator binary:
//! its pytest suite — a real Scrapy crawl through leased proxies that a
//! loopback site tells apart by their outgoing addresses, the asyncio
//! client under concurrency, retries, the requests and httpx helpers, the
//! models against the served OpenAPI document — run with the virtual
//! environment `tests/python-clients-setup.sh` makes (`tests/run.sh` runs
//! it). Afterwards no process the suite started is left.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn the_python_client_suite_passes_against_the_real_operator() {
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
    let mut child = Killed(child);
    let started = Instant::now();
    // Read output on threads so a full pipe cannot stall the suite.
    let mut stdout = child.0.stdout.take().unwrap();
    let mut stderr = child.0.stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the Python client suite still running after {DEADLINE:?}; killed"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let (stdout, stderr) = (out_thread.join().unwrap(), err_thread.join().unwrap());
    println!("{stdout}\n{stderr}");
    assert!(
        status.success(),
        "the Python client suite failed ({status}) after {:?}:\n{stdout}\n{stderr}",
        started.elapsed()
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
