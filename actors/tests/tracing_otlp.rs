//! Traces leave the operator binary over OTLP/HTTP into an in-process
//! receiver that decodes the export protobuf: span names, kinds, attributes,
//! parent/child structure, the probe → reconcile link, a continued incoming
//! `traceparent`, log lines carrying their span's traceID, spans flushed on
//! SIGTERM. Without the OTel environment nothing is exported and logs carry
//! no trace IDs.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_proxies::domain::resource::Phase;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;

mod support;

use support::operator::{LOCAL_PROVIDER, OperatorDir, OperatorProcess};
use support::process::{free_port, health_target, kill_local_instance};

type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP traces receiver on loopback (`POST /v1/traces`, protobuf).
fn receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let spans: Received = Arc::default();
    let sink = spans.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || serve(stream, sink));
        }
    });
    (format!("http://{addr}"), spans)
}

fn serve(stream: TcpStream, sink: Received) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((k, v)) = header.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if line.starts_with("POST /v1/traces")
            && let Ok(request) = ExportTraceServiceRequest::decode(body.as_slice())
        {
            let mut spans = sink.lock().unwrap();
            for rs in request.resource_spans {
                for ss in rs.scope_spans {
                    spans.extend(ss.spans);
                }
            }
        }
        let _ = writer.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.clone()),
            AnyValue::IntValue(i) => Some(i.to_string()),
            AnyValue::BoolValue(b) => Some(b.to_string()),
            AnyValue::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        }
    })
}

struct Scenario {
    dir: OperatorDir,
    operator: OperatorProcess,
}

