//! Where Kubernetes mode keeps a Proxy's credentials: a Secret in the
//! Proxy's namespace, owned by the Proxy (garbage-collected with it) and
//! labelled as the operator's. The kubernetes provider's pods mount its
//! `htpasswd` key as Squid's passwd file.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::domain::credentials::{CredentialsError, ProxyCredentials};
pub use crate::domain::provider_contract::{HTPASSWD_KEY, credentials_secret_name};
use crate::domain::resource::ObjectKey;

/// Key holding the username.
pub const USERNAME_KEY: &str = "username";
/// Key holding the password.
pub const PASSWORD_KEY: &str = "password";
/// Label marking the Secret as the operator's.
pub const CREDENTIALS_LABEL: &str = "crawl.example.com/proxy-credentials";
/// Label with the owning Proxy's UID.
const UID_LABEL: &str = "crawl.example.com/uid";
/// Annotation with the spec generation the credentials were made for.
const GENERATION_ANNOTATION: &str = "crawl.example.com/credentials-generation";

/// The credentials in `secret`, when it holds those of `uid` for `generation`.
pub fn kept(secret: &Secret, uid: &str, generation: &str) -> Option<ProxyCredentials> {
    let meta = &secret.metadata;
    let label = meta.labels.as_ref()?.get(UID_LABEL)?;
    let made_for = meta.annotations.as_ref()?.get(GENERATION_ANNOTATION)?;
    if label != uid || made_for != generation {
        return None;
    }
    let data = secret.data.as_ref()?;
    let text = |k: &str| String::from_utf8(data.get(k)?.0.clone()).ok();
    ProxyCredentials::new(&text(USERNAME_KEY)?, &text(PASSWORD_KEY)?).ok()
}

/// The Secret holding `credentials` of the Proxy at `key` (UID `uid`).
pub fn build(
    key: &ObjectKey,
    uid: &str,
    generation: &str,
    credentials: &ProxyCredentials,
) -> Result<Secret, CredentialsError> {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let data = BTreeMap::from([
        (USERNAME_KEY.to_owned(), bytes(&credentials.username)),
        (PASSWORD_KEY.to_owned(), bytes(&credentials.password)),
        (
            HTPASSWD_KEY.to_owned(),
            bytes(&format!(
                "{}\n",
                crate::adapters::random::htpasswd_line(credentials)?
            )),
        ),
    ]);
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(credentials_secret_name(uid)),
            namespace: Some(key.namespace.clone()),
            labels: Some(BTreeMap::from([
                (CREDENTIALS_LABEL.to_owned(), "true".to_owned()),
                (UID_LABEL.to_owned(), uid.to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                GENERATION_ANNOTATION.to_owned(),
                generation.to_owned(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "crawl.example.com/v1alpha1".into(),
                kind: "Proxy".into(),
                name: key.name.clone(),
                uid: uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Secret::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_secret_is_kept_only_for_its_uid_and_generation() {
        let key = ObjectKey::new("crawl", "p1");
        let c = ProxyCredentials::generate(&crate::adapters::random::SystemRandom).unwrap();
        let secret = build(&key, "u1", "h1", &c).unwrap();
        assert_eq!(kept(&secret, "u1", "h1"), Some(c.clone()));
        assert_eq!(kept(&secret, "u1", "h2"), None);
        assert_eq!(kept(&secret, "u2", "h1"), None);
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Proxy", "u1"));
        let htpasswd = &secret.data.as_ref().unwrap()[HTPASSWD_KEY].0;
        assert!(!String::from_utf8_lossy(htpasswd).contains(&c.password));
    }
}
