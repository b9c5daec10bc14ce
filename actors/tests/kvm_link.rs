//! The SSH link to a real libvirt daemon behind a real sshd on loopback
//! (tests/kvm-testbed.sh), on its own and under a host actor: calls queued
//! on a busy host keep the link, a hung call tears it down at its deadline.
//! Without the test bed these tests say so and skip; CI sets the bed up, so
//! there they always run.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies::adapters::providers::kvm::host::{LinkError, SshLink};
use egress_proxies::adapters::providers::kvm::libvirt::ensure_client_setup;
use egress_proxies::adapters::providers::kvm::provider::KvmProvider;
use egress_proxies::adapters::providers::kvm::ssh_key::load_private_key;
use egress_proxies::domain::provider_contract::{ErrorClass, Provider, ProviderId};
use egress_proxies_operator::kvm::runner_factory_with_job_deadline;
use egress_proxies_operator::supervision;
use support::kvm_bed::{
    RemoveOnDrop, bed_host, create_request, domain_exists, image_server, provider_config, target,
};

#[tokio::test]
async fn libvirt_over_the_ssh_link_lists_the_pool() {
    let bed = bed_or_skip!();
    ensure_client_setup();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let link = SshLink::dial(&target(&bed, "EPO_KVM_HOST_A"), key, Duration::from_secs(10))
        .await
        .unwrap();
    let uri = link.libvirt_uri();
    let pools = tokio::task::spawn_blocking(move || {
        let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
        let names: Vec<String> = conn
            .list_all_storage_pools(0)
            .unwrap()
            .iter()
            .map(|p| p.name().unwrap())
            .collect();
        drop(conn);
        names
    })
    .await
    .unwrap();
    assert!(pools.contains(&"default".to_owned()), "{pools:?}");
    assert!(!link.is_closed());
    link.close().await;
}

#[tokio::test]
async fn an_unknown_host_key_is_refused() {
    let bed = bed_or_skip!();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("known_hosts");
    // A valid known_hosts whose key for this host is someone else's.
    std::fs::write(
        &other,
        format!("[127.0.0.1]:{} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n", bed["EPO_KVM_HOST_A"].rsplit_once(':').unwrap().1),
    )
    .unwrap();
    let mut t = target(&bed, "EPO_KVM_HOST_A");
    t.known_hosts = Some(other);
    match SshLink::dial(&t, key, Duration::from_secs(10)).await {
        Err(e @ LinkError::HostKey { .. }) => assert!(!e.is_transient(), "{e}"),
        Err(other) => panic!("expected a host-key refusal, got {other}"),
        Ok(_) => panic!("a wrong host key was accepted"),
    }
}

#[tokio::test]
async fn a_dead_port_is_a_transient_dial_error() {
    let bed = bed_or_skip!();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut t = target(&bed, "EPO_KVM_HOST_A");
    t.address = dead.to_string();
    let err = SshLink::dial(&t, key, Duration::from_secs(5))
        .await
        .err()
        .expect("nothing listens there");
    assert!(err.is_transient(), "{err}");
}

/// The restarts of host actor `host` so far, from the supervision tree.
fn host_restarts(host: &str) -> Option<u32> {
    supervision::snapshot()
        .into_iter()
        .find(|a| a.kind == "kvm_host" && a.id == host)
        .map(|a| a.restarts)
}

#[actix_rt::test]
async fn a_burst_of_creates_queued_past_the_job_deadline_keeps_the_link() {
    let bed = bed_or_skip!();
    let (url, _, _) = image_server().await;
    let mut cfg = provider_config(&bed, &url);
    cfg.hosts = vec![bed_host(&bed, "burst", "EPO_KVM_HOST_A")];
    // Short enough for the burst to queue well past it; each create alone
    // takes a fraction of it.
    let deadline = Duration::from_secs(4);
    let runner = runner_factory_with_job_deadline(deadline)("kvm-burst", &cfg).unwrap();
    let provider = KvmProvider::new("kvm-burst", cfg, runner);
    let requests: Vec<_> = (0..13)
        .map(|i| create_request(&format!("b0a5b0a5-0000-4000-8000-0000000000{i:02}"), "burst"))
        .collect();
    let _cleanup = RemoveOnDrop(requests.iter().map(|r| r.name.to_string()).collect());

    // The first create dials the host and fetches the image.
    let first = &requests[0];
    let id = support::kvm_bed::past_transient("the first create", Duration::from_secs(60), async || {
        provider.create(first).await
    })
    .await
    .unwrap_or_else(|e| panic!("first create: {e}"));
    let alone = Instant::now();
    provider.create(first).await.unwrap();
    eprintln!("a create alone (domain already there): {:?}", alone.elapsed());

    // The burst: twelve creates at once, one after the other on the host's libvirt thread.
    let burst = requests[1..].iter().map(|r| async {
        let asked = Instant::now();
        (provider.create(r).await, asked.elapsed())
    });
    let answered = futures::future::join_all(burst).await;
    let mut longest = Duration::ZERO;
    for (request, (created, took)) in requests[1..].iter().zip(&answered) {
        if let Err(e) = created {
            panic!("{} failed after {took:?}: {e}", request.name);
        }
        longest = longest.max(*took);
    }
    eprintln!("longest wait in the burst: {longest:?}");
    assert!(
        longest > deadline,
        "the burst must queue calls past the {deadline:?} deadline to show anything (longest {longest:?}); add creates"
    );
    assert_eq!(host_restarts("burst"), Some(0), "the link was never torn down");

    // And a burst of deletes, for good measure.
    let ids: Vec<ProviderId> = std::iter::once(id)
        .chain(
            requests[1..]
                .iter()
                .map(|r| ProviderId(format!("hosts/burst/domains/{}", r.name))),
        )
        .collect();
    let deletes = ids.iter().map(|id| provider.delete(id));
    for (id, deleted) in ids.iter().zip(futures::future::join_all(deletes).await) {
        deleted.unwrap_or_else(|e| panic!("deleting {id}: {e}"));
    }
    for request in &requests {
        assert!(!domain_exists(request.name.as_str()), "{} deleted", request.name);
    }
    assert_eq!(host_restarts("burst"), Some(0));
}

