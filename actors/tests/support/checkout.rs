//! The copy of the repository the doc runners run the docs in, as a new
//! user's fresh clone: the files git tracks (and new ones it does not
//! ignore), without `.git`, build output or a quickstart's state — with the
//! real `cargo` building in it, and a git repository of its own (a
//! clone is one). The copy lives at one place per target
//! directory (`$CARGO_TARGET_TMPDIR/docs-checkout`) and keeps its own
//! `target/` between runs: each run rewrites only the files whose bytes
//! changed, so cargo rebuilds only what changed, as it would for the user.
//! One runner at a time holds it (a lock file beside it).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// What a user's first `cargo run --release` may take here, dependencies
/// and all (two cores).
pub const FIRST_BUILD_TIMEOUT: Duration = Duration::from_secs(60 * 60);

pub struct Checkout {
    root: PathBuf,
    _lock: Flock<File>,
}

impl Checkout {
    /// Takes the copy (waiting for another runner to be done with it) and
    /// brings it up to date with the repository.
    pub fn take() -> Self {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("docs-checkout");
        std::fs::create_dir_all(&base).unwrap();
        let lock = File::create(base.with_extension("lock")).unwrap();
        let lock = Flock::lock(lock, FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("locking the docs checkout");
        sync(&super::doc_blocks::repo_root(), &base);
        commit(&base);
        Self {
            root: base,
            _lock: lock,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `cargo build --release` and `cargo run --release` leave the
    /// operator, as docs/standalone.md tells users.
    pub fn release_binary(&self) -> PathBuf {
        self.root.join("target/release/egress-proxies-operator")
    }

    /// Builds what the README's first command runs, with the real cargo in
    /// `env` (a user's: see [`cargo_env`]), by running that command's own
    /// form with `--version`: the quickstart's `cargo run --release` then
    /// starts at once instead of spending its start-up time compiling.
    pub fn build_release(&self, env: &[(String, String)], log: &Path) {
        let out = File::create(log).unwrap();
        let mut child = Command::new("cargo")
            .args(["run", "--release", "--", "--version"])
            .env_clear()
            .envs(env.iter().cloned())
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("the real cargo runs");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > FIRST_BUILD_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "`cargo run --release` did not finish building within {FIRST_BUILD_TIMEOUT:?}:\n{}",
                    tail(log)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        assert!(
            status.success(),
            "`cargo run --release -- --version` in a fresh checkout failed ({status}):\n{}",
            tail(log)
        );
    }
}

/// A clone is a git repository (the docs take the image tag from its
/// commit): the copy is one, with a commit of its own whenever its files
/// changed.
fn commit(copy: &Path) {
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=doc test", "-c", "user.email=doc-test@localhost"])
            .args(args)
            .current_dir(copy)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    if !copy.join(".git").exists() {
        git(&["init", "-q"]);
    }
    // Without optional locks `git status` leaves the index alone: the
    // operator's build script watches it, and an index rewritten for
    // nothing would make cargo build the operator again.
    if !git(&["--no-optional-locks", "status", "--porcelain"])
        .trim()
        .is_empty()
    {
        git(&["add", "-A"]);
        git(&[
            "commit",
            "-q",
            "-m",
            "the repository's files, as the doc tests run them",
        ]);
    }
}

/// The variables the real cargo needs in a clean environment: where the
/// user's toolchain (rustup) and registry cache are — the runner's own.
pub fn cargo_env() -> Vec<(String, String)> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    ["CARGO_HOME", "RUSTUP_HOME"]
        .into_iter()
        .zip([".cargo", ".rustup"])
        .map(|(name, default)| {
            let value = std::env::var(name).unwrap_or_else(|_| format!("{home}/{default}"));
            (name.to_owned(), value)
        })
        .collect()
}

fn tail(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// The files of a fresh clone of `repo`: tracked ones and untracked ones
/// git does not ignore, relative to `repo`, that exist.
fn clone_files(repo: &Path) -> BTreeSet<PathBuf> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(repo)
        .output()
        .expect("git lists the repository's files");
    assert!(
        out.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
        .filter(|name| repo.join(name).symlink_metadata().is_ok())
        .collect()
}

/// Makes `copy` hold exactly the clone files of `repo` (and its own
/// `target/`): files whose bytes or mode differ are rewritten, the others
/// are left untouched (cargo keeps its fingerprints), extra files deleted.
pub fn sync(repo: &Path, copy: &Path) {
    let files = clone_files(repo);
    for name in &files {
        let (from, to) = (repo.join(name), copy.join(name));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let meta = from.symlink_metadata().unwrap();
        if meta.file_type().is_symlink() {
            let link = std::fs::read_link(&from).unwrap();
            if std::fs::read_link(&to).ok().as_ref() != Some(&link) {
                let _ = std::fs::remove_file(&to);
                std::os::unix::fs::symlink(&link, &to).unwrap();
            }
            continue;
        }
        let bytes = std::fs::read(&from).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        let same = to
            .symlink_metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o777 == mode)
            && std::fs::read(&to).is_ok_and(|b| b == bytes);
        if !same {
            let _ = std::fs::remove_file(&to);
            std::fs::write(&to, &bytes).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
    remove_extra(copy, copy, &files);
}

/// Deletes what `dir` holds that is not among `files` (but `target/` at
/// the top, and the copy's own `.git`); empty directories go too.
fn remove_extra(root: &Path, dir: &Path, files: &BTreeSet<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = path.strip_prefix(root).unwrap().to_path_buf();
        if name == Path::new("target") || name == Path::new(".git") {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            remove_extra(root, &path, files);
            if std::fs::read_dir(&path).unwrap().next().is_none() {
                std::fs::remove_dir(&path).unwrap();
            }
        } else if !files.contains(&name) {
            std::fs::remove_file(&path).unwrap();
        }
    }
}
