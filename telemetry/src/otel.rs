//! OpenTelemetry tracing, gated by the standard environment variables
//! (docs/observability.md#traces-opentelemetry): off unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_TRACES_EXPORTER` is set; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` force it off; `OTEL_TRACES_EXPORTER=console`
//! prints spans to stdout; OTLP speaks http/protobuf unless
//! `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` asks
//! for `grpc`. The SDK and the exporter read the sampler
//! (`OTEL_TRACES_SAMPLER[_ARG]`), endpoint, headers and timeout variables
//! themselves; `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` win over
//! the built-in resource values.

use opentelemetry::trace::TraceContextExt;
use opentelemetry::{KeyValue, global};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Where spans go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TracesExporter {
    OtlpHttp,
    OtlpGrpc,
    Console,
}

/// The tracing environment is contradictory or names something unknown.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("OTEL_TRACES_EXPORTER={0:?} is not supported (otlp, console or none)")]
    Exporter(String),
    #[error("{var}={value:?} is not a supported OTLP protocol (http/protobuf or grpc)")]
    Protocol { var: &'static str, value: String },
    #[error("building the OTLP exporter: {0}")]
    Build(String),
}

/// What the environment asks for (`None`: tracing off). Pure: `env` looks variables up.
pub fn exporter_from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<TracesExporter>, OtelError> {
    let get = |k: &str| env(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let exporter = get("OTEL_TRACES_EXPORTER");
    let endpoint =
        get("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    match exporter.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("none") => return Ok(None),
        Some("console") => return Ok(Some(TracesExporter::Console)),
        Some("otlp") => {}
        Some(other) => return Err(OtelError::Exporter(other.to_owned())),
        None if !endpoint => return Ok(None),
        None => {}
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(value) = get(var) {
            return match value.as_str() {
                "grpc" => Ok(Some(TracesExporter::OtlpGrpc)),
                "http/protobuf" => Ok(Some(TracesExporter::OtlpHttp)),
                _ => Err(OtelError::Protocol { var, value }),
            };
        }
    }
    Ok(Some(TracesExporter::OtlpHttp))
}

impl TracesExporter {
    /// How the start-up log line names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::OtlpHttp => "otlp http/protobuf",
            Self::OtlpGrpc => "otlp grpc",
            Self::Console => "console",
        }
    }
}

/// Where `exporter` sends spans, as the exporter resolves the environment,
/// fit for a log line: credentials, query and fragment of the URL left out.
pub fn destination(exporter: TracesExporter, env: impl Fn(&str) -> Option<String>) -> String {
    let get = |k: &str| env(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let endpoint = match exporter {
        TracesExporter::Console => return "stdout".to_owned(),
        TracesExporter::OtlpHttp => get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
            let base = get("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|| "http://localhost:4318".into());
            Some(format!("{}/v1/traces", base.trim_end_matches('/')))
        }),
        TracesExporter::OtlpGrpc => get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .or_else(|| Some("http://localhost:4317".into())),
    }
    .unwrap_or_default();
    match url::Url::parse(&endpoint) {
        Ok(mut url) => {
            // Failing these only means the URL had none to remove.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.to_string()
        }
        Err(_) => "an endpoint that is not a URL".to_owned(),
    }
}

/// The process's resource: built-in values, then the environment's on top.
fn resource() -> Resource {
    let mut builder = Resource::builder_empty()
        .with_service_name("egress-proxies-operator")
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    let from_env = EnvResourceDetector::new().detect();
    builder = builder.with_attributes(from_env.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    if let Ok(name) = std::env::var("OTEL_SERVICE_NAME")
        && !name.trim().is_empty()
    {
        builder = builder.with_service_name(name);
    }
    builder.build()
}

/// A running tracer provider and, for gRPC, the runtime its exporter lives on.
pub struct Tracer {
    pub provider: SdkTracerProvider,
    /// tonic needs a Tokio runtime of its own: the export must work whatever
    /// the calling thread (actix arbiters, the main thread at shutdown).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Tracer {
    /// Flushes and stops the exporter (then its runtime).
    pub fn shutdown(mut self) -> Result<(), String> {
        let result = self.provider.shutdown().map_err(|e| e.to_string());
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
        result
    }
}

/// Builds the tracer provider for `exporter` and installs the W3C
/// propagator. Keep it: [`Tracer::shutdown`] flushes.
pub fn tracer(exporter: TracesExporter) -> Result<Tracer, OtelError> {
    // The OTLP HTTP client is rustls without a built-in provider: ours (ring)
    // first. An error means one is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = SdkTracerProvider::builder().with_resource(resource());
    let mut runtime = None;
    let provider = match exporter {
        TracesExporter::Console => builder
            .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
            .build(),
        TracesExporter::OtlpHttp => {
            let exporter = SpanExporter::builder()
                .with_http()
                .build()
                .map_err(|e| OtelError::Build(e.to_string()))?;
            builder.with_batch_exporter(exporter).build()
        }
        TracesExporter::OtlpGrpc => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("otel-export")
                .enable_all()
                .build()
                .map_err(|e| OtelError::Build(e.to_string()))?;
            let processor = {
                let _inside = rt.enter();
                let exporter = SpanExporter::builder()
                    .with_tonic()
                    .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                    .build()
                    .map_err(|e| OtelError::Build(e.to_string()))?;
                opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
                    exporter,
                    opentelemetry_sdk::runtime::Tokio,
                )
                .build()
            };
            runtime = Some(rt);
            builder.with_span_processor(processor).build()
        }
    };
    global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(Tracer { provider, runtime })
}

