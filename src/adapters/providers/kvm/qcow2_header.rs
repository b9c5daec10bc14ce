//! The few qcow2 header fields that decide whether an image may be a base.
//!
//! A qcow2 image can name other files: a *backing file* (reads of
//! unallocated clusters go there) and an *external data file* (all guest
//! data lives there). QEMU opens whatever path the image names, so a
//! downloaded image could point a VM at host files or at other VMs' disks.
//! Our overlays name their base themselves; a base must name nothing.
//!
//! Layout (QEMU's `docs/interop/qcow2.txt`, all fields big-endian): magic
//! at 0, version at 4, `backing_file_offset` at 8, `backing_file_size` at
//! 16; version 3 adds `incompatible_features` at 72 (bit 2: external data
//! file) and `header_length` at 100. Header extensions follow the header
//! (at 72 for version 2), each `type: u32, length: u32, data` padded to 8
//! bytes, ended by type 0; type `0x44415441` ("DATA") names the data file.
//! No maintained crate parses a header from a prefix of bytes (the qcow2
//! crates open whole files), so these fixed fields are read here.

use super::base_image::detect_format;
use crate::domain::config::ImageFormat;

/// How many leading bytes of an image are kept to inspect its header: the
/// header and its extensions sit in the first cluster, and images with
/// clusters larger than this still keep them near the start.
pub const HEADER_PROBE_BYTES: usize = 64 * 1024;

const INCOMPATIBLE_EXTERNAL_DATA_FILE: u64 = 1 << 2;
const EXTENSION_END: u32 = 0;
const EXTENSION_DATA_FILE: u32 = 0x4441_5441;
const V2_HEADER_LENGTH: usize = 72;

/// Why an image may not be a base.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Qcow2HeaderError {
    #[error(
        "it is a qcow2 image with a backing file ({name:?}); a base must stand alone, \
         as a backing file could point a VM at host files or another VM's disk"
    )]
    BackingFile { name: String },
    #[error(
        "it is a qcow2 image with an external data file{}; a base must stand alone, \
         as a data file could point a VM at host files or another VM's disk",
        name.as_ref().map(|n| format!(" ({n:?})")).unwrap_or_default()
    )]
    ExternalDataFile { name: Option<String> },
    #[error("it is a qcow2 image of version {0}; only versions 2 and 3 are accepted")]
    Version(u32),
    #[error(
        "its qcow2 header does not fit in its first {available} bytes (it needs {needed}); \
         such an image cannot be inspected, so it is refused"
    )]
    Truncated { needed: usize, available: usize },
}

