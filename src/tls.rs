//! One TLS crypto provider for the whole process: ring (kube, the probes and
//! the HTTP clients all use it; mixing in aws-lc has made exporters panic).

/// Installs ring as the process-wide rustls provider (idempotent).
pub fn ensure_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
