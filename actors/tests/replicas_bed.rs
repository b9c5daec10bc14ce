//! The bed of three replicas (support::replicas) against today's
//! behaviour, where only the leader serves: three operator processes, each
//! on its own loopback address and its own link to the fake API server;
//! exactly one leads and is ready; a Service (support::service) sends
//! crawlers' connections only to it; a crawler fetches from a site
//! (support::site) through the Service, the gateway and a local proxy,
//! plain HTTP and through a tunnel; the leader's link made every Proxy
//! status write, the followers' none; the leader SIGKILLed, another
//! replica is ready within the lease duration and a margin, and the
//! Service moves new connections to it; the killed replica restarted comes
//! back as a follower; one replica cut off the API server alone. And the
//! bed's parts: the probe counter (support::probe_counter) against the
//! real prober (20 External proxies, each probed once per interval, plain
//! HTTP and through a TLS tunnel), the Service and the site on their own.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use support::probe_counter::ProbeCounter;
use support::replicas::{LEASE_DURATION, Port, ReplicaBed};
use support::service::{Backend, FakeService};
use support::site::{Site, SiteOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(60);

/// One plain-HTTP GET of `site` through the gateway at `gateway`: the
/// status line and head, lower case.
async fn fetch(gateway: SocketAddr, site: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect(gateway).await.map_err(|e| e.to_string())?;
    let head = format!("GET http://{site}/page HTTP/1.1\r\nHost: {site}\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).to_ascii_lowercase())
}

/// A `CONNECT` to `site` through the gateway, then one request inside.
async fn tunnel(gateway: SocketAddr, site: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect(gateway).await.map_err(|e| e.to_string())?;
    let connect = format!("CONNECT {site} HTTP/1.1\r\nHost: {site}\r\n\r\n");
    s.write_all(connect.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte)).await {
            Ok(Ok(1)) => got.push(byte[0]),
            other => return Err(format!("the CONNECT answer ended: {other:?} after {got:?}")),
        }
    }
    let reply = String::from_utf8_lossy(&got).into_owned();
    if !reply.starts_with("HTTP/1.1 200") {
        return Err(reply);
    }
    s.write_all(format!("GET /page HTTP/1.1\r\nHost: {site}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[actix_rt::test]
async fn three_replicas_one_leader_serving_through_the_service_and_a_failover() {
    let _one = support::exclusive::replicas_lock();
    let mut bed =
        ReplicaBed::start_leader_only(3, &["--lease-cooldown", "0s", "--max-leases-per-proxy", "2"]).await;
    assert_eq!(bed.len(), 3);
    let ips: Vec<_> = (0..3).map(|i| bed.addrs(i).ip).collect();
    assert!(
        ips[0] != ips[1] && ips[1] != ips[2] && ips[0] != ips[2],
        "each replica on its own address: {ips:?}"
    );
    for i in 0..3 {
        let addrs = bed.addrs(i);
        for addr in [addrs.health, addrs.discovery, addrs.gateway, addrs.metrics] {
            assert_eq!(addr.ip(), IpAddr::V4(addrs.ip), "replica {i}: {addrs:?}");
        }
    }

    // Exactly one leader, the Lease's holder, and only it ready.
    let leader = bed.wait_leader().await;
    assert_eq!(bed.ready_replicas().await, [leader], "only the leader is ready");
    for i in 0..3 {
        let leading = bed.metric(i, "egress_proxies_leader", "").await;
        let expected = if i == leader { 1.0 } else { 0.0 };
        assert_eq!(
            leading,
            Some(expected),
            "replica {i}'s leader gauge (leader {leader})"
        );
    }

    // Two local proxies, each leaving from its own address in the bed's network.
    let target = support::process::health_target();
    for name in ["p0", "p1"] {
        bed.apply_proxy(
            name,
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
        )
        .await;
    }
    bed.wait_phase(&["p0", "p1"], "Ready").await;
    let dashboard = bed
        .dashboard(leader)
        .await
        .expect("the leader's dashboard answers");
    assert!(dashboard["proxies"].is_array(), "{dashboard}");

    // The Service routes to the ready replica only.
    let gateway = bed.service(Port::Gateway).await;
    support::eventually("the Service to see the leader ready", WAIT, async || {
        let ready = gateway.ready();
        (ready == [leader]).then_some(()).ok_or(format!("{ready:?}"))
    })
    .await;
    let site = Site::start().await;
    let answer = support::eventually_explained(
        "a fetch through the Service",
        WAIT,
        || bed.logs(),
        async || {
            let answer = fetch(gateway.addr(), site.addr).await?;
            if answer.starts_with("http/1.1 200") {
                Ok(answer)
            } else {
                Err(answer)
            }
        },
    )
    .await;
    assert!(answer.ends_with("ok"), "{answer}");
    let reply = tunnel(gateway.addr(), site.addr).await.unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.ends_with("ok"),
        "{reply}"
    );
    let network = bed.proxy_network();
    let prefix = network.rsplit_once('.').unwrap().0;
    for request in site.log.requests() {
        assert!(
            request.source.to_string().starts_with(prefix),
            "the site was reached from a proxy's address in {network}: {request:?}"
        );
        assert_eq!(request.host, site.addr.to_string());
    }
    assert!(site.log.requests().len() >= 2);
    // One connection at a time here: no proxy had two open at once.
    let most = site.log.most_open_by_source();
    assert!(!most.is_empty() && most.values().all(|n| *n == 1), "{most:?}");
    assert_eq!(site.log.open(), 0);
    // The Service records a connection once both sides have closed it.
    support::eventually("the Service's connections ended", WAIT, async || {
        (gateway.open_connections() == 0).then_some(())
    })
    .await;
    let routed = gateway.accepted_per_backend();
    assert_eq!(routed.keys().collect::<Vec<_>>(), [&Some(leader)], "{routed:?}");
    for record in gateway.connections() {
        assert_eq!(record.backend, Some(leader), "{record:?}");
        assert!(record.sent > 0 && record.received > 0, "{record:?}");
    }

    // Every Proxy status write came through the leader's link.
    let writes = |i: usize| {
        bed.api_requests(i)
            .0
            .iter()
            .filter(|(k, _)| k.resource == "proxies/status" && k.verb != "get")
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert!(writes(leader) >= 2, "{:?}", bed.api_requests(leader));
    for i in (0..3).filter(|&i| i != leader) {
        assert_eq!(writes(i), 0, "follower {i}: {:?}", bed.api_requests(i));
        assert!(
            bed.api_requests(i).on("leases") > 0,
            "follower {i} tries the leader Lease through its own link"
        );
    }
    let total: u64 = (0..3).map(|i| bed.api_requests(i).total()).sum();
    assert!(
        total < bed.fake.requests().total(),
        "the test's own requests are on no link"
    );

    // The leader SIGKILLed: another replica ready within L and a margin.
    bed.kill(leader).await;
    let killed_at = Instant::now();
    // Seen ready between the look's sending and its answer.
    let (successor, earliest, took) = support::eventually_explained(
        "another replica ready",
        WAIT,
        || bed.logs(),
        async || {
            let sent = killed_at.elapsed();
            let ready = bed.ready_replicas().await;
            match ready.as_slice() {
                [one] if *one != leader => Ok((*one, sent, killed_at.elapsed())),
                _ => Err(format!("{ready:?}")),
            }
        },
    )
    .await;
    // The Lease holds until it expires unrenewed (the last renew was at
    // most one retry period, 0.4 s, before the kill).
    assert!(
        earliest >= LEASE_DURATION - Duration::from_millis(500),
        "took over after {earliest:?}"
    );
    assert!(
        took < LEASE_DURATION + Duration::from_secs(5),
        "took over after {took:?}"
    );
    assert_eq!(bed.leader().await, Some(successor));

    // The Service moves new connections to it; the proxies serve again.
    support::eventually("the Service to see the successor ready", WAIT, async || {
        let ready = gateway.ready();
        (ready == [successor]).then_some(()).ok_or(format!("{ready:?}"))
    })
    .await;
    let served_after = Instant::now();
    support::eventually_explained(
        "a fetch through the Service after the failover",
        WAIT,
        || bed.logs(),
        async || {
            let answer = fetch(gateway.addr(), site.addr).await?;
            answer.starts_with("http/1.1 200").then_some(()).ok_or(answer)
        },
    )
    .await;
    let after: Vec<_> = gateway
        .connections()
        .into_iter()
        .filter(|r| r.accepted >= served_after)
        .collect();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|r| r.backend == Some(successor)),
        "new connections go to the successor: {after:?}"
    );

    // The killed replica restarted: a follower, on the same addresses.
    bed.restart(leader).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!bed.ready(leader).await, "the restarted replica follows");
    assert_eq!(bed.wait_leader().await, successor);
    assert_eq!(bed.metric(leader, "egress_proxies_leader", "").await, Some(0.0));
    eprintln!(
        "replicas bed: leader replica-{leader}, successor replica-{successor} ready {took:?} after the kill; \
         Service connections per backend {:?}; API requests per link {:?}",
        gateway.accepted_per_backend(),
        (0..3).map(|i| bed.api_requests(i).total()).collect::<Vec<_>>()
    );
}

