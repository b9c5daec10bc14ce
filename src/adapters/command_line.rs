//! The command line: every flag of the operator, with environment
//! equivalents. The binary (`actors/src/main.rs`) parses it, adding its
//! build's version for `--version`, and starts what it asks for.

use std::path::PathBuf;
use std::time::Duration;

use crate::adapters::guarded_listener::ListenerSettings;
use crate::domain::config::BindAddress;
use crate::domain::destinations::{DestinationEntry, DestinationPolicy, DestinationRules, IpNet, parse_cidr};
use crate::domain::installation::InstallationId;
use crate::telemetry::LogFormat;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Keeps a fleet of egress HTTP proxies alive and hands them out through a lease API.
#[derive(Parser, Debug)]
// `version`: the crate's; the binary names its build's commit too.
#[command(
    name = "egress-proxies-operator",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Flags of `run`, so that `egress-proxies-operator --leader-elect` runs the operator.
    #[command(flatten)]
    pub run: RunArgs,

    #[command(flatten)]
    pub logging: LoggingArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator against a Kubernetes API server (the default).
    Run(Box<RunArgs>),
    /// Run on this machine without a cluster: manifests from a directory, state in a local file.
    Standalone {
        /// The standalone configuration (see config/standalone/quickstart.yaml).
        #[arg(long, env = "STANDALONE_CONFIG")]
        config: PathBuf,
    },
    /// Show stored objects, or what the running gateway learnt per site, as a table (standalone mode).
    Get {
        /// What to list.
        #[arg(value_enum)]
        resource: Resource,
        /// The standalone configuration whose state to read (for sites: where its discovery API listens).
        #[arg(long, env = "STANDALONE_CONFIG")]
        config: PathBuf,
        /// `wide` adds each proxy's status message; `yaml` and `json` print whole objects.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print a CustomResourceDefinition as YAML.
    Crd {
        /// Which one.
        #[arg(value_enum, default_value = "proxies")]
        kind: CrdArg,
    },
    /// Check a providers configuration file and print every problem.
    ValidateConfig {
        /// The providers configuration (YAML).
        file: PathBuf,
    },
    /// The built-in forward proxy a local instance runs (started by the local provider).
    #[command(hide = true)]
    ForwardProxy {
        /// The address and port to listen on.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// The instance directory (named in its log lines).
        #[arg(long)]
        instance_dir: PathBuf,
        /// Where to write this process's pid once it listens.
        #[arg(long)]
        pid_file: Option<PathBuf>,
        #[command(flatten)]
        destinations: DestinationArgs,
        /// A file (mode 0600) holding `username:password` that every request
        /// must present (Basic `Proxy-Authorization`). A file, not a flag:
        /// `ps` shows command lines to every user.
        #[arg(long)]
        credentials_file: Option<PathBuf>,
        /// The source address of connections to destinations (of its IP family).
        #[arg(long)]
        outgoing_address: Option<std::net::IpAddr>,
        #[command(flatten)]
        limits: Box<ConnectionLimitArgs>,
    },
}

/// How the built-in proxy limits its client connections (docs/standalone.md).
#[derive(Args, Debug, Clone)]
pub struct ConnectionLimitArgs {
    /// At most this many client connections at a time; at the cap the
    /// longest-idle one is closed for a new one [default: what the file
    /// limit allows, 3 descriptors each, and the memory limit]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// A complete request head must arrive within this after the connection
    /// opens or the previous response ends (so also the keep-alive idle timeout).
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,
    /// A request or tunnel that moves no byte either way for this long is ended.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration)]
    pub idle_timeout: Duration,
}

