//! The Kubernetes client's layer against a real HTTP server on loopback
//! standing in for the API server: `429` + `Retry-After` waited out, the
//! retries bounded, watches never retried, the budget spacing requests,
//! requests in flight bounded (open watches aside), and every try counted
//! in the metrics.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies::adapters::kube_client::{self, ApiBudget};
use egress_proxies::telemetry::metrics::metrics;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, WatchParams};
use tokio::net::TcpListener;

/// What the stand-in answers to its `n`th request (from 0).
type Script = fn(usize, &Request<hyper::body::Incoming>) -> Response<String>;

/// A server on loopback answering by `script`; the times its requests
/// arrived. Its task ends with the test's runtime.
async fn serve(script: Script) -> (SocketAddr, Arc<Mutex<Vec<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let n = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(Instant::now());
                        seen.len() - 1
                    };
                    async move { Ok::<_, Infallible>(script(n, &request)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, arrivals)
}

fn client(addr: SocketAddr, budget: Option<ApiBudget>) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube_client::client(config, budget).unwrap()
}

fn json(status: StatusCode, body: String) -> Response<String> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

fn too_many(retry_after: Option<&str>) -> Response<String> {
    let mut answer = json(
        StatusCode::TOO_MANY_REQUESTS,
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too many requests","reason":"TooManyRequests","code":429}"#
            .to_owned(),
    );
    if let Some(secs) = retry_after {
        answer.headers_mut().insert("retry-after", secs.parse().unwrap());
    }
    answer
}

/// The value of one metric line, 0 when absent.
fn metric(line_start: &str) -> f64 {
    metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_429_with_retry_after_is_sent_again_no_sooner() {
    let (addr, arrivals) = serve(|n, _| {
        if n < 2 {
            too_many(Some("1"))
        } else {
            json(
                StatusCode::OK,
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"t"},"data":{"k":"v"}}"#
                    .to_owned(),
            )
        }
    })
    .await;
    let waited_before = metric("egress_proxies_kube_api_wait_seconds_total{reason=\"retry_after\"}");
    let api: Api<ConfigMap> = Api::namespaced(client(addr, None), "t");
    let map = api.get("c").await.expect("the third try succeeds");
    assert_eq!(map.data.unwrap()["k"], "v");
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 3);
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_secs(1),
            "a try came {gap:?} after a Retry-After: 1"
        );
    }
    let labels = "egress_proxies_kube_api_requests_total{verb=\"get\",resource=\"configmaps\",code=";
    assert_eq!(metric(&format!("{labels}\"429\"}}")), 2.0);
    assert_eq!(metric(&format!("{labels}\"200\"}}")), 1.0);
    let waited = metric("egress_proxies_kube_api_wait_seconds_total{reason=\"retry_after\"}") - waited_before;
    assert!(waited >= 2.0, "Retry-After waits counted: {waited}");
}

#[tokio::test]
async fn retries_are_bounded_and_watches_not_retried() {
    // Always refused, without Retry-After: backoff, then the 429 to the caller.
    let (addr, arrivals) = serve(|_, _| too_many(None)).await;
    let api: Api<Secret> = Api::namespaced(client(addr, None), "t");
    let start = Instant::now();
    let error = api
        .list(&ListParams::default())
        .await
        .expect_err("refused each time");
    assert!(
        matches!(&error, kube::Error::Api(s) if s.code == 429),
        "{error:?}"
    );
    let tries = arrivals.lock().unwrap().clone();
    assert_eq!(tries.len(), 4, "one try and three retries");
    // Backoff from 250–500 ms doubling: never a tight loop.
    assert!(tries[1] - tries[0] >= Duration::from_millis(250));
    assert!(tries[3] - tries[2] >= Duration::from_secs(1));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        metric("egress_proxies_kube_api_requests_total{verb=\"list\",resource=\"secrets\",code=\"429\"}"),
        4.0
    );

    // A watch refused is handed back at once, whatever Retry-After says.
    let (addr, arrivals) = serve(|_, _| too_many(Some("1"))).await;
    let api: Api<Secret> = Api::namespaced(client(addr, None), "t");
    let start = Instant::now();
    assert!(api.watch(&WatchParams::default(), "0").await.is_err());
    assert_eq!(arrivals.lock().unwrap().len(), 1);
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn the_budget_spaces_requests_out() {
    let (addr, arrivals) = serve(|_, request| {
        let body = if request.uri().path().contains("/leases/") {
            r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"op","namespace":"t"}}"#
        } else {
            r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]}"#
        };
        json(StatusCode::OK, body.to_owned())
    })
    .await;
    let client = client(addr, Some(ApiBudget::new(5.0, Some(1))));
    let api: Api<Pod> = Api::namespaced(client.clone(), "t");
    let start = Instant::now();
    let params = ListParams::default();
    let lists = futures::future::join_all((0..10).map(|_| api.list(&params)));
    // The leader Lease does not queue behind them.
    let lease = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let asked = Instant::now();
        Api::<Lease>::namespaced(client.clone(), "t")
            .get("op")
            .await
            .expect("lease read");
        asked.elapsed()
    };
    let (lists, lease_took) = tokio::join!(lists, lease);
    for result in lists {
        result.expect("listed");
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1750),
        "10 requests at 5/s, burst 1, took {took:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        lease_took < Duration::from_millis(500),
        "the Lease waited {lease_took:?}"
    );
    assert_eq!(arrivals.lock().unwrap().len(), 11);
    let waited = metric("egress_proxies_kube_api_wait_seconds_total{reason=\"budget\"}");
    // 0.2 + 0.4 + … + 1.8 s queued in all.
    assert!(waited >= 8.9, "budget waits counted: {waited}");
}

/// A stand-in that answers each GET after `delay`, holds watches open, and
/// records the most GETs it ever had in flight at once.
async fn slow_server(delay: Duration) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let seen = most.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (now, most) = (now.clone(), most.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (now, most) = (now.clone(), most.clone());
                    async move {
                        if request.uri().query().is_some_and(|q| q.contains("watch=true")) {
                            std::future::pending::<()>().await;
                        }
                        let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(in_flight, Ordering::SeqCst);
                        tokio::time::sleep(delay).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(json(
                            StatusCode::OK,
                            r#"{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"c","namespace":"t"}}"#
                                .to_owned(),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn requests_in_flight_are_bounded_and_open_watches_take_no_share() {
    let (addr, most) = slow_server(Duration::from_millis(50)).await;
    let client = client(addr, None);
    // A kind no other test here counts in the (process-wide) metrics.
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), "t");
    // More open watches than the bound: they must not starve the requests.
    let watches: Vec<_> = (0..kube_client::layer::MAX_IN_FLIGHT + 6)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { api.watch(&WatchParams::default(), "0").await.map(|_| ()) })
        })
        .collect();
    let gets = (0..300).map(|_| {
        let api = api.clone();
        async move { api.get("c").await }
    });
    let answers = tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(gets))
        .await
        .expect("every request answered while the watches stay open");
    assert!(answers.iter().all(Result::is_ok));
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        most <= kube_client::layer::MAX_IN_FLIGHT,
        "{most} requests were in flight at once"
    );
    assert!(
        most >= kube_client::layer::MAX_IN_FLIGHT / 2,
        "the bound is used: {most}"
    );
    watches.iter().for_each(|w| w.abort());
}
