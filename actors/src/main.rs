//! `egress-proxies-operator`: the binary. It parses the command line (the
//! library's `adapters::command_line`) and starts what it asks for: the
//! operator's actors on an actix system of their own in `run` and
//! `standalone`; the one-shot commands and the forward-proxy helper process
//! run without actors.
#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use egress_proxies::adapters::command_line::{self as cli, Cli, Command, LoggingArgs, RunArgs};
use egress_proxies::adapters::config_files;
use egress_proxies::domain::resource::{
    ListFormat, crd_yaml_of, pool_list, pool_table, proxy_list, proxy_table,
};
use egress_proxies::telemetry::{TelemetryGuard, init_logging};
use egress_proxies_operator::{operator, standalone, system};

/// jemalloc instead of the system allocator: thousands of actors and
/// probes allocate small objects on several threads, where glibc's arenas
/// keep freed memory resident; jemalloc's background thread returns it
/// (docs/benchmarks.md, fleet scale: steady RSS 191 → 140 MiB at 10,000
/// proxies, CPU per probe 0.081 → 0.063 ms).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Version line: crate version and the commit the binary was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EPO_GIT_COMMIT"),
    ")"
);

fn main() -> ExitCode {
    let cli = command_line();
    match cli.command {
        Some(Command::Crd { kind }) => print_crd(kind.into()),
        Some(Command::ValidateConfig { file }) => validate_config(&file),
        Some(Command::Get {
            resource: cli::Resource::Proxies,
            config,
            output,
        }) => get_proxies(&config, output),
        Some(Command::Get {
            resource: cli::Resource::Pools,
            config,
            output,
        }) => get_pools(&config, output),
        Some(Command::Get {
            resource: cli::Resource::Sites,
            config,
            output,
        }) => get_sites(&config, output),
        Some(Command::Standalone { config }) => run_standalone(&cli.logging, &config),
        Some(Command::ForwardProxy {
            listen,
            instance_dir,
            pid_file,
            destinations,
            credentials_file,
            outgoing_address,
            limits,
        }) => forward_proxy(
            &cli.logging,
            listen,
            &instance_dir,
            pid_file.as_deref(),
            egress_proxies::adapters::forward_proxy::Options {
                destinations: destinations.policy().into(),
                auth: None,
                realm: None,
                outgoing: outgoing_address,
            },
            credentials_file.as_deref(),
            &limits,
        ),
        Some(Command::Run(args)) => run(&cli.logging, *args),
        None => run(&cli.logging, cli.run),
    }
}

