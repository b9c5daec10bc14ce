//! Every validation rule of the providers configuration, with the exact message.

use egress_proxies_domain::config::{
    DomainType, Firmware, ImageFormat, LocalImplementation, ProviderSettings, ProvidersConfig,
};

/// A valid kvm entry; cases below replace one line of it.
const KVM: &str = r#"
providers:
  - name: kvm-home
    type: kvm
    kvm:
      sshKeyFile: /keys/id_ed25519
      knownHostsFile: /keys/known_hosts
      images:
        debian:
          url: https://images.example.net/debian.qcow2
          sha256: 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
      machineTypes:
        small: {vcpus: 1, memoryMiB: 512}
      hosts:
        - name: dc1
          address: 127.0.0.1:2222
          user: proxyop
          bridge: br-epo
"#;

fn problems(yaml: &str) -> Vec<String> {
    match ProvidersConfig::parse(yaml, "test.yaml") {
        Ok(_) => Vec::new(),
        Err(e) => e.problems(),
    }
}

fn replace(from: &str, to: &str) -> String {
    assert!(KVM.contains(from), "{from:?} not in the base config");
    KVM.replacen(from, to, 1)
}

#[test]
fn the_base_config_is_valid_and_defaults_apply() {
    let config = ProvidersConfig::parse(KVM, "test.yaml").unwrap();
    let ProviderSettings::Kvm(kvm) = &config.get("kvm-home").unwrap().settings else {
        panic!("not kvm")
    };
    assert_eq!(kvm.disk_size_gb, 10);
    assert!(kvm.install_guest_agent);
    assert!(!kvm.insecure_ignore_host_key);
    let image = &kvm.images["debian"];
    assert_eq!(
        (image.format, image.firmware),
        (ImageFormat::Qcow2, Firmware::Uefi)
    );
    let host = &kvm.hosts[0];
    assert_eq!(host.socket, "/var/run/libvirt/libvirt-sock");
    assert_eq!(host.pool, "default");
    assert_eq!(host.domain_type, DomainType::Kvm);
}

