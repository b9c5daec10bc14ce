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
//! - In a fresh checkout of the repository (`support::checkout`: the files
//!   a clone has, no `.git`, build output or state) with a clean
//!   environment (`PATH`, `HOME`, `TMPDIR`, `LANG`, and where the user's
//!   cargo and rustup keep their files): nothing of the test runner's (a
//!   `DISCOVERY_TOKEN`, say) changes what a block does.
//! - `cargo` is the real cargo: `cargo run --release -- ARGS` builds and
//!   runs the operator in the checkout as it would for a user (the build is
//!   done first, with that command's own form and `--version`, so the
//!   quickstart's start-up wait is not spent compiling). Every form the
//!   docs use runs unchanged. `egress-proxies-operator` on `PATH` is
//!   `target/release/egress-proxies-operator`, where docs/standalone.md
//!   says that build leaves it. `bash tests/system-packages.sh build` runs
//!   as written: where the tests were built, the packages it checks for
//!   are installed and it does nothing.
//! - Before anything starts, every fixed port the blocks and the
//!   quickstart's configuration and manifests name must be free: a port
//!   something else holds fails the test at once, naming it, instead of as
//!   a confusing failure of a block later.
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
//!   be what the run printed, line by line and word by word, but for the
//!   columns docs/testing.md names as varying: a table's `AGE`, and the
//!   random suffix of a generated name (`demo-4kq7z`).
//! - A `python` block runs with the Python client's interpreter
//!   (`EPO_CLIENTS_PYTHON`, made by tests/python-clients-setup.sh) and the
//!   environment docs/clients.md gives a crawler: `EGRESS_PROXIES_URL` (the
//!   quickstart's API) and `EGRESS_PROXIES_TOKEN`, the package importable.
//! - Other `background` blocks start in a shell of their own in the copy's
//!   root and are stopped when their page's blocks are done; one that ended
//!   with an error by then fails the test.
//! - After each page, once the operator has read the manifests again,
//!   every Proxy is `Ready` and every pool's `Ready` condition true, but for
//!   what a page's `expect` marker says (`support::doc_blocks`).
//! - Last, the `standalone teardown` blocks run (the README's: how to stop
//!   the quickstart's proxies), the quickstart gets Ctrl-C (SIGINT), and no
//!   process may be left: none under the temporary directory or the
//!   checkout, none that `tests/leftover-processes.sh` would find, nothing
//!   on the four ports.

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
    for doc in doc_blocks::user_docs() {
        for expectation in doc_blocks::expectations(&doc) {
            if let Err(why) = expectation {
                problems.push(format!("{}: {why}", doc.display()));
            }
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

/// Every `python` block of the docs, run or not, parses, and what it
/// imports exists (its `import` statements run with the client package
/// importable): a renamed module or class fails here even in a block that
/// needs the Internet to run.
#[test]
fn python_blocks_parse_and_their_imports_exist() {
    let Some(python) = support::clients_python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the Python client's venv (tests/python-clients-setup.sh)"
        );
        eprintln!("SKIP: no Python client venv (tests/python-clients-setup.sh)");
        return;
    };
    let blocks: Vec<ShellBlock> = doc_blocks::all_shell_blocks()
        .into_iter()
        .filter(|b| b.lang == "python")
        .collect();
    assert!(
        blocks.len() >= 4,
        "the docs' python blocks are found ({})",
        blocks.len()
    );
    let checker = r#"
import ast, json, sys
problems = []
for place, code in json.load(sys.stdin):
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        problems.append(f"{place}: does not parse: {e}")
        continue
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    try:
        exec(compile(ast.Module(body=imports, type_ignores=[]), place, "exec"), {})
    except Exception as e:
        problems.append(f"{place}: {type(e).__name__}: {e}")
print("\n".join(problems))
"#;
    let input: Vec<(String, String)> = blocks.iter().map(|b| (b.place(), b.commands())).collect();
    let mut child = Command::new(python)
        .args(["-c", checker])
        .env("PYTHONPATH", doc_blocks::repo_root().join("clients/python/src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the checker ran");
    let problems = String::from_utf8_lossy(&out.stdout);
    assert!(
        problems.trim().is_empty(),
        "python blocks in the docs:\n{problems}"
    );
}

// ---------------------------------------------------------------------------
// The standalone runner.

/// The checkout the blocks run in, and a directory of the run's own
/// (`bin` first on `PATH`, `home`, `tmp`, the blocks' scripts and output
/// in `run`); everything under either is reaped when it goes.
struct Workspace {
    checkout: support::checkout::Checkout,
    dir: tempfile::TempDir,
}

/// The crawler token a documented crawler pod has in `EGRESS_PROXIES_TOKEN`
/// (the quickstart checks none, as it has no `DISCOVERY_TOKEN`).
const POD_TOKEN: &str = "doc-test-crawler-token";

impl Workspace {
    fn new() -> Self {
        let checkout = support::checkout::Checkout::take();
        let dir = tempfile::tempdir().unwrap();
        for sub in ["bin", "home", "tmp", "run"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(
            checkout.release_binary(),
            dir.path().join("bin/egress-proxies-operator"),
        )
        .unwrap();
        Self { checkout, dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn repo(&self) -> PathBuf {
        self.checkout.root().to_owned()
    }

    fn quickstart_config(&self) -> PathBuf {
        self.repo().join("config/standalone/quickstart.yaml")
    }

    /// The clean environment every block gets: a user's.
    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "PATH".to_owned(),
                format!(
                    "{}:{}",
                    self.path().join("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            ),
            ("HOME".to_owned(), self.path().join("home").display().to_string()),
            ("TMPDIR".to_owned(), self.path().join("tmp").display().to_string()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ];
        env.extend(support::checkout::cargo_env());
        env
    }

    /// `bash -euo pipefail` with the doc test's environment, in the
    /// checkout's root, in a process group of its own.
    fn bash(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail"]).args(args);
        cmd.env_clear()
            .envs(self.env())
            .current_dir(self.repo())
            .process_group(0);
        cmd
    }

    /// What runs a `python` block's file: the client's interpreter with a
    /// documented crawler pod's environment, the package importable.
    fn python_command(&self, python: &Path, file: &Path) -> String {
        format!(
            "EGRESS_PROXIES_URL=http://127.0.0.1:8090 EGRESS_PROXIES_TOKEN={POD_TOKEN} \\\n  \
             PYTHONPATH={} PYTHONDONTWRITEBYTECODE=1 {} {}\n",
            self.repo().join("clients/python/src").display(),
            python.display(),
            file.display()
        )
    }

    /// The Proxies of the running quickstart, as `get proxies -o json` lists them.
    fn proxies(&self) -> Result<Vec<serde_json::Value>, String> {
        self.list("proxies")
    }

    /// The quickstart's Proxies or pools, as `get ... -o json` lists them.
    fn list(&self, what: &str) -> Result<Vec<serde_json::Value>, String> {
        let out = Command::new(BIN)
            .args(["get", what, "-o", "json", "--config"])
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

/// The shell script that runs block number `n`: its commands, or for a
/// `python` block the client's interpreter on its code.
fn write_script(ws: &Workspace, block: &ShellBlock, n: usize) -> PathBuf {
    let script = ws.path().join(format!("run/{n}.sh"));
    if block.lang == "python" {
        let code = ws.path().join(format!("run/{n}.py"));
        std::fs::write(&code, block.commands()).unwrap();
        let python = support::clients_python().unwrap_or_else(|| {
            panic!(
                "{} is a python block: the doc test runs it with the Python client's interpreter; \
                 run tests/python-clients-setup.sh and set EPO_CLIENTS_PYTHON (tests/run.sh does)",
                block.place()
            )
        });
        std::fs::write(&script, ws.python_command(&python, &code)).unwrap();
    } else {
        std::fs::write(&script, block.commands()).unwrap();
    }
    script
}

/// A background block, started in a shell of its own in the copy's root.
fn start_background(ws: &Workspace, block: &ShellBlock, n: usize) -> Group {
    let script = write_script(ws, block, n);
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
        let script = write_script(ws, block, n);
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

/// A `console` block's sample output is what a run prints: as many lines,
/// each with the same words, but for what varies from run to run and
/// docs/testing.md names: a table's `AGE` column, and the random suffix of
/// a generated name (`demo-4kq7z` for `demo-x2m9p`).
fn check_sample_output(block: &ShellBlock, printed: &str) {
    let sample = block.sample_output();
    if sample.is_empty() {
        return;
    }
    let printed: Vec<&str> = printed.lines().collect();
    let sample: Vec<&str> = sample.iter().map(String::as_str).collect();
    if let Err(why) = same_output(&sample, &printed) {
        panic!(
            "the sample output at {} is not what a run prints ({why}):\n--- the page shows:\n{}\n--- a run printed:\n{}",
            block.place(),
            sample.join("\n"),
            printed.join("\n")
        );
    }
}

/// Whether a page's sample output and a run's agree (see [`check_sample_output`]).
fn same_output(sample: &[&str], printed: &[&str]) -> Result<(), String> {
    if sample.len() != printed.len() {
        return Err(format!("{} lines shown, {} printed", sample.len(), printed.len()));
    }
    // Each table's AGE column: where its header line has it.
    let (mut shown_age, mut printed_age) = (None, None);
    for (n, (shown, run)) in sample.iter().zip(printed).enumerate() {
        if shown.starts_with("NAME ") {
            shown_age = column(shown, "AGE");
            printed_age = column(run, "AGE");
        }
        let shown_words = words_at(shown);
        let run_words = words_at(run);
        let line = n + 1;
        if shown_words.len() != run_words.len() {
            return Err(format!("line {line} has other words: `{shown}` / `{run}`"));
        }
        for (i, ((at_shown, a), (at_run, b))) in shown_words.iter().zip(&run_words).enumerate() {
            let is_age = Some(*at_shown) == shown_age && Some(*at_run) == printed_age && age(a) && age(b);
            let is_name = i == 0 && generated_name(a).is_some() && generated_name(a) == generated_name(b);
            if a != b && !is_age && !is_name {
                return Err(format!("line {line}: `{a}` shown, `{b}` printed"));
            }
        }
    }
    Ok(())
}

/// The byte offset of a header's column.
fn column(header: &str, name: &str) -> Option<usize> {
    words_at(header)
        .into_iter()
        .find(|(_, w)| *w == name)
        .map(|(at, _)| at)
}

/// The words of a line, with their byte offsets.
fn words_at(line: &str) -> Vec<(usize, &str)> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                words.push((s, &line[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    words
}

/// An age as the tables print it: `12s`, `5m`, `3h`, `2d`, `1m30s`.
fn age(word: &str) -> bool {
    let mut rest = word;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let Some(unit) = rest[digits..].chars().next() else {
            return false;
        };
        if digits == 0 || !"smhd".contains(unit) {
            return false;
        }
        rest = &rest[digits + 1..];
        parts += 1;
    }
    parts > 0
}

/// A generated name's stem: `demo` of `demo-4kq7z` (five lowercase letters
/// or digits after the last `-`, as pools and Kubernetes name members).
fn generated_name(word: &str) -> Option<&str> {
    let (stem, suffix) = word.rsplit_once('-')?;
    (!stem.is_empty()
        && suffix.len() == 5
        && suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
    .then_some(stem)
}

#[test]
fn sample_output_is_compared_word_by_word_but_ages_and_name_suffixes() {
    let shown = [
        "NAME         MODE       PROVIDER   PHASE       IP          HEALTHY   AGE",
        "demo-4kq7z   Managed    local      Ready       127.0.0.1   true      12s",
        "my-squid     External              Unhealthy   127.0.0.1   false     12s",
    ];
    let printed = [
        "NAME         MODE       PROVIDER   PHASE       IP          HEALTHY   AGE",
        "demo-x2m9p   Managed    local      Ready       127.0.0.1   true      1m30s",
        "my-squid     External              Unhealthy   127.0.0.1   false     3s",
    ];
    same_output(&shown, &printed).unwrap();
    let mut wrong = printed;
    wrong[2] = "my-squid     External              Pending     127.0.0.1   false     3s";
    assert!(
        same_output(&shown, &wrong)
            .unwrap_err()
            .contains("`Unhealthy` shown, `Pending` printed")
    );
    wrong = printed;
    wrong[1] = "local-1      Managed    local      Ready       127.0.0.1   true      1m";
    assert!(
        same_output(&shown, &wrong).is_err(),
        "another name is not a suffix"
    );
    assert!(same_output(&shown, &printed[..2]).is_err(), "a line missing");
    // An age-like word outside the AGE column is compared.
    let shown = ["a: backing off 40s"];
    assert!(same_output(&shown, &["a: backing off 20s"]).is_err());
    assert!(age("12s") && age("1m30s") && age("2d") && !age("12") && !age("s") && !age("true"));
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

#[test]
fn fixed_ports_are_found_in_commands_and_manifests() {
    let found = doc_blocks::named_ports(
        "curl -x http://127.0.0.1:8888 http://127.0.0.1:8081/healthz\nhost: 127.0.0.1\nport: 3128\nlocalhost:9 x127.0.0.1:5 [::1]:7",
    );
    let found: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        ["127.0.0.1:9", "127.0.0.1:8081", "127.0.0.1:8888", "[::1]:7"]
    );
}

/// Every fixed port the run will use or expect closed: the quickstart's
/// listen addresses, what its External proxies' endpoints name (a Squid on
/// 127.0.0.1:3128 would make `my-squid` Ready), and what the blocks name.
fn fixed_ports(ws: &Workspace, blocks: &[&ShellBlock]) -> BTreeMap<SocketAddr, String> {
    let mut ports = BTreeMap::new();
    for addr in quickstart_addresses(&ws.quickstart_config()) {
        ports.insert(addr, "the quickstart's configuration".to_owned());
    }
    let manifests = ws.repo().join("config/standalone/proxies");
    for manifest in std::fs::read_dir(&manifests).unwrap().flatten() {
        let text = std::fs::read_to_string(manifest.path()).unwrap_or_default();
        let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_default();
        let endpoint = &doc["spec"]["endpoint"];
        if let (Some(host), Some(port)) = (endpoint["host"].as_str(), endpoint["port"].as_u64()) {
            for addr in doc_blocks::named_ports(&format!("{host}:{port}")) {
                ports
                    .entry(addr)
                    .or_insert_with(|| format!("{}", manifest.path().display()));
            }
        }
    }
    for block in blocks {
        for addr in doc_blocks::named_ports(&block.commands()) {
            ports.entry(addr).or_insert_with(|| block.place());
        }
    }
    ports
}

#[test]
fn phases_other_than_ready_must_be_expected() {
    let proxy =
        |name: &str, phase: &str| serde_json::json!({"metadata": {"name": name}, "status": {"phase": phase}});
    let pool = |ready: &str| serde_json::json!({"metadata": {"name": "demo"}, "status": {"conditions": [{"type": "Ready", "status": ready}]}});
    let mut expected = BTreeMap::new();
    let proxies = [proxy("a", "Ready"), proxy("b", "Unhealthy")];
    assert_eq!(
        doc_blocks::unexpected_phases(false, &proxies, &[pool("True")], &expected).len(),
        1
    );
    expected.insert(("proxy".to_owned(), "b".to_owned()), "Unhealthy".to_owned());
    assert!(doc_blocks::unexpected_phases(false, &proxies, &[pool("True")], &expected).is_empty());
    for phase in ["Pending", "BackOff", "Provisioning", "Failed"] {
        let proxies = [proxy("a", phase), proxy("b", "Unhealthy")];
        assert_eq!(
            doc_blocks::unexpected_phases(false, &proxies, &[], &expected).len(),
            1,
            "{phase}"
        );
    }
    assert_eq!(
        doc_blocks::unexpected_phases(false, &proxies, &[pool("False")], &expected).len(),
        1
    );
    expected.insert(("proxy".to_owned(), "gone".to_owned()), "Unhealthy".to_owned());
    assert_eq!(
        doc_blocks::unexpected_phases(false, &proxies, &[], &expected).len(),
        1,
        "an expected proxy that is missing"
    );
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

#[tokio::test]
async fn standalone_blocks_run_against_the_quickstart() {
    let ws = Workspace::new();
    // Reaped last (declared first): whatever a failing run leaves.
    let _reaper = Reaper(ws.path().to_owned());
    let _instances = Reaper(ws.repo().join("config/standalone"));
    let addresses = quickstart_addresses(&ws.quickstart_config());
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
    let all_blocks: Vec<&ShellBlock> = pages.iter().flat_map(|(_, b)| b).collect();
    let busy: Vec<String> = fixed_ports(&ws, &all_blocks)
        .into_iter()
        .filter(|(addr, _)| !port_is_free(*addr))
        .map(|(addr, whose)| format!("{addr} (named by {whose})"))
        .collect();
    assert!(
        busy.is_empty(),
        "ports the docs' blocks use are in use by something else; stop it first:\n{}",
        busy.join("\n")
    );
    let mut expected = BTreeMap::new();

    // The README's first command's build, with the real cargo.
    let started = std::time::Instant::now();
    let build_log = ws.path().join("run/cargo-build.log");
    ws.checkout.build_release(&ws.env(), &build_log);
    eprintln!(
        "`cargo run --release` built the checkout in {:?}",
        started.elapsed()
    );

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
        let mut expects = false;
        for expectation in doc_blocks::expectations(&doc_blocks::repo_root().join(page)) {
            let expectation = expectation.unwrap_or_else(|e| panic!("{page}: {e}"));
            if expectation.bed == Bed::Standalone {
                expected.insert((expectation.kind, expectation.name), expectation.phase);
                expects = true;
            }
        }
        if !blocks.is_empty() || expects {
            assert_phases_as_expected(&ws, page, &expected).await;
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
    let mut left = processes_under(ws.path());
    left.extend(processes_under(&ws.repo()));
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
/// manifest scans) and acted on it, every Proxy and pool is as the pages
/// so far expect ([`doc_blocks::unexpected_phases`]); a phase still changing gets time.
async fn assert_phases_as_expected(
    ws: &Workspace,
    page: &str,
    expected: &BTreeMap<(String, String), String>,
) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    support::eventually(
        &format!("the Proxies and pools to be as expected after {page}"),
        Duration::from_secs(60),
        async || {
            let proxies = ws.proxies()?;
            let pools = ws.list("pools")?;
            let wrong = doc_blocks::unexpected_phases(false, &proxies, &pools, expected);
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(wrong.join("; "))
            }
        },
    )
    .await;
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

/// The fresh checkout's sync (`support::checkout`).
mod checkout_sync {
    use std::process::Command;
    use std::time::Duration;

    use super::support::checkout::sync;

    #[test]
    fn a_sync_rewrites_only_what_changed_and_drops_the_rest() {
        let repo = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            assert!(
                Command::new("git")
                    .args(args)
                    .current_dir(repo.path())
                    .status()
                    .unwrap()
                    .success()
            );
        };
        git(&["init", "-q"]);
        std::fs::write(repo.path().join(".gitignore"), "state/\n").unwrap();
        std::fs::create_dir_all(repo.path().join("src")).unwrap();
        std::fs::create_dir_all(repo.path().join("state")).unwrap();
        std::fs::write(repo.path().join("src/a.rs"), "a").unwrap();
        std::fs::write(repo.path().join("src/b.rs"), "b").unwrap();
        std::fs::write(repo.path().join("state/db"), "ignored").unwrap();
        git(&["add", "src/a.rs", ".gitignore"]);
        let copy = tempfile::tempdir().unwrap();
        sync(repo.path(), copy.path());
        assert_eq!(
            std::fs::read_to_string(copy.path().join("src/b.rs")).unwrap(),
            "b",
            "untracked, not ignored"
        );
        assert!(!copy.path().join("state").exists(), "ignored files stay out");
        let before = copy
            .path()
            .join("src/a.rs")
            .metadata()
            .unwrap()
            .modified()
            .unwrap();
        std::fs::create_dir_all(copy.path().join("target")).unwrap();
        std::fs::write(copy.path().join("target/keep"), "").unwrap();
        std::fs::write(copy.path().join("src/stray.rs"), "").unwrap();
        std::fs::write(repo.path().join("src/b.rs"), "b2").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        sync(repo.path(), copy.path());
        assert_eq!(
            copy.path()
                .join("src/a.rs")
                .metadata()
                .unwrap()
                .modified()
                .unwrap(),
            before
        );
        assert_eq!(
            std::fs::read_to_string(copy.path().join("src/b.rs")).unwrap(),
            "b2"
        );
        assert!(!copy.path().join("src/stray.rs").exists());
        assert!(copy.path().join("target/keep").exists());
    }
}
