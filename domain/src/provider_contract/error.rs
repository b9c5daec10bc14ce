//! The provider error taxonomy. The reconciler decides what to do from the
//! class alone: retry, back off slowly, give up, or treat as gone.

use std::error::Error as StdError;
use std::fmt;

/// What the caller should do about a failed provider call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The instance does not exist (a normal answer to `get`).
    NotFound,
    /// Out of quota or rate-limited: retry after minutes.
    QuotaExceeded,
    /// Worth retrying soon with exponential backoff. Anything unclassified.
    Transient,
    /// Retrying cannot help until the spec or configuration changes.
    Permanent,
}

impl ErrorClass {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::NotFound => "not_found",
            ErrorClass::QuotaExceeded => "quota_exceeded",
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The provider operation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Create,
    Get,
    Delete,
    List,
    Release,
}

impl Op {
    /// Label value for metrics, logs and span names.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Get => "get",
            Op::Delete => "delete",
            Op::List => "list",
            Op::Release => "release",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// A failed provider call: its class, which call, on which provider and id, and why.
#[derive(Debug, thiserror::Error)]
#[error("{provider} {op}{}: {class}: {cause}", id.as_deref().map(|id| format!(" {id}")).unwrap_or_default())]
pub struct ProviderError {
    pub class: ErrorClass,
    pub op: Op,
    pub provider: String,
    pub id: Option<String>,
    #[source]
    pub cause: Cause,
    /// When the provider knows better than the backoff when to try again
    /// (work it started is still under way).
    pub retry_after: Option<std::time::Duration>,
}

impl ProviderError {
    /// An error of a known class.
    pub fn new(
        class: ErrorClass,
        op: Op,
        provider: impl Into<String>,
        id: Option<&str>,
        cause: impl Into<Cause>,
    ) -> Self {
        Self {
            class,
            op,
            provider: provider.into(),
            id: id.map(str::to_owned),
            cause: cause.into(),
            retry_after: None,
        }
    }

    /// Retry after `delay` instead of the class's backoff.
    pub fn retry_after(mut self, delay: std::time::Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// An error nobody classified: it counts as Transient, so it is retried.
    pub fn unclassified(
        op: Op,
        provider: impl Into<String>,
        id: Option<&str>,
        cause: impl Into<Cause>,
    ) -> Self {
        Self::new(ErrorClass::Transient, op, provider, id, cause)
    }

    pub fn is_not_found(&self) -> bool {
        self.class == ErrorClass::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_provider_op_id_class_and_cause() {
        let err = ProviderError::new(
            ErrorClass::Permanent,
            Op::Create,
            "gcp-eu",
            Some("zones/europe-west1-b/instances/proxy-abc"),
            "machine type n9-huge does not exist",
        );
        assert_eq!(
            err.to_string(),
            "gcp-eu create zones/europe-west1-b/instances/proxy-abc: permanent: machine type n9-huge does not exist"
        );
        let err = ProviderError::new(
            ErrorClass::Transient,
            Op::List,
            "kvm-home",
            None,
            "host dc1 unreachable",
        );
        assert_eq!(err.to_string(), "kvm-home list: transient: host dc1 unreachable");
    }

    #[test]
    fn unclassified_errors_are_transient() {
        let err = ProviderError::unclassified(Op::Get, "local", Some("x"), "boom");
        assert_eq!(err.class, ErrorClass::Transient);
        assert!(!err.is_not_found());
    }

    #[test]
    fn the_cause_is_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = ProviderError::new(ErrorClass::Transient, Op::Get, "p", None, io);
        let source = err.source().map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("refused"));
    }
}
