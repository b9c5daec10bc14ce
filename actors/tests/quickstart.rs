//! The README's quickstart, as shipped, the way new users run it: from a
//! private directory (mode 0700, like a home directory), with Squid
//! installed — once as the user running the tests (root in CI, where Squid
//! drops to its own user) and once as a regular user. Both Managed proxies
//! reach Ready offline, a crawler leases one and fetches through it (and
//! through the gateway, which leases for it), and
//! deleting the manifests leaves no process and no file behind.

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use egress_proxies::domain::credentials::ProxyCredentials;
use egress_proxies::domain::resource::{Phase, Proxy};
use nix::unistd::User;
use support::operator::{BIN, OperatorDir, OperatorProcess};
use support::process::free_port;

const CONVERGE: Duration = Duration::from_secs(40);

struct Quickstart {
    /// The private directory holding the configuration and the state.
    dir: OperatorDir,
    config: PathBuf,
    /// The operator's own /healthz (the samples probe it through each proxy).
    own: String,
    api: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
    /// The gateway (open: the quickstart sets no token, and it is on loopback).
    gateway: std::net::SocketAddr,
    /// Who runs the operator; `None`: whoever runs the tests.
    user: Option<User>,
}

impl Quickstart {
    fn new(user: Option<User>) -> Self {
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/standalone");
        let dir = OperatorDir::new(&std::fs::read_to_string(format!("{shipped}/providers.yaml")).unwrap());
        let root = dir.path();
        for file in ["proxies/local.yaml", "proxies/external.yaml"] {
            std::fs::copy(format!("{shipped}/{file}"), root.join(file)).unwrap();
        }
        // The same files on other ports (tests run side by side).
        let own = format!("127.0.0.1:{}", free_port());
        let api: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let gateway: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        for file in ["proxies/local.yaml", "proxies/external.yaml"] {
            let path = root.join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.contains("url: http://127.0.0.1:8081/healthz"), "{file}");
            std::fs::write(&path, text.replace("127.0.0.1:8081", &own)).unwrap();
        }
        let quickstart = std::fs::read_to_string(format!("{shipped}/quickstart.yaml")).unwrap();
        for shipped_addr in [
            "127.0.0.1:8081",
            "127.0.0.1:8090",
            "127.0.0.1:8082",
            "127.0.0.1:8888",
        ] {
            assert!(quickstart.contains(shipped_addr), "{shipped_addr}");
        }
        let quickstart = quickstart
            .replace("127.0.0.1:8081", &own)
            .replace("127.0.0.1:8090", &api.to_string())
            .replace("127.0.0.1:8082", &metrics.to_string())
            .replace("127.0.0.1:8888", &gateway.to_string());
        let config = root.join("quickstart.yaml");
        std::fs::write(&config, quickstart).unwrap();
        std::fs::write(root.join("operator.log"), "").unwrap();
        if let Some(user) = &user {
            chown_tree(root, user);
        }
        // Private, like a home directory: nobody else may even look inside.
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
        Self {
            config,
            own,
            api,
            metrics,
            gateway,
            user,
            dir,
        }
    }

    async fn start(&self) -> OperatorProcess {
        let mut operator = self
            .dir
            .standalone()
            .config("quickstart.yaml")
            .health_at(self.own.parse().unwrap())
            .discovery_at(self.api)
            .metrics_at(self.metrics);
        if let Some(user) = &self.user {
            operator = operator.run_as(user);
        }
        operator.start().await
    }

    fn proxies(&self) -> BTreeMap<String, Proxy> {
        self.dir
            .proxies()
            .into_iter()
            .map(|p| (p.metadata.name.clone().unwrap(), p))
            .collect()
    }

    fn instances_dir(&self) -> PathBuf {
        self.dir.state().join("local/local/instances")
    }

    /// Every instance record, by instance directory.
    fn records(&self) -> Vec<(PathBuf, serde_json::Value)> {
        let Ok(entries) = std::fs::read_dir(self.instances_dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let record =
                    serde_json::from_slice(&std::fs::read(e.path().join("instance.json")).ok()?).ok()?;
                Some((e.path(), record))
            })
            .collect()
    }

    fn operator_log(&self) -> String {
        self.dir.logs()
    }

    fn get(&self, output: &str) -> String {
        let mut cmd = Command::new(BIN);
        cmd.args(["get", "proxies", "-o", output, "--config"])
            .arg(&self.config);
        if let Some(user) = &self.user {
            cmd.uid_gid(user);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// An absolute-URI GET through `proxy`, presenting `authorization` (a
/// `Proxy-Authorization` value) when given; the response head and body.
async fn get_through(proxy: std::net::SocketAddr, url: &str, authorization: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let auth = authorization
        .map(|a| format!("Proxy-Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    answer
}

fn chown_tree(path: &Path, user: &User) {
    nix::unistd::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            chown_tree(&entry.path(), user);
        }
    }
}

fn squid_installed() -> bool {
    let found = support::squid::binary().is_some();
    assert!(
        found || std::env::var_os("CI").is_none(),
        "CI must have Squid installed (tests/system-packages.sh)"
    );
    found
}

async fn run_quickstart(qs: Quickstart) {
    let squid = squid_installed();
    // The External sample points at 127.0.0.1:3128: Ready only if a Squid runs there.
    let external_expected = if std::net::TcpStream::connect("127.0.0.1:3128").is_ok() {
        Phase::Ready
    } else {
        Phase::Unhealthy
    };
    let operator = qs.start().await;
    let want: BTreeMap<String, Option<Phase>> = [
        ("local-1".to_owned(), Some(Phase::Ready)),
        ("local-2".to_owned(), Some(Phase::Ready)),
        ("my-squid".to_owned(), Some(external_expected)),
    ]
    .into();
    operator
        .eventually("the quickstart's phases", CONVERGE, async || {
            let phases: BTreeMap<String, Option<Phase>> = qs
                .proxies()
                .into_iter()
                .map(|(n, p)| (n, p.status.and_then(|s| s.phase)))
                .collect();
            if phases == want {
                Ok(())
            } else {
                Err(format!("{phases:?}\n{}", qs.get("wide")))
            }
        })
        .await;
    let records = qs.records();
    assert_eq!(records.len(), 2);
    let implementation = if squid { "squid" } else { "builtin" };
    let mut pids = Vec::new();
    let mut run_dirs = Vec::new();
    for (dir, record) in &records {
        assert_eq!(record["implementation"], implementation, "{record}");
        pids.push(support::process::instance_pid(dir).expect("each instance's recorded process runs"));
        if let Some(run_dir) = record["runDir"].as_str() {
            run_dirs.push(PathBuf::from(run_dir));
        }
    }
    let root_squid = squid && qs.user.is_none() && nix::unistd::geteuid().is_root();
    assert_eq!(
        run_dirs.len(),
        if root_squid { 2 } else { 0 },
        "Squid started by root runs outside the private directory: {records:?}"
    );

    let table = qs.get("wide");
    let row = "local-1    Managed    local      Ready       127.0.0.1   true";
    assert!(table.contains(row), "missing {row:?} in\n{table}");
    assert!(table.lines().next().unwrap().ends_with("MESSAGE"), "{table}");
    let listed: serde_json::Value = serde_json::from_str(&qs.get("json")).unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 3, "{listed}");

    // A crawler's cycle: take a lease, fetch through the leased proxy, release.
    let ask = r#"{"target":"127.0.0.1","selector":{"purpose":"quickstart"},"ttlSeconds":60}"#;
    let (status, text) = support::http::request(qs.api, "POST", "/v1/leases", &[], Some(ask)).await;
    assert_eq!(status, 201, "{text}");
    let lease: serde_json::Value = serde_json::from_str(&text).unwrap();
    let leased = url::Url::parse(lease["proxy"]["url"].as_str().unwrap()).unwrap();
    let (username, password) = (
        lease["proxy"]["username"].as_str().unwrap(),
        lease["proxy"]["password"].as_str().unwrap(),
    );
    assert_eq!((leased.username(), leased.password()), (username, Some(password)));
    let proxy = std::net::SocketAddr::new(
        leased.host_str().unwrap().parse().unwrap(),
        leased.port().unwrap(),
    );
    let own: std::net::SocketAddr = qs.own.parse().unwrap();
    let healthz = format!("http://{own}/healthz");
    let answer = get_through(proxy, &healthz, None).await;
    assert!(
        answer.starts_with("HTTP/1.1 407") && answer.contains("Proxy-Authenticate: Basic realm="),
        "without credentials: {answer}"
    );
    let credentials = ProxyCredentials::new(username, password).unwrap();
    let answer = get_through(proxy, &healthz, Some(&credentials.basic_authorization())).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "through the leased proxy: {answer}"
    );
    // The same fetch through the gateway: it leases the other proxy itself.
    let answer = get_through(qs.gateway, &healthz, None).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "through the gateway: {answer}"
    );
    // The password is handed out by leases only.
    let (_, listing) = support::http::request(qs.api, "GET", "/v1/proxies", &[], None).await;
    let (_, dashboard) = support::http::request(qs.api, "GET", "/v1/dashboard", &[], None).await;
    assert!(
        dashboard.contains("local-1"),
        "the dashboard lists the leased proxy: {dashboard}"
    );
    let (status, metrics) = support::http::request(qs.metrics, "GET", "/metrics", &[], None).await;
    assert_eq!(status, 200, "{metrics}");
    for (place, text) in [
        ("GET /v1/proxies", listing),
        ("the dashboard", dashboard),
        ("the metrics", metrics),
        ("the operator's log", qs.operator_log()),
        ("get proxies -o yaml", qs.get("yaml")),
        ("get proxies -o wide", qs.get("wide")),
    ] {
        assert!(!text.contains(password), "the password shows in {place}:\n{text}");
    }
    let id = lease["id"].as_str().unwrap();
    let (status, _) = support::http::request(qs.api, "DELETE", &format!("/v1/leases/{id}"), &[], None).await;
    assert_eq!(status, 204);
    drop(operator);

    // Deleting the manifests deletes the proxies: no process, no file left.
    for file in ["local.yaml", "external.yaml"] {
        std::fs::remove_file(qs.dir.path().join("proxies").join(file)).unwrap();
    }
    let operator = qs.start().await;
    operator
        .eventually("the proxies deleted", CONVERGE, async || {
            if qs.proxies().is_empty() && qs.records().is_empty() {
                Ok(())
            } else {
                Err(format!("{:?}", qs.proxies().keys()))
            }
        })
        .await;
    drop(operator);
    for pid in pids {
        let (gone, stat) = support::process::is_gone(pid);
        assert!(gone, "proxy process {pid} outlived its Proxy: {stat}");
    }
    for dir in run_dirs {
        assert!(!dir.exists(), "{} outlived its Proxy", dir.display());
    }
}