impl ConnectionLimitArgs {
    pub fn settings(&self) -> ListenerSettings {
        let mut settings = ListenerSettings::for_process_limits(
            crate::adapters::forward_proxy::FDS_PER_CONNECTION,
            crate::adapters::forward_proxy::unauthenticated_limits(),
        );
        if let Some(max) = self.max_connections {
            settings.max_connections = usize::try_from(max).unwrap_or(usize::MAX);
        }
        settings.header_read_timeout = self.header_read_timeout;
        settings.idle_timeout = self.idle_timeout;
        settings
    }
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// Requests a second: a positive, finite number.
fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps > 0.0 => Ok(qps),
        Ok(_) => Err("must be a number above zero".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// The built-in proxy's destination rules. Without any, it refuses what
/// every operator-made proxy refuses by default (docs/security.md).
#[derive(Args, Debug, Clone)]
pub struct DestinationArgs {
    /// A network (CIDR or address) reachable despite the default denies, or a port CONNECT may reach besides 443 (repeatable).
    #[arg(long = "allow", value_name = "CIDR|PORT")]
    pub allow: Vec<DestinationEntry>,
    /// A network or port never reached (repeatable); beats --allow.
    #[arg(long = "deny", value_name = "CIDR|PORT")]
    pub deny: Vec<DestinationEntry>,
    /// A cluster network denied like the default ones (repeatable).
    #[arg(long = "cluster-network", value_name = "CIDR", value_parser = parse_cidr)]
    pub cluster_networks: Vec<IpNet>,
}

impl DestinationArgs {
    pub fn policy(&self) -> DestinationPolicy {
        let rules = DestinationRules {
            allow: self.allow.clone(),
            deny: self.deny.clone(),
        };
        DestinationPolicy::new(&rules, &self.cluster_networks)
    }
}

/// What `get` lists.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    #[value(alias = "proxy", alias = "px")]
    Proxies,
    #[value(alias = "pool", alias = "proxypools", alias = "pp")]
    Pools,
    /// What the running operator's gateway learnt per site (asked of its
    /// discovery API with EGRESS_PROXIES_TOKEN or DISCOVERY_TOKEN).
    #[value(alias = "site")]
    Sites,
}

/// How `get` prints.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The kubectl-style table.
    Table,
    /// The table with a MESSAGE column.
    Wide,
    /// Whole objects as a YAML `List` (inline cloud-init redacted).
    Yaml,
    /// Whole objects as a JSON `List` (inline cloud-init redacted).
    Json,
}

/// Log settings, shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct LoggingArgs {
    /// Log level or filter (`info`, `debug`, `egress_proxies=trace,info`); overrides RUST_LOG.
    /// Default: `RUST_LOG` when set, else `info`.
    // No clap default: a default value would always win over RUST_LOG
    // (init_logging falls back to RUST_LOG, then `info`).
    #[arg(long, global = true, env = "LOG_LEVEL")]
    pub log_level: Option<String>,

    /// Log line format; `auto` is JSON unless stderr's reader is a terminal.
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t = LogFormatArg::Auto)]
    pub log_format: LogFormatArg,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormatArg {
    Auto,
    Json,
    Text,
}

impl From<LogFormatArg> for LogFormat {
    fn from(value: LogFormatArg) -> Self {
        match value {
            LogFormatArg::Auto => LogFormat::Auto,
            LogFormatArg::Json => LogFormat::Json,
            LogFormatArg::Text => LogFormat::Text,
        }
    }
}