/// The probe counter (support::probe_counter) answers what a health probe
/// of an External proxy sends, plain HTTP and through a CONNECT tunnel with
/// TLS: 20 External Proxies pointing at it, each with its own health URL,
/// all come up Ready and Healthy; each is probed about once per 1 s interval (today
/// by the leader alone: the followers' links write no Proxy status), and
/// nothing reaches the counter that names no Proxy.
#[actix_rt::test]
async fn the_probe_counter_counts_each_external_proxy_s_probes() {
    let _one = support::exclusive::replicas_lock();
    let counter = ProbeCounter::start().await;
    let ca = tempfile::NamedTempFile::new().unwrap();
    counter.write_ca(ca.path());
    let ca_arg = ca.path().to_str().unwrap().to_owned();
    let bed = ReplicaBed::start_leader_only(
        3,
        &[
            "--allow-external-endpoint-networks",
            "127.0.0.0/8",
            "--health-ca-file",
            &ca_arg,
        ],
    )
    .await;
    let leader = bed.wait_leader().await;
    let names: Vec<String> = (0..20).map(|i| format!("ext-{i:02}")).collect();
    // Every fifth through a tunnel with TLS, as the default https URL is.
    bed.apply_proxies(names.iter().enumerate().map(|(i, name)| {
        let url = if i % 5 == 0 {
            ProbeCounter::https_url(name)
        } else {
            ProbeCounter::health_url(name)
        };
        (name.clone(), counter.external_spec(&url, "1s"))
    }))
    .await;
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    bed.wait_phase(&all, "Ready").await;
    // Healthy only once the probes through the counter succeed.
    bed.wait_condition(&all, "Healthy", "True").await;

    // Over 6 s, each proxy probed once a second, give or take one at each end.
    let before = counter.counts();
    let window = Duration::from_secs(6);
    let from = Instant::now();
    tokio::time::sleep(window).await;
    for name in &names {
        let in_window = counter.probes_of(name).iter().filter(|at| **at >= from).count();
        assert!(
            (5..=7).contains(&in_window),
            "{name}: {in_window} probes in {window:?} (counted before: {:?})",
            before.get(name)
        );
    }
    assert_eq!(counter.counts().len(), 20, "{:?}", counter.counts());
    assert_eq!(counter.strays(), 0);
    assert!(counter.total() >= 20 * 5);
    for i in (0..3).filter(|&i| i != leader) {
        assert_eq!(bed.api_requests(i).on("proxies/status"), 0, "follower {i}");
    }
    assert!(bed.api_requests(leader).on("proxies/status") >= 20);
}

