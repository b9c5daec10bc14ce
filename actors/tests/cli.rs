//! The binary's offline subcommands, run as a user would.

use std::process::Command;

fn operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
}

fn repo_file(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn validate_config_accepts_the_shipped_sample() {
    let out = operator()
        .args(["validate-config", &repo_file("config/providers.yaml")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("ok, 4 provider(s)"), "{stdout}");
}

#[test]
fn validate_config_accepts_the_standalone_sample() {
    let out = operator()
        .args(["validate-config", &repo_file("config/standalone/providers.yaml")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok, 1 provider(s): local (local)"));
}

#[test]
fn get_proxies_before_any_state_exists() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("standalone.yaml");
    std::fs::write(&config, "providersConfig: p.yaml\nmanifests: m\nstateDir: s\n").unwrap();
    let out = operator()
        .args(["get", "proxies", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "No proxies found.\n");
}

#[test]
fn standalone_refuses_a_missing_manifest_directory_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), "providers: []\n").unwrap();
    let config = dir.path().join("standalone.yaml");
    std::fs::write(
        &config,
        "providersConfig: p.yaml\nmanifests: nowhere\nstateDir: s\n",
    )
    .unwrap();
    let out = operator()
        .args(["standalone", "--log-format", "text", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("manifest directory")
            && stderr.contains("nowhere")
            && stderr.contains("does not exist"),
        "{stderr}"
    );
}

#[test]
fn a_config_path_without_a_directory_is_relative_to_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), "providers: []\n").unwrap();
    std::fs::write(
        dir.path().join("standalone.yaml"),
        "providersConfig: p.yaml\nmanifests: nowhere\nstateDir: s\n",
    )
    .unwrap();
    let out = operator()
        .current_dir(dir.path())
        .args([
            "standalone",
            "--log-format",
            "text",
            "--config",
            "standalone.yaml",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The config was read (paths resolved against the working directory):
    // what stops it is the missing manifest directory, not the path itself.
    assert!(
        stderr.contains(&format!(
            "{}/nowhere",
            dir.path().canonicalize().unwrap().display()
        )) || stderr.contains(&format!("{}/nowhere", dir.path().display())),
        "{stderr}"
    );
}

#[test]
fn standalone_reports_a_taken_port_without_panicking() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("m")).unwrap();
    std::fs::write(dir.path().join("p.yaml"), "providers: []\n").unwrap();
    let config = dir.path().join("standalone.yaml");
    let yaml = format!(
        "providersConfig: p.yaml\nmanifests: m\nstateDir: s\nhealthProbeBindAddress: \"0\"\ndiscoveryBindAddress: {}\n",
        taken.local_addr().unwrap()
    );
    std::fs::write(&config, yaml).unwrap();
    let out = operator()
        .args(["standalone", "--log-format", "text", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listener 127.0.0.1:") && stderr.contains("in use"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn validate_config_prints_every_problem_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.yaml");
    std::fs::write(
        &file,
        "providers:\n  - name: kvm-home\n    type: kvm\n    kvm:\n      sshKeyFile: /k\n      machineTypes: {}\n      \
         hosts: [{name: dc1/rack2, address: h, user: u, bridge: b}]\n  - {name: gcp-eu, type: gcp, gcp: {project: \"\"}}\n",
    )
    .unwrap();
    let out = operator().arg("validate-config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("5 problem(s)"), "{stderr}");
    for expected in [
        "providers[0] (kvm-home): kvm.knownHostsFile is required",
        "providers[0] (kvm-home): kvm.machineTypes must define at least one machine type",
        "providers[0] (kvm-home): kvm.hosts[0].name \"dc1/rack2\" must be",
        "providers[0] (kvm-home): kvm.hosts[0].address \"h\" must be host:port",
        "providers[1] (gcp-eu): gcp.project is required",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in\n{stderr}");
    }
}

#[test]
fn validate_config_reports_a_missing_file() {
    let out = operator()
        .args(["validate-config", "/nonexistent/providers.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("reading /nonexistent/providers.yaml"), "{stderr}");
}

#[test]
fn crd_prints_the_committed_definition() {
    let out = operator().arg("crd").output().unwrap();
    assert!(out.status.success());
    let committed = std::fs::read_to_string(repo_file("deploy/crd/proxies.yaml")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), committed);
}

#[test]
fn version_names_the_commit() {
    let out = operator().arg("--version").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("egress-proxies-operator "), "{stdout}");
    let commit = stdout
        .split("(commit ")
        .nth(1)
        .unwrap_or_default()
        .trim_end()
        .trim_end_matches(')');
    let hex = commit.trim_end_matches("-dirty");
    assert!(
        commit == "unknown" || (hex.len() == 40 && hex.chars().all(|c| c.is_ascii_hexdigit())),
        "{stdout}"
    );
}

/// `run` with the gateway: a settings file it cannot use, or an open
/// gateway on a reachable address, stops the start before any connection to
/// the API server, naming the problem.
#[test]
fn run_refuses_gateway_settings_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), "providers: []\n").unwrap();
    let run = |gateway_yaml: Option<&str>, token: Option<&str>, bind: &str| {
        let mut cmd = operator();
        cmd.env_clear()
            .args(["run", "--log-format", "text", "--providers-config"])
            .arg(dir.path().join("p.yaml"))
            .args([
                "--health-probe-bind-address=0",
                "--metrics-bind-address=0",
                "--discovery-bind-address=0",
            ])
            .arg(format!("--gateway-bind-address={bind}"))
            // Nowhere: the start must fail before it is asked.
            .env("KUBECONFIG", dir.path().join("absent.kubeconfig"));
        if let Some(text) = gateway_yaml {
            std::fs::write(dir.path().join("gateway.yaml"), text).unwrap();
            cmd.arg("--gateway-config").arg(dir.path().join("gateway.yaml"));
        }
        if let Some(token) = token {
            cmd.env("DISCOVERY_TOKEN", token);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let stderr = run(Some("tries: 0\n"), Some("t0ken"), "127.0.0.1:0");
    assert!(
        stderr.contains("--gateway-config") && stderr.contains("tries: 0"),
        "{stderr}"
    );
    let stderr = run(Some("destinatons: {}\n"), Some("t0ken"), "127.0.0.1:0");
    assert!(
        stderr.contains("--gateway-config") && stderr.contains("destinatons"),
        "{stderr}"
    );
    std::fs::remove_file(dir.path().join("gateway.yaml")).unwrap();
    let mut cmd = operator();
    let out = cmd
        .env_clear()
        .args(["run", "--gateway-bind-address=127.0.0.1:0", "--gateway-config"])
        .arg(dir.path().join("gateway.yaml"))
        .args(["--providers-config"])
        .arg(dir.path().join("p.yaml"))
        .args([
            "--health-probe-bind-address=0",
            "--metrics-bind-address=0",
            "--discovery-bind-address=0",
        ])
        .env("DISCOVERY_TOKEN", "t0ken")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && stderr.contains("--gateway-config")
            && stderr.contains("gateway.yaml"),
        "{stderr}"
    );
    // No token: never an open proxy on a reachable address.
    let stderr = run(None, None, "0.0.0.0:0");
    assert!(stderr.contains("DISCOVERY_TOKEN"), "{stderr}");
}
