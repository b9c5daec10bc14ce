//! `type: kvm` — VMs on libvirt hosts reached over SSH
//! (docs/kvm-provider.md).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::problems::{IDENTIFIER_RULE, Problems, is_identifier};

/// Default libvirt socket on a host.
pub const DEFAULT_LIBVIRT_SOCKET: &str = "/var/run/libvirt/libvirt-sock";
/// Default storage pool.
pub const DEFAULT_POOL: &str = "default";
/// Default capacity of each VM's overlay disk.
pub const DEFAULT_DISK_SIZE_GB: u32 = 10;
/// Default bound on a base image's size.
pub const DEFAULT_MAX_IMAGE_SIZE_GB: u32 = 20;
/// Smallest memory a VM may be given (UEFI guests need 256 MiB to boot).
pub const MIN_MEMORY_MIB: u32 = 128;

/// Settings of one kvm provider instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvmConfig {
    /// Private key used for every host; read lazily on first connection.
    pub ssh_key_file: PathBuf,
    /// OpenSSH known_hosts used to verify host keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts_file: Option<PathBuf>,
    /// Skip host-key verification (logged as insecure).
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_ignore_host_key: bool,
    /// Capacity of each VM's thin overlay disk.
    #[serde(default = "default_disk_size_gb")]
    pub disk_size_gb: u32,
    /// Extra cloud-init vendor-data for every VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_data: Option<String>,
    /// Ship the vendor-data script that installs qemu-guest-agent.
    #[serde(default = "yes")]
    pub install_guest_agent: bool,
    /// Named base images (`placement.image` picks one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, KvmImage>,
    /// Let a Proxy name an image URL (with its sha256) instead of a
    /// configured image: whoever may create a Proxy then picks what the
    /// operator downloads and boots.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_image_urls: bool,
    /// Largest base image accepted, in GiB (announced or streamed).
    #[serde(default = "default_max_image_size_gb")]
    pub max_image_size_gb: u32,
    /// Named VM sizes (`placement.machineType` picks one).
    #[serde(default)]
    pub machine_types: BTreeMap<String, MachineType>,
    /// Hypervisors (`placement.zone` picks one).
    #[serde(default)]
    pub hosts: Vec<KvmHost>,
}

/// A base image the operator downloads into each host's pool on first use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvmImage {
    /// `http://` or `https://` address of the image.
    pub url: String,
    /// Expected digest (64 hex characters); verified after download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default)]
    pub format: ImageFormat,
    #[serde(default)]
    pub firmware: Firmware,
}

/// Disk format of a base image.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    #[default]
    Qcow2,
    Raw,
}

impl ImageFormat {
    /// Also the volume file extension.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Raw => "raw",
        }
    }
}

/// Boot firmware for VMs of an image.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// OVMF, secure boot off (stock cloud images hang in GRUB under SeaBIOS headless).
    #[default]
    Uefi,
    /// SeaBIOS, the escape hatch.
    Bios,
}

/// A VM size.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineType {
    pub vcpus: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u32,
}

/// One libvirt host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvmHost {
    /// Unique; becomes part of providerIDs (`hosts/<name>/domains/...`).
    pub name: String,
    /// sshd address, `host:port`.
    pub address: String,
    /// SSH user (a member of the host's `libvirt` group).
    pub user: String,
    /// Linux bridge VMs attach their NIC to.
    pub bridge: String,
    /// libvirt's unix socket on the host.
    #[serde(default = "default_socket")]
    pub socket: String,
    /// Storage pool for images, overlays and seeds.
    #[serde(default = "default_pool")]
    pub pool: String,
    #[serde(default)]
    pub domain_type: DomainType,
}

/// Hypervisor of a host's domains.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum DomainType {
    /// Hardware virtualization.
    #[default]
    Kvm,
    /// Software emulation (TCG) for hosts without hardware virtualization.
    Qemu,
}

fn default_disk_size_gb() -> u32 {
    DEFAULT_DISK_SIZE_GB
}
fn default_max_image_size_gb() -> u32 {
    DEFAULT_MAX_IMAGE_SIZE_GB
}
fn default_socket() -> String {
    DEFAULT_LIBVIRT_SOCKET.to_owned()
}
fn default_pool() -> String {
    DEFAULT_POOL.to_owned()
}
fn yes() -> bool {
    true
}
fn is_false(b: &bool) -> bool {
    !b
}

impl KvmConfig {
    pub(super) fn validate(&self, p: &mut Problems) {
        if self.ssh_key_file.as_os_str().is_empty() {
            p.report("kvm.sshKeyFile", "must name the SSH private key file");
        }
        match (&self.known_hosts_file, self.insecure_ignore_host_key) {
            (None, false) => p.report(
                "kvm.knownHostsFile",
                "is required unless insecureIgnoreHostKey is true (host keys must be verified)",
            ),
            // Which one was meant? Ignoring the file silently would turn off
            // the verification its author configured.
            (Some(_), true) => p.report(
                "kvm.insecureIgnoreHostKey",
                "cannot be true together with knownHostsFile: remove one (knownHostsFile verifies host keys, \
                 insecureIgnoreHostKey turns verification off)",
            ),
            _ => {}
        }
        if self.disk_size_gb == 0 {
            p.report("kvm.diskSizeGb", "must be at least 1");
        }
        if self.max_image_size_gb == 0 {
            p.report("kvm.maxImageSizeGb", "must be at least 1");
        }
        for (key, image) in &self.images {
            image.validate(&format!("kvm.images.{key}"), key, p);
        }
        if self.machine_types.is_empty() {
            p.report("kvm.machineTypes", "must define at least one machine type");
        }
        for (key, mt) in &self.machine_types {
            if mt.vcpus == 0 {
                p.report(format!("kvm.machineTypes.{key}.vcpus"), "must be at least 1");
            }
            if mt.memory_mib < MIN_MEMORY_MIB {
                p.report(
                    format!("kvm.machineTypes.{key}.memoryMiB"),
                    format!("{} must be at least {MIN_MEMORY_MIB}", mt.memory_mib),
                );
            }
        }
        if self.hosts.is_empty() {
            p.report("kvm.hosts", "must list at least one host");
        }
        let mut first_index: HashMap<&str, usize> = HashMap::new();
        for (i, host) in self.hosts.iter().enumerate() {
            host.validate(&format!("kvm.hosts[{i}]"), p);
            if let Some(j) = first_index.get(host.name.as_str()) {
                p.report(
                    format!("kvm.hosts[{i}].name"),
                    format!(
                        "{:?} is already used by kvm.hosts[{j}]: host names must be unique",
                        host.name
                    ),
                );
            } else {
                first_index.insert(&host.name, i);
            }
        }
    }

