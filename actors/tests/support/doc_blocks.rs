//! The shell blocks of the user docs (README.md, CHANGELOG.md, docs/**/*.md),
//! each with what its page says about running it.
//!
//! A shell block is a fenced block whose info string is `sh`, `bash`,
//! `shell` or `console` (in a `console` block, lines starting with `$ ` are
//! the commands, the rest is output), or `python` (run with the Python
//! client's interpreter). The line just before its fence (blank lines
//! between are allowed) is a marker:
//!
//! ```text
//! <!-- doc-test: standalone -->              run, in page order, against the quickstart
//! <!-- doc-test: standalone background -->   started and left running for the rest of the page
//! <!-- doc-test: kubernetes -->              run, in page order, against the fake cluster
//! <!-- doc-test: kubernetes background -->
//! <!-- doc-test: standalone teardown -->     run after every page's blocks: undoes what the page started
//! <!-- doc-test: skip: needs a real GCP project -->   not run; the reason is required
//! ```
//!
//! A block without a marker, or with one that does not parse, fails the doc
//! test: every command a user is shown is either run or says why it cannot be.
//!
//! After a page's blocks, every Proxy must be `Ready` and every pool's
//! `Ready` condition true, unless the page (or an earlier one) expects
//! otherwise, and says why in prose, with a line of its own (not just
//! before a fence):
//!
//! ```text
//! <!-- doc-test: expect standalone proxy my-squid Unhealthy -->
//! <!-- doc-test: expect kubernetes proxy crawlers/partner-a Unhealthy -->
//! <!-- doc-test: expect standalone pool demo NotReady -->
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where a block runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bed {
    Standalone,
    Kubernetes,
}

/// What the marker before a block says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marker {
    /// Run in page order; `background`: started and left running until the
    /// page's blocks are done.
    Run { bed: Bed, background: bool },
    /// Run after the blocks of every page (in page order): how a page's
    /// background is stopped and cleaned up — an uninstall, say — which
    /// would pull the bed from under the pages that follow it.
    Teardown { bed: Bed },
    /// Not run, for the reason given (a real cloud, cluster or KVM host).
    Skip { reason: String },
}

/// One shell block of one page.
#[derive(Clone, Debug)]
pub struct ShellBlock {
    pub file: PathBuf,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The info string: `sh`, `bash`, `shell`, `console` or `python`.
    pub lang: String,
    /// `None`: no marker; `Some(Err)`: a marker that does not parse.
    pub marker: Option<Result<Marker, String>>,
    pub code: String,
}

impl ShellBlock {
    /// `file:line`, relative to the repository root, for failure messages.
    pub fn place(&self) -> String {
        let file = self.file.strip_prefix(repo_root()).unwrap_or(&self.file);
        format!("{}:{}", file.display(), self.line)
    }

    /// The commands of the block: a `console` block's `$ ` lines (with
    /// their `\` continuations), every line of the others.
    pub fn commands(&self) -> String {
        if self.lang != "console" {
            return self.code.clone();
        }
        let mut out = String::new();
        let mut continuing = false;
        for line in self.code.lines() {
            if let Some(command) = line.strip_prefix("$ ") {
                out.push_str(command);
                out.push('\n');
                continuing = command.trim_end().ends_with('\\');
            } else if continuing {
                out.push_str(line);
                out.push('\n');
                continuing = line.trim_end().ends_with('\\');
            }
        }
        out
    }

    /// The output a `console` block shows: its lines that are not commands
    /// (nothing for other blocks).
    pub fn sample_output(&self) -> Vec<String> {
        if self.lang != "console" {
            return Vec::new();
        }
        let mut output = Vec::new();
        let mut continuing = false;
        for line in self.code.lines() {
            if let Some(command) = line.strip_prefix("$ ") {
                continuing = command.trim_end().ends_with('\\');
            } else if continuing {
                continuing = line.trim_end().ends_with('\\');
            } else {
                output.push(line.to_owned());
            }
        }
        output
    }
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("actors/ lives in the repository root")
        .to_path_buf()
}

