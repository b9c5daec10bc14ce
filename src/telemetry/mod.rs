//! Logs (and, as the system grows, metrics and traces).

mod logging;

pub use logging::{LogFormat, LoggingError, init_logging};
