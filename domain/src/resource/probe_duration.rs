//! The health check's durations (`interval`, `timeout`): their spelling and
//! their bounds, checked the same way by the CRD (a schema pattern plus CEL
//! rules the API server evaluates) and by the operator at runtime (the
//! embedded store has no API server, and an object stored before the CRD
//! gained its rules must not slip through).
//!
//! Spelling: whole numbers with the units `h`, `m`, `s` and `ms`, one after
//! another (`1s`, `500ms`, `1m30s`). That is the part of Go's duration
//! syntax, which CEL's `duration()` reads, that needs no explanation.

use std::time::Duration;

/// The shortest probe interval: below it a few Proxies would keep every
/// probe worker busy.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest probe interval (a day): a proxy probed more rarely is not
/// watched at all, and timers far in the future only hide mistakes.
pub const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// The longest a probe may take: a worker waiting on one proxy serves no other.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// One of the two duration fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Interval,
    Timeout,
}

impl Field {
    pub fn name(self) -> &'static str {
        match self {
            Field::Interval => "interval",
            Field::Timeout => "timeout",
        }
    }

    /// The inclusive range the field's value must lie in.
    fn bounds(self) -> (Duration, Duration) {
        match self {
            Field::Interval => (MIN_INTERVAL, MAX_INTERVAL),
            Field::Timeout => (Duration::from_millis(1), MAX_TIMEOUT),
        }
    }
}

/// A health-check duration that is misspelt or out of bounds.
#[derive(Debug, thiserror::Error)]
#[error("healthCheck.{field} {problem} (got {value:?})")]
pub struct DurationError {
    pub field: &'static str,
    pub value: String,
    pub problem: String,
}

/// Parses and bounds-checks `value` of `field`.
pub fn parse(field: Field, value: &str) -> Result<Duration, DurationError> {
    let error = |problem: String| DurationError {
        field: field.name(),
        value: value.to_owned(),
        problem,
    };
    let parsed = spelled(value)
        .ok_or_else(|| error("must be whole numbers with h, m, s or ms, like 500ms, 1s or 1m30s".into()))?;
    // Worded as the CRD's rule, so both stores answer alike.
    let (min, max) = field.bounds();
    if parsed < min || parsed > max {
        return Err(error(format!("must be between {} and {}", show(min), show(max))));
    }
    Ok(parsed)
}

/// `value` read per the fields' schema pattern `^([0-9]+(h|m|s|ms))+$`;
/// `None` when it does not match. ProxyPool durations share the spelling.
pub(crate) fn spelled(value: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = value;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, millis) = [("ms", 1), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)]
            .into_iter()
            .find(|(unit, _)| rest.starts_with(unit))?;
        rest = &rest[unit.len()..];
        total = total.checked_add(Duration::from_millis(number.checked_mul(millis)?))?;
    }
    Some(total)
}

/// A bound as the CRD's rules spell it.
fn show(bound: Duration) -> String {
    if bound.subsec_millis() != 0 || bound.as_secs() == 0 {
        format!("{}ms", bound.as_millis())
    } else if bound.as_secs().is_multiple_of(3600) {
        format!("{}h", bound.as_secs() / 3600)
    } else {
        format!("{}s", bound.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spelling_follows_the_pattern() {
        for (value, millis) in [
            ("1s", 1000),
            ("500ms", 500),
            ("1m30s", 90_000),
            ("2h", 7_200_000),
            ("1s1s", 2000),
        ] {
            assert_eq!(spelled(value), Some(Duration::from_millis(millis)), "{value}");
        }
        for value in [
            "",
            "s",
            "1",
            "1.5s",
            "1 s",
            "-1s",
            "1min",
            "1d",
            "1sm",
            "1µs",
            "99999999999999999999h",
        ] {
            assert_eq!(spelled(value), None, "{value}");
        }
    }

    #[test]
    fn bounds_name_the_field_and_the_limit() {
        assert_eq!(parse(Field::Interval, "1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse(Field::Timeout, "30s").unwrap(), Duration::from_secs(30));
        let message = |field, value| parse(field, value).unwrap_err().to_string();
        assert_eq!(
            message(Field::Interval, "999ms"),
            "healthCheck.interval must be between 1s and 24h (got \"999ms\")"
        );
        assert_eq!(
            message(Field::Interval, "24h1s"),
            "healthCheck.interval must be between 1s and 24h (got \"24h1s\")"
        );
        assert_eq!(
            message(Field::Timeout, "31s"),
            "healthCheck.timeout must be between 1ms and 30s (got \"31s\")"
        );
        assert_eq!(
            message(Field::Timeout, "0s"),
            "healthCheck.timeout must be between 1ms and 30s (got \"0s\")"
        );
        assert!(message(Field::Interval, "often").starts_with("healthCheck.interval must be whole numbers"));
    }
}
