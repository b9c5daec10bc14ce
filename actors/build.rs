//! Embeds the git commit the binary is built from, for `--version`.
//! `EPO_GIT_COMMIT` overrides it (container builds without `.git`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    // No optional locks: `git status` would otherwise refresh and rewrite
    // `.git/index`, which this script watches, so every build would leave
    // the next one a reason to build again.
    let out = Command::new("git")
        .arg("--no-optional-locks")
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=EPO_GIT_COMMIT");
    let commit = std::env::var("EPO_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let head = git(&["rev-parse", "HEAD"])?;
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
            Some(if dirty { format!("{head}-dirty") } else { head })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let mut watched = vec!["HEAD".to_owned(), "index".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for file in watched {
        // `--git-path`: where git keeps it, in a worktree too (its refs live
        // in the main repository's directory).
        let Some(path) = git(&["rev-parse", "--git-path", &file]) else {
            continue;
        };
        let path = std::env::current_dir().unwrap_or_default().join(path);
        // Only files that exist: cargo runs a script again on every build
        // while a file it watches is missing (a repository without
        // `packed-refs`, say), and the operator would be rebuilt each time.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rustc-env=EPO_GIT_COMMIT={commit}");
}
