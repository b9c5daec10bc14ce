//! The NoCloud seed ISO (docs/kvm-internals.md#the-seed-iso): the small disk
//! cloud-init reads `user-data`, `meta-data` and `vendor-data` from on an
//! instance's first boot.
//!
//! The user's cloud-init travels byte for byte: whatever its format, it is
//! never parsed or rewritten (re-rendered YAML loses comments and turns
//! `version: 1.10` into `1.1`).

use std::io::Cursor;

use data_encoding::BASE64;
use hadris_iso::read::PathSeparator;
use hadris_iso::write::options::{CreationFeatures, IsoFormatOptions};
use hadris_iso::write::{InputEntry, InputTree, IsoCreationError, IsoImageWriter};

/// The volume label cloud-init's NoCloud datasource looks for.
pub const VOLUME_LABEL: &str = "cidata";

/// What goes wrong building the seed ISO.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("cannot write the seed ISO: {0}")]
    Write(#[from] IsoCreationError),
}

/// The three NoCloud documents, as the bytes the guest will read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedFiles {
    pub user_data: Vec<u8>,
    pub meta_data: Vec<u8>,
    pub vendor_data: Option<Vec<u8>>,
}

/// The seed ISO, in memory: volume `cidata` with `user-data`, `meta-data` and
/// (when given) `vendor-data` at its root, stored exactly as given.
///
/// Rock Ridge (what Linux reads) and Joliet carry the lowercase, dashed
/// names: plain ISO 9660 would turn `user-data` into `USER_DAT`.
pub fn build_iso(files: &SeedFiles) -> Result<Vec<u8>, SeedError> {
    let mut entries = vec![
        InputEntry::file("user-data", files.user_data.clone()),
        InputEntry::file("meta-data", files.meta_data.clone()),
    ];
    if let Some(vendor_data) = &files.vendor_data {
        entries.push(InputEntry::file("vendor-data", vendor_data.clone()));
    }
    let options = IsoFormatOptions {
        volume_name: VOLUME_LABEL.to_string(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: None,
        application_id: None,
        sector_size: 2048,
        path_separator: PathSeparator::ForwardSlash,
        features: CreationFeatures::extensions(),
        // Keeps the label lowercase, as `genisoimage -V cidata` writes it.
        strict_charset: false,
    };
    let tree = InputTree::new(PathSeparator::ForwardSlash, entries);
    let image = IsoImageWriter::create(Cursor::new(Vec::new()), tree, options)?;
    Ok(image.into_inner())
}

/// The NoCloud meta-data. The instance name is the instance-id, so a reboot
/// is not a new instance to cloud-init and per-instance modules run once.
pub fn meta_data(instance_id: &str) -> Vec<u8> {
    let name = yaml_quoted(instance_id);
    format!("instance-id: {name}\nlocal-hostname: {name}\n").into_bytes()
}

/// A YAML double-quoted scalar that every YAML parser reads back as `value`:
/// only printable ASCII stays literal, so no name can break the document.
fn yaml_quoted(value: &str) -> String {
    let mut quoted = String::from("\"");
    for character in value.chars() {
        match character {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(character);
            }
            ' '..='~' => quoted.push(character),
            _ if u32::from(character) <= 0xFFFF => {
                quoted.push_str(&format!("\\u{:04X}", u32::from(character)));
            }
            _ => quoted.push_str(&format!("\\U{:08X}", u32::from(character))),
        }
    }
    quoted.push('"');
    quoted
}

/// Installs and starts qemu-guest-agent, through which the operator learns the
/// instance's addresses. A script rather than cloud-config, because cloud-init
/// merges vendor-data cloud-config under user-data and drops every key the user
/// also sets (a user's own `packages:` would silently drop the agent).
/// Idempotent: cloud-init may run it again.
pub const GUEST_AGENT_SCRIPT: &str = r#"#!/bin/sh
# Installs and starts qemu-guest-agent (egress-proxies-operator vendor-data).
# Safe to run again: it installs only what is missing.
set -eu
PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH

has() { command -v "$1" >/dev/null 2>&1; }

if ! has qemu-ga; then
  if has apt-get; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -q -o DPkg::Lock::Timeout=600 update
    apt-get -q -y -o DPkg::Lock::Timeout=600 install qemu-guest-agent
  elif has dnf; then
    dnf -y install qemu-guest-agent
  elif has yum; then
    yum -y install qemu-guest-agent
  elif has zypper; then
    zypper --non-interactive install qemu-guest-agent
  elif has apk; then
    apk add --no-cache qemu-guest-agent
  else
    echo "qemu-guest-agent: no apt-get, dnf, yum, zypper or apk found" >&2
    exit 1
  fi