impl Scenario {
    /// The operator with one local Proxy; `otel` adds the exporter environment.
    async fn start(otel: Option<(&str, &str)>) -> Self {
        let dir = OperatorDir::new(LOCAL_PROVIDER);
        dir.write_manifest(
            "p",
            &format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p, namespace: crawl}}\n\
                 spec: {{mode: Managed, provider: local, port: {}, \
                 healthCheck: {{url: \"{}\", interval: 1s, unhealthyThreshold: 2}}}}\n",
                free_port(),
                health_target()
            ),
        );
        let mut builder = dir
            .standalone()
            .discovery()
            .setting("traceHealthProbes", "true")
            .setting("gcInterval", "1s")
            .log_format("json")
            .log_level("debug");
        if let Some((endpoint, protocol)) = otel {
            builder = builder
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
                .env("OTEL_BSP_SCHEDULE_DELAY", "200")
                .env("OTEL_SERVICE_NAME", "epo-under-test");
        }
        let operator = builder.start().await;
        Self { dir, operator }
    }

    fn log(&self) -> String {
        self.operator.logs()
    }

    async fn wait_ready(&self) {
        self.operator
            .eventually("the proxy Ready", Duration::from_secs(30), async || {
                let phase = self.dir.proxy("p").and_then(|p| p.status?.phase);
                (phase == Some(Phase::Ready)).then_some(())
            })
            .await;
    }

    fn request(&self, path: &str, traceparent: &str) -> String {
        let mut s = TcpStream::connect(self.operator.discovery()).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\ntraceparent: {traceparent}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn kill_proxy_process(&self) {
        kill_local_instance(&self.dir.state());
    }

    /// SIGTERM and wait: a graceful stop flushes the spans.
    async fn stop(&self) {
        self.operator.stop().await;
    }
}

const INCOMING_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const INCOMING_PARENT: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn spans_leave_with_their_structure_links_and_an_incoming_traceparent() {
    let (endpoint, received) = receiver();
    let run = Scenario::start(Some((&endpoint, "http/protobuf"))).await;
    // A proxy whose reconciles fail: its credentials Secret does not exist.
    run.dir.write_manifest(
        "broken",
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: broken, namespace: crawl}\n\
         spec: {mode: External, endpoint: {host: 127.0.0.1, port: 9, credentialsSecretRef: {name: missing}}}\n",
    );
    run.wait_ready().await;
    let answer = run.request(
        "/v1/proxies",
        &format!("00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    run.request("/healthz", &format!("00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"));
    // A dead proxy: failing probes flip the verdict, which triggers a reconcile linked to its probe.
    run.kill_proxy_process();
    run.operator
        .eventually(
            "a reconcile linked to a failed probe to be exported",
            Duration::from_secs(20),
            async || {
                let spans = received.lock().unwrap();
                let failed: Vec<&Vec<u8>> = spans
                    .iter()
                    .filter(|s| s.name == "health.probe" && attr(s, "probe.result").as_deref() != Some("ok"))
                    .map(|s| &s.span_id)
                    .collect();
                spans
                    .iter()
                    .filter(|s| s.name == "Reconcile Proxy")
                    .flat_map(|r| r.links.iter())
                    .any(|l| failed.contains(&&l.span_id))
                    .then_some(())
            },
        )
        .await;
    run.stop().await;
    let log = run.log();
    let spans = received.lock().unwrap().clone();
    assert!(!spans.is_empty(), "no spans received\n{log}");
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);

    // The start said where spans go (no credentials: there are none here).
    assert!(
        log.lines()
            .any(|l| l.contains("tracing enabled") && l.contains(&format!("{endpoint}/v1/traces"))),
        "a start-up line names the exporter's destination\n{log}"
    );

    // Reconcile Proxy roots with their children.
    let roots: Vec<&Span> = named("Reconcile Proxy").collect();
    // Each says how it ended and when the next is due; a failed one has status Error.
    let of = |proxy: &str| -> Vec<&Span> {
        roots
            .iter()
            .copied()
            .filter(|r| attr(r, "proxy").as_deref() == Some(proxy))
            .collect()
    };
    let fine = of("crawl/p");
    assert!(
        fine.iter()
            .any(|r| attr(r, "reconcile.result").as_deref() == Some("ok")
                && attr(r, "reconcile.requeue_after_ms").is_some()
                && r.status
                    .as_ref()
                    .is_none_or(|s| s.code != StatusCode::Error as i32)),
        "a successful reconcile of crawl/p that requeued itself"
    );
    let failed = of("crawl/broken");
    let failure = failed
        .iter()
        .find(|r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.code == StatusCode::Error as i32)
        })
        .unwrap_or_else(|| panic!("a Reconcile Proxy span of crawl/broken with status Error: {failed:?}"));
    let status = failure.status.as_ref().unwrap();
    assert!(status.message.contains("credentialsSecretRef"), "{status:?}");
    assert_eq!(
        attr(failure, "reconcile.result").as_deref(),
        Some("external_credentials")
    );
    let retry: u64 = attr(failure, "reconcile.requeue_after_ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 0, "a failed reconcile is retried after a backoff");
    assert!(
        !roots.is_empty(),
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(
        roots
            .iter()
            .all(|r| r.parent_span_id.is_empty() && r.kind == SpanKind::Internal as i32)
    );
    let root_ids: Vec<&Vec<u8>> = roots.iter().map(|r| &r.span_id).collect();
    let managed: Vec<&Span> = named("reconcile.managed").collect();
    assert!(!managed.is_empty() && managed.iter().all(|m| root_ids.contains(&&m.parent_span_id)));
    assert!(named("status.patch").any(|s| root_ids.contains(&&s.parent_span_id)));
    let create = named("provider.create").next().expect("a provider.create span");
    assert_eq!(create.kind, SpanKind::Client as i32);
    assert_eq!(attr(create, "provider.name").as_deref(), Some("local"));
    assert_eq!(attr(create, "provider.result").as_deref(), Some("ok"));
    let parent = by_id[&create.parent_span_id];
    assert_eq!(
        parent.name, "reconcile.managed",
        "provider calls are children of the reconcile"
    );
    assert_eq!(parent.trace_id, create.trace_id);

    // The discovery request continued the caller's trace; /healthz made no span.
    let server: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(
        server.len(),
        1,
        "{:?}",
        server.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert_eq!(server[0].name, "GET /v1/proxies");
    assert_eq!(hex(&server[0].trace_id), INCOMING_TRACE);
    assert_eq!(hex(&server[0].parent_span_id), INCOMING_PARENT);
    assert_eq!(
        attr(server[0], "http.response.status_code").as_deref(),
        Some("200")
    );

    // GC sweeps are traced with their counts.
    let gc = named("gc.sweep").next().expect("a gc.sweep span");
    assert!(attr(gc, "gc.listed").is_some());

    // Probes are traced (opt-in) and the reconcile their verdict triggered links to one.
    let probes: HashMap<&Vec<u8>, &Span> = named("health.probe").map(|p| (&p.span_id, p)).collect();
    assert!(!probes.is_empty());
    let linked = roots
        .iter()
        .flat_map(|r| r.links.iter())
        .find(|l| probes.contains_key(&l.span_id))
        .expect("a reconcile linked to the probe that failed");
    let probe = probes[&linked.span_id];
    assert_eq!(linked.trace_id, probe.trace_id);
    assert_ne!(attr(probe, "probe.result").as_deref(), Some("ok"));
    // A failed probe has status Error naming the failure; every probe its latency.
    let probe_status = probe.status.as_ref().expect("a failed probe's status");
    assert_eq!(probe_status.code, StatusCode::Error as i32);
    assert!(!probe_status.message.is_empty());
    for p in probes.values() {
        let latency: f64 = attr(p, "probe.latency_ms")
            .expect("probe.latency_ms")
            .parse()
            .unwrap();
        assert!((0.0..30_000.0).contains(&latency), "{latency}");
        if attr(p, "probe.result").as_deref() == Some("ok") {
            assert!(
                p.status
                    .as_ref()
                    .is_none_or(|s| s.code != StatusCode::Error as i32)
            );
            assert!(latency > 0.0, "a probe that answered took some time");
        }
    }

    // Log lines inside a span carry its traceID (JSON: the current span's fields).
    let create_trace = hex(&create.trace_id);
    let correlated = log.lines().any(|l| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| {
            v["span"]["name"] == "provider.create" && v["span"]["traceID"] == create_trace.as_str()
        })
    });
    assert!(
        correlated,
        "a log line inside provider.create carries its traceID {create_trace}\n{log}"
    );
}

#[tokio::test]
async fn without_the_otel_environment_nothing_is_exported_and_logs_carry_no_trace_ids() {
    let (endpoint, received) = receiver();
    let run = Scenario::start(None).await;
    run.wait_ready().await;
    run.request(
        "/v1/proxies",
        &format!("00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"),
    );
    run.stop().await;
    let _ = endpoint;
    assert!(received.lock().unwrap().is_empty());
    let log = run.log();
    assert!(log.contains("provider call"), "debug logs were written\n{log}");
    assert!(
        !log.contains("traceID"),
        "no trace IDs in logs when tracing is off\n{log}"
    );
}

/// An OTLP/gRPC traces receiver (tonic) on loopback, on its own runtime.
fn grpc_receiver() -> (String, Received) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };

    struct Sink(Received);

    #[tonic::async_trait]
    impl TraceService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let mut spans = self.0.lock().unwrap();
            for rs in request.into_inner().resource_spans {
                for ss in rs.scope_spans {
                    spans.extend(ss.spans);
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    let spans: Received = Arc::default();
    let sink = spans.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Sink(sink)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    });
    (format!("http://{}", rx.recv().unwrap()), spans)
}

