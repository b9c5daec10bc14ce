//! The port through which the domain is handed randomness: generated
//! credentials and password salts draw from it. The adapters implement it
//! on the operating system's CSPRNG; a test may hand fixed bytes.

use super::CredentialsError;

/// Fills buffers with random bytes.
pub trait RandomSource: Send + Sync {
    fn fill(&self, buf: &mut [u8]) -> Result<(), CredentialsError>;
}

/// The operating system's CSPRNG, for the domain's own tests (the running
/// system's source is the adapters').
#[cfg(test)]
pub(crate) struct TestRandom;

#[cfg(test)]
impl RandomSource for TestRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), CredentialsError> {
        getrandom::fill(buf).map_err(|e| CredentialsError::Random(e.to_string()))
    }
}
