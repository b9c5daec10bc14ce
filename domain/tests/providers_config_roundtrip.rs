//! Property: any valid configuration survives being written and read back.

use std::collections::BTreeMap;

use egress_proxies_domain::config::{
    DomainType, Firmware, GcpConfig, ImageFormat, KubernetesConfig, KvmConfig, KvmHost, KvmImage,
    LocalConfig, LocalImplementation, MachineType, ProviderInstance, ProviderSettings, ProvidersConfig,
};
use proptest::prelude::*;

const IDENT: &str = "[a-z0-9][a-z0-9._-]{0,20}";

fn image() -> impl Strategy<Value = KvmImage> {
    (
        "[a-z]{1,10}",
        proptest::option::of("[0-9a-f]{64}"),
        prop_oneof![Just(ImageFormat::Qcow2), Just(ImageFormat::Raw)],
        prop_oneof![Just(Firmware::Uefi), Just(Firmware::Bios)],
    )
        .prop_map(|(path, sha256, format, firmware)| KvmImage {
            url: format!("https://images.example.net/{path}.img"),
            sha256,
            format,
            firmware,
        })
}

fn host(name: String) -> impl Strategy<Value = KvmHost> {
    (
        1u16..,
        "[a-z]{1,8}",
        "br[0-9]{1,2}",
        prop_oneof![Just(DomainType::Kvm), Just(DomainType::Qemu)],
    )
        .prop_map(move |(port, user, bridge, domain_type)| KvmHost {
            name: name.clone(),
            address: format!("10.0.0.1:{port}"),
            user,
            bridge,
            socket: "/var/run/libvirt/libvirt-sock".into(),
            pool: "default".into(),
            domain_type,
        })
}

fn kvm() -> impl Strategy<Value = KvmConfig> {
    (
        proptest::collection::btree_set(IDENT, 1..4),
        proptest::collection::btree_map(IDENT, image(), 0..3),
        proptest::collection::btree_map("[a-z]{1,8}", (1u32..64, 128u32..65536), 1..3),
        any::<bool>(),
        proptest::option::of("[ -~]{0,40}"),
        1u32..500,
    )
        .prop_flat_map(
            |(host_names, images, machine_types, insecure, vendor_data, disk)| {
                let hosts: Vec<_> = host_names.into_iter().map(host).collect();
                (hosts, Just((images, machine_types, insecure, vendor_data, disk)))
            },
        )
        .prop_map(
            |(hosts, (images, machine_types, insecure, vendor_data, disk_size_gb))| KvmConfig {
                ssh_key_file: "/keys/id_ed25519".into(),
                known_hosts_file: (!insecure).then(|| "/keys/known_hosts".into()),
                insecure_ignore_host_key: insecure,
                disk_size_gb,
                vendor_data,
                install_guest_agent: !insecure,
                images,
                allow_image_urls: insecure,
                max_image_size_gb: egress_proxies_domain::config::DEFAULT_MAX_IMAGE_SIZE_GB
                    + disk_size_gb % 100,
                machine_types: machine_types
                    .into_iter()
                    .map(|(k, (vcpus, memory_mib))| (k, MachineType { vcpus, memory_mib }))
                    .collect::<BTreeMap<_, _>>(),
                hosts,
            },
        )
}

fn settings() -> impl Strategy<Value = ProviderSettings> {
    prop_oneof![
        "[a-z]{1,10}(/[a-z]{1,10})?:[a-z0-9.]{1,8}".prop_map(|image| ProviderSettings::Kubernetes(
            KubernetesConfig {
                image,
                ..Default::default()
            }
        )),
        (
            "[a-z][a-z0-9-]{5,20}",
            proptest::option::of("[a-z][a-z0-9]{0,10}"),
            10u32..100
        )
            .prop_map(
                |(project, network_tag, disk_size_gb)| ProviderSettings::Gcp(GcpConfig {
                    project,
                    network: "global/networks/default".into(),
                    network_tag,
                    disk_size_gb,
                    api_endpoint: "https://compute.googleapis.com/compute/v1/".into(),
                })
            ),
        kvm().prop_map(ProviderSettings::Kvm),
        prop_oneof![Just(LocalImplementation::Auto), Just(LocalImplementation::Squid)].prop_map(
            |implementation| {
                ProviderSettings::Local(LocalConfig {
                    implementation,
                    ..LocalConfig::default()
                })
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn valid_configs_round_trip(entries in proptest::collection::btree_map(IDENT, settings(), 0..5)) {
        let config = ProvidersConfig {
            providers: entries
                .into_iter()
                .map(|(name, settings)| ProviderInstance { name, settings })
                .collect(),
        };
        let yaml = config.to_yaml().unwrap();
        let back = ProvidersConfig::parse(&yaml, "generated");
        prop_assert!(back.is_ok(), "{yaml}\n{:?}", back.err().map(|e| e.problems()));
        prop_assert_eq!(back.unwrap(), config);
    }
}