/// README.md, CHANGELOG.md (when present) and every Markdown file under docs/,
/// in a stable order.
pub fn user_docs() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs = vec![root.join("README.md")];
    if root.join("CHANGELOG.md").exists() {
        docs.push(root.join("CHANGELOG.md"));
    }
    let mut under_docs = Vec::new();
    collect_markdown(&root.join("docs"), &mut under_docs);
    under_docs.sort();
    docs.extend(under_docs);
    docs
}

fn collect_markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("docs/ is readable") {
        let path = entry.expect("a docs entry").path();
        if path.is_dir() {
            collect_markdown(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

const SHELL: &[&str] = &["sh", "bash", "shell", "console", "python"];

/// The shell blocks of one page, in order.
pub fn shell_blocks(file: &Path) -> Vec<ShellBlock> {
    let text = std::fs::read_to_string(file).expect("a readable doc");
    parse_shell_blocks(file, &text)
}

/// Every shell block of every user doc.
pub fn all_shell_blocks() -> Vec<ShellBlock> {
    user_docs().iter().flat_map(|f| shell_blocks(f)).collect()
}

pub fn parse_shell_blocks(file: &Path, text: &str) -> Vec<ShellBlock> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(fence) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let lang = trimmed.trim_start_matches(fence.chars().next().unwrap_or('`'));
        let lang = lang.split_whitespace().next().unwrap_or("").to_owned();
        let open = i;
        let mut code = String::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with(fence) {
            let line = lines[i];
            // Blocks inside list items are indented like their fence.
            code.push_str(line.get(indent.min(leading_spaces(line))..).unwrap_or(""));
            code.push('\n');
            i += 1;
        }
        i += 1;
        if SHELL.contains(&lang.as_str()) {
            blocks.push(ShellBlock {
                file: file.to_path_buf(),
                line: open + 1,
                lang,
                marker: marker_before(&lines, open),
                code,
            });
        }
    }
    blocks
}

fn leading_spaces(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn marker_before(lines: &[&str], fence: usize) -> Option<Result<Marker, String>> {
    let previous = lines[..fence].iter().rev().find(|l| !l.trim().is_empty())?;
    let inner = previous.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let spec = inner.strip_prefix("doc-test:")?.trim();
    Some(parse_marker(spec))
}

/// Parses what follows `doc-test:` in a marker.
pub fn parse_marker(spec: &str) -> Result<Marker, String> {
    if let Some(reason) = spec.strip_prefix("skip:") {
        let reason = reason.trim();
        return if reason.is_empty() {
            Err("`skip:` needs a reason (what the block needs that the tests do not have)".into())
        } else {
            Ok(Marker::Skip {
                reason: reason.to_owned(),
            })
        };
    }
    let mut words = spec.split_whitespace();
    let bed = match words.next() {
        Some("standalone") => Bed::Standalone,
        Some("kubernetes") => Bed::Kubernetes,
        other => {
            return Err(format!(
                "`{}`: expected `standalone`, `kubernetes` or `skip: <reason>`",
                other.unwrap_or("")
            ));
        }
    };
    let marker = match words.next() {
        None => Marker::Run {
            bed,
            background: false,
        },
        Some("background") => Marker::Run {
            bed,
            background: true,
        },
        Some("teardown") => Marker::Teardown { bed },
        Some(other) => {
            return Err(format!(
                "`{other}`: the modifiers are `background` and `teardown`"
            ));
        }
    };
    if let Some(extra) = words.next() {
        return Err(format!("`{extra}`: unexpected after the modifier"));
    }
    Ok(marker)
}

/// A phase a page expects an object to have at its end, other than `Ready`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expectation {
    pub bed: Bed,
    /// `proxy` or `pool`.
    pub kind: String,
    /// The object's name; `namespace/name` in Kubernetes.
    pub name: String,
    /// A Proxy's `status.phase`; a pool's `Ready` or `NotReady`.
    pub phase: String,
    /// 1-based line of the marker.
    pub line: usize,
}

/// The `expect` markers of a page (outside code blocks), or why one does not parse.
pub fn expectations(file: &Path) -> Vec<Result<Expectation, String>> {
    let text = std::fs::read_to_string(file).expect("a readable doc");
    parse_expectations(&text)
}

pub fn parse_expectations(text: &str) -> Vec<Result<Expectation, String>> {
    let mut fence: Option<&str> = None;
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(f) = fence {
            if trimmed.starts_with(f) {
                fence = None;
            }
            continue;
        }
        if let Some(f) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) {
            fence = Some(f);
            continue;
        }
        let Some(spec) = trimmed
            .strip_prefix("<!--")
            .and_then(|t| t.strip_suffix("-->"))
            .and_then(|t| t.trim().strip_prefix("doc-test:"))
            .and_then(|t| t.trim().strip_prefix("expect "))
        else {
            continue;
        };
        let words: Vec<&str> = spec.split_whitespace().collect();
        let parsed = match words.as_slice() {
            [bed, kind @ ("proxy" | "pool"), name, phase] => match *bed {
                "standalone" | "kubernetes" => Ok(Expectation {
                    bed: if *bed == "standalone" {
                        Bed::Standalone
                    } else {
                        Bed::Kubernetes
                    },
                    kind: (*kind).to_owned(),
                    name: (*name).to_owned(),
                    phase: (*phase).to_owned(),
                    line: n + 1,
                }),
                other => Err(format!(
                    "line {}: `{other}`: expected `standalone` or `kubernetes`",
                    n + 1
                )),
            },
            _ => Err(format!(
                "line {}: `expect {spec}`: expected `expect <standalone|kubernetes> <proxy|pool> <name> <phase>`",
                n + 1
            )),
        };
        found.push(parsed);
    }
    found
}

