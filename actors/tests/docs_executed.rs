//! The user docs, executed (README.md, CHANGELOG.md, docs/**/*.md):
//!
//! - every shell block carries a doc-test marker that parses
//!   (`support::doc_blocks`);
//! - every relative link between them resolves, `#anchors` included, by
//!   GitHub's heading slugs;
//! - the `standalone` blocks run as a user would run them, against the
//!   README's quickstart.
//!
//! How the standalone blocks run:
//!
//! - In a copy of the repository (without `.git` and build output) in a
//!   temporary directory, with a clean environment (`PATH`, `HOME`,
//!   `TMPDIR`, `LANG`): nothing of the test runner's (a `DISCOVERY_TOKEN`,
//!   say) changes what a block does.
//! - `cargo run [--release] [-q] -- ARGS` is the operator binary the tests
//!   built, with ARGS (a `cargo` first on `PATH`; any other cargo command
//!   fails the block), and `egress-proxies-operator` is that binary too.
//!   `bash tests/system-packages.sh build` runs as written: where the tests
//!   were built, the packages it checks for are installed and it does nothing.
//! - The README's first `standalone background` block is the quickstart: it
//!   is started first, in a shell of its own, and the blocks wait until it
//!   serves `/healthz` and its Managed proxies are Ready. It listens where it
//!   is shipped to (127.0.0.1:8081, :8090, :8082, the gateway's :8888); no other test uses those
//!   ports, and this one test runs every page, one after another.
//! - Then each page's `standalone` blocks run in page order, README first,
//!   in one `bash -euo pipefail` session per page starting in the copy's
//!   root: a block sees the variables and working directory the page's
//!   earlier blocks left. A block that fails, or runs over a minute, fails
//!   the test naming its `file:line`, with its stdout and stderr. Of a
//!   `console` block only the `$ ` lines run, and the output it shows must
//!   have as many lines as the run printed and the same first line.
//! - Other `background` blocks start in a shell of their own in the copy's
//!   root and are stopped when their page's blocks are done; one that ended
//!   with an error by then fails the test.
//! - After each page, once the operator has read the manifests again, no
//!   Proxy may be `Failed`.
//! - Last, the `standalone teardown` blocks run (the README's: how to stop
//!   the quickstart's proxies), the quickstart gets Ctrl-C (SIGINT), and no
//!   process may be left: none under the temporary directory, none that
//!   `tests/leftover-processes.sh` would find, nothing on the four ports.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use support::doc_blocks::{self, Bed, Marker, ShellBlock};
use support::operator::BIN;
use support::process::{Reaper, processes_under};

/// How long one block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the quickstart may take to serve and bring its proxies to Ready.
const QUICKSTART_TIMEOUT: Duration = Duration::from_secs(90);

#[test]
fn every_shell_block_is_marked() {
    let mut problems = Vec::new();
    for block in doc_blocks::all_shell_blocks() {
        match &block.marker {
            None => problems.push(format!("{}: no `<!-- doc-test: ... -->` marker", block.place())),
            Some(Err(why)) => problems.push(format!("{}: {why}", block.place())),
            Some(Ok(_)) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "every shell block needs a marker on the line before its fence \
         (standalone, kubernetes, [background|teardown], or skip: <reason>):\n{}",
        problems.join("\n")
    );
}

#[test]
fn relative_links_between_docs_resolve() {
    let root = doc_blocks::repo_root();
    let mut broken = Vec::new();
    let mut anchors_of: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for doc in doc_blocks::user_docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (line, target) in links(&text) {
            let place = format!("{}:{line}", doc.strip_prefix(&root).unwrap().display());
            let (path, anchor) = target
                .split_once('#')
                .map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = if path.is_empty() {
                doc.clone()
            } else {
                let file = doc.parent().unwrap().join(path);
                match file.canonicalize() {
                    Ok(file) if file.starts_with(&root) => file,
                    _ => {
                        broken.push(format!("{place}: `{target}`: no such file in the repository"));
                        continue;
                    }
                }
            };
            let Some(anchor) = anchor else { continue };
            if file.extension().is_some_and(|e| e == "md") {
                let known = anchors_of
                    .entry(file.clone())
                    .or_insert_with(|| anchors(&std::fs::read_to_string(&file).unwrap_or_default()));
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{place}: `{target}`: no heading or anchor `#{anchor}` there"
                    ));
                }
            } else if !is_line_anchor(anchor) {
                broken.push(format!(
                    "{place}: `{target}`: only `#L<n>` anchors point into a non-Markdown file"
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken relative links:\n{}", broken.join("\n"));
}

/// The lines of a Markdown text outside fenced code blocks, with their
/// 0-based numbers.
fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    text.lines().enumerate().filter(move |(_, line)| {
        let trimmed = line.trim_start();
        if let Some(f) = fence {
            if trimmed.starts_with(f) {
                fence = None;
            }
            return false;
        }
        if let Some(f) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) {
            fence = Some(f);
            return false;
        }
        true
    })
}