fn be_u32(head: &[u8], at: usize) -> Result<u32, Qcow2HeaderError> {
    let bytes = slice(head, at, 4)?;
    Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

fn be_u64(head: &[u8], at: usize) -> Result<u64, Qcow2HeaderError> {
    let hi = u64::from(be_u32(head, at)?);
    let lo = u64::from(be_u32(head, at + 4)?);
    Ok(hi << 32 | lo)
}

fn slice(head: &[u8], at: usize, len: usize) -> Result<&[u8], Qcow2HeaderError> {
    let end = at.saturating_add(len);
    head.get(at..end).ok_or(Qcow2HeaderError::Truncated {
        needed: end,
        available: head.len(),
    })
}

/// A name stored in the image, for the error message (lossy, bounded).
fn name_at(head: &[u8], at: usize, len: usize) -> Option<String> {
    let bytes = head.get(at..at.checked_add(len.min(4096))?)?;
    let text = String::from_utf8_lossy(bytes);
    Some(text.trim_end_matches('\0').to_owned())
}

/// Checks the leading bytes of an image (at least its header; see
/// [`HEADER_PROBE_BYTES`]). Anything without the qcow2 magic is raw and
/// names no other file.
pub fn check_standalone(head: &[u8]) -> Result<(), Qcow2HeaderError> {
    if detect_format(head) != ImageFormat::Qcow2 {
        return Ok(());
    }
    let version = be_u32(head, 4)?;
    if !matches!(version, 2 | 3) {
        return Err(Qcow2HeaderError::Version(version));
    }
    let backing_offset = be_u64(head, 8)?;
    if backing_offset != 0 {
        let size = be_u32(head, 16)? as usize;
        let name = usize::try_from(backing_offset)
            .ok()
            .and_then(|at| name_at(head, at, size))
            .unwrap_or_else(|| format!("at byte {backing_offset}"));
        return Err(Qcow2HeaderError::BackingFile { name });
    }
    let extensions_at = if version == 3 {
        let header_length = be_u32(head, 100)? as usize;
        let incompatible = be_u64(head, 72)?;
        if incompatible & INCOMPATIBLE_EXTERNAL_DATA_FILE != 0 {
            // The data file's name, when the image records one, makes the message clearer.
            let name = data_file_name(head, header_length).ok().flatten();
            return Err(Qcow2HeaderError::ExternalDataFile { name });
        }
        header_length
    } else {
        V2_HEADER_LENGTH
    };
    match data_file_name(head, extensions_at)? {
        // A data file named without the feature bit is ignored by QEMU; refused all the same.
        Some(name) => Err(Qcow2HeaderError::ExternalDataFile { name: Some(name) }),
        None => Ok(()),
    }
}

/// Walks the header extensions from `at` to their end; the data file's name if one is there.
fn data_file_name(head: &[u8], mut at: usize) -> Result<Option<String>, Qcow2HeaderError> {
    loop {
        let kind = be_u32(head, at)?;
        let len = be_u32(head, at + 4)? as usize;
        if kind == EXTENSION_END {
            return Ok(None);
        }
        let data = at + 8;
        if kind == EXTENSION_DATA_FILE {
            slice(head, data, len)?;
            return Ok(name_at(head, data, len));
        }
        at = data.saturating_add(len.div_ceil(8) * 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-3 header of 104 bytes, then `extensions`, then the end marker.
    fn v3(incompatible: u64, backing: Option<&str>, extensions: &[(u32, &[u8])]) -> Vec<u8> {
        let mut h = vec![0u8; 104];
        h[..4].copy_from_slice(b"QFI\xfb");
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[20..24].copy_from_slice(&16u32.to_be_bytes());
        h[72..80].copy_from_slice(&incompatible.to_be_bytes());
        h[100..104].copy_from_slice(&104u32.to_be_bytes());
        for (kind, data) in extensions {
            h.extend(kind.to_be_bytes());
            h.extend((data.len() as u32).to_be_bytes());
            h.extend(*data);
            h.resize(h.len().div_ceil(8) * 8, 0);
        }
        h.extend([0u8; 8]);
        if let Some(name) = backing {
            let at = h.len() as u64;
            h[8..16].copy_from_slice(&at.to_be_bytes());
            h[16..20].copy_from_slice(&(name.len() as u32).to_be_bytes());
            h.extend(name.as_bytes());
        }
        h
    }

    #[test]
    fn a_plain_image_passes_raw_or_qcow2() {
        assert_eq!(check_standalone(b"\xebc\x90 a raw disk"), Ok(()));
        assert_eq!(check_standalone(b""), Ok(()));
        let backing_format = (0xe279_2aca, &b"raw"[..]);
        assert_eq!(check_standalone(&v3(0, None, &[backing_format])), Ok(()));
        let mut v2 = v3(0, None, &[]);
        v2[4..8].copy_from_slice(&2u32.to_be_bytes());
        assert_eq!(check_standalone(&v2[..80]), Ok(()));
    }

    #[test]
    fn a_backing_file_is_refused_with_its_name() {
        let err = check_standalone(&v3(0, Some("/etc/shadow"), &[])).unwrap_err();
        assert_eq!(
            err,
            Qcow2HeaderError::BackingFile {
                name: "/etc/shadow".into()
            }
        );
        assert!(
            err.to_string().contains("backing file (\"/etc/shadow\")"),
            "{err}"
        );
    }

    #[test]
    fn an_external_data_file_is_refused_by_bit_or_by_extension() {
        let named = (EXTENSION_DATA_FILE, &b"/var/lib/libvirt/images/other.raw"[..]);
        let err = check_standalone(&v3(INCOMPATIBLE_EXTERNAL_DATA_FILE, None, &[named])).unwrap_err();
        assert_eq!(
            err,
            Qcow2HeaderError::ExternalDataFile {
                name: Some("/var/lib/libvirt/images/other.raw".into())
            }
        );
        assert!(err.to_string().contains("external data file"), "{err}");
        let unnamed = check_standalone(&v3(INCOMPATIBLE_EXTERNAL_DATA_FILE, None, &[])).unwrap_err();
        assert_eq!(unnamed, Qcow2HeaderError::ExternalDataFile { name: None });
        let extension_only = check_standalone(&v3(0, None, &[named])).unwrap_err();
        assert!(matches!(
            extension_only,
            Qcow2HeaderError::ExternalDataFile { .. }
        ));
    }

    #[test]
    fn an_unknown_version_or_a_cut_header_is_refused() {
        let mut v4 = v3(0, None, &[]);
        v4[4..8].copy_from_slice(&4u32.to_be_bytes());
        assert_eq!(check_standalone(&v4), Err(Qcow2HeaderError::Version(4)));
        let cut = check_standalone(&v3(0, None, &[])[..90]).unwrap_err();
        assert!(
            matches!(
                cut,
                Qcow2HeaderError::Truncated {
                    needed: 104,
                    available: 90
                }
            ),
            "{cut:?}"
        );
    }
}
