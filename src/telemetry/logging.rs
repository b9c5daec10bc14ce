//! Structured logging with `tracing`: JSON when stdout is not a terminal (in
//! a cluster, under a supervisor), human-readable in a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

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
}

/// Installs the global subscriber. `level` (from `--log-level`) wins over
/// `RUST_LOG`; with neither, `info`.
pub fn init_logging(level: Option<&str>, format: LogFormat) -> Result<(), LoggingError> {
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|_| LoggingError::AlreadyInstalled)
}