/// Settings of the running operator.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Providers configuration (YAML).
    #[arg(
        long,
        env = "PROVIDERS_CONFIG",
        default_value = "/etc/proxy-operator/providers.yaml"
    )]
    pub providers_config: PathBuf,

    /// Prometheus metrics listener (`0` disables it).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8080")]
    pub metrics_bind_address: BindAddress,

    /// Serve metrics over HTTPS, only to bearer tokens the API server
    /// authenticates (TokenReview) and allows `get /metrics`
    /// (SubjectAccessReview). `false`: plain HTTP, open to anyone who
    /// reaches the port.
    #[arg(long, env = "METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,

    /// Directory with `tls.crt` and `tls.key` for the metrics listener
    /// (default: a self-signed certificate made at start).
    #[arg(long, env = "METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<PathBuf>,

    /// Listener for `/healthz` and `/readyz`.
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: BindAddress,

    /// Discovery and lease API listener.
    #[arg(long, env = "DISCOVERY_BIND_ADDRESS", default_value = ":8090")]
    pub discovery_bind_address: BindAddress,

    /// The gateway's listener (docs/gateway.md): one forward-proxy endpoint
    /// that leases a proxy per request (`0` disables it). Crawlers present
    /// their crawler token as the proxy password; without any token it
    /// serves on loopback only.
    #[arg(long, env = "GATEWAY_BIND_ADDRESS", default_value = "0")]
    pub gateway_bind_address: BindAddress,

    /// The gateway's settings (YAML: destinations and the rest, as in
    /// docs/gateway.md); without it, the defaults.
    #[arg(long, env = "GATEWAY_CONFIG")]
    pub gateway_config: Option<PathBuf>,

    /// Named crawler tokens (docs/security.md): a directory with one file
    /// per crawler identity, the file name its name, the content its token
    /// (a mounted Secret). Re-read every few seconds: a changed file takes
    /// effect within 10 s. `DISCOVERY_TOKEN` keeps working as identity
    /// `default`.
    #[arg(long, env = "CRAWLER_TOKENS_DIR")]
    pub crawler_tokens_dir: Option<PathBuf>,

    /// Serve the discovery API without `DISCOVERY_TOKEN` (anyone who reaches
    /// it may lease proxies). Without this flag the operator refuses to
    /// start with the API enabled and no token.
    #[arg(long, env = "INSECURE_DISCOVERY_WITHOUT_TOKEN")]
    pub insecure_discovery_without_token: bool,

    /// Run only while holding the leader Lease (for more than one replica).
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,

    /// With `--leader-elect`: every replica serves the gateway and the
    /// lease API from a capacity share the leader hands out
    /// (docs/kubernetes.md, "Every replica serves"). `false`: only the
    /// leader serves. Without `--leader-elect` the one process serves.
    #[arg(long, env = "EVERY_REPLICA_SERVES", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub every_replica_serves: bool,

    /// The replicas' internal listener (sync with the leader, forwarded
    /// lease calls), bound only when every replica serves. Off the
    /// loopback only with a `DISCOVERY_TOKEN`, from which the replicas'
    /// token is derived.
    #[arg(long, env = "REPLICA_BIND_ADDRESS", default_value = ":8091")]
    pub replica_bind_address: BindAddress,

    /// Where the other replicas reach this one's internal listener (`ip:port`).
    /// Default: `$POD_IP` with the listener's port, else the listener's
    /// address when it names an IP.
    #[arg(long, env = "REPLICA_ADVERTISE_ADDRESS", value_name = "IP:PORT")]
    pub replica_advertise_address: Option<std::net::SocketAddr>,

    /// Leader Lease duration: a candidate takes over a Lease unchanged this
    /// long; the leader stops acting 2/3 of it after its last successful
    /// renew began and renews every 2/15 of it.
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,

    /// Watch Proxies in this namespace only (default: all namespaces).
    /// Orphan GC then reaps only instances of Proxies in it.
    #[arg(long, env = "PROXY_NAMESPACE")]
    pub proxy_namespace: Option<String>,

    /// This installation's id, written on every instance it creates (orphan
    /// GC reaps only its own). Default: generated once and kept in the
    /// ConfigMap `egress-proxies-installation` of the operator's namespace.
    /// 1-63 characters a-z, 0-9, '-'.
    #[arg(long, env = "INSTALLATION_ID")]
    pub installation_id: Option<InstallationId>,

    /// Health probes running at the same time.
    #[arg(long, env = "HEALTH_WORKERS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub health_workers: u32,

    /// Cooldown of a proxy for a target after a lease on it is released.
    #[arg(long, env = "LEASE_COOLDOWN", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease_cooldown: Duration,

    /// Upper bound of a lease's TTL.
    #[arg(long, env = "MAX_LEASE_TTL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub max_lease_ttl: Duration,

    /// Concurrent leases one proxy may carry (0 = unlimited).
    #[arg(long, env = "MAX_LEASES_PER_PROXY", default_value_t = 1)]
    pub max_leases_per_proxy: u32,

    /// Weights of crawler identities' fair shares of a scarce fleet:
    /// `team-a=2,team-b=3`; identities not named weigh 1.
    #[arg(long, env = "FAIR_SHARE_WEIGHTS", value_parser = crate::domain::lease::FairShare::parse)]
    pub fair_share_weights: Option<crate::domain::lease::FairShare>,

    /// Time between orphan-GC sweeps.
    #[arg(long, env = "GC_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub gc_interval: Duration,

    /// Orphans younger than this are spared (creates racing a sweep).
    #[arg(long, env = "GC_GRACE_PERIOD", default_value = "10m", value_parser = humantime::parse_duration)]
    pub gc_grace_period: Duration,

    /// How long an autoscaled ProxyPool's demand must stay low before it shrinks.
    #[arg(long, env = "POOL_SCALE_DOWN_DELAY", default_value = "2m", value_parser = humantime::parse_duration)]
    pub pool_scale_down_delay: Duration,

    /// Local state of providers that keep any (the `local` provider; development only in a cluster).
    #[arg(long, env = "STATE_DIR", default_value = "/tmp/egress-proxies-operator")]
    pub state_dir: PathBuf,

    /// Extra CA certificates (PEM) trusted by health probes, beside the Mozilla roots.
    #[arg(long, env = "HEALTH_CA_FILE")]
    pub health_ca_file: Option<PathBuf>,

    /// Open one trace span per health probe (off by default: one per proxy per second).
    #[arg(long, env = "TRACE_HEALTH_PROBES")]
    pub trace_health_probes: bool,

    /// The cluster's pod and service ranges (comma-separated CIDRs): every
    /// proxy the operator makes, and the gateway, refuse them unless a
    /// provider's `destinations.allow` (the gateway's own) lists them.
    #[arg(
        long,
        env = "CLUSTER_NETWORKS",
        value_delimiter = ',',
        value_parser = parse_cidr,
        value_name = "CIDR,..."
    )]
    pub cluster_networks: Vec<IpNet>,

    /// Networks External Proxies may point at although they are loopback or
    /// link-local (comma-separated CIDRs). Without it such endpoints are
    /// refused: a Proxy's author could otherwise probe the operator's own
    /// pod or the cloud metadata server through it.
    #[arg(
        long,
        env = "ALLOW_EXTERNAL_ENDPOINT_NETWORKS",
        value_delimiter = ',',
        value_parser = parse_cidr,
        value_name = "CIDR,..."
    )]
    pub allow_external_endpoint_networks: Vec<IpNet>,

    /// A client-side budget of requests a second to the Kubernetes API
    /// server (watches are not counted). Off by default: the API server
    /// shares its capacity by Priority and Fairness, and the operator waits
    /// out its `429` answers (`Retry-After`).
    #[arg(long, env = "KUBE_API_QPS", value_parser = parse_qps)]
    pub kube_api_qps: Option<f64>,

    /// Requests the budget lets through at once after a quiet spell
    /// (default: twice `--kube-api-qps`).
    #[arg(long, env = "KUBE_API_BURST", requires = "kube_api_qps", value_parser = clap::value_parser!(u32).range(1..))]
    pub kube_api_burst: Option<u32>,

    /// Log GCP request/response payloads in full at trace level instead of eliding large fields.
    #[arg(long, env = "GCP_WIRE_LOG_FULL_PAYLOADS")]
    pub gcp_wire_log_full_payloads: bool,
}

