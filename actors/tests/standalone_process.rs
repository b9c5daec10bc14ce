//! The real binary in standalone mode, SIGKILLed at many points of creates,
//! replacements and deletions: after each restart the fleet converges with
//! exactly one proxy process per Proxy and nothing left of deleted ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use egress_proxies::domain::resource::{Phase, Proxy, SPEC_HASH_ANNOTATION};

mod support;

use support::operator::{LOCAL_PROVIDER, OperatorDir, OperatorProcess};
use support::process::health_target;

const CONVERGE: Duration = Duration::from_secs(30);

struct Bed {
    /// Health-check target (loopback; probes never leave this machine).
    health_url: String,
    dir: OperatorDir,
}

impl Bed {
    fn new() -> Self {
        Self {
            health_url: health_target(),
            dir: OperatorDir::new(LOCAL_PROVIDER),
        }
    }

    fn write_proxy(&self, name: &str, port: u16) {
        let doc = format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, port: {port}, \
             healthCheck: {{url: \"{url}\", interval: 1s}}}}\n",
            url = self.health_url
        );
        self.dir.write_manifest(name, &doc);
    }

    fn remove_proxy(&self, name: &str) {
        self.dir.remove_manifest(name);
    }

    /// The operator, started without waiting: the tests kill it at any point.
    fn start(&self) -> OperatorProcess {
        self.dir.standalone().log_level("info").spawn()
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

    /// Instance name → owning UID, from the instance records.
    fn instances(&self) -> BTreeMap<String, String> {
        let Ok(entries) = std::fs::read_dir(self.instances_dir()) else {
            return BTreeMap::new();
        };
        entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let record: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(e.path().join("instance.json")).ok()?).ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    record["uid"].as_str()?.to_owned(),
                ))
            })
            .collect()
    }

    /// Live proxy processes of this bed, by the instance directory they serve.
    fn processes(&self) -> BTreeMap<String, usize> {
        let root = self
            .instances_dir()
            .canonicalize()
            .unwrap_or_else(|_| self.instances_dir());
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            if entry
                .file_name()
                .to_str()
                .is_none_or(|n| n.parse::<u32>().is_err())
            {
                continue;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')) {
                continue;
            }
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            for arg in cmdline.split(|b| *b == 0) {
                let arg = PathBuf::from(String::from_utf8_lossy(arg).into_owned());
                if let Ok(rest) = arg.strip_prefix(&root)
                    && let Some(first) = rest.components().next()
                {
                    *out.entry(first.as_os_str().to_string_lossy().into_owned())
                        .or_default() += 1;
                    break;
                }
            }
        }
        out
    }

    /// Everything settled: declared proxies Ready on one process each, nothing else.
    fn converged(&self, declared: &BTreeMap<&str, u16>) -> Result<(), String> {
        let proxies = self.proxies();
        let names: Vec<&str> = proxies.keys().map(String::as_str).collect();
        let wanted: Vec<&str> = declared.keys().copied().collect();
        if names != wanted {
            return Err(format!("stored proxies {names:?}, want {wanted:?}"));
        }
        let instances = self.instances();
        let processes = self.processes();
        for (name, proxy) in &proxies {
            let status = proxy.status.clone().unwrap_or_default();
            if status.phase != Some(Phase::Ready) {
                return Err(format!("{name} is {:?}", status.phase));
            }
            let hash_port = proxy.spec.port;
            if hash_port != declared[name.as_str()]
                || !proxy
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(SPEC_HASH_ANNOTATION))
            {
                return Err(format!("{name} not yet at its declared spec"));
            }
            let uid = proxy.metadata.uid.clone().unwrap();
            let owned: Vec<_> = instances
                .iter()
                .filter(|(_, u)| **u == uid)
                .map(|(n, _)| n.clone())
                .collect();
            if owned.len() != 1 {
                return Err(format!("{name} owns instances {owned:?}"));
            }
            if processes.get(&owned[0]).copied().unwrap_or(0) != 1 {
                return Err(format!(
                    "{name}: {:?} processes for {}",
                    processes.get(&owned[0]),
                    owned[0]
                ));
            }
        }
        if instances.len() != proxies.len() {
            return Err(format!("instances {instances:?} for {} proxies", proxies.len()));
        }
        if processes.keys().any(|dir| !instances.contains_key(dir)) || processes.values().any(|n| *n != 1) {
            return Err(format!("processes {processes:?} vs instances {instances:?}"));
        }
        Ok(())
    }

    /// Invariant at any instant: never two processes for one instance.
    fn assert_never_doubled(&self) {
        let processes = self.processes();
        assert!(
            processes.values().all(|n| *n <= 1),
            "duplicate processes: {processes:?}"
        );
    }
}

async fn converge(bed: &Bed, declared: &BTreeMap<&str, u16>) {
    let operator = bed.start();
    operator
        .eventually("convergence", CONVERGE, async || {
            bed.assert_never_doubled();
            bed.converged(declared)
        })
        .await;
}

/// Starts the operator and SIGKILLs it after each delay in turn.
async fn kill_at(bed: &Bed, delays_ms: &[u64]) {
    for delay in delays_ms {
        let operator = bed.start();
        // Not a wait for anything: the kill lands at this point of its work.
        tokio::time::sleep(Duration::from_millis(*delay)).await;
        drop(operator);
        bed.assert_never_doubled();
    }
}

