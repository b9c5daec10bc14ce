//! Turning what an instance left behind (a log, a status) into a short,
//! readable reason for the Proxy's message.

/// `text` cut to `max` characters, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The last `n` lines that report an error (`FATAL`, `ERROR`, `error:`, a
/// panic, Squid's "Bungled" config lines), else the last `n` lines.
pub fn telling_lines<'a>(lines: &[&'a str], n: usize) -> Vec<&'a str> {
    let flagged: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            ["FATAL", "ERROR", "error:", "panicked", "Bungled"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    let chosen = if flagged.is_empty() { lines } else { &flagged[..] };
    chosen[chosen.len().saturating_sub(n)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_by_characters_and_prefers_error_lines() {
        assert_eq!(clip("héllo", 3), "hél…");
        assert_eq!(clip("hi", 3), "hi");
        assert_eq!(telling_lines(&["a", "FATAL: x", "b"], 2), ["FATAL: x"]);
        assert_eq!(telling_lines(&["a", "b", "c"], 2), ["b", "c"]);
    }
}
