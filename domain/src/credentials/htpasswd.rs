//! The passwd-file line Squid's `basic_ncsa_auth` reads: `user:<crypt(3) hash>`.
//! SHA-512 crypt (`$6$`), which glibc's `crypt` verifies; the password
//! itself never reaches the file.

use sha_crypt::{Params, ShaCrypt, password_hash::CustomizedPasswordHasher};

use super::{CredentialsError, ProxyCredentials, RandomSource};

/// Random salt bytes: 12 encode to the 16 characters SHA-crypt uses.
const SALT_BYTES: usize = 12;

/// A password hash's salt: fresh random bytes for every hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Salt(pub [u8; SALT_BYTES]);

impl Salt {
    pub fn draw(random: &dyn RandomSource) -> Result<Salt, CredentialsError> {
        let mut salt = [0u8; SALT_BYTES];
        random.fill(&mut salt)?;
        Ok(Salt(salt))
    }
}

/// `username:$6$rounds=5000$<salt>$<hash>`.
pub fn htpasswd_line(credentials: &ProxyCredentials, salt: &Salt) -> Result<String, CredentialsError> {
    let hash = ShaCrypt::SHA512
        .hash_password_customized(
            credentials.password.as_bytes(),
            &salt.0,
            None,
            None,
            Params::RECOMMENDED,
        )
        .map_err(|e| CredentialsError::Hash(e.to_string()))?;
    Ok(format!("{}:{hash}", credentials.username))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha_crypt::password_hash::PasswordVerifier;

    #[test]
    fn the_line_holds_a_verifiable_sha512_hash_not_the_password() {
        let c = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let line = htpasswd_line(&c, &Salt::draw(&crate::credentials::random::TestRandom).unwrap()).unwrap();
        let (user, hash) = line.split_once(':').unwrap();
        assert_eq!(user, c.username);
        assert!(hash.starts_with("$6$"), "{hash}");
        assert!(!line.contains(&c.password));
        ShaCrypt::default()
            .verify_password(c.password.as_bytes(), hash)
            .unwrap();
        assert!(ShaCrypt::default().verify_password(b"wrong", hash).is_err());
    }
}