/// PIDs of the sshd processes serving this process's connections to `port`.
fn sshd_sessions_of_this_process(port: &str) -> Vec<String> {
    let ss = |filter: String| {
        let out = std::process::Command::new("ss")
            .args(["-Htnp", &filter])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let me = format!("pid={},", std::process::id());
    let mut pids = Vec::new();
    for line in ss(format!("dport = :{port}")).lines().filter(|l| l.contains(&me)) {
        // Local address:port is the fourth column.
        let Some(local_port) = line
            .split_whitespace()
            .nth(3)
            .and_then(|a| a.rsplit_once(':'))
            .map(|(_, p)| p.to_owned())
        else {
            continue;
        };
        let servers = ss(format!("sport = :{port} and dport = :{local_port}"));
        for line in servers.lines() {
            pids.extend(
                line.split("pid=")
                    .skip(1)
                    .filter_map(|p| p.split(',').next())
                    .map(str::to_owned),
            );
        }
    }
    pids.sort();
    pids.dedup();
    pids
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[actix_rt::test]
async fn a_hung_call_fails_at_its_deadline_and_the_link_is_redialed() {
    let bed = bed_or_skip!();
    let mut cfg = provider_config(&bed, "http://127.0.0.1:9/unused.qcow2");
    cfg.hosts = vec![bed_host(&bed, "hung", "EPO_KVM_HOST_B")];
    let deadline = Duration::from_secs(2);
    let runner = runner_factory_with_job_deadline(deadline)("kvm-hung", &cfg).unwrap();
    let provider = KvmProvider::new("kvm-hung", cfg, runner);
    let missing = ProviderId("hosts/hung/domains/proxy-hungcall0000000".into());
    support::eventually("the link to come up", Duration::from_secs(30), async || {
        matches!(provider.get(&missing).await, Err(e) if e.class == ErrorClass::NotFound).then_some(())
    })
    .await;

    // Freeze the sshd session serving the link: the next libvirt call gets no answer.
    let port = bed["EPO_KVM_HOST_B"].rsplit_once(':').unwrap().1.to_owned();
    let frozen = sshd_sessions_of_this_process(&port);
    assert!(!frozen.is_empty(), "found the link's sshd session");
    let signal = |sig: &str| {
        for pid in &frozen {
            let _ = std::process::Command::new("kill").args([sig, pid]).status();
        }
    };
    signal("-STOP");
    let asked = Instant::now();
    let answer = provider.get(&missing).await;
    let took = asked.elapsed();
    // Released by the teardown while sshd is still frozen: the old libvirt thread ends.
    let released = support::eventually("the hung thread to end", Duration::from_secs(10), async || {
        (threads_named("libvirt-hung") <= 1).then_some(())
    });
    let released = tokio::time::timeout(Duration::from_secs(15), released).await;
    signal("-CONT");
    let err = answer.expect_err("a call to a frozen server cannot succeed");
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.to_string().contains("ran past its 2s deadline"), "{err}");
    // SSH keepalive would notice the frozen server only after ~15 s.
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(5),
        "failed after {took:?}"
    );
    assert!(released.is_ok(), "the blocked libvirt call was released");

    support::eventually(
        "the redialed link to answer",
        Duration::from_secs(30),
        async || {
            matches!(provider.get(&missing).await, Err(e) if e.class == ErrorClass::NotFound).then_some(())
        },
    )
    .await;
    assert!(host_restarts("hung") >= Some(1), "the host actor restarted");
}