#[test]
fn kvm_rules_each_report_their_field_path_and_reason() {
    let p = "providers[0] (kvm-home): ";
    let cases: Vec<(String, String)> = vec![
        (
            replace("name: dc1", "name: dc1/rack2"),
            format!(
                "{p}kvm.hosts[0].name \"dc1/rack2\" must be 1-63 characters of letters, digits, '.', '-' and '_', \
                 starting with a letter or digit: it becomes part of providerIDs and volume names, where a slash \
                 would make the VM unaddressable or a path escape the storage pool"
            ),
        ),
        (
            replace("        debian:", "        ../debian:"),
            format!(
                "{p}kvm.images.../debian key \"../debian\" must be 1-63 characters of letters, digits, '.', '-' \
                 and '_', starting with a letter or digit: it becomes part of the base volume's file name, where \
                 a slash would let a path escape the storage pool"
            ),
        ),
        (
            replace("sha256: 0f1e", "sha256: zz1e"),
            format!(
                "{p}kvm.images.debian.sha256 \"zz1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0\" \
                 must be 64 hexadecimal characters (a sha256 digest)"
            ),
        ),
        (
            replace(
                "sha256: 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
                "sha256: abc",
            ),
            format!(
                "{p}kvm.images.debian.sha256 \"abc\" must be 64 hexadecimal characters (a sha256 digest)"
            ),
        ),
        (
            replace("url: https://images", "url: ftp://images"),
            format!(
                "{p}kvm.images.debian.url \"ftp://images.example.net/debian.qcow2\" must be an http:// or https:// URL"
            ),
        ),
        (
            replace(
                "url: https://images.example.net/debian.qcow2",
                "url: debian.qcow2",
            ),
            format!("{p}kvm.images.debian.url \"debian.qcow2\" is not a URL: relative URL without a base"),
        ),
        (
            replace("          sha256:", "          format: vmdk\n          sha256:"),
            format!("{p}kvm.images.debian.format unknown variant `vmdk`, expected `qcow2` or `raw`"),
        ),
        (
            replace(
                "          sha256:",
                "          firmware: coreboot\n          sha256:",
            ),
            format!("{p}kvm.images.debian.firmware unknown variant `coreboot`, expected `uefi` or `bios`"),
        ),
        (
            replace("        small: {vcpus: 1, memoryMiB: 512}", ""),
            format!("{p}kvm.machineTypes must define at least one machine type"),
        ),
        (
            replace("{vcpus: 1, memoryMiB: 512}", "{vcpus: 0, memoryMiB: 512}"),
            format!("{p}kvm.machineTypes.small.vcpus must be at least 1"),
        ),
        (
            replace("{vcpus: 1, memoryMiB: 512}", "{vcpus: 1, memoryMiB: 64}"),
            format!("{p}kvm.machineTypes.small.memoryMiB 64 must be at least 128"),
        ),
        (
            replace(
                "      hosts:\n        - name: dc1\n          address: 127.0.0.1:2222\n          user: proxyop\n          bridge: br-epo\n",
                "      hosts: []\n",
            ),
            format!("{p}kvm.hosts must list at least one host"),
        ),
        (
            replace(
                "          bridge: br-epo\n",
                "          bridge: br-epo\n        - {name: dc1, address: 10.0.0.9:22, user: u, bridge: br0}\n",
            ),
            format!(
                "{p}kvm.hosts[1].name \"dc1\" is already used by kvm.hosts[0]: host names must be unique"
            ),
        ),
        (
            replace("      knownHostsFile: /keys/known_hosts\n", ""),
            format!(
                "{p}kvm.knownHostsFile is required unless insecureIgnoreHostKey is true (host keys must be verified)"
            ),
        ),
        (
            replace("address: 127.0.0.1:2222", "address: 127.0.0.1"),
            format!(
                "{p}kvm.hosts[0].address \"127.0.0.1\" must be host:port (e.g. 10.0.0.5:22 or [2001:db8::5]:22)"
            ),
        ),
        (
            replace("user: proxyop", "user: \"\""),
            format!("{p}kvm.hosts[0].user must name the SSH user"),
        ),
        (
            replace("bridge: br-epo", "bridge: \"\""),
            format!("{p}kvm.hosts[0].bridge must name the host bridge VMs attach to"),
        ),
        (
            replace(
                "bridge: br-epo",
                "bridge: br-epo\n          socket: run/libvirt-sock",
            ),
            format!("{p}kvm.hosts[0].socket \"run/libvirt-sock\" must be an absolute path"),
        ),
        (
            replace("bridge: br-epo", "bridge: br-epo\n          domainType: xen"),
            format!("{p}kvm.hosts[0].domainType unknown variant `xen`, expected `kvm` or `qemu`"),
        ),
        (
            replace("bridge: br-epo", "bridge: br-epo\n          bridges: br1"),
            format!(
                "{p}kvm.hosts[0].bridges unknown field `bridges`, expected one of `name`, `address`, `user`, `bridge`, \
                 `socket`, `pool`, `domainType`"
            ),
        ),
        (
            replace("      sshKeyFile: /keys/id_ed25519\n", ""),
            format!("{p}kvm missing field `sshKeyFile`"),
        ),
        (
            replace("    kvm:\n", "    kvm:\n      diskSizeGb: 0\n"),
            format!("{p}kvm.diskSizeGb must be at least 1"),
        ),
        (
            replace("    kvm:\n", "    kvm:\n      maxImageSizeGb: 0\n"),
            format!("{p}kvm.maxImageSizeGb must be at least 1"),
        ),
        (
            replace("    kvm:\n", "    kvm:\n      allowImageUrls: yes please\n"),
            format!("{p}kvm.allowImageUrls invalid type: string \"yes please\", expected a boolean"),
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(problems(&yaml), vec![expected.clone()], "for:\n{yaml}");
    }
}

#[test]
fn insecure_mode_needs_no_known_hosts() {
    let yaml = replace(
        "      knownHostsFile: /keys/known_hosts\n",
        "      insecureIgnoreHostKey: true\n",
    );
    assert_eq!(problems(&yaml), Vec::<String>::new());
}

#[test]
fn insecure_mode_and_a_known_hosts_file_together_are_refused() {
    let yaml = replace(
        "      knownHostsFile: /keys/known_hosts\n",
        "      knownHostsFile: /keys/known_hosts\n      insecureIgnoreHostKey: true\n",
    );
    let problems = problems(&yaml);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("kvm.insecureIgnoreHostKey cannot be true together with knownHostsFile"),
        "{problems:?}"
    );
}