/// The relative link targets of a Markdown text, with their 1-based lines:
/// inline links and images `[text](target)` and reference definitions
/// `[name]: target`, outside code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose_lines(text) {
        let prose = without_code_spans(line);
        let mut targets = Vec::new();
        if let Some(rest) = prose.trim_start().strip_prefix('[')
            && let Some((_, after)) = rest.split_once("]:")
        {
            targets.push(after.split_whitespace().next().unwrap_or("").to_owned());
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let mut depth = 0;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' if depth == 0 => return true,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    false
                })
                .map_or(after.len(), |(i, _)| i);
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.trim_start_matches('<').trim_end_matches('>').to_owned());
            rest = &after[end..];
        }
        for target in targets {
            let scheme = target.split_once(':').is_some_and(|(s, _)| {
                !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
            });
            if !target.is_empty() && !scheme {
                found.push((n + 1, target));
            }
        }
    }
    found
}

fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join("")
}

fn is_line_anchor(anchor: &str) -> bool {
    let line = |s: &str| {
        s.strip_prefix('L')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    match anchor.split_once('-') {
        Some((from, to)) => line(from) && line(to),
        None => line(anchor),
    }
}

/// The anchors GitHub makes for a Markdown text: one per heading (its
/// slug, `-1`, `-2`... for repeats) and each `<a id="...">`/`name`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (_, line) in prose_lines(text) {
        for attr in ["id=\"", "name=\""] {
            for (at, _) in line.match_indices(&format!("<a {attr}")) {
                let value = &line[at + 3 + attr.len()..];
                if let Some((value, _)) = value.split_once('"') {
                    anchors.insert(value.to_owned());
                }
            }
        }
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !trimmed[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(trimmed[hashes..].trim().trim_end_matches('#').trim());
        let repeats = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *repeats == 0 {
            base.clone()
        } else {
            format!("{base}-{repeats}")
        });
        *repeats += 1;
    }
    anchors
}

/// GitHub's slug of a heading: its text as rendered (no code ticks, link
/// targets or emphasis), lower case, without punctuation but `-` and `_`,
/// each space a `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](target) renders as text.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .split_once("](")
            .and_then(|(inner, tail)| Some((inner, tail.split_once(')')?.1)))
        {
            Some((inner, tail)) => {
                text.push_str(inner);
                rest = tail;
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("Lease API (`actors/benches/lease_api.rs`)"),
        "lease-api-actorsbencheslease_apirs"
    );
    assert_eq!(slug("Local (standalone mode)"), "local-standalone-mode");
    assert_eq!(slug("See [the API](api.md) — v1"), "see-the-api--v1");
    let anchors = anchors("# A\n## A\n```sh\n# not a heading\n```\n<a id=\"x\"></a>\n## B?\n");
    assert_eq!(
        anchors,
        ["a", "a-1", "b", "x"].into_iter().map(String::from).collect()
    );
    let found = links(
        "[a](x.md#y) `[b](no.md)` [c](https://e.org) ![d](p.png)\n[r]: ../z.md\n```\n[e](no.md)\n```\n",
    );
    assert_eq!(
        found,
        vec![(1, "x.md#y".into()), (1, "p.png".into()), (2, "../z.md".into())]
    );
}

// ---------------------------------------------------------------------------
// The standalone runner.

