//! docs/reference/cli.md, rendered from the clap definition: every
//! subcommand (hidden ones too, marked), every flag with its environment
//! variable, default, possible values and help.

use std::fmt::Write;

use clap::{Arg, Command};

/// The built-in flags clap adds to every command.
const BUILT_IN: [&str; 2] = ["help", "version"];

pub fn render(cli: &Command, header: &str) -> String {
    let mut cli = cli.clone();
    cli.build();
    let name = cli.get_name().to_owned();
    let mut out = String::new();
    let _ = writeln!(out, "# Command-line reference\n\n{header}\n");
    let _ = writeln!(out, "{}\n", help_of(cli.get_long_about().or(cli.get_about())));
    let _ = writeln!(out, "```text\n{}\n```\n", usage(&mut cli));
    out.push_str("| command | what it does |\n|---|---|\n");
    for sub in subcommands(&cli) {
        let hidden = if sub.is_hide_set() {
            " (hidden from `--help`)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "| [`{}`](#{}) | {}{hidden} |",
            sub.get_name(),
            sub.get_name(),
            cell(&help_of(sub.get_about()))
        );
    }
    out.push('\n');

    let globals: Vec<&Arg> = own_args(&cli).filter(|a| a.is_global_set()).collect();
    let root_args: Vec<&Arg> = own_args(&cli).filter(|a| !a.is_global_set()).collect();
    let run = cli.find_subcommand("run");
    let same_as_run = run.is_some_and(|run| {
        let ids = |args: Vec<&Arg>| args.iter().map(|a| a.get_id().to_string()).collect::<Vec<_>>();
        ids(root_args.clone()) == ids(own_args(run).filter(|a| !a.is_global_set()).collect())
    });
    if same_as_run {
        let _ = writeln!(
            out,
            "Without a subcommand `{name}` runs [`run`](#run) and takes its flags: \
             `{name} --leader-elect` is `{name} run --leader-elect`.\n"
        );
    } else if !root_args.is_empty() {
        out.push_str("Flags without a subcommand:\n\n");
        out.push_str(&table(&root_args));
    }
    out.push_str("## Flags of every subcommand\n\n");
    out.push_str(&table(&globals));
    let _ = writeln!(
        out,
        "`-h`, `--help` prints help (`-h` a summary), as does `{name} help [COMMAND]`; \
         `-V`, `--version` prints the version and the commit it was built from (`{name}` only).\n"
    );

    for sub in subcommands(&cli).cloned().collect::<Vec<_>>() {
        let mut sub = sub;
        let _ = writeln!(out, "## {}\n", sub.get_name());
        if sub.is_hide_set() {
            out.push_str("Hidden from `--help`: the operator starts it itself.\n\n");
        }
        let _ = writeln!(out, "{}\n", help_of(sub.get_long_about().or(sub.get_about())));
        let _ = writeln!(out, "```text\n{}\n```\n", usage(&mut sub));
        let args: Vec<&Arg> = own_args(&sub).filter(|a| !a.is_global_set()).collect();
        if args.is_empty() {
            out.push_str("No flags besides those of every subcommand.\n\n");
        } else {
            out.push_str(&table(&args));
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// The subcommands but clap's own `help`.
fn subcommands(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|s| s.get_name() != "help")
}

/// A command's arguments without clap's built-in `--help`/`--version`.
pub fn own_args(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments()
        .filter(|a| !BUILT_IN.contains(&a.get_id().as_str()))
}

fn usage(cmd: &mut Command) -> String {
    cmd.render_usage().to_string()
}

fn table(args: &[&Arg]) -> String {
    let mut out =
        String::from("| argument | environment | default | values | description |\n|---|---|---|---|---|\n");
    for arg in args {
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        // A switch (a flag without a value) is off unless given.
        let defaults: Vec<String> = if arg.get_action().takes_values() {
            arg.get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect()
        } else {
            vec!["off".to_owned()]
        };
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| {
                let aliases: Vec<String> = v
                    .get_name_and_aliases()
                    .skip(1)
                    .map(|a| format!("`{a}`"))
                    .collect();
                let mut text = format!("`{}`", v.get_name());
                if !aliases.is_empty() {
                    let _ = write!(text, " (or {})", aliases.join(", "));
                }
                if let Some(help) = v.get_help() {
                    let _ = write!(text, ": {help}");
                }
                text
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {env} | {} | {} | {} |",
            cell(&name_of(arg)),
            defaults.join(", "),
            cell(&values.join("; ")),
            cell(&help_of(arg.get_long_help().or(arg.get_help())))
        );
    }
    out.push('\n');
    out
}

/// `--name <VALUE>`, `-o, --output <OUTPUT>`, or `<FILE>` for a positional.
fn name_of(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    let takes_value = arg.get_action().takes_values();
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    if names.is_empty() {
        return format!("`{value}`");
    }
    let names = names.join(", ");
    if takes_value {
        let repeat = if matches!(arg.get_action(), clap::ArgAction::Append) {
            " (repeatable)"
        } else {
            ""
        };
        format!("`{names} {value}`{repeat}")
    } else {
        format!("`{names}`")
    }
}

fn help_of(text: Option<&clap::builder::StyledStr>) -> String {
    text.map(|t| t.to_string()).unwrap_or_default()
}

/// Text fit for one table cell: one line, pipes escaped.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}
