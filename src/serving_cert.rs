//! The certificate an HTTPS listener of the operator serves: `tls.crt` and
//! `tls.key` (PEM) from a directory — a cert-manager Certificate's Secret
//! mounted there — or, without one, a self-signed certificate made at start
//! (clients then skip verification, as Prometheus does for controller-runtime
//! operators by default; the bearer token is what protects the data).

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum ServingCertError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// A server configuration from `dir`'s `tls.crt` and `tls.key`, or with a
/// self-signed certificate for `names` when `dir` is `None`.
pub fn server_config(dir: Option<&Path>, names: &[String]) -> Result<Arc<ServerConfig>, ServingCertError> {
    crate::tls::ensure_crypto_provider();
    let (chain, key) = match dir {
        Some(dir) => load(dir)?,
        None => self_signed(names)?,
    };
    let config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

fn load(dir: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ServingCertError> {
    let read = |name: &str| dir.join(name).display().to_string();
    let chain = CertificateDer::pem_file_iter(dir.join("tls.crt"))
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| ServingCertError::Read {
            path: read("tls.crt"),
            source,
        })?;
    if chain.is_empty() {
        return Err(ServingCertError::NoCertificate(read("tls.crt")));
    }
    let key = PrivateKeyDer::from_pem_file(dir.join("tls.key")).map_err(|source| ServingCertError::Read {
        path: read("tls.key"),
        source,
    })?;
    Ok((chain, key))
}

fn self_signed(
    names: &[String],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ServingCertError> {
    let certified = rcgen::generate_simple_self_signed(names.to_vec())?;
    let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der())
        .map_err(|e| rcgen::Error::PemError(e.to_owned()))?;
    Ok((vec![certified.cert.der().clone()], key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_or_one_from_a_directory_configures_tls() {
        assert!(server_config(None, &["localhost".into()]).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["metrics.example".into()]).unwrap();
        std::fs::write(dir.path().join("tls.crt"), made.cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.key"), made.signing_key.serialize_pem()).unwrap();
        assert!(server_config(Some(dir.path()), &[]).is_ok());
        let empty = tempfile::tempdir().unwrap();
        let err = server_config(Some(empty.path()), &[]).unwrap_err().to_string();
        assert!(err.contains("tls.crt"), "{err}");
    }
}