#[tokio::test]
async fn grpc_is_used_when_asked_for() {
    let (endpoint, received) = grpc_receiver();
    let run = Scenario::start(Some((&endpoint, "grpc"))).await;
    run.wait_ready().await;
    run.stop().await;
    let spans = received.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"Reconcile Proxy") && names.contains(&"provider.create"),
        "{names:?}\n{}",
        run.log()
    );
}

#[tokio::test]
async fn gcp_calls_are_http_client_spans_under_their_provider_call() {
    use fake_compute::{FakeCompute, Fault};
    let (endpoint, received) = receiver();
    let fake = FakeCompute::start("crawl-test").unwrap();
    fake.state().step = Duration::from_millis(200);
    // The first insert fails (a 503 Google would retry): its span is an error.
    fake.state().inject(
        Fault {
            method: "POST".into(),
            path_contains: "/instances".into(),
            status: 503,
            reason: "backendError".into(),
        },
        1,
    );
    let dir = OperatorDir::new(&format!(
        "providers:\n  - name: gcp-test\n    type: gcp\n    gcp:\n      project: crawl-test\n      networkTag: egress-proxy\n      apiEndpoint: \"{}\"\n",
        fake.api_root()
    ));
    let key = support::gcp::key_file(dir.path(), &fake);
    let operator = dir
        .standalone()
        .env("GOOGLE_APPLICATION_CREDENTIALS", &key)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .start()
        .await;
    dir.write_manifest(
        "vm",
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: vm, namespace: crawl}\n\
         spec:\n  mode: Managed\n  provider: gcp-test\n\
         \x20 placement: {zone: europe-west1-b, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}\n\
         \x20 cloudInit: {inline: \"#cloud-config\\n\"}\n",
    );
    // Until the accepted insert's span is exported: the VM is recorded at
    // the fake before the operator has read its answer, and a stop in
    // between would cut the span short.
    operator
        .eventually(
            "the accepted insert exported",
            Duration::from_secs(30),
            async || {
                let exported = received.lock().unwrap().iter().any(|s| {
                    s.name == "POST"
                        && attr(s, "url.full").is_some_and(|u| u.ends_with("/instances"))
                        && attr(s, "http.response.status_code").as_deref() == Some("200")
                });
                (!fake.state().inserted.is_empty() && exported).then_some(())
            },
        )
        .await;
    operator.stop().await;
    let spans = received.lock().unwrap().clone();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let inserts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "POST" && attr(s, "url.full").is_some_and(|u| u.ends_with("/instances")))
        .collect();
    assert!(
        inserts.len() >= 2,
        "a failed and a successful insert: {:?}\n{}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>(),
        operator.logs()
    );
    for insert in &inserts {
        assert_eq!(insert.kind, SpanKind::Client as i32);
        assert_eq!(attr(insert, "http.request.method").as_deref(), Some("POST"));
        assert_eq!(attr(insert, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(
            by_id[&insert.parent_span_id].name, "provider.create",
            "an HTTP call is a child of its provider call"
        );
    }
    let status = |s: &Span| attr(s, "http.response.status_code");
    let failed = inserts
        .iter()
        .find(|s| status(s).as_deref() == Some("503"))
        .expect("the refused insert");
    let failed_status = failed.status.as_ref().unwrap();
    assert_eq!(failed_status.code, StatusCode::Error as i32);
    assert!(
        failed_status.message.contains("backendError"),
        "{failed_status:?}"
    );
    assert_eq!(attr(failed, "error.type").as_deref(), Some("503"));
    let ok = inserts
        .iter()
        .find(|s| status(s).as_deref() == Some("200"))
        .expect("the accepted insert");
    assert!(
        ok.status
            .as_ref()
            .is_none_or(|s| s.code != StatusCode::Error as i32)
    );
    // No token leaves in a span.
    let token = fake.state().issued.first().cloned().expect("a token was issued");
    for span in &spans {
        for kv in &span.attributes {
            assert!(
                !format!("{:?}", kv.value).contains(&token),
                "{} carries the token",
                span.name
            );
        }
    }
}
