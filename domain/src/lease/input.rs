//! Bounds and shapes of what clients send to the lease API. Every limit is a
//! constant here because the OpenAPI document states the same numbers and
//! patterns: the server must reject exactly what the document forbids.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

/// Longest target: a DNS name's 253 characters.
pub const MAX_TARGET_LEN: usize = 253;
/// Attribute pairs in one selector (or `attr` filters in one listing).
pub const MAX_SELECTOR_PAIRS: usize = 16;
/// Longest attribute key, in characters.
pub const MAX_ATTRIBUTE_KEY_CHARS: usize = 128;
/// Longest attribute value, in characters.
pub const MAX_ATTRIBUTE_VALUE_CHARS: usize = 256;
/// Longest report `detail`, in characters (longer ones are refused, not cut).
pub const MAX_DETAIL_CHARS: usize = 1024;
/// Longest `client` name, in characters.
pub const MAX_CLIENT_CHARS: usize = 128;
/// Largest `ttlSeconds` a request may name (one day); the server's
/// maximum TTL then caps it.
pub const MAX_TTL_SECONDS: u64 = 86_400;

/// One label of a host name: letters, digits, `-` and `_`, not starting or
/// ending with `-`, at most 63 characters.
const LABEL: &str = "[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?";
const HEX: &str = "[0-9A-Fa-f]{1,4}";

/// The pattern the OpenAPI document states for `target` (with
/// `maxLength` [`MAX_TARGET_LEN`]): a host name, or an IPv6 address in hex
/// groups (IPv4 literals are host names by this rule). No port, no brackets.
pub fn target_pattern() -> String {
    let host = format!("{LABEL}(?:\\.{LABEL})*");
    let h = HEX;
    let ipv6 = [
        format!("(?:{h}:){{7}}{h}"),
        format!("(?:{h}:){{1,7}}:"),
        format!("(?:{h}:){{1,6}}:{h}"),
        format!("(?:{h}:){{1,5}}(?::{h}){{1,2}}"),
        format!("(?:{h}:){{1,4}}(?::{h}){{1,3}}"),
        format!("(?:{h}:){{1,3}}(?::{h}){{1,4}}"),
        format!("(?:{h}:){{1,2}}(?::{h}){{1,5}}"),
        format!("{h}:(?::{h}){{1,6}}"),
        format!(":(?:(?::{h}){{1,7}}|:)"),
    ]
    .join("|");
    format!("^(?:{host}|{ipv6})$")
}

/// The pattern of one `attr` query filter: `key=value`, the key without `=`.
pub fn attr_filter_pattern() -> String {
    format!("^[^=]{{1,{MAX_ATTRIBUTE_KEY_CHARS}}}=[\\s\\S]{{0,{MAX_ATTRIBUTE_VALUE_CHARS}}}$")
}

/// What is wrong with a request, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("target must not be empty")]
    EmptyTarget,
    #[error("target is {0} bytes long; at most {MAX_TARGET_LEN} are allowed")]
    TargetTooLong(usize),
    #[error(
        "target {0:?} is neither a host name (labels of letters, digits, '-' and '_', at most 63 characters each, \
         no port) nor an IPv6 address"
    )]
    BadTarget(String),
    #[error("{field} has {count} pairs; at most {MAX_SELECTOR_PAIRS} are allowed")]
    TooManyPairs { field: &'static str, count: usize },
    #[error("{field} key must be 1 to {MAX_ATTRIBUTE_KEY_CHARS} characters (got {chars})")]
    BadKey { field: &'static str, chars: usize },
    #[error(
        "{field} value of {key:?} is {chars} characters; at most {MAX_ATTRIBUTE_VALUE_CHARS} are allowed"
    )]
    LongValue {
        field: &'static str,
        key: String,
        chars: usize,
    },
    #[error("detail is {0} characters; at most {MAX_DETAIL_CHARS} are allowed")]
    LongDetail(usize),
    #[error(
        "client names `gateway` and `gateway/...` are the gateway's own (its leases are released when the operator restarts)"
    )]
    ReservedClient,
    #[error("client is {0} characters; at most {MAX_CLIENT_CHARS} are allowed")]
    LongClient(usize),
    #[error("ttlSeconds must be between 1 and {MAX_TTL_SECONDS} (got {0})")]
    BadTtl(u64),
    #[error(
        "pool {0:?} is not a ProxyPool name (lower-case letters, digits, '-' and '.', \
         starting and ending with a letter or digit, at most 253 characters)"
    )]
    BadPool(String),
    #[error("selector's {key} is {selected:?}, but pool is {pool:?}")]
    PoolConflict {
        key: &'static str,
        selected: String,
        pool: String,
    },
}

/// Longest ProxyPool name (a DNS subdomain).
pub const MAX_POOL_LEN: usize = 253;

/// The pattern the OpenAPI document states for `pool`.
pub const POOL_PATTERN: &str = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";