/// The command line as given; `--version` names this build's commit.
fn command_line() -> Cli {
    let mut command = Cli::command().version(VERSION);
    let mut matches = command.get_matches_mut();
    Cli::from_arg_matches_mut(&mut matches)
        .map_err(|e| e.format(&mut command))
        .unwrap_or_else(|e| e.exit())
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

/// Logs, and traces when `traces` and the environment ask for them; keep
/// the guard until exit. Then, first thing of every long-running command,
/// the open-file limit is raised.
fn logging(args: &LoggingArgs, traces: bool) -> Result<TelemetryGuard, ExitCode> {
    let guard = init_logging(args.log_level.as_deref(), args.log_format.into(), traces).map_err(fail)?;
    raise_file_limit();
    Ok(guard)
}

/// The open-file limit to its hard limit, before any listener, thread or
/// child (Squid, the built-in proxy inherit it); logged. Failing to raise
/// it is not fatal: the listeners size their caps from what it is.
fn raise_file_limit() {
    match egress_proxies::file_limit::raise_to_hard_limit() {
        Ok(limit) => tracing::info!(
            soft = limit.soft,
            hard = limit.hard,
            was = limit.was,
            "open-file limit (RLIMIT_NOFILE)"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            soft = egress_proxies::file_limit::current(),
            "open-file limit left as it is"
        ),
    }
}

fn print_crd(kind: egress_proxies::domain::resource::CrdKind) -> ExitCode {
    match crd_yaml_of(kind) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn validate_config(file: &Path) -> ExitCode {
    match config_files::providers_config(file) {
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

fn get_proxies(config: &Path, output: cli::Output) -> ExitCode {
    let proxies = match standalone::snapshot(config) {
        Ok(proxies) => proxies,
        Err(e) => return fail(e),
    };
    let text = match output {
        cli::Output::Table | cli::Output::Wide if proxies.is_empty() => Ok("No proxies found.\n".to_owned()),
        cli::Output::Table => Ok(proxy_table(&proxies, jiff::Timestamp::now(), false)),
        cli::Output::Wide => Ok(proxy_table(&proxies, jiff::Timestamp::now(), true)),
        cli::Output::Yaml => proxy_list(&proxies, ListFormat::Yaml),
        cli::Output::Json => proxy_list(&proxies, ListFormat::Json),
    };
    match text {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn get_pools(config: &Path, output: cli::Output) -> ExitCode {
    let pools = match standalone::pool_snapshot(config) {
        Ok(pools) => pools,
        Err(e) => return fail(e),
    };
    let text = match output {
        cli::Output::Table | cli::Output::Wide if pools.is_empty() => Ok("No pools found.\n".to_owned()),
        cli::Output::Table | cli::Output::Wide => Ok(pool_table(&pools, jiff::Timestamp::now())),
        cli::Output::Yaml => pool_list(&pools, ListFormat::Yaml),
        cli::Output::Json => pool_list(&pools, ListFormat::Json),
    };
    match text {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn get_sites(config: &Path, output: cli::Output) -> ExitCode {
    let sites = match standalone::sites(config) {
        Ok(sites) => sites,
        Err(e) => return fail(e),
    };
    let text = match output {
        cli::Output::Table | cli::Output::Wide if sites.is_empty() => Ok("No sites learnt yet.\n".to_owned()),
        cli::Output::Table | cli::Output::Wide => Ok(egress_proxies::domain::resource::site_table(&sites)),
        cli::Output::Yaml => serde_saphyr::to_string(&sites).map_err(|e| e.to_string()),
        cli::Output::Json => serde_json::to_string_pretty(&sites)
            .map(|json| json + "\n")
            .map_err(|e| e.to_string()),
    };
    match text {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn run_standalone(log: &LoggingArgs, config: &Path) -> ExitCode {
    let _telemetry = match logging(log, true) {
        Ok(guard) => guard,
        Err(code) => return code,
    };
    starting();
    // Checked and bound first; then the actors start on an actix system
    // that lasts until SIGTERM.
    let ran = standalone::prepare(config)
        .and_then(|prepared| actix::System::new().block_on(standalone::run(prepared)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "standalone mode stopped");
            fail(e)
        }
    }
}

fn forward_proxy(
    log: &LoggingArgs,
    listen: std::net::SocketAddr,
    instance_dir: &Path,
    pid_file: Option<&Path>,
    mut options: egress_proxies::adapters::forward_proxy::Options,
    credentials_file: Option<&Path>,
    limits: &cli::ConnectionLimitArgs,
) -> ExitCode {
    // A helper process of the local provider: no traces of its own.
    let _telemetry = match logging(log, false) {
        Ok(guard) => guard,
        Err(code) => return code,
    };
    // One worker per core: hyper's connections and the upstream pool spread over them.
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    match credentials_file.map(egress_proxies::adapters::stores::credentials_file::read_credentials_file) {
        Some(Ok(credentials)) => {
            options.auth = Some(egress_proxies::domain::credentials::BasicAuthorization::of(
                &credentials,
            ));
            // Its 407 names the credentials' own realm, as a local Squid's does.
            options.realm = Some(credentials.realm());
        }
        Some(Err(e)) => return fail(e),
        None => {}
    }
    // Sized to the file limit as it is now, after any raise at start.
    let settings = limits.settings();
    tracing::info!(
        %listen, instance = %instance_dir.display(), authenticated = options.auth.is_some(),
        realm = options.realm.as_deref(),
        outgoing_address = options.outgoing.map(tracing::field::display),
        max_connections = settings.max_connections,
        memory_limit = egress_proxies::memory_limit::current().map(tracing::field::display),
        head_budget = settings.unauthenticated.head_budget,
        connections_per_source = settings.unauthenticated.connections_per_source,
        header_read_timeout = ?settings.header_read_timeout, idle_timeout = ?settings.idle_timeout,
        "built-in forward proxy starting"
    );
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        if let Some(file) = pid_file {
            std::fs::write(file, format!("{}\n", std::process::id()))?;
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            served = egress_proxies::adapters::forward_proxy::serve_with(listener, options, settings) => served,
            _ = term.recv() => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("forward proxy on {listen}: {e}")),
    }
}

fn run(log: &LoggingArgs, args: RunArgs) -> ExitCode {
    let _telemetry = match logging(log, true) {
        Ok(guard) => guard,
        Err(code) => return code,
    };
    starting();
    let tokens = match egress_proxies_operator::discovery::Tokens::from_env(args.crawler_tokens_dir.clone()) {
        Ok(tokens) => tokens,
        Err(e) => return fail(e),
    };
    if tokens.is_open()
        && args.discovery_bind_address != egress_proxies::domain::config::BindAddress::Disabled
    {
        if !args.insecure_discovery_without_token {
            return fail(
                "DISCOVERY_TOKEN is not set: the discovery API would lease proxies to anyone who reaches it. \
                 Set it (the Deployment takes it from the discovery-token Secret) or give named crawler tokens \
                 (--crawler-tokens-dir), or pass \
                 --insecure-discovery-without-token to serve it open on purpose",
            );
        }
        tracing::warn!("--insecure-discovery-without-token: the discovery API serves without authentication");
    }
    let replica_advertise = args.replica_advertise(std::env::var("POD_IP").ok().as_deref());
    let options = operator::Options {
        providers_config: args.providers_config,
        state_dir: args.state_dir,
        health_probe_bind_address: args.health_probe_bind_address,
        metrics_bind_address: args.metrics_bind_address,
        metrics_secure: args.metrics_secure,
        metrics_cert_dir: args.metrics_cert_dir.clone(),
        discovery_bind_address: args.discovery_bind_address,
        gateway_bind_address: args.gateway_bind_address,
        gateway_config: args.gateway_config.clone(),
        leader_elect: args.leader_elect,
        lease_duration: args.lease_duration,
        proxy_namespace: args.proxy_namespace.clone(),
        health_ca_file: args.health_ca_file,
        gcp: egress_proxies::adapters::providers::gcp::GcpOptions {
            wire_log_full_payloads: args.gcp_wire_log_full_payloads,
        },
        cluster_networks: args.cluster_networks,
        settings: system::Settings {
            health_workers: args.health_workers as usize,
            trace_health_probes: args.trace_health_probes,
            leases: system::lease_settings(
                args.lease_cooldown,
                args.max_lease_ttl,
                args.max_leases_per_proxy,
            ),
            fair_share: args.fair_share_weights.clone().unwrap_or_default(),
            gc_interval: args.gc_interval,
            gc_grace_period: args.gc_grace_period,
            pool_scale_down_delay: args.pool_scale_down_delay,
            discovery_tokens: tokens,
            lease_journal: None,
            tenure: None,
            proxy_namespace: args.proxy_namespace.clone(),
            external_endpoints: Some(std::sync::Arc::new(
                egress_proxies::domain::destinations::DestinationPolicy::external_endpoints(
                    &args.allow_external_endpoint_networks,
                ),
            )),
        },
        installation_id: args.installation_id.clone(),
        kube_api_budget: args
            .kube_api_qps
            .map(|qps| egress_proxies::adapters::kube_client::ApiBudget::new(qps, args.kube_api_burst)),
        every_replica_serves: args.every_replica_serves,
        replica_bind_address: args.replica_bind_address,
        replica_advertise,
        replica_token: std::env::var("DISCOVERY_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .map(|t| egress_proxies::adapters::replicas::token::ReplicaToken::derive(&t)),
    };
    // Checked and bound first; then the actors start on an actix system
    // that lasts until SIGTERM or a lost leadership.
    let ran = operator::prepare(options)
        .and_then(|prepared| actix::System::new().block_on(operator::run(prepared)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "operator stopped");
            fail(e)
        }
    }
}

/// Says which build starts: in the log and as `egress_proxies_build_info`.
fn starting() {
    tracing::info!(version = VERSION, "starting egress-proxies-operator");
    let build = egress_proxies::telemetry::metrics::BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        commit: env!("EPO_GIT_COMMIT").to_owned(),
    };
    egress_proxies::telemetry::metrics::metrics()
        .build_info
        .get_or_create(&build)
        .set(1);
}