/// A copy of the repository (no `.git`, no build output) with the doc
/// test's `cargo` and `egress-proxies-operator` first on `PATH`, where the
/// blocks run; everything under it is reaped when it goes.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = doc_blocks::repo_root();
        copy_tree(&root, &root, &dir.path().join("repo"));
        for sub in ["bin", "home", "tmp", "run"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let bin = dir.path().join("bin");
        std::os::unix::fs::symlink(BIN, bin.join("egress-proxies-operator")).unwrap();
        let cargo = bin.join("cargo");
        std::fs::write(&cargo, CARGO_SHIM.replace("@BIN@", BIN)).unwrap();
        std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn repo(&self) -> PathBuf {
        self.path().join("repo")
    }

    fn quickstart_config(&self) -> PathBuf {
        self.repo().join("config/standalone/quickstart.yaml")
    }

    /// `bash -euo pipefail` with the doc test's environment: a clean one
    /// (the runner's variables do not leak into what a user would see),
    /// in the copy's root, in a process group of its own.
    fn bash(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail"]).args(args);
        cmd.env_clear()
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.path().join("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("HOME", self.path().join("home"))
            .env("TMPDIR", self.path().join("tmp"))
            .env("LANG", "C.UTF-8")
            .current_dir(self.repo())
            .process_group(0);
        cmd
    }

    /// The Proxies of the running quickstart, as `get proxies -o json` lists them.
    fn proxies(&self) -> Result<Vec<serde_json::Value>, String> {
        let out = Command::new(BIN)
            .args(["get", "proxies", "-o", "json", "--config"])
            .arg(self.quickstart_config())
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }
}

/// `cargo run [--release] [-q] -- ARGS` in a block is the operator binary
/// the tests built, run with ARGS; any other cargo command is refused.
const CARGO_SHIM: &str = r#"#!/usr/bin/env bash
# The doc test's cargo: `cargo run [--release] [-q] -- ARGS` runs the built operator.
set -euo pipefail
if [ "${1-}" != run ]; then
  echo "doc test: only \`cargo run [--release] [-q] -- ARGS\` runs in a doc block, not \`cargo $*\`" >&2
  exit 127
fi
shift
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
  case $1 in
    --release|-q|--quiet) shift ;;
    *) echo "doc test: \`cargo run $1\` is not supported in a doc block" >&2; exit 127 ;;
  esac
done
[ "$#" -gt 0 ] && shift
exec "@BIN@" "$@"
"#;

/// What the copy of the repository leaves out: git's data, build output,
/// and the state of a quickstart run in this checkout (its Proxies and
/// their processes are someone else's).
const NOT_COPIED: &[&str] = &[".git", "target", "config/standalone/state"];

/// Copies the repository at `root`, from its directory `from`, to `to`.
fn copy_tree(root: &Path, from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if NOT_COPIED.iter().any(|skip| entry.path() == root.join(skip)) {
            continue;
        }
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(root, &entry.path(), &to.join(&name));
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path()).unwrap(), to.join(&name)).unwrap();
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// A process group started by the runner: a background block, or a page's
/// shell session. Killed with the group when dropped.
struct Group {
    child: Child,
    place: String,
    out: PathBuf,
    err: PathBuf,
}

impl Group {
    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    fn output(&self) -> String {
        output(&self.out, &self.err)
    }