/// A stand-in backend for the Service's own test: `/readyz` on `health`
/// answers 200 while `ready`, 503 otherwise; `serve` greets each
/// connection with its name, then echoes.
struct StandIn {
    health: SocketAddr,
    serve: SocketAddr,
    ready: Arc<AtomicBool>,
    server: tokio::task::JoinHandle<()>,
}

async fn stand_in(name: &'static str) -> StandIn {
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let serve = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ready = Arc::new(AtomicBool::new(true));
    let (health_addr, serve_addr, is_ready) = (
        health.local_addr().unwrap(),
        serve.local_addr().unwrap(),
        ready.clone(),
    );
    tokio::spawn(async move {
        while let Ok((mut s, _)) = health.accept().await {
            let answer: &[u8] = if is_ready.load(Ordering::SeqCst) {
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(answer).await;
        }
    });
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = serve.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(name.as_bytes()).await;
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    StandIn {
        health: health_addr,
        serve: serve_addr,
        ready,
        server,
    }
}

/// Connects through the Service and reads the backend's greeting.
async fn greeted(service: SocketAddr) -> (TcpStream, Result<String, std::io::Error>) {
    let mut s = TcpStream::connect(service).await.unwrap();
    let mut name = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut name))
        .await
        .expect("an answer or an error within 5 s")
        .map(|_| String::from_utf8_lossy(&name).into_owned());
    (s, read)
}

