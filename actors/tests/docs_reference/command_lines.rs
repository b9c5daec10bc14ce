//! The operator's command lines in the docs, and whether the CLI has what
//! they name: `egress-proxies-operator ARGS` (or a path ending in it) and
//! `cargo run [..] -- ARGS`, wherever a shell command starts.

use clap::{Arg, Command};

const BINARY: &str = "egress-proxies-operator";

/// The word [`words`] puts for a redirection operator.
const REDIRECT: &str = ">";

/// Shell words of one command line: quotes removed, a `#` comment dropped.
pub fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                word.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                in_word = true;
                word.extend(chars.by_ref().take_while(|&c| c != '"'));
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '#' if !in_word => break,
            // A redirection (`> file`, `2>&1`, `<<EOF`): a token of its own,
            // its file descriptor dropped.
            '>' | '<' => {
                if in_word && !word.chars().all(|c| c.is_ascii_digit()) {
                    words.push(std::mem::take(&mut word));
                }
                word.clear();
                in_word = false;
                while chars.clone().next().is_some_and(|c| "<>&".contains(c)) {
                    chars.next();
                }
                words.push(REDIRECT.to_owned());
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            // Operators end a command; keep them as words of their own.
            ';' | '|' | '&' | '(' | ')' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                words.push(c.to_string());
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The operator's arguments of each invocation among `words`.
pub fn invocations(words: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for command in words.split(|w| [";", "|", "&", "(", ")"].contains(&w.as_str())) {
        let mut rest = command.iter().skip_while(|w| {
            is_assignment(w) || ["env", "exec", "sudo", "time", "then", "do"].contains(&w.as_str())
        });
        let Some(first) = rest.next() else { continue };
        // Redirections and their targets are the shell's, not arguments.
        let mut rest: Vec<String> = rest.cloned().collect();
        while let Some(at) = rest.iter().position(|w| w == REDIRECT) {
            rest.drain(at..(at + 2).min(rest.len()));
        }
        if first == BINARY || first.ends_with(&format!("/{BINARY}")) {
            found.push(rest);
        } else if first == "cargo"
            && rest.first().is_some_and(|w| w == "run")
            && let Some(dash) = rest.iter().position(|w| w == "--")
        {
            found.push(rest[dash + 1..].to_vec());
        }
    }
    found
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// A word that stands for something the reader fills in.
fn placeholder(word: &str) -> bool {
    word.contains("...") || word.contains('…') || word.starts_with(['<', '[', '$'])
}

/// What `args` names that the CLI does not have.
pub fn problems(cli: &Command, args: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut cmd = cli;
    let mut path = BINARY.to_owned();
    let mut positional = 0;
    let mut i = 0;
    while i < args.len() {
        let word = &args[i];
        i += 1;
        if placeholder(word) {
            continue;
        }
        if word == "--" {
            break;
        }
        let arg = if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = long.split_once('=').map_or((long, false), |(n, _)| (n, true));
            match cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(name) || has_alias(a, name))
            {
                Some(arg) => Some((arg, inline)),
                None => {
                    problems.push(format!("`--{name}` is not a flag of `{path}`"));
                    // Whether it would take the next word is unknown: one that is no flag is taken as its value.
                    if !inline && args.get(i).is_some_and(|next| !next.starts_with('-')) {
                        i += 1;
                    }
                    None
                }
            }
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            let short = shorts.chars().next().unwrap_or('-');
            match cmd.get_arguments().find(|a| a.get_short() == Some(short)) {
                Some(arg) => Some((arg, shorts.len() > 1)),
                None => {
                    problems.push(format!("`-{short}` is not a flag of `{path}`"));
                    None
                }
            }
        } else {
            if positional == 0
                && cmd.has_subcommands()
                && let Some(sub) = cmd.find_subcommand(word)
            {
                path = format!("{path} {}", sub.get_name());
                cmd = sub;
                continue;
            }
            let slots: Vec<&Arg> = cmd.get_positionals().collect();
            match slots.get(positional) {
                None if cmd.has_subcommands() && positional == 0 => {
                    // The rest belongs to a subcommand that does not exist.
                    problems.push(format!("`{word}` is not a subcommand of `{path}`"));
                    break;
                }
                None => problems.push(format!("`{path}` takes no argument `{word}`")),
                Some(slot) => {
                    let values = slot.get_possible_values();
                    if !values.is_empty() && !values.iter().any(|v| v.matches(word, false)) {
                        let names: Vec<&str> = values.iter().map(|v| v.get_name()).collect();
                        problems.push(format!("`{path}`: `{word}` is not one of {}", names.join(", ")));
                    }
                }
            }
            positional += 1;
            continue;
        };
        // A flag that takes a value takes the next word unless it came inline.
        if let Some((arg, inline)) = arg
            && arg.get_action().takes_values()
            && !inline
        {
            i += 1;
        }
    }
    problems
}

fn has_alias(arg: &Arg, name: &str) -> bool {
    arg.get_all_aliases()
        .is_some_and(|aliases| aliases.contains(&name))
}

/// Every `--flag` of any command, with the command's path.
pub fn all_flags(cli: &Command) -> Vec<(String, &Arg)> {
    fn walk<'a>(cmd: &'a Command, path: String, out: &mut Vec<(String, &'a Arg)>) {
        for arg in cmd.get_arguments() {
            out.push((path.clone(), arg));
        }
        for sub in cmd.get_subcommands() {
            walk(sub, format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(cli, BINARY.to_owned(), &mut out);
    out
}

#[test]
fn invocations_are_found_where_commands_start() {
    let line = "FOO=1 egress-proxies-operator run --x 'a b' # note";
    assert_eq!(invocations(&words(line)), [vec!["run", "--x", "a b"]]);
    let line = "kubectl get lease egress-proxies-operator && cargo run --release -q -- get pools";
    assert_eq!(invocations(&words(line)), [vec!["get", "pools"]]);
    assert!(invocations(&words("cargo run --release")).is_empty());
    let line = "cargo run -q -- crd proxypools > deploy/crd/proxypools.yaml 2>&1";
    assert_eq!(invocations(&words(line)), [vec!["crd", "proxypools"]]);
    let line = "./target/release/egress-proxies-operator crd | kubectl apply -f -";
    assert_eq!(invocations(&words(line)), [vec!["crd"]]);
}
