//! The operating system's CSPRNG behind the domain's [`RandomSource`] port.

use crate::domain::credentials::{self, CredentialsError, ProxyCredentials, RandomSource, Salt};

/// Draws from the operating system (`getrandom`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemRandom;

impl RandomSource for SystemRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), CredentialsError> {
        getrandom::fill(buf).map_err(|e| CredentialsError::Random(e.to_string()))
    }
}

/// The passwd line of `credentials`, hashed with a fresh salt.
pub fn htpasswd_line(credentials: &ProxyCredentials) -> Result<String, CredentialsError> {
    credentials::htpasswd_line(credentials, &Salt::draw(&SystemRandom)?)
}