/// The Service on its own: round-robin over the ready backends only; a
/// connection stays on its backend when that turns unready; with none
/// ready, or the chosen one refusing, the client's connection is reset;
/// each connection recorded with its backend, bytes and end.
#[actix_rt::test]
async fn the_service_spreads_new_connections_over_ready_backends_only() {
    let backends = [stand_in("a").await, stand_in("b").await];
    let service = FakeService::start(
        backends
            .iter()
            .map(|b| Backend {
                health: b.health,
                serve: b.serve,
            })
            .collect(),
    )
    .await;
    support::eventually("both backends ready", WAIT, async || {
        (service.ready() == [0, 1]).then_some(())
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let (s, name) = greeted(service.addr()).await;
        held.push((name.unwrap(), s));
    }
    let mut greetings: Vec<&str> = held.iter().map(|(n, _)| n.as_str()).collect();
    greetings.sort_unstable();
    assert_eq!(greetings, ["a", "a", "b", "b"], "round-robin");

    // b unready: new connections all go to a; b's open ones stay and work.
    backends[1].ready.store(false, Ordering::SeqCst);
    support::eventually("b unready", WAIT, async || (service.ready() == [0]).then_some(())).await;
    for _ in 0..3 {
        assert_eq!(greeted(service.addr()).await.1.unwrap(), "a");
    }
    let on_b = held.iter().position(|(n, _)| n == "b").unwrap();
    let (_, mut stay) = held.remove(on_b);
    stay.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stay.read_exact(&mut echo))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echo, b"ping", "an open connection stays on its backend");

    // None ready: reset at once.
    backends[0].ready.store(false, Ordering::SeqCst);
    support::eventually("none ready", WAIT, async || {
        service.ready().is_empty().then_some(())
    })
    .await;
    let (_, refused) = greeted(service.addr()).await;
    let refused = refused.expect_err("no backend, no answer");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionReset, "{refused}");

    // a ready again but its port closed (a dead process): reset too.
    backends[0].server.abort();
    tokio::time::sleep(Duration::from_millis(100)).await;
    backends[0].ready.store(true, Ordering::SeqCst);
    support::eventually("a ready again", WAIT, async || {
        (service.ready() == [0]).then_some(())
    })
    .await;
    let (_, dead) = greeted(service.addr()).await;
    assert_eq!(
        dead.expect_err("a refused it").kind(),
        std::io::ErrorKind::ConnectionReset
    );

    drop(held);
    drop(stay);
    support::eventually("every connection ended", WAIT, async || {
        (service.open_connections() == 0).then_some(())
    })
    .await;
    let records = service.connections();
    assert_eq!(records.len(), 9, "{records:?}");
    assert_eq!(
        service.accepted_per_backend(),
        [(None, 1), (Some(0), 6), (Some(1), 2)].into()
    );
    let errors: Vec<&str> = records.iter().filter_map(|r| r.error.as_deref()).collect();
    assert_eq!(errors.len(), 2, "{records:?}");
    assert!(errors.contains(&"no ready backend"), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.starts_with("connecting to the backend")),
        "{errors:?}"
    );
    let echoed = records
        .iter()
        .find(|r| r.sent == 4)
        .expect("the echoed connection");
    assert_eq!(
        (echoed.backend, echoed.received),
        (Some(1), 5),
        "greeting and echo: {echoed:?}"
    );
}