impl RunArgs {
    /// Where the other replicas reach this one: `--replica-advertise-address`,
    /// else `pod_ip` (`$POD_IP`) with the listener's port, else the
    /// listener's own address when it names an IP; `None` when the
    /// listener is off or nothing names an address.
    pub fn replica_advertise(&self, pod_ip: Option<&str>) -> Option<std::net::SocketAddr> {
        let BindAddress::Listen(bind) = self.replica_bind_address else {
            return None;
        };
        if let Some(explicit) = self.replica_advertise_address {
            return Some(explicit);
        }
        let pod_ip = pod_ip.and_then(|ip| ip.trim().parse::<std::net::IpAddr>().ok());
        match pod_ip {
            Some(ip) => Some(std::net::SocketAddr::new(ip, bind.port())),
            None => (!bind.ip().is_unspecified()).then_some(bind),
        }
    }
}

/// The `crd` command's argument.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CrdArg {
    Proxies,
    Proxypools,
}

impl From<CrdArg> for crate::domain::resource::CrdKind {
    fn from(arg: CrdArg) -> Self {
        match arg {
            CrdArg::Proxies => Self::Proxies,
            CrdArg::Proxypools => Self::ProxyPools,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_is_the_default_and_flags_parse() {
        let cli = Cli::try_parse_from([
            "egress-proxies-operator",
            "--leader-elect",
            "--lease-cooldown",
            "1m30s",
            "--discovery-bind-address",
            "127.0.0.1:9000",
            "--max-leases-per-proxy",
            "0",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert!(cli.run.leader_elect);
        assert_eq!(cli.run.lease_cooldown, Duration::from_secs(90));
        assert_eq!(cli.run.max_leases_per_proxy, 0);
        assert_eq!(
            cli.run.discovery_bind_address,
            BindAddress::Listen("127.0.0.1:9000".parse().unwrap())
        );
        assert_eq!(cli.run.gc_interval, Duration::from_secs(600));
        assert_eq!(cli.run.gateway_bind_address, BindAddress::Disabled);
        assert!(cli.run.gateway_config.is_none());
    }

    #[test]
    fn the_api_budget_flags_parse() {
        let cli = Cli::try_parse_from([
            "egress-proxies-operator",
            "run",
            "--kube-api-qps=5",
            "--kube-api-burst",
            "10",
        ])
        .unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("run parses as Run");
        };
        assert_eq!((run.kube_api_qps, run.kube_api_burst), (Some(5.0), Some(10)));
        let cli = Cli::try_parse_from(["egress-proxies-operator"]).unwrap();
        assert_eq!((cli.run.kube_api_qps, cli.run.kube_api_burst), (None, None));
        for bad in [
            &["--kube-api-qps=0"][..],
            &["--kube-api-qps=-1"],
            &["--kube-api-qps=NaN"],
            &["--kube-api-qps=5", "--kube-api-burst=0"],
            &["--kube-api-burst=5"],
        ] {
            let args = ["egress-proxies-operator"].iter().chain(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn the_gateway_flags_parse() {
        let cli = Cli::try_parse_from([
            "egress-proxies-operator",
            "run",
            "--gateway-bind-address=:8888",
            "--gateway-config",
            "/etc/proxy-operator/gateway.yaml",
        ])
        .unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("run parses as Run");
        };
        assert_eq!(
            run.gateway_bind_address,
            BindAddress::Listen("0.0.0.0:8888".parse().unwrap())
        );
        assert_eq!(
            run.gateway_config.as_deref(),
            Some(std::path::Path::new("/etc/proxy-operator/gateway.yaml"))
        );
    }

    #[test]
    fn cluster_networks_and_forward_proxy_rules_parse() {
        let cli = Cli::try_parse_from([
            "egress-proxies-operator",
            "--cluster-networks",
            "10.244.0.0/16,10.96.0.0/12",
        ])
        .unwrap();
        assert_eq!(cli.run.cluster_networks.len(), 2);
        let err =
            Cli::try_parse_from(["egress-proxies-operator", "--cluster-networks", "10.244.0.0"]).unwrap_err();
        assert!(
            err.to_string().contains("--cluster-networks") && err.to_string().contains("is not a CIDR"),
            "{err}"
        );

        let cli = Cli::try_parse_from([
            "egress-proxies-operator",
            "forward-proxy",
            "--listen",
            "127.0.0.1:3128",
            "--instance-dir",
            "/tmp",
            "--allow",
            "127.0.0.0/8",
            "--deny",
            "25",
        ])
        .unwrap();
        let Some(Command::ForwardProxy { destinations, .. }) = cli.command else {
            panic!("forward-proxy parses as ForwardProxy");
        };
        let policy = destinations.policy();
        assert!(policy.check("127.0.0.1".parse().unwrap(), 80, false).is_ok());
        assert!(policy.check("127.0.0.1".parse().unwrap(), 25, false).is_err());
        let err = Cli::try_parse_from([
            "egress-proxies-operator",
            "forward-proxy",
            "--listen",
            "127.0.0.1:3128",
            "--instance-dir",
            "/tmp",
            "--allow",
            "10.0.0.1/8",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("did you mean 10.0.0.0/8"), "{err}");
    }

    #[test]
    fn the_replica_flags_parse_and_the_advertised_address_follows_the_pod() {
        let parse = |args: &[&str]| {
            let all = ["egress-proxies-operator"].iter().chain(args);
            Cli::try_parse_from(all).unwrap().run
        };
        let default = parse(&[]);
        assert!(default.every_replica_serves, "on by default");
        assert_eq!(
            default.replica_advertise(Some("10.1.2.3")),
            Some("10.1.2.3:8091".parse().unwrap()),
            "the pod's IP with the default listener's port"
        );
        let off = parse(&["--replica-bind-address=0"]);
        assert_eq!(off.replica_bind_address, BindAddress::Disabled);
        assert_eq!(
            off.replica_advertise(Some("10.1.2.3")),
            None,
            "no listener, nothing to advertise"
        );
        assert!(parse(&["--every-replica-serves"]).every_replica_serves);
        assert!(parse(&["--every-replica-serves=true"]).every_replica_serves);
        assert!(!parse(&["--every-replica-serves=false"]).every_replica_serves);

        let pod = parse(&["--replica-bind-address=:8091"]);
        assert_eq!(
            pod.replica_advertise(Some("10.1.2.3")),
            Some("10.1.2.3:8091".parse().unwrap()),
            "the pod's IP with the listener's port"
        );
        assert_eq!(pod.replica_advertise(None), None, "0.0.0.0 names no address");
        assert_eq!(pod.replica_advertise(Some("not-an-ip")), None);
        let loopback = parse(&["--replica-bind-address", "127.0.0.5:8091"]);
        assert_eq!(
            loopback.replica_advertise(None),
            Some("127.0.0.5:8091".parse().unwrap())
        );
        assert_eq!(
            loopback.replica_advertise(Some("fd00::7")),
            Some("[fd00::7]:8091".parse().unwrap())
        );
        let explicit = parse(&[
            "--replica-bind-address=:8091",
            "--replica-advertise-address",
            "192.0.2.9:9000",
        ]);
        assert_eq!(
            explicit.replica_advertise(Some("10.1.2.3")),
            Some("192.0.2.9:9000".parse().unwrap())
        );
        let err = Cli::try_parse_from([
            "egress-proxies-operator",
            "--replica-advertise-address",
            "replica-0:8091",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--replica-advertise-address"), "{err}");
    }

    #[test]
    fn bad_values_are_rejected_with_the_flag_named() {
        let err = Cli::try_parse_from(["egress-proxies-operator", "--gc-interval", "soon"]).unwrap_err();
        assert!(err.to_string().contains("--gc-interval"), "{err}");
        let err = Cli::try_parse_from(["egress-proxies-operator", "--health-workers", "0"]).unwrap_err();
        assert!(err.to_string().contains("--health-workers"), "{err}");
        let err =
            Cli::try_parse_from(["egress-proxies-operator", "--metrics-bind-address", "8080"]).unwrap_err();
        assert!(err.to_string().contains("not a bind address"), "{err}");
    }
}
