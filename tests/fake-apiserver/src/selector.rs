//! Label selectors as the API server parses them: equality (`k=v`, `k==v`,
//! `k!=v`) and set-based (`k in (a,b)`, `k notin (a,b)`, `k`, `!k`),
//! comma-separated, all of which must match.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            out.push(requirement(part)?);
        }
        Ok(Selector(out))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn values(list: &str) -> Result<Vec<String>, String> {
    let inner = list
        .trim()
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised list, got {list:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(key.trim().to_owned()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok(Requirement::Equals(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok(Requirement::Equals(k.trim().to_owned(), v.trim().to_owned()));
    }
    let words: Vec<&str> = part.splitn(3, ' ').collect();
    match words.as_slice() {
        [key] => Ok(Requirement::Exists(key.trim().to_owned())),
        [key, "in", rest] => Ok(Requirement::In(key.to_string(), values(rest)?)),
        [key, "notin", rest] => Ok(Requirement::NotIn(key.to_string(), values(rest)?)),
        _ => Err(format!("unable to parse requirement {part:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_and_set_based() {
        let l = labels(&[("app", "proxy"), ("tier", "edge")]);
        for (sel, want) in [
            ("", true),
            ("app=proxy", true),
            ("app==proxy", true),
            ("app!=proxy", false),
            ("app=proxy,tier=edge", true),
            ("app=proxy,tier=core", false),
            ("tier in (edge, core)", true),
            ("tier notin (edge)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app in (proxy),!missing,tier!=core", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(Selector::parse("tier in edge").is_err());
    }
}