/// Proxies and pools whose state at the end of a page is not what the
/// pages so far expect: every Proxy `Ready` and every pool's `Ready`
/// condition true, but where an `expect` marker says otherwise. Names are
/// `namespace/name` when `namespaced` (Kubernetes).
pub fn unexpected_phases(
    namespaced: bool,
    proxies: &[serde_json::Value],
    pools: &[serde_json::Value],
    expected: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut check = |kind: &str, name: &str, phase: &str, detail: &str| {
        let want = expected
            .get(&(kind.to_owned(), name.to_owned()))
            .map_or("Ready", String::as_str);
        if phase != want {
            wrong.push(format!("{kind} {name} is {phase}, not {want}{detail}"));
        }
    };
    let name_of = |object: &serde_json::Value| {
        let name = object["metadata"]["name"].as_str().unwrap_or("");
        match object["metadata"]["namespace"].as_str() {
            Some(ns) if namespaced => format!("{ns}/{name}"),
            _ => name.to_owned(),
        }
    };
    for proxy in proxies {
        let name = &name_of(proxy);
        let phase = proxy["status"]["phase"].as_str().unwrap_or("(no phase)");
        let message = proxy["status"]["message"].as_str().unwrap_or("");
        check("proxy", name, phase, &format!(": {message}"));
    }
    for pool in pools {
        let name = &name_of(pool);
        let ready = pool["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        check("pool", name, if ready { "Ready" } else { "NotReady" }, "");
    }
    for (kind, name) in expected.keys() {
        let listed = if kind == "proxy" { proxies } else { pools };
        if !listed.iter().any(|o| name_of(o) == *name) {
            wrong.push(format!("{kind} {name} is expected but does not exist"));
        }
    }
    wrong
}

/// The fixed loopback ports a text names (`127.0.0.1:3128`,
/// `localhost:8090`, `[::1]:8888`), with the address to bind to check them.
pub fn named_ports(text: &str) -> BTreeSet<SocketAddr> {
    let mut found = BTreeSet::new();
    for (host, ip) in [
        ("127.0.0.1:", "127.0.0.1"),
        ("localhost:", "127.0.0.1"),
        ("[::1]:", "[::1]"),
    ] {
        for (at, _) in text.match_indices(host) {
            let after = &text[at + host.len()..];
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '.') {
                continue;
            }
            if let Ok(port) = digits.parse::<u16>()
                && port > 0
                && let Ok(addr) = format!("{ip}:{port}").parse()
            {
                found.insert(addr);
            }
        }
    }
    found
}