#[tokio::test]
async fn sigkill_during_create_replace_and_delete_never_duplicates_or_leaks() {
    let bed = Bed::new();
    let mut declared: BTreeMap<&str, u16> = [("p1", 3128), ("p2", 3128), ("p3", 3128)].into();
    for (name, port) in &declared {
        bed.write_proxy(name, *port);
    }

    // Creates interrupted at several points.
    kill_at(&bed, &[5, 40, 120, 250, 600]).await;
    converge(&bed, &declared).await;
    let first_uids: BTreeMap<String, String> = bed
        .proxies()
        .into_iter()
        .map(|(n, p)| (n, p.metadata.uid.unwrap()))
        .collect();

    // Replacements (a port change changes the spec hash) interrupted.
    for name in ["p1", "p2"] {
        declared.insert(name, 3129);
        bed.write_proxy(name, 3129);
    }
    kill_at(&bed, &[30, 150, 300, 700]).await;
    converge(&bed, &declared).await;
    let uids: BTreeMap<String, String> = bed
        .proxies()
        .into_iter()
        .map(|(n, p)| (n, p.metadata.uid.unwrap()))
        .collect();
    assert_eq!(
        uids, first_uids,
        "replacement keeps the Proxy; only its instance changes"
    );

    // Deletions interrupted.
    for name in ["p2", "p3"] {
        declared.remove(name);
        bed.remove_proxy(name);
    }
    kill_at(&bed, &[20, 150, 400]).await;
    converge(&bed, &declared).await;

    // And the last one, so the bed ends empty.
    declared.clear();
    bed.remove_proxy("p1");
    converge(&bed, &declared).await;
    assert!(bed.processes().is_empty());
}

#[tokio::test]
async fn a_restarted_operator_adopts_running_proxies_without_restarting_them() {
    let bed = Bed::new();
    let declared: BTreeMap<&str, u16> = [("solo", 3128)].into();
    bed.write_proxy("solo", 3128);
    converge(&bed, &declared).await;
    let pid_before = pids(&bed);
    converge(&bed, &declared).await;
    assert_eq!(
        pids(&bed),
        pid_before,
        "the same process serves after the restart"
    );

    bed.remove_proxy("solo");
    converge(&bed, &BTreeMap::new()).await;
}

fn pids(bed: &Bed) -> Vec<i32> {
    let mut pids = support::process::processes_under(bed.dir.path());
    pids.sort();
    pids
}

/// External proxies come up with one status write each (their first
/// status waits for the first verdict), and a restarted operator finds
/// their statuses right: its probes confirm the recorded verdicts, and
/// nothing is reported or written.
#[tokio::test]
async fn external_proxies_come_up_in_one_write_and_a_restart_rewrites_no_status() {
    const N: usize = 5;
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    // Probes of proxy i fetch /ext-i: the target counts each proxy's probes.
    let (target, seen) =
        support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;
    let probes_of = |i: usize| {
        let path = format!("GET /ext-{i} ");
        seen.lock()
            .unwrap()
            .iter()
            .filter(|h| h.starts_with(&path))
            .count()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        None,
    ));
    for i in 0..N {
        dir.write_manifest(
            &format!("ext-{i}"),
            &format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: ext-{i}, namespace: crawl}}\n\
                 spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: {proxy_port}}}, \
                 healthCheck: {{url: \"http://{target}/ext-{i}\", interval: 1s}}}}\n"
            ),
        );
    }
    // Each verdict the prober reports is logged.
    let start = async |name: &str| {
        dir.standalone()
            .name(name)
            .log_level("info,egress_proxies_operator::health_prober=debug")
            .log_format("json")
            .start()
            .await
    };
    let two_more_probe_rounds = async |op: &OperatorProcess| {
        let before: Vec<usize> = (0..N).map(probes_of).collect();
        op.eventually("two more probes of every proxy", CONVERGE, async || {
            let now: Vec<usize> = (0..N).map(probes_of).collect();
            now.iter()
                .zip(&before)
                .all(|(now, before)| *now >= before + 2)
                .then_some(())
                .ok_or(format!("probes {now:?}, before {before:?}"))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let statuses = || -> BTreeMap<String, serde_json::Value> {
        dir.proxies()
            .into_iter()
            .map(|p| (p.metadata.name.unwrap(), serde_json::to_value(p.status).unwrap()))
            .collect()
    };
    let phase_changes = |logs: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains("phase changed"))
            .map(str::to_owned)
            .collect()
    };

    let first = start("first").await;
    first.wait_ready(N).await;
    two_more_probe_rounds(&first).await;
    let recorded = statuses();
    let logs = first.logs();
    // Every write that changes the phase is logged: one per proxy, straight to Ready.
    let changes = phase_changes(&logs);
    assert_eq!(changes.len(), N, "{changes:#?}");
    assert!(
        changes.iter().all(|l| l.contains(r#""to":"Ready""#)),
        "{changes:#?}"
    );
    assert_eq!(
        logs.matches("health verdict").count(),
        N,
        "one verdict each\n{logs}"
    );

    drop(first);
    let second = start("second").await;
    two_more_probe_rounds(&second).await;
    assert_eq!(statuses(), recorded, "the statuses as they were");
    let logs = second.logs();
    assert!(
        !logs.contains("health verdict") && phase_changes(&logs).is_empty(),
        "the restarted operator's probes confirm the recorded verdicts\n{logs}"
    );
}
