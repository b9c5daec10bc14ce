//! The libvirt domain of one proxy VM, as XML
//! (docs/kvm-internals.md#the-domain).
//!
//! q35; the overlay on virtio (`vda`) and the seed as a read-only SATA cdrom,
//! both `type="file"` with the volumes' paths — AppArmor's helper
//! grants QEMU access only to disks that carry a path; one virtio NIC on the
//! host bridge; serial console; the guest-agent channel; a virtio RNG; no
//! graphics. UEFI (`<os firmware="efi">`, secure boot off) unless the image
//! asks for BIOS; ACPI always (UEFI requires it). CPU host-passthrough for
//! `kvm`; none for `qemu` (TCG rejects host-passthrough).

use quick_xml::Writer;
use quick_xml::events::BytesText;

use super::metadata::{InstanceMetadata, METADATA_PREFIX, METADATA_URI};
use crate::domain::config::{DomainType, Firmware};

/// Guest-agent channel name (how the provider reads a VM's address).
pub const GUEST_AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// Everything that varies between proxy VMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSpec {
    pub name: String,
    pub domain_type: DomainType,
    pub firmware: Firmware,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Path of the overlay volume.
    pub disk_path: String,
    /// Path of the seed ISO volume.
    pub seed_path: String,
    pub bridge: String,
    pub metadata: InstanceMetadata,
}

type W = Writer<Vec<u8>>;
type R = std::io::Result<()>;

fn text(w: &mut W, name: &str, value: &str) -> R {
    w.create_element(name).write_text_content(BytesText::new(value))?;
    Ok(())
}

/// The domain XML for `virDomainDefineXML`.
pub fn domain_xml(spec: &DomainSpec) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let kind = match spec.domain_type {
        DomainType::Kvm => "kvm",
        DomainType::Qemu => "qemu",
    };
    // Writing into a Vec cannot fail.
    let _ = w
        .create_element("domain")
        .with_attribute(("type", kind))
        .write_inner_content(|w| body(w, spec));
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

fn body(w: &mut W, spec: &DomainSpec) -> R {
    text(w, "name", &spec.name)?;
    w.create_element("metadata").write_inner_content(|w| {
        let tag = format!("{METADATA_PREFIX}:instance");
        let xmlns = format!("xmlns:{METADATA_PREFIX}");
        w.create_element(tag.as_str())
            .with_attribute((xmlns.as_str(), METADATA_URI))
            .write_inner_content(|w| {
                for (name, value) in spec.metadata.fields() {
                    text(w, &format!("{METADATA_PREFIX}:{name}"), &value)?;
                }
                Ok(())
            })?;
        Ok(())
    })?;
    w.create_element("memory")
        .with_attribute(("unit", "MiB"))
        .write_text_content(BytesText::new(&spec.memory_mib.to_string()))?;
    text(w, "vcpu", &spec.vcpus.to_string())?;
    let os = w.create_element("os");
    let os = match spec.firmware {
        Firmware::Uefi => os.with_attribute(("firmware", "efi")),
        Firmware::Bios => os,
    };
    os.write_inner_content(|w| {
        w.create_element("type")
            .with_attributes([("arch", "x86_64"), ("machine", "q35")])
            .write_text_content(BytesText::new("hvm"))?;
        if spec.firmware == Firmware::Uefi {
            // libvirt picks OVMF and creates the NVRAM itself; secure boot off.
            w.create_element("firmware").write_inner_content(|w| {
                w.create_element("feature")
                    .with_attributes([("enabled", "no"), ("name", "secure-boot")])
                    .write_empty()?;
                w.create_element("feature")
                    .with_attributes([("enabled", "no"), ("name", "enrolled-keys")])
                    .write_empty()?;
                Ok(())
            })?;
        }
        w.create_element("boot")
            .with_attribute(("dev", "hd"))
            .write_empty()?;
        Ok(())
    })?;
    w.create_element("features").write_inner_content(|w| {
        w.create_element("acpi").write_empty()?;
        w.create_element("apic").write_empty()?;
        Ok(())
    })?;
    if spec.domain_type == DomainType::Kvm {
        w.create_element("cpu")
            .with_attribute(("mode", "host-passthrough"))
            .write_empty()?;
    }
    text(w, "on_poweroff", "destroy")?;
    text(w, "on_reboot", "restart")?;
    text(w, "on_crash", "destroy")?;
    w.create_element("devices")
        .write_inner_content(|w| devices(w, spec))?;
    Ok(())
}