/// Adds `pool` to the selector as the attribute every member of the pool
/// carries; a selector naming another pool contradicts it.
pub fn select_pool(selector: &mut BTreeMap<String, String>, pool: Option<&str>) -> Result<(), InputError> {
    let Some(pool) = pool else {
        return Ok(());
    };
    let b = pool.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid = !b.is_empty()
        && b.len() <= MAX_POOL_LEN
        && b.iter().all(|c| inner(c) || *c == b'-' || *c == b'.')
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner);
    if !valid {
        return Err(InputError::BadPool(preview(pool)));
    }
    let key = crate::resource::POOL_LABEL;
    match selector.get(key) {
        Some(selected) if selected != pool => Err(InputError::PoolConflict {
            key,
            selected: preview(selected),
            pool: pool.to_owned(),
        }),
        _ => {
            selector.insert(key.to_owned(), pool.to_owned());
            Ok(())
        }
    }
}

fn is_label(label: &str) -> bool {
    let b = label.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| inner(c) || *c == b'-')
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
}

/// Checks a target and returns its canonical form: host names in lower case
/// (DNS is case-insensitive, so `Shop.Example` rests with `shop.example`),
/// IPv6 addresses in their shortest form.
pub fn normalize_target(target: &str) -> Result<String, InputError> {
    if target.is_empty() {
        return Err(InputError::EmptyTarget);
    }
    if target.len() > MAX_TARGET_LEN {
        return Err(InputError::TargetTooLong(target.len()));
    }
    if target.split('.').all(is_label) {
        return Ok(target.to_ascii_lowercase());
    }
    // Hex groups only: the pattern leaves out the dotted-quad tail IPv6 allows.
    if target.contains(':')
        && target.bytes().all(|c| c.is_ascii_hexdigit() || c == b':')
        && let Ok(addr) = target.parse::<Ipv6Addr>()
    {
        return Ok(addr.to_string());
    }
    Err(InputError::BadTarget(preview(target)))
}

/// At most 64 characters of a rejected value, for the error message.
fn preview(value: &str) -> String {
    value.chars().take(64).collect()
}

/// Checks a selector (or the `attr` filters of a listing, `field` naming which).
pub fn check_attributes(field: &'static str, pairs: &BTreeMap<String, String>) -> Result<(), InputError> {
    if pairs.len() > MAX_SELECTOR_PAIRS {
        return Err(InputError::TooManyPairs {
            field,
            count: pairs.len(),
        });
    }
    for (k, v) in pairs {
        check_pair(field, k, v)?;
    }
    Ok(())
}

/// Checks one attribute pair.
pub fn check_pair(field: &'static str, key: &str, value: &str) -> Result<(), InputError> {
    let chars = key.chars().count();
    if chars == 0 || chars > MAX_ATTRIBUTE_KEY_CHARS {
        return Err(InputError::BadKey { field, chars });
    }
    let chars = value.chars().count();
    if chars > MAX_ATTRIBUTE_VALUE_CHARS {
        return Err(InputError::LongValue {
            field,
            key: preview(key),
            chars,
        });
    }
    Ok(())
}

pub fn check_detail(detail: Option<&str>) -> Result<(), InputError> {
    match detail.map(|d| d.chars().count()) {
        Some(n) if n > MAX_DETAIL_CHARS => Err(InputError::LongDetail(n)),
        _ => Ok(()),
    }
}

pub fn check_client(client: Option<&str>) -> Result<(), InputError> {
    match client.map(|c| c.chars().count()) {
        Some(n) if n > MAX_CLIENT_CHARS => Err(InputError::LongClient(n)),
        _ if client.is_some_and(super::is_gateway_client) => Err(InputError::ReservedClient),
        _ => Ok(()),
    }
}