/// Records the span's OpenTelemetry IDs as its `traceID`/`spanID` fields
/// (declared empty by the span), so log lines inside it carry them. Does
/// nothing while tracing is off.
pub fn record_ids(span: &tracing::Span) {
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    if sc.is_valid() {
        span.record("traceID", sc.trace_id().to_string());
        span.record("spanID", sc.span_id().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn decide(vars: &[(&str, &str)]) -> Result<Option<TracesExporter>, OtelError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        exporter_from_env(|k| map.get(k).cloned())
    }

    #[test]
    fn off_unless_asked_for_and_forced_off_by_the_kill_switches() {
        use TracesExporter::*;
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        type Case = (Vec<(&'static str, &'static str)>, Option<TracesExporter>);
        let cases: Vec<Case> = vec![
            (vec![], None),
            (vec![("OTEL_SERVICE_NAME", "x")], None),
            (vec![endpoint], Some(OtlpHttp)),
            (
                vec![("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")],
                Some(OtlpHttp),
            ),
            (vec![("OTEL_TRACES_EXPORTER", "otlp")], Some(OtlpHttp)),
            (vec![("OTEL_TRACES_EXPORTER", "console")], Some(Console)),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                Some(OtlpGrpc),
            ),
            (
                vec![
                    endpoint,
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ],
                Some(OtlpHttp),
            ),
            (vec![endpoint, ("OTEL_SDK_DISABLED", "true")], None),
            (vec![endpoint, ("OTEL_SDK_DISABLED", "TRUE")], None),
            (vec![endpoint, ("OTEL_SDK_DISABLED", "false")], Some(OtlpHttp)),
            (vec![endpoint, ("OTEL_TRACES_EXPORTER", "none")], None),
            (
                vec![("OTEL_TRACES_EXPORTER", "console"), ("OTEL_SDK_DISABLED", "true")],
                None,
            ),
        ];
        for (vars, want) in cases {
            assert_eq!(decide(&vars).unwrap(), want, "{vars:?}");
        }
    }

    #[test]
    fn the_destination_is_logged_without_credentials() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        use TracesExporter::*;
        assert_eq!(destination(OtlpHttp, env(&[])), "http://localhost:4318/v1/traces");
        assert_eq!(
            destination(
                OtlpHttp,
                env(&[(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "https://user:secret@collector:4318/"
                )])
            ),
            "https://collector:4318/v1/traces"
        );
        assert_eq!(
            destination(
                OtlpHttp,
                env(&[(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://c:4318/v1/traces?key=hidden#x"
                )])
            ),
            "https://c:4318/v1/traces"
        );
        assert_eq!(
            destination(
                OtlpHttp,
                env(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9/traces")
                ])
            ),
            "http://c:9/traces"
        );
        assert_eq!(
            destination(OtlpGrpc, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")])),
            "http://c:4317/"
        );
        assert_eq!(destination(OtlpGrpc, env(&[])), "http://localhost:4317/");
        assert_eq!(destination(Console, env(&[])), "stdout");
        assert_eq!(
            destination(
                OtlpHttp,
                env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "not a url")])
            ),
            "an endpoint that is not a URL"
        );
    }

    #[test]
    fn unknown_values_are_named() {
        let err = decide(&[("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "OTEL_TRACES_EXPORTER=\"zipkin\" is not supported (otlp, console or none)"
        );
        let err = decide(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"http/json\""),
            "{err}"
        );
    }
}