fi

if [ -d /run/systemd/system ] && has systemctl; then
  systemctl enable qemu-guest-agent 2>/dev/null || true  # static unit on some distros
  systemctl start qemu-guest-agent
elif has rc-update && has rc-service; then
  rc-update add qemu-guest-agent default 2>/dev/null || true  # already added
  rc-service qemu-guest-agent start
else
  echo "qemu-guest-agent: neither systemd nor OpenRC found" >&2
  exit 1
fi
"#;

/// The vendor-data document: the guest-agent script, the configured
/// `vendorData`, both as one MIME multipart, or nothing.
pub fn vendor_data(install_guest_agent: bool, extra: Option<&str>) -> Option<Vec<u8>> {
    match (install_guest_agent, extra) {
        (false, None) => None,
        (true, None) => Some(GUEST_AGENT_SCRIPT.as_bytes().to_vec()),
        (false, Some(extra)) => Some(extra.as_bytes().to_vec()),
        (true, Some(extra)) => Some(
            multipart(&[
                Part {
                    filename: "qemu-guest-agent.sh",
                    content: GUEST_AGENT_SCRIPT,
                },
                Part {
                    filename: "vendor-data",
                    content: extra,
                },
            ])
            .into_bytes(),
        ),
    }
}

/// One document inside a multipart vendor-data.
struct Part<'a> {
    filename: &'a str,
    content: &'a str,
}

/// A `multipart/mixed` document as cloud-init reads it, `MIME-Version` first
/// (cloud-init looks for it to recognise MIME).
// Hand-written: mail crates lead with Date/Message-ID headers and pick random boundaries.
fn multipart(parts: &[Part<'_>]) -> String {
    let contents: Vec<&str> = parts.iter().map(|part| part.content).collect();
    let boundary = unused_boundary(&contents);
    let mut document =
        format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{boundary}\"\n\n");
    for part in parts {
        let (encoding, charset, body) = transfer_encoded(part.content);
        document.push_str(&format!(
            "--{boundary}\n\
             Content-Type: {}; charset=\"{charset}\"\n\
             MIME-Version: 1.0\n\
             Content-Transfer-Encoding: {encoding}\n\
             Content-Disposition: attachment; filename=\"{}\"\n\n\
             {body}\n",
            content_type(part.content),
            part.filename,
        ));
    }
    document.push_str(&format!("--{boundary}--\n"));
    document
}

/// The first of `seed-part-boundary-0`, `-1`, … that occurs in no content,
/// so no line of a part can end it early. Base64 bodies never contain `-`.
fn unused_boundary(contents: &[&str]) -> String {
    let mut n = 0u64;
    loop {
        let boundary = format!("seed-part-boundary-{n}");
        if !contents.iter().any(|content| content.contains(&boundary)) {
            return boundary;
        }
        n += 1;
    }
}

/// ASCII goes as is; anything else as base64, because cloud-init's parser
/// would turn raw non-ASCII into Latin-1 or `\u` escapes on decoding.
fn transfer_encoded(content: &str) -> (&'static str, &'static str, String) {
    if content.is_ascii() {
        return ("7bit", "us-ascii", content.to_string());
    }
    let mut wrapped = String::new();
    for (index, character) in BASE64.encode(content.as_bytes()).chars().enumerate() {
        if index > 0 && index % 76 == 0 {
            wrapped.push('\n');
        }
        wrapped.push(character);
    }
    ("base64", "utf-8", wrapped)
}