pub fn check_ttl(ttl_seconds: Option<u64>) -> Result<(), InputError> {
    match ttl_seconds {
        Some(t) if t == 0 || t > MAX_TTL_SECONDS => Err(InputError::BadTtl(t)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn schema_accepts(validator: &jsonschema::Validator, s: &str) -> bool {
        validator.is_valid(&json!(s))
    }

    fn target_validator() -> &'static jsonschema::Validator {
        static V: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| {
            jsonschema::validator_for(&json!({
                "type": "string", "minLength": 1, "maxLength": MAX_TARGET_LEN, "pattern": target_pattern()
            }))
            .unwrap()
        });
        &V
    }

    #[test]
    fn targets_accepted_and_refused() {
        for (ok, canonical) in [
            ("shop.example", "shop.example"),
            ("Shop.Example", "shop.example"),
            ("a", "a"),
            ("x_y.example-1.org", "x_y.example-1.org"),
            ("192.0.2.7", "192.0.2.7"),
            ("2001:DB8:0:0::1", "2001:db8::1"),
            ("::1", "::1"),
            ("::", "::"),
        ] {
            assert_eq!(normalize_target(ok).as_deref(), Ok(canonical), "{ok}");
        }
        let long = format!("{}.example", "a".repeat(250));
        for bad in [
            "shop.example:443",
            "http://shop.example",
            "shop.example.",
            "-shop.example",
            "shop..example",
            "shop example",
            "[::1]",
            "::ffff:192.0.2.7",
            "1:2:3:4:5:6:7:8:9",
            &long,
            &"a".repeat(64),
        ] {
            assert!(normalize_target(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(normalize_target(""), Err(InputError::EmptyTarget));
        assert_eq!(normalize_target(&long), Err(InputError::TargetTooLong(258)));
    }

    #[test]
    fn the_documented_attr_pattern_is_what_the_server_splits() {
        let v =
            jsonschema::validator_for(&json!({"type": "string", "pattern": attr_filter_pattern()})).unwrap();
        for (s, ok) in [
            ("geo=eu", true),
            ("geo=", true),
            ("k=v=w", true),
            ("=v", false),
            ("geo", false),
            ("", false),
        ] {
            assert_eq!(schema_accepts(&v, s), ok, "{s}");
            let server = s
                .split_once('=')
                .is_some_and(|(k, v)| check_pair("attr", k, v).is_ok());
            assert_eq!(server, ok, "{s}");
        }
        let key = "k".repeat(MAX_ATTRIBUTE_KEY_CHARS + 1);
        assert!(!schema_accepts(&v, &format!("{key}=v")));
        assert!(check_pair("attr", &key, "v").is_err());
        let value = "é".repeat(MAX_ATTRIBUTE_VALUE_CHARS);
        assert!(schema_accepts(&v, &format!("k={value}")), "characters, not bytes");
        assert!(check_pair("attr", "k", &value).is_ok());
    }

    #[test]
    fn bounds_name_the_field() {
        let many: BTreeMap<String, String> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(
            check_attributes("selector", &many).unwrap_err().to_string(),
            "selector has 17 pairs; at most 16 are allowed"
        );
        assert!(check_detail(Some(&"d".repeat(MAX_DETAIL_CHARS))).is_ok());
        assert_eq!(
            check_detail(Some(&"d".repeat(MAX_DETAIL_CHARS + 1))),
            Err(InputError::LongDetail(1025))
        );
        assert!(check_client(Some(&"c".repeat(129))).is_err());
        assert!(check_client(Some("gateway")).is_err());
        assert!(check_client(Some("gateway/spider")).is_err());
        assert!(check_client(Some("gateways")).is_ok());
        assert_eq!(check_ttl(Some(0)), Err(InputError::BadTtl(0)));
        assert!(check_ttl(Some(MAX_TTL_SECONDS)).is_ok());
        assert!(check_ttl(Some(MAX_TTL_SECONDS + 1)).is_err());
    }

    fn pattern_strings() -> impl Strategy<Value = String> {
        let pattern = target_pattern();
        proptest::string::string_regex(pattern.trim_start_matches('^').trim_end_matches('$')).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        /// The server accepts a target exactly when the OpenAPI schema does:
        /// random strings over the characters that matter.
        #[test]
        fn server_and_schema_agree_on_any_string(s in "[0-9a-fA-F:.xg_ -]{0,42}") {
            let v = target_validator();
            prop_assert_eq!(normalize_target(&s).is_ok(), schema_accepts(v, &s), "{:?}", s);
        }

        /// ... and on strings the schema's own pattern produces (every IPv6 shape, long names).
        #[test]
        fn server_accepts_what_the_pattern_generates(s in pattern_strings()) {
            let v = target_validator();
            prop_assert_eq!(normalize_target(&s).is_ok(), schema_accepts(v, &s), "{:?}", s);
        }
    }

    #[test]
    fn a_pool_selects_its_members_and_a_contradicting_selector_is_named() {
        let key = crate::resource::POOL_LABEL;
        let mut selector = BTreeMap::from([("geo".to_owned(), "eu".to_owned())]);
        select_pool(&mut selector, Some("eu-west.1")).unwrap();
        assert_eq!(selector[key], "eu-west.1");
        select_pool(&mut selector, None).unwrap();
        let err = select_pool(&mut selector, Some("us")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("selector's {key} is \"eu-west.1\", but pool is \"us\"")
        );
        let pattern = jsonschema::validator_for(&json!({"type": "string", "pattern": POOL_PATTERN})).unwrap();
        for bad in ["", "EU", "-eu", "eu-", "e_u", "e u", &"a".repeat(254)] {
            assert!(matches!(
                select_pool(&mut BTreeMap::new(), Some(bad)),
                Err(InputError::BadPool(_))
            ));
            assert!(
                !schema_accepts(&pattern, bad) || bad.len() > MAX_POOL_LEN,
                "{bad:?}"
            );
        }
        assert!(schema_accepts(&pattern, "eu-west.1"));
    }
}
