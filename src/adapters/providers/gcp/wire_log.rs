//! What the wire log may show of a request or response body: strings over
//! 1 KiB are elided unless full payloads were asked for, and the instance's
//! cloud-init (`user-data` metadata) is never shown at all — it carries
//! secrets. Tokens never reach this point (they travel in a header the wire
//! log does not print).

use serde_json::Value;

use super::body::USER_DATA_KEY;

/// Strings longer than this are elided by default.
pub const ELIDE_OVER: usize = 1024;

/// A copy of `body` fit for the log.
pub fn loggable(body: &Value, full_payloads: bool) -> Value {
    match body {
        Value::String(s) if !full_payloads && s.len() > ELIDE_OVER => {
            Value::String(format!("<{} bytes elided>", s.len()))
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| loggable(v, full_payloads)).collect()),
        Value::Object(map) => {
            let is_user_data = map.get("key").and_then(Value::as_str) == Some(USER_DATA_KEY);
            Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let shown = match (k.as_str(), v) {
                            ("value", Value::String(s)) if is_user_data => {
                                Value::String(format!("<cloud-init, {} bytes, redacted>", s.len()))
                            }
                            _ => loggable(v, full_payloads),
                        };
                        (k.clone(), shown)
                    })
                    .collect(),
            )
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_strings_are_elided_unless_full_payloads() {
        let long = "x".repeat(ELIDE_OVER + 1);
        let edge = "y".repeat(ELIDE_OVER);
        let body = json!({"a": long, "b": [edge, {"c": long}], "n": 3, "t": true});
        let shown = loggable(&body, false);
        assert_eq!(shown["a"], "<1025 bytes elided>");
        assert_eq!(shown["b"][0], edge.as_str(), "exactly 1 KiB is kept");
        assert_eq!(shown["b"][1]["c"], "<1025 bytes elided>");
        assert_eq!((&shown["n"], &shown["t"]), (&json!(3), &json!(true)));
        assert_eq!(loggable(&body, true), body);
    }

    #[test]
    fn cloud_init_is_never_shown_even_with_full_payloads() {
        let body = json!({"metadata": {"items": [
            {"key": "user-data", "value": "#cloud-config\npassword: hunter2\n"},
            {"key": "enable-oslogin", "value": "TRUE"},
        ]}});
        for full in [false, true] {
            let text = loggable(&body, full).to_string();
            assert!(!text.contains("hunter2"), "{text}");
            let redacted = format!(
                "<cloud-init, {} bytes, redacted>",
                "#cloud-config\npassword: hunter2\n".len()
            );
            assert!(text.contains(&redacted) && text.contains("TRUE"), "{text}");
        }
    }
}