fn devices(w: &mut W, spec: &DomainSpec) -> R {
    w.create_element("disk")
        .with_attributes([("type", "file"), ("device", "disk")])
        .write_inner_content(|w| {
            w.create_element("driver")
                .with_attributes([("name", "qemu"), ("type", "qcow2")])
                .write_empty()?;
            w.create_element("source")
                .with_attribute(("file", spec.disk_path.as_str()))
                .write_empty()?;
            w.create_element("target")
                .with_attributes([("dev", "vda"), ("bus", "virtio")])
                .write_empty()?;
            Ok(())
        })?;
    w.create_element("disk")
        .with_attributes([("type", "file"), ("device", "cdrom")])
        .write_inner_content(|w| {
            w.create_element("driver")
                .with_attributes([("name", "qemu"), ("type", "raw")])
                .write_empty()?;
            w.create_element("source")
                .with_attribute(("file", spec.seed_path.as_str()))
                .write_empty()?;
            w.create_element("target")
                .with_attributes([("dev", "sda"), ("bus", "sata")])
                .write_empty()?;
            w.create_element("readonly").write_empty()?;
            Ok(())
        })?;
    w.create_element("interface")
        .with_attribute(("type", "bridge"))
        .write_inner_content(|w| {
            w.create_element("source")
                .with_attribute(("bridge", spec.bridge.as_str()))
                .write_empty()?;
            w.create_element("model")
                .with_attribute(("type", "virtio"))
                .write_empty()?;
            Ok(())
        })?;
    w.create_element("serial")
        .with_attribute(("type", "pty"))
        .write_inner_content(|w| {
            w.create_element("target")
                .with_attribute(("port", "0"))
                .write_empty()?;
            Ok(())
        })?;
    w.create_element("console")
        .with_attribute(("type", "pty"))
        .write_inner_content(|w| {
            w.create_element("target")
                .with_attributes([("type", "serial"), ("port", "0")])
                .write_empty()?;
            Ok(())
        })?;
    w.create_element("channel")
        .with_attribute(("type", "unix"))
        .write_inner_content(|w| {
            w.create_element("target")
                .with_attributes([("type", "virtio"), ("name", GUEST_AGENT_CHANNEL)])
                .write_empty()?;
            Ok(())
        })?;
    w.create_element("rng")
        .with_attribute(("model", "virtio"))
        .write_inner_content(|w| {
            w.create_element("backend")
                .with_attribute(("model", "random"))
                .write_text_content(BytesText::new("/dev/urandom"))?;
            Ok(())
        })?;
    w.create_element("video").write_inner_content(|w| {
        w.create_element("model")
            .with_attribute(("type", "none"))
            .write_empty()?;
        Ok(())
    })?;
    w.create_element("memballoon")
        .with_attribute(("model", "virtio"))
        .write_empty()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(domain_type: DomainType, firmware: Firmware) -> DomainSpec {
        DomainSpec {
            name: "proxy-abcdefghijklmnop".into(),
            domain_type,
            firmware,
            vcpus: 2,
            memory_mib: 512,
            disk_path: "/var/lib/libvirt/images/proxy-abcdefghijklmnop.qcow2".into(),
            seed_path: "/var/lib/libvirt/images/proxy-abcdefghijklmnop-seed.iso".into(),
            bridge: "br0".into(),
            metadata: InstanceMetadata {
                managed: true,
                uid: "uid<&>\"1".into(),
                created_at: "2026-11-30T00:00:00Z".parse().unwrap(),
                namespace: Some("crawl".into()),
                installation: Some("prod-eu-1".into()),
                released: false,
            },
        }
    }

    #[test]
    fn field_by_field() {
        let xml = domain_xml(&spec(DomainType::Kvm, Firmware::Uefi));
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let root = doc.root_element();
        fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> roxmltree::Node<'a, 'i> {
            n.children().find(|c| c.has_tag_name(name)).unwrap()
        }
        assert_eq!(root.attribute("type"), Some("kvm"));
        assert_eq!(child(root, "name").text(), Some("proxy-abcdefghijklmnop"));
        let mem = child(root, "memory");
        assert_eq!((mem.attribute("unit"), mem.text()), (Some("MiB"), Some("512")));
        assert_eq!(child(root, "vcpu").text(), Some("2"));
        let os = child(root, "os");
        assert_eq!(os.attribute("firmware"), Some("efi"));
        let ty = child(os, "type");
        assert_eq!((ty.attribute("machine"), ty.text()), (Some("q35"), Some("hvm")));
        let secure = child(os, "firmware")
            .children()
            .find(|f| f.attribute("name") == Some("secure-boot"))
            .unwrap();
        assert_eq!(secure.attribute("enabled"), Some("no"));
        assert!(child(root, "features").children().any(|f| f.has_tag_name("acpi")));
        assert_eq!(child(root, "cpu").attribute("mode"), Some("host-passthrough"));

        let devices = child(root, "devices");
        let disks: Vec<_> = devices.children().filter(|d| d.has_tag_name("disk")).collect();
        assert_eq!(disks.len(), 2);
        assert_eq!(
            (disks[0].attribute("type"), disks[0].attribute("device")),
            (Some("file"), Some("disk"))
        );
        assert_eq!(
            child(disks[0], "source").attribute("file"),
            Some(spec(DomainType::Kvm, Firmware::Uefi).disk_path.as_str())
        );
        assert_eq!(child(disks[0], "target").attribute("bus"), Some("virtio"));
        assert_eq!(disks[1].attribute("device"), Some("cdrom"));
        assert_eq!(child(disks[1], "target").attribute("bus"), Some("sata"));
        assert!(disks[1].children().any(|c| c.has_tag_name("readonly")));
        let nic = child(devices, "interface");
        assert_eq!(
            (nic.attribute("type"), child(nic, "source").attribute("bridge")),
            (Some("bridge"), Some("br0"))
        );
        assert_eq!(child(nic, "model").attribute("type"), Some("virtio"));
        assert_eq!(
            child(child(devices, "channel"), "target").attribute("name"),
            Some(GUEST_AGENT_CHANNEL)
        );
        assert_eq!(child(devices, "rng").attribute("model"), Some("virtio"));
        assert!(
            !devices.children().any(|d| d.has_tag_name("graphics")),
            "no graphics"
        );

        // The metadata element is namespaced and its text escaped; the parser reads it back.
        let meta = child(child(root, "metadata"), "instance");
        assert_eq!(meta.tag_name().namespace(), Some(METADATA_URI));
        let inner = &xml[meta.range()];
        assert_eq!(
            super::super::metadata::parse(inner),
            Some(spec(DomainType::Kvm, Firmware::Uefi).metadata)
        );
    }

    #[test]
    fn software_emulation_and_bios() {
        let xml = domain_xml(&spec(DomainType::Qemu, Firmware::Bios));
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let root = doc.root_element();
        assert_eq!(root.attribute("type"), Some("qemu"));
        assert!(
            !root.children().any(|c| c.has_tag_name("cpu")),
            "TCG rejects host-passthrough"
        );
        let os = root.children().find(|c| c.has_tag_name("os")).unwrap();
        assert_eq!(os.attribute("firmware"), None);
        assert!(!os.children().any(|c| c.has_tag_name("firmware")));
        assert!(
            root.children()
                .find(|c| c.has_tag_name("features"))
                .unwrap()
                .children()
                .any(|f| f.has_tag_name("acpi"))
        );
    }
}