/// The site on its own: per source address the connections open and the
/// most at once; each request logged with its host; a (source, host) pair
/// blocked answers 403, other pairs 200.
#[actix_rt::test]
async fn the_site_counts_per_source_and_blocks_a_source_for_one_host() {
    let site = Site::start().await;
    let (a, b): (IpAddr, IpAddr) = ("127.0.13.1".parse().unwrap(), "127.0.13.2".parse().unwrap());
    let connect = async |from: IpAddr| {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        socket.connect(site.addr).await.unwrap()
    };
    let held = vec![
        connect(a).await,
        connect(a).await,
        connect(a).await,
        connect(b).await,
    ];
    support::eventually("four open", WAIT, async || (site.log.open() == 4).then_some(())).await;
    assert_eq!((site.log.open_from(a), site.log.open_from(b)), (3, 1));
    drop(held);
    support::eventually("all closed", WAIT, async || (site.log.open() == 0).then_some(())).await;
    assert_eq!(site.log.most_open_by_source(), [(a, 3), (b, 1)].into());
    assert_eq!(site.log.most_open(), 4);

    site.log.block(a, Some("blocked.test"));
    let ask = async |from: IpAddr, host: &str| {
        let mut s = connect(from).await;
        s.write_all(format!("GET /page HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer[9..12].to_owned()
    };
    assert_eq!(ask(a, "blocked.test:8080").await, "403");
    assert_eq!(ask(a, "other.test").await, "200");
    assert_eq!(ask(b, "blocked.test").await, "200");
    site.log.unblock(a, Some("blocked.test"));
    assert_eq!(ask(a, "blocked.test").await, "200");
    let logged: Vec<(IpAddr, String, u16)> = site
        .log
        .requests()
        .into_iter()
        .map(|r| (r.source, r.host, r.status))
        .collect();
    assert_eq!(
        logged,
        [
            (a, "blocked.test:8080".to_owned(), 403),
            (a, "other.test".to_owned(), 200),
            (b, "blocked.test".to_owned(), 200),
            (a, "blocked.test".to_owned(), 200),
        ]
    );
    assert_eq!(site.log.requests_by_source(), [(a, 3), (b, 1)].into());
    let events = site.log.events();
    assert_eq!(events.iter().filter(|e| e.opened).count(), 8);
    assert_eq!(events.iter().filter(|e| !e.opened).count(), 8);

    // Kept alive (and on another loopback address): two requests, one connection.
    let ip: IpAddr = "127.0.13.9".parse().unwrap();
    let kept = Site::start_with(SiteOptions { keep_alive: true, ip }).await;
    assert_eq!(kept.addr.ip(), ip);
    let mut s = TcpStream::connect(kept.addr).await.unwrap();
    s.write_all(
        b"GET /1 HTTP/1.1\r\nHost: one\r\n\r\nGET /2 HTTP/1.1\r\nHost: two\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answers = String::new();
    s.read_to_string(&mut answers).await.unwrap();
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
    let hosts: Vec<String> = kept.log.requests().into_iter().map(|r| r.host).collect();
    assert_eq!(hosts, ["one", "two"]);
    assert_eq!(kept.log.most_open(), 1);
}

/// `cut(i)` partitions one replica alone: a follower cut off makes no
/// request the API server answers (its link's counts stand still) while
/// the leader leads on, and its held requests are answered at the heal;
/// the leader cut off stops being ready within the renew deadline (2 s)
/// and exits with status 1, another replica taking over after the lease
/// duration; restarted, it follows.
#[actix_rt::test]
async fn a_replica_cut_off_alone() {
    let _one = support::exclusive::replicas_lock();
    let mut bed = ReplicaBed::start_leader_only(3, &[]).await;
    let leader = bed.wait_leader().await;
    let follower = (leader + 1) % 3;
    bed.cut(follower);
    let before = bed.api_requests(follower).total();
    tokio::time::sleep(LEASE_DURATION + Duration::from_secs(1)).await;
    assert_eq!(
        bed.api_requests(follower).total(),
        before,
        "nothing answered while cut"
    );
    assert_eq!(bed.ready_replicas().await, [leader], "the leader leads on");
    bed.heal(follower);
    support::eventually("the follower's held requests answered", WAIT, async || {
        (bed.api_requests(follower).total() > before).then_some(())
    })
    .await;

    bed.cut(leader);
    let cut = Instant::now();
    let unready = support::eventually_explained(
        "the cut-off leader unready",
        WAIT,
        || bed.logs(),
        async || (!bed.ready(leader).await).then(|| cut.elapsed()),
    )
    .await;
    assert!(
        unready < Duration::from_millis(2_500),
        "unready {unready:?} after the cut"
    );
    let (successor, took) = support::eventually_explained(
        "a successor",
        WAIT,
        || bed.logs(),
        async || {
            let sent = cut.elapsed();
            let ready = bed.ready_replicas().await;
            match ready.as_slice() {
                [one] if *one != leader => Ok((*one, sent)),
                _ => Err(format!("{ready:?}")),
            }
        },
    )
    .await;
    assert!(
        took >= LEASE_DURATION - Duration::from_millis(500),
        "took over {took:?} after the cut"
    );
    let status = support::eventually("the cut-off leader to exit", WAIT, async || {
        bed.process(leader).exited()
    })
    .await;
    assert_eq!(status.code(), Some(1), "exits to restart as a follower");
    bed.heal(leader);
    bed.restart(leader).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bed.ready_replicas().await, [successor]);
    assert_eq!(bed.leader().await, Some(successor));
    eprintln!(
        "cut: leader replica-{leader} unready {unready:?} after its cut, replica-{successor} ready {took:?} after"
    );
}