    /// SIGINT to the group, as Ctrl-C in its terminal; then its leader's exit.
    async fn interrupt(&mut self) {
        let _ = killpg(self.pgid(), Signal::SIGINT);
        let child = &mut self.child;
        support::eventually(
            &format!("{} to exit after Ctrl-C", self.place),
            Duration::from_secs(30),
            async || child.try_wait().unwrap(),
        )
        .await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(self.pgid(), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// What a block printed: the end of its stdout and stderr.
fn output(out: &Path, err: &Path) -> String {
    format!("--- stdout:\n{}\n--- stderr:\n{}", tail(out), tail(err))
}

/// The last lines of a file.
fn tail(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A background block, started in a shell of its own in the copy's root.
fn start_background(ws: &Workspace, block: &ShellBlock, n: usize) -> Group {
    let script = ws.path().join(format!("run/{n}.sh"));
    std::fs::write(&script, block.commands()).unwrap();
    let (out, err) = (script.with_extension("out"), script.with_extension("err"));
    let child = ws
        .bash(&[script.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    eprintln!("started {}", block.place());
    Group {
        child,
        place: block.place(),
        out,
        err,
    }
}

/// One page's shell: blocks are sourced into it one after another, so
/// they share its variables and working directory; a failing command ends it.
struct Session {
    group: Group,
    commands: Option<ChildStdin>,
}

impl Session {
    fn start(ws: &Workspace, page: &str) -> Self {
        let log = ws.path().join(format!("run/{}.session", page.replace('/', "-")));
        let file = std::fs::File::create(&log).unwrap();
        let mut child = ws
            .bash(&["-s"])
            .stdin(Stdio::piped())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Self {
            commands: child.stdin.take(),
            group: Group {
                child,
                place: page.to_owned(),
                out: log.clone(),
                err: log,
            },
        }
    }

    /// Runs one block in the session; panics naming its place, with its
    /// output, if it fails or outlasts [`BLOCK_TIMEOUT`].
    async fn run(&mut self, ws: &Workspace, block: &ShellBlock, n: usize) {
        let script = ws.path().join(format!("run/{n}.sh"));
        std::fs::write(&script, block.commands()).unwrap();
        let (out, err, done) = (
            script.with_extension("out"),
            script.with_extension("err"),
            script.with_extension("done"),
        );
        let line = format!(
            "source {} </dev/null >{} 2>{}; touch {}\n",
            script.display(),
            out.display(),
            err.display(),
            done.display()
        );
        let commands = self.commands.as_mut().expect("the session takes commands");
        commands.write_all(line.as_bytes()).unwrap();
        commands.flush().unwrap();
        let child = &mut self.group.child;
        support::eventually_explained(
            &format!("the block at {} to finish", block.place()),
            BLOCK_TIMEOUT,
            || output(&out, &err),
            async || {
                if done.exists() {
                    return Some(());
                }
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "the block at {} failed ({status}):\n{}\n--- the block:\n{}",
                        block.place(),
                        output(&out, &err),
                        block.commands()
                    );
                }
                None
            },
        )
        .await;
        check_sample_output(block, &std::fs::read_to_string(&out).unwrap_or_default());
        eprintln!("ran {}", block.place());
    }

    /// Ends the session (end of input) and checks it exits cleanly.
    async fn finish(mut self) {
        drop(self.commands.take());
        let child = &mut self.group.child;
        let status = support::eventually(
            &format!("the session of {} to end", self.group.place),
            BLOCK_TIMEOUT,
            async || child.try_wait().unwrap(),
        )
        .await;
        assert!(
            status.success(),
            "the session of {} ended with {status}:\n{}",
            self.group.place,
            self.group.output()
        );
    }
}

/// A `console` block's sample output is what a run prints, as far as a
/// run repeats: as many lines, and the same first line (a table's header,
/// a one-line answer), spaces aside. Ages, ports and generated names vary.
fn check_sample_output(block: &ShellBlock, printed: &str) {
    let sample = block.sample_output();
    if sample.is_empty() {
        return;
    }
    let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
    let printed: Vec<&str> = printed.lines().collect();
    assert!(
        printed.len() == sample.len() && words(printed[0]) == words(&sample[0]),
        "the sample output at {} is not what a run prints:\n--- the page shows:\n{}\n--- a run printed:\n{}",
        block.place(),
        sample.join("\n"),
        printed.join("\n")
    );
}

fn port_is_free(addr: SocketAddr) -> bool {
    TcpListener::bind(addr).is_ok()
}

/// The quickstart's listen addresses, read from its configuration.
fn quickstart_addresses(config: &Path) -> Vec<SocketAddr> {
    let text = std::fs::read_to_string(config).unwrap();
    let addresses: Vec<SocketAddr> = [
        "healthProbeBindAddress",
        "discoveryBindAddress",
        "metricsBindAddress",
        "gatewayBindAddress",
    ]
    .iter()
    .map(|key| {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap_or_else(|| panic!("{} sets {key}", config.display()));
        line.trim().trim_matches('"').parse().unwrap()
    })
    .collect();
    addresses
}

/// What a block with a marker is, for the runner.
fn standalone(block: &ShellBlock) -> Option<Marker> {
    match &block.marker {
        Some(Ok(
            marker @ Marker::Run {
                bed: Bed::Standalone, ..
            },
        ))
        | Some(Ok(marker @ Marker::Teardown { bed: Bed::Standalone })) => Some(marker.clone()),
        _ => None,
    }
}

/// The Proxies that are `Failed`, with their messages.
fn failed(proxies: &[serde_json::Value]) -> Vec<String> {
    proxies
        .iter()
        .filter(|p| p["status"]["phase"] == "Failed")
        .map(|p| {
            format!(
                "{}/{}: {}",
                p["metadata"]["namespace"].as_str().unwrap_or(""),
                p["metadata"]["name"].as_str().unwrap_or(""),
                p["status"]["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn standalone_blocks_run_against_the_quickstart() {
    let ws = Workspace::new();
    // Reaped last (declared first): whatever a failing run leaves.
    let _reaper = Reaper(ws.path().to_owned());
    let _instances = Reaper(ws.repo().join("config/standalone"));
    let addresses = quickstart_addresses(&ws.quickstart_config());
    for addr in &addresses {
        assert!(
            port_is_free(*addr),
            "{addr}, where the quickstart listens as shipped, is in use: only this test may use it"
        );
    }
    let health = addresses[0];

    let pages: Vec<(String, Vec<ShellBlock>)> = doc_blocks::user_docs()
        .iter()
        .map(|doc| {
            let page = doc
                .strip_prefix(doc_blocks::repo_root())
                .unwrap()
                .display()
                .to_string();
            (
                page,
                doc_blocks::shell_blocks(doc)
                    .into_iter()
                    .filter(|b| standalone(b).is_some())
                    .collect(),
            )
        })
        .collect();
    let readme = &pages[0].1;
    let quickstart = readme
        .iter()
        .position(|b| {
            standalone(b)
                == Some(Marker::Run {
                    bed: Bed::Standalone,
                    background: true,
                })
        })
        .expect("README.md has a `standalone background` block: the quickstart");

    // The quickstart, as the README starts it; it runs until the end.
    let mut n = 0;
    let mut operator = start_background(&ws, &readme[quickstart], n);
    let _on_failure = StopProxiesOnFailure {
        ws: &ws,
        quickstart: operator.child.id(),
    };
    let (out, err) = (operator.out.clone(), operator.err.clone());
    support::eventually_explained(
        "the quickstart to serve /healthz and bring its Managed proxies to Ready",
        QUICKSTART_TIMEOUT,
        || output(&out, &err),
        async || {
            if let Some(status) = operator.child.try_wait().unwrap() {
                panic!(
                    "the quickstart at {} exited ({status}):\n{}",
                    operator.place,
                    operator.output()
                );
            }
            if std::net::TcpStream::connect(health).is_err() {
                return Err(format!("nothing listens on {health} yet"));
            }
            let proxies = ws.proxies()?;
            let managed: Vec<_> = proxies
                .iter()
                .filter(|p| p["spec"]["mode"] == "Managed")
                .collect();
            let ready = managed.iter().all(|p| p["status"]["phase"] == "Ready");
            if !managed.is_empty() && ready {
                Ok(())
            } else {
                Err(format!("{:?}", phases(&proxies)))
            }
        },
    )
    .await;

    let mut teardown = Vec::new();
    for (page, blocks) in &pages {
        let mut session: Option<Session> = None;
        let mut background = Vec::new();
        for block in blocks {
            if std::ptr::eq(block, &readme[quickstart]) {
                continue;
            }
            n += 1;
            match standalone(block) {
                Some(Marker::Teardown { .. }) => teardown.push((page.clone(), block.clone())),
                Some(Marker::Run { background: true, .. }) => {
                    background.push(start_background(&ws, block, n))
                }
                _ => {
                    let session = session.get_or_insert_with(|| Session::start(&ws, page));
                    session.run(&ws, block, n).await;
                }
            }
        }
        if let Some(session) = session {
            session.finish().await;
        }
        if !blocks.is_empty() {
            assert_nothing_failed(&ws, page).await;
        }
        // Stopped only now: they have had the settling time to fail.
        for mut block in background {
            if let Some(status) = block.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "the background block at {} failed ({status}):\n{}",
                    block.place,
                    block.output()
                );
            }
            drop(block);
        }
    }

    // The README's way to stop the quickstart's proxies, then Ctrl-C.
    assert!(
        !teardown.is_empty(),
        "README.md has no `standalone teardown` block: how to stop the quickstart's proxies"
    );
    let mut session: Option<(String, Session)> = None;
    for (page, block) in &teardown {
        if session.as_ref().is_none_or(|(p, _)| p != page) {
            if let Some((_, s)) = session.take() {
                s.finish().await;
            }
            session = Some((page.clone(), Session::start(&ws, page)));
        }
        n += 1;
        session.as_mut().unwrap().1.run(&ws, block, n).await;
    }
    if let Some((_, s)) = session {
        s.finish().await;
    }
    operator.interrupt().await;
    drop(operator);
    for addr in &addresses {
        assert!(
            port_is_free(*addr),
            "{addr} is still in use after the quickstart stopped"
        );
    }
    let left = processes_under(ws.path());
    let leftover = Command::new("bash")
        .arg(doc_blocks::repo_root().join("tests/leftover-processes.sh"))
        .arg(ws.path())
        .output()
        .unwrap();
    assert!(
        left.is_empty() && leftover.status.success(),
        "the documented way to stop the quickstart left processes {left:?}:\n{}",
        String::from_utf8_lossy(&leftover.stderr)
    );
}

/// When the run fails half-way, stops the quickstart's proxies the way the
/// README does (their manifests deleted while the operator runs) before
/// they are killed with the rest, so that none leaves its files behind
/// (Squid's, run as root, are outside the temporary directory).
struct StopProxiesOnFailure<'a> {
    ws: &'a Workspace,
    /// The quickstart's shell.
    quickstart: u32,
}

impl Drop for StopProxiesOnFailure<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let manifests = self.ws.repo().join("config/standalone/proxies");
        for manifest in std::fs::read_dir(manifests).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(manifest.path());
        }
        // Not `eventually`: this runs in `Drop`, during a panic.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let running = || !support::process::is_gone(i32::try_from(self.quickstart).unwrap_or(0)).0;
        while running() && std::time::Instant::now() < deadline {
            if self.ws.proxies().is_ok_and(|p| p.is_empty()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// After a page: once the operator has read what the page changed (two
/// manifest scans) and acted on it, no Proxy is `Failed`.
async fn assert_nothing_failed(ws: &Workspace, page: &str) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let proxies = support::eventually(
        &format!("the Proxies to settle after {page}"),
        Duration::from_secs(30),
        async || {
            let proxies = ws.proxies()?;
            let settling = proxies.iter().any(|p| {
                matches!(
                    p["status"]["phase"].as_str(),
                    None | Some("Pending" | "Provisioning")
                )
            });
            if settling {
                Err(format!("{:?}", phases(&proxies)))
            } else {
                Ok::<_, String>(proxies)
            }
        },
    )
    .await;
    let failed = failed(&proxies);
    assert!(
        failed.is_empty(),
        "after the blocks of {page}, Proxies are Failed:\n{}",
        failed.join("\n")
    );
}

fn phases(proxies: &[serde_json::Value]) -> BTreeMap<String, String> {
    proxies
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                p["status"]["phase"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

/// The marker parser and block finder of `support::doc_blocks`.
mod doc_blocks_parsing {
    use std::path::Path;

    use super::support::doc_blocks::*;

    #[test]
    fn markers_parse() {
        assert_eq!(
            parse_marker("standalone"),
            Ok(Marker::Run {
                bed: Bed::Standalone,
                background: false
            })
        );
        assert_eq!(
            parse_marker("kubernetes background"),
            Ok(Marker::Run {
                bed: Bed::Kubernetes,
                background: true
            })
        );
        assert_eq!(
            parse_marker("standalone teardown"),
            Ok(Marker::Teardown { bed: Bed::Standalone })
        );
        assert_eq!(
            parse_marker("skip: needs a GCP project"),
            Ok(Marker::Skip {
                reason: "needs a GCP project".into()
            })
        );
        assert!(parse_marker("skip:").is_err());
        assert!(parse_marker("cluster").is_err());
        assert!(parse_marker("standalone twice").is_err());
        assert!(parse_marker("standalone background teardown").is_err());
    }

    #[test]
    fn a_console_blocks_sample_output_is_its_other_lines() {
        let text = "<!-- doc-test: standalone -->\n```console\n$ a \\\n  --b\nout 1\nout 2\n$ c\n```\n";
        let blocks = parse_shell_blocks(Path::new("x.md"), text);
        assert_eq!(blocks[0].commands(), "a \\\n  --b\nc\n");
        assert_eq!(blocks[0].sample_output(), vec!["out 1", "out 2"]);
    }

    #[test]
    fn blocks_and_their_markers_are_found() {
        let text = "intro\n\n<!-- doc-test: standalone -->\n```sh\necho one\n```\n\n```console\n$ echo two \\\n  three\noutput\n```\n\n```yaml\na: b\n```\n  <!-- doc-test: skip: needs a cluster -->\n  ```bash\n  kubectl get pods\n  ```\n";
        let blocks = parse_shell_blocks(Path::new("x.md"), text);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0].line, 4);
        assert_eq!(blocks[0].code, "echo one\n");
        assert!(matches!(blocks[0].marker, Some(Ok(Marker::Run { .. }))));
        assert_eq!(blocks[1].marker, None);
        assert_eq!(blocks[1].commands(), "echo two \\\n  three\n");
        assert_eq!(blocks[2].code, "kubectl get pods\n");
        assert!(matches!(blocks[2].marker, Some(Ok(Marker::Skip { .. }))));
    }
}