#[tokio::test]
async fn the_quickstart_reaches_ready_from_a_private_directory() {
    run_quickstart(Quickstart::new(None)).await;
}

#[tokio::test]
async fn the_quickstart_reaches_ready_as_a_regular_user() {
    if !nix::unistd::geteuid().is_root() {
        // The test above already ran as a regular user.
        run_quickstart(Quickstart::new(None)).await;
        return;
    }
    let user = User::from_name("nobody")
        .unwrap()
        .expect("the nobody user exists");
    // The operator binary must be reachable by that user (CI builds under /var/cache).
    let reachable = Command::new("/bin/sh")
        .args(["-c", r#"test -x "$1""#, "sh", BIN])
        .uid_gid(&user)
        .status()
        .unwrap()
        .success();
    if !reachable {
        eprintln!("{BIN} is not executable by nobody (a private CARGO_TARGET_DIR?); skipping");
        assert!(
            std::env::var_os("CI").is_none(),
            "CI builds where every user can run the binary"
        );
        return;
    }
    run_quickstart(Quickstart::new(Some(user))).await;
}

trait AsUser {
    fn uid_gid(&mut self, user: &User) -> &mut Self;
}

impl AsUser for Command {
    fn uid_gid(&mut self, user: &User) -> &mut Self {
        use std::os::unix::process::CommandExt;
        self.uid(user.uid.as_raw()).gid(user.gid.as_raw())
    }
}
