//! Structured logging with `tracing`: JSON when stdout is not a terminal (in
//! a cluster, under a supervisor), human-readable in a terminal.

use std::io::IsTerminal;

use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt, Targets};
use tracing_subscriber::prelude::*;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// JSON unless stdout is a terminal.
    #[default]
    Auto,
    Json,
    Text,
}

/// The log filter did not parse.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid log level/filter {filter:?}: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
    #[error(transparent)]
    Tracing(#[from] super::otel::OtelError),
}

/// Keeps tracing alive; dropping it flushes and shuts the exporter down.
pub struct TelemetryGuard {
    tracer: Option<super::otel::Tracer>,
}

impl TelemetryGuard {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.tracer.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(tracer) = self.tracer.take()
            && let Err(e) = tracer.shutdown()
        {
            eprintln!("flushing traces at shutdown: {e}");
        }
    }
}

/// Installs the global subscriber. `level` (from `--log-level`) wins over
/// `RUST_LOG`; with neither, `info`. With `traces` and the OpenTelemetry
/// environment asking for it (see [`super::otel`]), spans are exported too
/// — filtered on their own, so the log level never hides a span.
pub fn init_logging(
    level: Option<&str>,
    format: LogFormat,
    traces: bool,
) -> Result<TelemetryGuard, LoggingError> {
    let filter_text = level
        .map(str::to_owned)
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "info".to_owned());
    let filter = EnvFilter::builder()
        .parse(&filter_text)
        .map_err(|source| LoggingError::Filter {
            filter: filter_text.clone(),
            source,
        })?;
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stdout().is_terminal(),
    };
    let exporter = if traces {
        super::otel::exporter_from_env(|k| std::env::var(k).ok())?
    } else {
        None
    };
    let tracer = exporter.map(super::otel::tracer).transpose()?;
    let otel_layer = tracer.as_ref().map(|t| {
        use opentelemetry::trace::TracerProvider as _;
        // Only the operator's own spans: dependencies' spans would start traces of their own.
        let spans = Targets::new()
            .with_target("egress_proxies", Level::INFO)
            .with_target("egress_proxies_operator", Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(t.provider.tracer("egress-proxies-operator"))
            .with_filter(spans)
    });
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // Accept errors repeat while the process is out of files: once per burst.
    let filter = filter.and(super::log_bursts::OncePerBurst::default());
    let fmt_layer = if json {
        // The current span's fields (traceID, spanID, proxy) on every line.
        fmt.json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    tracing_subscriber::registry()
        .with(fmt_layer)
        .with(otel_layer)
        .try_init()
        .map_err(|_| LoggingError::AlreadyInstalled)?;
    if let Some(exporter) = exporter {
        let env = |k: &str| std::env::var(k).ok();
        tracing::info!(
            exporter = exporter.name(),
            destination = %super::otel::destination(exporter, env),
            sampler = env("OTEL_TRACES_SAMPLER").as_deref().unwrap_or("parentbased_always_on"),
            "tracing enabled"
        );
    }
    Ok(TelemetryGuard { tracer })
}
