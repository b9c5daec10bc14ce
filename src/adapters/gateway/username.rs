//! Parameters written into the proxy username, the way crawler teams know
//! from commercial gateways (`user-session-abc-sesstime-30`):
//!
//! ```text
//! username = client *( "-" key "-" value )
//! key      = "pool" / "session" / "sesstime" / "attr"
//! ```
//!
//! The first dash-separated word is always the client name, and a value
//! runs up to the next word that is a key, so values may contain dashes
//! (pool names do) but not a key as a whole word. Everything is optional:
//! `crawler`, `crawler-pool-eu-west`, `crawler-session-a1-sesstime-30`,
//! `crawler-attr-country=de-attr-tier=premium`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::domain::lease::input::select_pool;

/// Longest client name or session id, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// What a username asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parameters {
    /// Who the crawler says it is (metrics, rate limits, lease listings).
    pub client: Option<String>,
    /// Attributes the proxy must carry; a `pool` is its pool label.
    pub selector: BTreeMap<String, String>,
    /// A sticky session: requests naming it keep one proxy.
    pub session: Option<String>,
    /// How long the session keeps its proxy (`sesstime`, in minutes).
    pub lifetime: Option<Duration>,
}

/// A username that does not follow the grammar, naming what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UsernameError {
    #[error("`{0}` is given twice in the proxy username")]
    Repeated(&'static str),
    #[error("`{0}` in the proxy username has no value")]
    Empty(&'static str),
    #[error("the client name in the proxy username must be 1 to {MAX_NAME_LEN} letters, digits, `_` or `.`")]
    BadClient,
    #[error(
        "the session id in the proxy username must be 1 to {MAX_NAME_LEN} letters, digits, `_`, `.` or `-`"
    )]
    BadSession,
    #[error("sesstime in the proxy username is whole minutes, 1 or more; got {0:?}")]
    BadLifetime(String),
    #[error("attr in the proxy username is `key=value`; got {0:?}")]
    BadAttribute(String),
    #[error("pool in the proxy username: {0}")]
    BadPool(String),
}

const KEYS: [&str; 4] = ["pool", "session", "sesstime", "attr"];

/// Parses a proxy username (see the module docs).
pub fn parse(username: &str) -> Result<Parameters, UsernameError> {
    let mut params = Parameters::default();
    if username.is_empty() {
        return Ok(params);
    }
    let words: Vec<&str> = username.split('-').collect();
    // The first word is always the client's, even if it spells a key.
    let first_key = words
        .iter()
        .skip(1)
        .position(|w| KEYS.contains(w))
        .map_or(words.len(), |i| i + 1);
    let client = words[..first_key].join("-");
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    if client.len() > MAX_NAME_LEN
        || !client
            .split('-')
            .all(|w| !w.is_empty() && w.chars().all(name_char))
    {
        return Err(UsernameError::BadClient);
    }
    params.client = Some(client);
    let mut rest = &words[first_key..];
    let mut pool = None;
    while let Some((&key, after)) = rest.split_first() {
        let end = after.iter().position(|w| KEYS.contains(w)).unwrap_or(after.len());
        let value = after[..end].join("-");
        rest = &after[end..];
        let key = KEYS.iter().copied().find(|k| *k == key).unwrap_or("attr");
        if value.is_empty() {
            return Err(UsernameError::Empty(key));
        }
        match key {
            "pool" if pool.is_some() => return Err(UsernameError::Repeated("pool")),
            "pool" => pool = Some(value),
            "session" if params.session.is_some() => return Err(UsernameError::Repeated("session")),
            "session" => {
                let ok = value.len() <= MAX_NAME_LEN && value.chars().all(|c| name_char(c) || c == '-');
                if !ok {
                    return Err(UsernameError::BadSession);
                }
                params.session = Some(value);
            }
            "sesstime" if params.lifetime.is_some() => return Err(UsernameError::Repeated("sesstime")),
            "sesstime" => {
                let minutes = value
                    .parse::<u32>()
                    .ok()
                    .filter(|m| *m > 0)
                    .ok_or_else(|| UsernameError::BadLifetime(value.clone()))?;
                params.lifetime = Some(Duration::from_secs(u64::from(minutes) * 60));
            }
            _ => {
                let Some((k, v)) = value
                    .split_once('=')
                    .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                else {
                    return Err(UsernameError::BadAttribute(value));
                };
                params.selector.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    select_pool(&mut params.selector, pool.as_deref()).map_err(|e| UsernameError::BadPool(e.to_string()))?;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::resource::POOL_LABEL;

    #[test]
    fn every_parameter_with_dashes_in_values() {
        let p = parse("spider-1-pool-eu-west-1-session-a-b-sesstime-30-attr-cloud-region=eu-west").unwrap();
        assert_eq!(p.client.as_deref(), Some("spider-1"));
        assert_eq!(p.selector[POOL_LABEL], "eu-west-1");
        assert_eq!(p.selector["cloud-region"], "eu-west");
        assert_eq!(p.session.as_deref(), Some("a-b"));
        assert_eq!(p.lifetime, Some(Duration::from_secs(1800)));
    }

    #[test]
    fn plain_names_and_the_vendor_form() {
        assert_eq!(parse("").unwrap(), Parameters::default());
        assert_eq!(parse("crawler").unwrap().client.as_deref(), Some("crawler"));
        // The first word is the client's even when it spells a key.
        let p = parse("session-session-x").unwrap();
        assert_eq!(
            (p.client.as_deref(), p.session.as_deref()),
            (Some("session"), Some("x"))
        );
        let p = parse("user-session-abc-sesstime-10").unwrap();
        assert_eq!(p.session.as_deref(), Some("abc"));
        let p = parse("c-attr-a=1-attr-b=2").unwrap();
        assert_eq!(p.selector.len(), 2);
    }

    #[test]
    fn mistakes_are_named() {
        for (username, expected) in [
            ("c-pool", UsernameError::Empty("pool")),
            ("c-session-a-session-b", UsernameError::Repeated("session")),
            ("c-sesstime-0", UsernameError::BadLifetime("0".into())),
            ("c-sesstime-soon", UsernameError::BadLifetime("soon".into())),
            ("c-attr-novalue", UsernameError::BadAttribute("novalue".into())),
            ("c-session-a b", UsernameError::BadSession),
            ("bad client", UsernameError::BadClient),
            ("c--x", UsernameError::BadClient),
        ] {
            assert_eq!(parse(username), Err(expected), "{username}");
        }
        assert!(matches!(parse("c-pool-EU"), Err(UsernameError::BadPool(_))));
        assert!(parse(&"c".repeat(65)).is_err());
    }
}