#[test]
fn instance_level_rules() {
    let cases = [
        (
            "providers:\n  - {name: a, type: gcp, gcp: {project: p}}\n  - {name: a, type: local}\n",
            vec![
                "providers[1] (a): name \"a\" is already used by providers[0]: instance names must be unique",
            ],
        ),
        (
            "providers:\n  - {name: a, type: vmware}\n",
            vec![
                "providers[0] (a): type \"vmware\" is not a provider type (one of kubernetes, gcp, kvm, local)",
            ],
        ),
        (
            "providers:\n  - {name: a, type: gcp}\n",
            vec!["providers[0] (a): gcp block is required for type gcp"],
        ),
        (
            "providers:\n  - {name: a, type: gcp, gcp: {}}\n",
            vec!["providers[0] (a): gcp missing field `project`"],
        ),
        (
            "providers:\n  - {name: a, type: gcp, gcp: {project: \"\"}}\n",
            vec!["providers[0] (a): gcp.project is required (the project the VMs are created in)"],
        ),
        (
            "providers:\n  - {name: a, type: gcp, gcp: {project: p, diskSizeGb: 5}}\n",
            vec!["providers[0] (a): gcp.diskSizeGb 5 is below Compute Engine's minimum of 10"],
        ),
        (
            "providers:\n  - {name: a, type: gcp, gcp: {project: p, networkTag: Egress_Proxy}}\n",
            vec![
                "providers[0] (a): gcp.networkTag \"Egress_Proxy\" must be 1-63 lowercase letters, digits or '-', \
                 starting with a letter",
            ],
        ),
        (
            "providers:\n  - {name: a, type: local, gcp: {project: p}}\n",
            vec!["providers[0] (a): gcp block does not match type \"local\"; remove it"],
        ),
        (
            "providers:\n  - {name: \"x/y\", type: local}\n",
            vec![
                "providers[0] (x/y): name \"x/y\" must be 1-63 characters of letters, digits, '.', '-' and '_', \
                 starting with a letter or digit: it names the provider in Proxy specs, metrics and logs",
            ],
        ),
        (
            "providers:\n  - {type: local}\n",
            vec!["providers[0] (?) missing field `name`"],
        ),
        (
            "providers:\n  - {name: k, type: kubernetes, kubernetes: {image: \"\"}}\n",
            vec!["providers[0] (k): kubernetes.image \"\" is not a container image reference"],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {implementation: builtin, squidBinary: /usr/sbin/squid}}\n",
            vec![
                "providers[0] (l): local.squidBinary is set but implementation is builtin, which never runs Squid",
            ],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {listenAddress: localhost}}\n",
            vec!["providers[0] (l): local.listenAddress invalid IP address syntax"],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {destinations: {allow: [127.0.0.0/8, 10.0.0.1/8]}}}\n",
            vec![
                "providers[0] (l): local.destinations.allow[1] \"10.0.0.1/8\" has host bits set: did you mean 10.0.0.0/8?",
            ],
        ),
        (
            "providers:\n  - {name: k, type: kubernetes, kubernetes: {destinations: {deny: [example.com]}}}\n",
            vec![
                "providers[0] (k): kubernetes.destinations.deny[0] \"example.com\" is not a destination: expected a CIDR \
                 (10.0.0.0/8, fd00::/8), an IP address, a port (8443) or a port range (8000-8099)",
            ],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {destinations: {allow: [70000]}}}\n",
            vec!["providers[0] (l): local.destinations.allow[0] \"70000\": ports are 1-65535"],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {destinations: {permit: [8443]}}}\n",
            vec![
                "providers[0] (l): local.destinations.permit unknown field `permit`, expected `allow` or `deny`",
            ],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {outgoingAddresses: [127.0.1.1/29]}}\n",
            vec![
                "providers[0] (l): local.outgoingAddresses[0] \"127.0.1.1/29\" has host bits set: did you mean 127.0.1.0/29?",
            ],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {outgoingAddresses: [eth1]}}\n",
            vec![
                "providers[0] (l): local.outgoingAddresses[0] \"eth1\" is not an outgoing address: expected an IP \
                 address (127.0.0.2) or a CIDR (127.0.1.0/29)",
            ],
        ),
        (
            "providers:\n  - {name: l, type: local, local: {outgoingAddresses: [127.0.1.0/29, 0.0.0.0, 127.0.1.6]}}\n",
            vec![
                "providers[0] (l): local.outgoingAddresses[1] 0.0.0.0 cannot be a source address (unspecified, \
                 multicast or broadcast): give addresses of this machine",
                "providers[0] (l): local.outgoingAddresses[2] 127.0.1.6 overlaps outgoingAddresses[0] (127.0.1.0/29): \
                 each address may be given once",
            ],
        ),
        (
            "providers:\n  - {name: v, type: kvm, kvm: {destinations: {allow: [8443]}}}\n",
            vec![
                "providers[0] (v): kvm.destinations is not applied by type kvm: its VMs' Squid is configured by the \
                 cloud-init you supply; edit the destination rules there (see docs/security.md) and remove this field",
            ],
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(problems(yaml), expected, "for:\n{yaml}");
    }
}

