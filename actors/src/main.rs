//! `egress-proxies-operator`: the binary.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use egress_proxies::config::ProvidersConfig;
use egress_proxies::resource::crd_yaml;
use egress_proxies::telemetry::init_logging;

use cli::{Cli, Command, RunArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crd) => print_crd(),
        Some(Command::ValidateConfig { file }) => validate_config(&file),
        Some(Command::Run(args)) => run(&cli.logging, args),
        None => run(&cli.logging, cli.run),
    }
}

fn print_crd() -> ExitCode {
    match crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn validate_config(file: &std::path::Path) -> ExitCode {
    match ProvidersConfig::load(file) {
        Ok(config) => {
            let names: Vec<String> = config
                .providers
                .iter()
                .map(|p| format!("{} ({})", p.name, p.settings.kind()))
                .collect();
            println!(
                "{}: ok, {} provider(s): {}",
                file.display(),
                names.len(),
                names.join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let problems = e.problems();
            eprintln!("{}: {} problem(s)", file.display(), problems.len());
            for problem in problems {
                eprintln!("  - {problem}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(logging: &cli::LoggingArgs, args: RunArgs) -> ExitCode {
    if let Err(e) = init_logging(logging.log_level.as_deref(), logging.log_format.into()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    tracing::info!(version = cli::VERSION, "starting egress-proxies-operator");
    if let Err(e) = ProvidersConfig::load(&args.providers_config) {
        tracing::error!(error = %e, "providers configuration rejected");
        return ExitCode::FAILURE;
    }
    tracing::error!(
        "Kubernetes mode is not part of this build yet; nothing was started. \
         Use the standalone mode once it lands (see README.md)"
    );
    ExitCode::FAILURE
}