/// The part's type by cloud-init's own prefixes. `text/plain` is the safe
/// default: cloud-init sniffs text/plain parts itself (Jinja, `#include`, …).
fn content_type(content: &str) -> &'static str {
    let first_line = content.lines().next().unwrap_or_default().trim_end();
    if first_line == "#cloud-config" {
        "text/cloud-config"
    } else if content.starts_with("#!") {
        "text/x-shellscript"
    } else {
        "text/plain"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::process::Command;

    use hadris_iso::file::EntryType;
    use hadris_iso::joliet::decode_joliet_name;
    use hadris_iso::read::IsoImage;
    use hadris_iso::volume::VolumeDescriptor;
    use proptest::prelude::*;

    /// `#cloud-config\npackages: [squid]\n`, compressed by `gzip -n -9`.
    const GZIP_CLOUD_CONFIG: &[u8] = &[
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0x53, 0x4e, 0xce, 0xc9, 0x2f, 0x4d, 0xd1,
        0x4d, 0xce, 0xcf, 0x4b, 0xcb, 0x4c, 0xe7, 0x2a, 0x48, 0x4c, 0xce, 0x4e, 0x4c, 0x4f, 0x2d, 0xb6, 0x52,
        0x88, 0x2e, 0x2e, 0x2c, 0xcd, 0x4c, 0x89, 0xe5, 0x02, 0x00, 0x20, 0x3e, 0xdd, 0x9c, 0x20, 0x00, 0x00,
        0x00,
    ];

    /// The seven user-data formats a Proxy may carry, each to survive byte for byte.
    fn user_data_samples() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            (
                "cloud-config",
                b"#cloud-config\n# keep this comment\nversion: 1.10\nruncmd:\n  - [echo, 'a: b']  # trailing\n"
                    .to_vec(),
            ),
            (
                "jinja",
                b"## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n".to_vec(),
            ),
            (
                "mime",
                b"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"XYZ\"\n\n--XYZ\n\
                  Content-Type: text/cloud-config\n\n#cloud-config\nversion: 1.10\n--XYZ--\n"
                    .to_vec(),
            ),
            ("gzip", GZIP_CLOUD_CONFIG.to_vec()),
            ("shell", b"#!/bin/sh\nset -e\necho 'hello' > /tmp/x\n".to_vec()),
            ("boothook-include", b"#cloud-boothook\n#include\nhttps://example.com/a.yaml\n".to_vec()),
            (
                "crlf-utf8",
                "#cloud-config\r\n# Grüße, 日本語 ✓\r\nwrite_files:\r\n  - content: \"café\"\r\n"
                    .as_bytes()
                    .to_vec(),
            ),
        ]
    }

    fn seed(user_data: &[u8]) -> SeedFiles {
        SeedFiles {
            user_data: user_data.to_vec(),
            meta_data: meta_data("proxy-abc"),
            vendor_data: vendor_data(true, Some("#cloud-config\nruncmd: [true]\n")),
        }
    }

    fn open(iso: &[u8]) -> IsoImage<Cursor<Vec<u8>>> {
        IsoImage::open(Cursor::new(iso.to_vec())).unwrap()
    }

    /// Root files by the name Linux shows: the Rock Ridge name on the primary tree.
    fn rock_ridge_files(iso: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let image = open(iso);
        assert!(image.supports_rrip(), "no Rock Ridge");
        let root = image
            .root_dirs()
            .iter()
            .copied()
            .find(|root| matches!(root.entry_type(), EntryType::Level1 { .. }));
        let entries = image.open_dir(root.unwrap().dir_ref()).read_entries().unwrap();
        entries
            .iter()
            .filter(|entry| !entry.is_special())
            .map(|entry| {
                let name = entry.rrip.as_ref().and_then(|rrip| rrip.alternate_name.clone());
                (name.expect("Rock Ridge name"), image.read_file(entry).unwrap())
            })
            .collect()
    }

    /// Root files by their Joliet name (what readers without Rock Ridge show).
    fn joliet_files(iso: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let image = open(iso);
        let root = image
            .root_dirs()
            .iter()
            .copied()
            .find(|root| matches!(root.entry_type(), EntryType::Joliet { .. }));
        let entries = image
            .open_dir(root.expect("no Joliet tree").dir_ref())
            .read_entries()
            .unwrap();
        entries
            .iter()
            .filter(|entry| !entry.is_special())
            .map(|entry| (decode_joliet_name(entry.name()), image.read_file(entry).unwrap()))
            .collect()
    }

    fn names(files: &BTreeMap<String, Vec<u8>>) -> Vec<&str> {
        files.keys().map(String::as_str).collect()
    }

    #[test]
    fn every_user_data_format_is_stored_byte_for_byte() {
        for (format, user_data) in user_data_samples() {
            let files = seed(&user_data);
            let iso = build_iso(&files).unwrap();
            for stored in [rock_ridge_files(&iso), joliet_files(&iso)] {
                assert_eq!(
                    names(&stored),
                    ["meta-data", "user-data", "vendor-data"],
                    "{format}"
                );
                assert_eq!(stored["user-data"], user_data, "{format}");
                assert_eq!(stored["meta-data"], files.meta_data, "{format}");
                assert_eq!(
                    Some(&stored["vendor-data"]),
                    files.vendor_data.as_ref(),
                    "{format}"
                );
            }
        }
    }

    #[test]
    fn yaml_user_data_keeps_its_version_and_comments() {
        let user_data = b"#cloud-config\n# keep this comment\nversion: 1.10\n";
        let iso = build_iso(&seed(user_data)).unwrap();
        let stored = String::from_utf8(rock_ridge_files(&iso)["user-data"].clone()).unwrap();
        assert!(stored.contains("version: 1.10\n") && stored.contains("# keep this comment"));
    }

    #[test]
    fn without_vendor_data_only_two_files() {
        let files = SeedFiles {
            vendor_data: None,
            ..seed(b"#cloud-config\n")
        };
        let iso = build_iso(&files).unwrap();
        assert_eq!(names(&rock_ridge_files(&iso)), ["meta-data", "user-data"]);
        assert_eq!(names(&joliet_files(&iso)), ["meta-data", "user-data"]);
    }

    #[test]
    fn empty_user_data_is_an_empty_file() {
        let files = SeedFiles {
            user_data: Vec::new(),
            ..seed(b"")
        };
        let iso = build_iso(&files).unwrap();
        assert_eq!(rock_ridge_files(&iso)["user-data"], b"");
    }

    #[test]
    fn volume_label_is_cidata_in_both_descriptors() {
        let iso = build_iso(&seed(b"#cloud-config\n")).unwrap();
        let image = open(&iso);
        assert_eq!(
            image.read_pvd().unwrap().volume_identifier.to_str().trim_end(),
            "cidata"
        );
        let joliet_labels: Vec<String> = image
            .read_volume_descriptors()
            .map(Result::unwrap)
            .filter_map(|descriptor| match descriptor {
                VolumeDescriptor::Supplementary(svd) => Some(
                    decode_joliet_name(svd.volume_identifier.as_bytes())
                        .trim_end()
                        .to_string(),
                ),
                _ => None,
            })
            .collect();
        assert_eq!(joliet_labels, ["cidata"]);
    }

    /// xorriso (libisofs), an independent reader, finds the label, the exact
    /// names in both the Rock Ridge tree (the one Linux shows) and the Joliet
    /// tree, and every byte as written, for each user-data format.
    #[test]
    fn xorriso_reads_the_names_label_and_contents() {
        let dir = tempfile::tempdir().unwrap();
        let iso_path = dir.path().join("seed.iso");
        // `-read_fs nojoliet` loads the Rock Ridge tree, `norock` the Joliet one.
        let xorriso = |tree: &str, args: &[&str]| {
            let output = Command::new("xorriso")
                .args(["-read_fs", tree, "-indev"])
                .arg(&iso_path)
                .args(args)
                .output()
                .expect("xorriso not found: run tests/system-packages.sh test");
            assert!(output.status.success(), "xorriso {tree} {args:?}: {output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        };

        for (format, user_data) in user_data_samples() {
            let files = seed(&user_data);
            std::fs::write(&iso_path, build_iso(&files).unwrap()).unwrap();

            let pvd = xorriso("any", &["-pvd_info"]);
            let label = pvd.lines().find(|line| line.starts_with("Volume Id"));
            assert!(
                label.is_some_and(|line| line.ends_with(": cidata")),
                "{format}: {pvd}"
            );

            for tree in ["nojoliet", "norock"] {
                let listed = xorriso(tree, &["-find", "/", "-type", "f"]);
                let mut listed: Vec<&str> = listed.lines().collect();
                listed.sort();
                let expected = ["'/meta-data'", "'/user-data'", "'/vendor-data'"];
                assert_eq!(listed, expected, "{format} {tree}");

                let out = dir.path().join(format!("{format}-{tree}"));
                xorriso(tree, &["-osirrox", "on", "-extract", "/", out.to_str().unwrap()]);
                let read = |name: &str| std::fs::read(out.join(name)).unwrap();
                assert_eq!(read("user-data"), user_data, "{format} {tree}");
                assert_eq!(read("meta-data"), files.meta_data, "{format} {tree}");
                assert_eq!(Some(read("vendor-data")), files.vendor_data, "{format} {tree}");
            }
        }
    }

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct MetaData {
        instance_id: String,
        local_hostname: String,
    }

    #[test]
    fn meta_data_names_the_instance() {
        assert_eq!(
            meta_data("proxy-abc"),
            b"instance-id: \"proxy-abc\"\nlocal-hostname: \"proxy-abc\"\n"
        );
    }

    proptest! {
        #[test]
        fn meta_data_reads_back_whatever_the_name(name in any::<String>()) {
            let document = String::from_utf8(meta_data(&name)).unwrap();
            prop_assert!(document.is_ascii());
            let parsed: MetaData = serde_saphyr::from_str(&document).unwrap();
            prop_assert_eq!(&parsed.instance_id, &name);
            prop_assert_eq!(&parsed.local_hostname, &name);
        }

        #[test]
        fn boundary_never_occurs_in_the_parts(extra in ".*seed-part-boundary-[0-3].*") {
            let document = String::from_utf8(vendor_data(true, Some(&extra)).unwrap()).unwrap();
            let boundary = boundary_of(&document);
            prop_assert!(!extra.contains(&boundary));
            prop_assert!(!GUEST_AGENT_SCRIPT.contains(&boundary));
            prop_assert_eq!(parts(&document), vec![GUEST_AGENT_SCRIPT.to_string(), extra]);
        }
    }

    #[test]
    fn vendor_data_is_nothing_without_agent_or_extra() {
        assert_eq!(vendor_data(false, None), None);
    }

    #[test]
    fn vendor_data_is_the_script_alone_for_the_agent() {
        assert_eq!(
            vendor_data(true, None),
            Some(GUEST_AGENT_SCRIPT.as_bytes().to_vec())
        );
    }

    #[test]
    fn vendor_data_is_the_extra_as_given_without_the_agent() {
        let extra = "#cloud-config\n# comment\nversion: 1.10\n";
        assert_eq!(vendor_data(false, Some(extra)), Some(extra.as_bytes().to_vec()));
    }

    #[test]
    fn guest_agent_script_covers_every_package_manager_and_init() {
        assert!(GUEST_AGENT_SCRIPT.starts_with("#!/bin/sh\n"));
        for needed in [
            "apt-get",
            "dnf",
            "yum",
            "zypper",
            "apk",
            "systemctl",
            "rc-update",
            "rc-service",
            "if ! has qemu-ga",
        ] {
            assert!(GUEST_AGENT_SCRIPT.contains(needed), "{needed}");
        }
    }

    #[test]
    fn guest_agent_script_is_valid_shell() {
        let status = Command::new("sh")
            .args(["-n", "-c", GUEST_AGENT_SCRIPT])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Runs the script against stub commands that log their arguments; the
    /// apt-get stub "installs" qemu-ga. Returns what was called.
    fn run_guest_agent_script(stubs: &std::path::Path) -> Vec<String> {
        let log = stubs.join("calls.log");
        let _ = std::fs::remove_file(&log);
        // Absolute: with PATH overridden, Command looks the program up there.
        let output = Command::new("/bin/sh")
            .args(["-c", GUEST_AGENT_SCRIPT])
            .env("PATH", stubs)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        calls.lines().map(str::to_string).collect()
    }

    fn write_stub(stubs: &std::path::Path, name: &str, extra: &str) {
        use std::os::unix::fs::PermissionsExt;
        let log = stubs.join("calls.log");
        let body = format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\n{extra}", log.display());
        let path = stubs.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn guest_agent_script_installs_once_and_starts_every_time() {
        let stubs = tempfile::tempdir().unwrap();
        let qemu_ga = stubs.path().join("qemu-ga");
        let install = format!(
            "case \"$*\" in *install*) printf '#!/bin/sh\\n' > '{0}'; chmod +x '{0}';; esac\n",
            qemu_ga.display()
        );
        // Stubs shadow the host's apt-get; the init system is whichever this host has.
        write_stub(stubs.path(), "apt-get", &install);
        for name in ["systemctl", "rc-update", "rc-service"] {
            write_stub(stubs.path(), name, "");
        }

        let first = run_guest_agent_script(stubs.path());
        assert!(first.iter().any(|call| call.ends_with(" update")), "{first:?}");
        assert!(
            first
                .iter()
                .any(|call| call.ends_with(" install qemu-guest-agent")),
            "{first:?}"
        );
        let started = |calls: &[String]| {
            calls.last().is_some_and(|call| {
                call == "systemctl start qemu-guest-agent" || call == "rc-service qemu-guest-agent start"
            })
        };
        assert!(started(&first), "{first:?}");

        let again = run_guest_agent_script(stubs.path());
        assert!(!again.iter().any(|call| call.starts_with("apt-get")), "{again:?}");
        assert!(started(&again), "{again:?}");
    }

    /// The `boundary="…"` of a multipart document.
    fn boundary_of(document: &str) -> String {
        let start = document.find("boundary=\"").unwrap() + "boundary=\"".len();
        let end = start + document[start..].find('"').unwrap();
        document[start..end].to_string()
    }

    /// Each part's headers, split off its decoded body, as cloud-init's parser splits them.
    fn split_parts(document: &str) -> Vec<(String, String)> {
        let delimiter = format!("\n--{}", boundary_of(document));
        let sections: Vec<&str> = document.split(delimiter.as_str()).collect();
        assert_eq!(sections.last(), Some(&"--\n"), "closing delimiter");
        sections[1..sections.len() - 1]
            .iter()
            .map(|section| {
                let (headers, body) = section.split_once("\n\n").unwrap();
                let body = if headers.contains("Content-Transfer-Encoding: base64") {
                    let joined: String = body.lines().collect();
                    String::from_utf8(BASE64.decode(joined.as_bytes()).unwrap()).unwrap()
                } else {
                    assert!(headers.contains("Content-Transfer-Encoding: 7bit"));
                    body.to_string()
                };
                (headers.trim_start_matches('\n').to_string(), body)
            })
            .collect()
    }

    fn parts(document: &str) -> Vec<String> {
        split_parts(document).into_iter().map(|(_, body)| body).collect()
    }

    fn content_types(document: &str) -> Vec<String> {
        split_parts(document)
            .iter()
            .map(|(headers, _)| {
                let line = headers
                    .lines()
                    .find(|line| line.starts_with("Content-Type: "))
                    .unwrap();
                line["Content-Type: ".len()..]
                    .split(';')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn agent_and_extra_travel_as_one_multipart() {
        let extra = "#cloud-config\npackages: [htop]\n";
        let document = String::from_utf8(vendor_data(true, Some(extra)).unwrap()).unwrap();
        let mut lines = document.lines();
        assert_eq!(lines.next(), Some("MIME-Version: 1.0"));
        let content_type = lines.next().unwrap();
        assert!(
            content_type.starts_with("Content-Type: multipart/mixed; boundary="),
            "{content_type}"
        );
        assert_eq!(parts(&document), [GUEST_AGENT_SCRIPT, extra]);
        assert_eq!(
            content_types(&document),
            ["text/x-shellscript", "text/cloud-config"]
        );
    }

    #[test]
    fn extra_part_type_follows_cloud_inits_prefixes() {
        for (extra, expected) in [
            ("#cloud-config\nruncmd: [true]\n", "text/cloud-config"),
            ("#cloud-config\r\nruncmd: [true]\r\n", "text/cloud-config"),
            ("#!/bin/bash\necho hi\n", "text/x-shellscript"),
            ("#cloud-config-archive\n- content: x\n", "text/plain"),
            ("## template: jinja\n#cloud-config\n", "text/plain"),
            ("#include\nhttps://example.com/x\n", "text/plain"),
            ("plain words", "text/plain"),
            ("", "text/plain"),
        ] {
            let document = String::from_utf8(vendor_data(true, Some(extra)).unwrap()).unwrap();
            assert_eq!(
                content_types(&document),
                ["text/x-shellscript", expected],
                "{extra:?}"
            );
            assert_eq!(parts(&document), [GUEST_AGENT_SCRIPT, extra], "{extra:?}");
        }
    }

    #[test]
    fn non_ascii_extra_is_base64_and_decodes_exactly() {
        let extra = "#cloud-config\r\n# Grüße ✓ 😀\r\nruncmd: [true]\r\n";
        let document = String::from_utf8(vendor_data(true, Some(extra)).unwrap()).unwrap();
        assert!(document.is_ascii());
        assert_eq!(parts(&document), [GUEST_AGENT_SCRIPT, extra]);
    }

    #[test]
    fn boundary_changes_when_the_extra_contains_it() {
        let extra = "#!/bin/sh\n# --seed-part-boundary-0\n# seed-part-boundary-1\n";
        let document = String::from_utf8(vendor_data(true, Some(extra)).unwrap()).unwrap();
        assert_eq!(boundary_of(&document), "seed-part-boundary-2");
        assert_eq!(parts(&document), [GUEST_AGENT_SCRIPT, extra]);
    }
}