    /// [`Self::max_image_size_gb`] in bytes.
    pub fn max_image_bytes(&self) -> u64 {
        u64::from(self.max_image_size_gb) << 30
    }

    /// The host a `placement.zone` selects: the named one, or the only one.
    pub fn host(&self, zone: Option<&str>) -> Option<&KvmHost> {
        match zone {
            Some(name) => self.hosts.iter().find(|h| h.name == name),
            None if self.hosts.len() == 1 => self.hosts.first(),
            None => None,
        }
    }
}

impl KvmImage {
    fn validate(&self, path: &str, key: &str, p: &mut Problems) {
        if !is_identifier(key) {
            p.report(
                path,
                format!(
                    "key {key:?} {IDENTIFIER_RULE}: it becomes part of the base volume's file name, \
                     where a slash would let a path escape the storage pool"
                ),
            );
        }
        match url::Url::parse(&self.url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
            Ok(_) => p.report(
                format!("{path}.url"),
                format!("{:?} must be an http:// or https:// URL", self.url),
            ),
            Err(e) => p.report(format!("{path}.url"), format!("{:?} is not a URL: {e}", self.url)),
        }
        if let Some(sha) = &self.sha256
            && !is_sha256_hex(sha)
        {
            p.report(
                format!("{path}.sha256"),
                format!("{sha:?} must be 64 hexadecimal characters (a sha256 digest)"),
            );
        }
    }
}

/// 64 hex digits, either case.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

impl KvmHost {
    fn validate(&self, path: &str, p: &mut Problems) {
        if !is_identifier(&self.name) {
            p.report(
                format!("{path}.name"),
                format!(
                    "{:?} {IDENTIFIER_RULE}: it becomes part of providerIDs and volume names, \
                     where a slash would make the VM unaddressable or a path escape the storage pool",
                    self.name
                ),
            );
        }
        if let Err(why) = check_host_port(&self.address) {
            p.report(format!("{path}.address"), format!("{:?} {why}", self.address));
        }
        if self.user.trim().is_empty() {
            p.report(format!("{path}.user"), "must name the SSH user");
        }
        if self.bridge.trim().is_empty() {
            p.report(
                format!("{path}.bridge"),
                "must name the host bridge VMs attach to",
            );
        }
        if !self.socket.starts_with('/') {
            p.report(
                format!("{path}.socket"),
                format!("{:?} must be an absolute path", self.socket),
            );
        }
        if self.pool.trim().is_empty() {
            p.report(format!("{path}.pool"), "must name a storage pool");
        }
    }
}

/// `host:port` with a non-empty host (IPv6 in brackets) and a port 1-65535.
fn check_host_port(address: &str) -> Result<(), &'static str> {
    const SHAPE: &str = "must be host:port (e.g. 10.0.0.5:22 or [2001:db8::5]:22)";
    let (host, port) = address.rsplit_once(':').ok_or(SHAPE)?;
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !host.is_empty() && !host.contains(':') && !host.contains(char::is_whitespace)
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 && host_ok => Ok(()),
        _ => Err(SHAPE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_shapes() {
        for ok in [
            "10.0.0.5:22",
            "kvm1.example.net:2222",
            "[::1]:22",
            "127.0.0.1:2222",
        ] {
            assert!(check_host_port(ok).is_ok(), "{ok}");
        }
        for bad in [
            "10.0.0.5",
            ":22",
            "host:0",
            "host:65536",
            "::1:22",
            "[::1]",
            "h h:22",
            "host:ssh",
        ] {
            assert!(check_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_selection_by_zone() {
        let host = |name: &str| KvmHost {
            name: name.into(),
            address: "h:22".into(),
            user: "u".into(),
            bridge: "br0".into(),
            socket: default_socket(),
            pool: default_pool(),
            domain_type: DomainType::Kvm,
        };
        let mut cfg = KvmConfig {
            ssh_key_file: "k".into(),
            known_hosts_file: None,
            insecure_ignore_host_key: true,
            disk_size_gb: 10,
            vendor_data: None,
            install_guest_agent: true,
            images: BTreeMap::new(),
            allow_image_urls: false,
            max_image_size_gb: DEFAULT_MAX_IMAGE_SIZE_GB,
            machine_types: BTreeMap::new(),
            hosts: vec![host("a")],
        };
        assert_eq!(cfg.host(None).map(|h| h.name.as_str()), Some("a"));
        assert_eq!(cfg.host(Some("b")), None);
        cfg.hosts.push(host("b"));
        assert_eq!(cfg.host(None), None, "zone is required with several hosts");
        assert_eq!(cfg.host(Some("b")).map(|h| h.name.as_str()), Some("b"));
    }
}
