//! `egress-proxies-operator`: the binary.

mod cli;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use egress_proxies::config::ProvidersConfig;
use egress_proxies::resource::{crd_yaml, proxy_table};
use egress_proxies::telemetry::init_logging;
use egress_proxies_operator::standalone;

use cli::{Cli, Command, LoggingArgs, RunArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crd) => print_crd(),
        Some(Command::ValidateConfig { file }) => validate_config(&file),
        Some(Command::Get { config, .. }) => get_proxies(&config),
        Some(Command::Standalone { config }) => run_standalone(&cli.logging, &config),
        Some(Command::ForwardProxy { listen, instance_dir }) => {
            forward_proxy(&cli.logging, listen, &instance_dir)
        }
        Some(Command::Run(args)) => run(&cli.logging, args),
        None => run(&cli.logging, cli.run),
    }
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

fn logging(args: &LoggingArgs) -> Result<(), ExitCode> {
    init_logging(args.log_level.as_deref(), args.log_format.into()).map_err(fail)
}

fn print_crd() -> ExitCode {
    match crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn validate_config(file: &Path) -> ExitCode {
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

fn get_proxies(config: &Path) -> ExitCode {
    match standalone::snapshot(config) {
        Ok(proxies) if proxies.is_empty() => {
            println!("No proxies found.");
            ExitCode::SUCCESS
        }
        Ok(proxies) => {
            print!("{}", proxy_table(&proxies, jiff::Timestamp::now()));
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn run_standalone(log: &LoggingArgs, config: &Path) -> ExitCode {
    if let Err(code) = logging(log) {
        return code;
    }
    tracing::info!(version = cli::VERSION, "starting egress-proxies-operator");
    match standalone::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "standalone mode stopped");
            fail(e)
        }
    }
}

fn forward_proxy(log: &LoggingArgs, listen: std::net::SocketAddr, instance_dir: &Path) -> ExitCode {
    if let Err(code) = logging(log) {
        return code;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    tracing::info!(%listen, instance = %instance_dir.display(), "built-in forward proxy starting");
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            served = egress_proxies::forward_proxy::serve(listener) => served,
            _ = term.recv() => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("forward proxy on {listen}: {e}")),
    }
}

fn run(log: &LoggingArgs, args: RunArgs) -> ExitCode {
    if let Err(code) = logging(log) {
        return code;
    }
    tracing::info!(version = cli::VERSION, "starting egress-proxies-operator");
    if let Err(e) = ProvidersConfig::load(&args.providers_config) {
        tracing::error!(error = %e, "providers configuration rejected");
        return ExitCode::FAILURE;
    }
    fail(
        "Kubernetes mode is not part of this build yet; nothing was started. \
         Run `egress-proxies-operator standalone --config FILE` instead (see README.md)",
    )
}