#[test]
fn every_problem_of_every_entry_is_reported() {
    let yaml = r#"
providers:
  - name: kvm-home
    type: kvm
    kvm:
      sshKeyFile: /k
      machineTypes: {}
      hosts:
        - {name: "dc1/rack2", address: nowhere, user: u, bridge: br0}
        - {name: "dc1/rack2", address: "h:22", user: u, bridge: br0}
  - name: gcp-eu
    type: gcp
    gcp: {project: ""}
  - name: broken
    type: gcp
    gcp: {project: p, diskSizeGb: lots}
"#;
    let got = problems(yaml);
    assert_eq!(got.len(), 8, "{got:#?}");
    for fragment in [
        "providers[0] (kvm-home): kvm.knownHostsFile is required",
        "providers[0] (kvm-home): kvm.machineTypes must define at least one machine type",
        "providers[0] (kvm-home): kvm.hosts[0].name \"dc1/rack2\" must be",
        "providers[0] (kvm-home): kvm.hosts[0].address \"nowhere\" must be host:port",
        "providers[0] (kvm-home): kvm.hosts[1].name \"dc1/rack2\" must be",
        "providers[0] (kvm-home): kvm.hosts[1].name \"dc1/rack2\" is already used by kvm.hosts[0]",
        "providers[1] (gcp-eu): gcp.project is required",
        "providers[2] (broken): gcp.diskSizeGb invalid type",
    ] {
        assert!(
            got.iter().any(|p| p.starts_with(fragment)),
            "missing {fragment:?} in {got:#?}"
        );
    }
}

#[test]
fn syntax_errors_name_the_file() {
    let err = ProvidersConfig::parse("providers: [", "broken.yaml").unwrap_err();
    assert!(
        err.to_string().starts_with("broken.yaml: not valid YAML"),
        "{err}"
    );
    let err = ProvidersConfig::parse("provider: []", "typo.yaml").unwrap_err();
    assert!(err.to_string().contains("unknown field `provider`"), "{err}");
}

#[test]
fn empty_file_means_no_providers() {
    assert_eq!(ProvidersConfig::parse("", "x").unwrap().providers, vec![]);
    assert_eq!(
        ProvidersConfig::parse("providers: []", "x").unwrap().providers,
        vec![]
    );
}

#[test]
fn local_and_kubernetes_blocks_may_be_omitted() {
    let config = ProvidersConfig::parse(
        "providers:\n  - {name: l, type: local}\n  - {name: k, type: kubernetes}\n",
        "x",
    )
    .unwrap();
    let ProviderSettings::Local(local) = &config.providers[0].settings else {
        panic!()
    };
    assert_eq!(local.implementation, LocalImplementation::Auto);
    assert_eq!(local.listen_address.to_string(), "127.0.0.1");
    let ProviderSettings::Kubernetes(k) = &config.providers[1].settings else {
        panic!()
    };
    assert_eq!(k.image, "ubuntu/squid:6.6-24.04_edge");
}

#[test]
fn the_shipped_samples_are_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/providers.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let config = ProvidersConfig::parse(&text, path).unwrap();
    let kinds: Vec<&str> = config.providers.iter().map(|p| p.settings.kind()).collect();
    assert_eq!(kinds, ["kubernetes", "gcp", "kvm", "local"]);
}
