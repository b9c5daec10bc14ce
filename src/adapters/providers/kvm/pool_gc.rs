//! Leftovers in a host's pool: overlay and seed volumes whose domain is
//! gone (a crash between volume creation and define, a domain removed by
//! hand), bases no overlay is backed by any more, their markers and pins. Only
//! names the operator gives ([`PoolName`]) are ever considered.
//!
//! "In use" is judged against every domain defined on the host, whoever made
//! it — this installation, another one sharing the host, an earlier version,
//! a released domain or an admin's own — never against this installation's
//! list: a domain of an overlay's name keeps it, and any volume a domain has
//! as a disk (or as a backing file libvirt reports) is never a leftover, so
//! a renamed domain or one booting a base directly keeps what it uses.
//!
//! A leftover is deleted only after it has been one for the whole grace
//! period (the caller tracks since when, [`SweepPlan::due`]), and never when
//! it is in use: a base backing any overlay, the current base of a
//! configured image ([`SweepPlan::keep`]) and anything a running download
//! writes ([`SweepPlan::protect`]) are kept. The sweep runs on the host's
//! libvirt thread, serialised with creates, so no overlay can appear on a
//! base between the inventory and the delete.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::base_image::{PoolName, pin_of_url_base};
use super::ops::VolumeInfo;

/// What one sweep of one pool may do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Configured images: base volumes (digest configured) and pins (not).
    pub keep: BTreeSet<String>,
    /// Volumes a download is writing right now.
    pub protect: BTreeSet<String>,
    /// Leftovers seen for at least the grace period: delete them if they still are.
    pub due: BTreeSet<String>,
}

/// What one sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSweep {
    /// Every leftover found now (deleted or not).
    pub leftovers: Vec<String>,
    pub deleted: Vec<String>,
    /// Deletes that failed, with the reason.
    pub failed: Vec<(String, String)>,
}

/// The leftovers among `volumes`, in a safe deletion order (pins and
/// markers before their bases, so an interrupted sweep never leaves a base
/// that looks complete without being pinned or marked).
///
/// `domains`: names of every domain on the host; `disks`: the paths every
/// domain uses as disks (the host session's `domain_disk_paths`, pool volumes
/// resolved to paths).
pub fn leftovers(
    volumes: &[VolumeInfo],
    domains: &HashSet<String>,
    disks: &HashSet<String>,
    pins: &HashMap<String, String>,
    plan: &SweepPlan,
) -> Vec<String> {
    let present: HashSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    let backing: HashSet<&str> = volumes.iter().filter_map(|v| v.backing.as_deref()).collect();
    let on_disk: HashSet<&str> = volumes
        .iter()
        .filter(|v| disks.contains(&v.path))
        .map(|v| v.name.as_str())
        .collect();
    // Bases in use: a domain's disk, backing an overlay, configured, or pinned by a configured URL.
    let mut used: HashSet<&str> = volumes
        .iter()
        .filter(|v| backing.contains(v.path.as_str()) || plan.keep.contains(&v.name))
        .map(|v| v.name.as_str())
        .chain(on_disk.iter().copied())
        .collect();
    used.extend(
        pins.iter()
            .filter(|(pin, _)| plan.keep.contains(*pin))
            .map(|(_, base)| base.as_str()),
    );
    let base_left = |base: &str| !present.contains(base) || !used.contains(base);
    // A fetch under way protects the URL bases of its URL through its pin.
    let protected = |name: &str| {
        plan.protect.contains(name) || pin_of_url_base(name).is_some_and(|pin| plan.protect.contains(&pin))
    };

    let mut first = Vec::new();
    let mut bases = Vec::new();
    for v in volumes {
        let name = v.name.as_str();
        if protected(name) || plan.keep.contains(name) || on_disk.contains(name) {
            continue;
        }
        match PoolName::of(name) {
            PoolName::Overlay(instance) | PoolName::Seed(instance) if !domains.contains(&instance) => {
                first.push(v.name.clone())
            }
            PoolName::Marker(base) if base_left(&base) && !protected(&base) => first.push(v.name.clone()),
            // A pin that cannot be read points nowhere: a leftover too.
            PoolName::Pin if pins.get(name).is_none_or(|base| base_left(base)) => first.push(v.name.clone()),
            PoolName::Base if !used.contains(name) => bases.push(v.name.clone()),
            _ => {}
        }
    }
    first.extend(bases);
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::providers::kvm::base_image::{base_volume, marker_name, pin_name, url_base_volume};
    use crate::domain::config::ImageFormat;
    use crate::domain::provider_contract::instance_name;

    fn vol(name: &str, backing: Option<&str>) -> VolumeInfo {
        VolumeInfo {
            name: name.into(),
            path: format!("/pool/{name}"),
            backing: backing.map(|b| format!("/pool/{b}")),
        }
    }

    #[test]
    fn leftovers_are_only_unused_operator_volumes() {
        let live = instance_name("live").to_string();
        let dead = instance_name("dead").to_string();
        let (d1, d2, d3) = ("1".repeat(64), "2".repeat(64), "3".repeat(64));
        let used_base = base_volume(&d1, ImageFormat::Qcow2);
        let old_base = base_volume(&d2, ImageFormat::Qcow2);
        let configured = base_volume(&d3, ImageFormat::Raw);
        let pinned_url = "http://images.example/latest.qcow2";
        let pinned_base = base_volume(&"4".repeat(64), ImageFormat::Qcow2);
        let stray_pin = pin_name("http://images.example/old.qcow2");
        let volumes = vec![
            vol(&format!("{live}.qcow2"), Some(&used_base)),
            vol(&format!("{live}-seed.iso"), None),
            vol(&format!("{dead}.qcow2"), Some(&old_base)),
            vol(&format!("{dead}-seed.iso"), None),
            vol(&used_base, None),
            vol(&marker_name(&used_base), None),
            vol(&old_base, None),
            vol(&marker_name(&old_base), None),
            vol(&configured, None),
            vol(&marker_name(&configured), None),
            vol(&pin_name(pinned_url), None),
            vol(&pinned_base, None),
            vol(&marker_name(&pinned_base), None),
            vol(&stray_pin, None),
            vol(
                &marker_name(&base_volume(&"5".repeat(64), ImageFormat::Raw)),
                None,
            ),
            vol("base-debian.qcow2", None),
            vol("users-own-disk.qcow2", None),
        ];
        let domains = HashSet::from([live.clone(), "users-vm".to_owned()]);
        let pins = HashMap::from([
            (pin_name(pinned_url), pinned_base.clone()),
            (stray_pin.clone(), old_base.clone()),
        ]);
        let plan = SweepPlan {
            keep: BTreeSet::from([configured.clone(), pin_name(pinned_url)]),
            ..SweepPlan::default()
        };
        let found = leftovers(&volumes, &domains, &HashSet::new(), &pins, &plan);
        assert_eq!(
            found,
            vec![
                format!("{dead}.qcow2"),
                format!("{dead}-seed.iso"),
                marker_name(&base_volume(&"5".repeat(64), ImageFormat::Raw)),
            ],
            "the dead instance's volumes first; old_base is still backing its overlay"
        );

        // Once the overlay is gone, the old base goes too — pin and marker before it.
        let without: Vec<VolumeInfo> = volumes
            .iter()
            .filter(|v| !v.name.starts_with(&dead))
            .cloned()
            .collect();
        let found = leftovers(&without, &domains, &HashSet::new(), &pins, &plan);
        assert_eq!(
            found,
            vec![
                marker_name(&old_base),
                stray_pin.clone(),
                marker_name(&base_volume(&"5".repeat(64), ImageFormat::Raw)),
                old_base.clone(),
            ]
        );

        // A download in flight protects what it writes.
        let plan = SweepPlan {
            protect: BTreeSet::from([old_base.clone(), marker_name(&old_base)]),
            ..plan
        };
        let found = leftovers(&without, &domains, &HashSet::new(), &pins, &plan);
        assert!(
            !found.contains(&old_base) && !found.contains(&marker_name(&old_base)),
            "{found:?}"
        );
    }

    #[test]
    fn url_bases_are_kept_while_pinned_used_or_being_fetched() {
        let url = "http://images.example/latest.qcow2";
        let pinned = url_base_volume(url, ImageFormat::Qcow2);
        let superseded = url_base_volume(url, ImageFormat::Qcow2);
        let in_use = url_base_volume(url, ImageFormat::Qcow2);
        let vm = instance_name("vm").to_string();
        let volumes = vec![
            vol(&pin_name(url), None),
            vol(&pinned, None),
            vol(&marker_name(&pinned), None),
            vol(&superseded, None),
            vol(&marker_name(&superseded), None),
            vol(&in_use, None),
            vol(&marker_name(&in_use), None),
            vol(&format!("{vm}.qcow2"), Some(&in_use)),
        ];
        let domains = HashSet::from([vm]);
        let pins = HashMap::from([(pin_name(url), pinned.clone())]);
        let configured = SweepPlan {
            keep: BTreeSet::from([pin_name(url)]),
            ..SweepPlan::default()
        };
        assert_eq!(
            leftovers(&volumes, &domains, &HashSet::new(), &pins, &configured),
            vec![marker_name(&superseded), superseded.clone()],
            "the pinned base and the one a VM sits on stay"
        );

        // The image no longer configured: its pin goes before the base it names.
        let found = leftovers(&volumes, &domains, &HashSet::new(), &pins, &SweepPlan::default());
        assert_eq!(
            found,
            vec![
                pin_name(url),
                marker_name(&pinned),
                marker_name(&superseded),
                pinned.clone(),
                superseded.clone(),
            ]
        );

        // A fetch of the URL under way writes a base of a name chosen as it
        // starts: its pin protects every base of the URL, marked or not yet.
        let fetching = SweepPlan {
            protect: BTreeSet::from([pin_name(url)]),
            ..SweepPlan::default()
        };
        let other = url_base_volume("http://images.example/other.qcow2", ImageFormat::Raw);
        let mut with_other = volumes.clone();
        with_other.push(vol(&other, None));
        assert_eq!(
            leftovers(&with_other, &domains, &HashSet::new(), &pins, &fetching),
            vec![other],
            "only the other URL's unused base"
        );
    }
    #[test]
    fn whatever_any_domain_uses_as_a_disk_is_never_a_leftover() {
        // Instances of other installations, renamed or hand-made domains:
        // none of their names is this installation's, yet their disks count.
        let renamed = instance_name("renamed").to_string();
        let gone = instance_name("gone").to_string();
        let direct_base = base_volume(&"6".repeat(64), ImageFormat::Qcow2);
        let under_renamed = base_volume(&"7".repeat(64), ImageFormat::Qcow2);
        let volumes = vec![
            vol(&format!("{renamed}.qcow2"), Some(&under_renamed)),
            vol(&format!("{renamed}-seed.iso"), None),
            vol(&under_renamed, None),
            vol(&marker_name(&under_renamed), None),
            vol(&direct_base, None),
            vol(&marker_name(&direct_base), None),
            vol(&format!("{gone}.qcow2"), None),
        ];
        // No domain carries these names any more: `renamed` was renamed by its admin.
        let domains = HashSet::from(["admins-vm".to_owned(), "other-vm".to_owned()]);
        let disks = HashSet::from([
            format!("/pool/{renamed}.qcow2"),
            format!("/pool/{renamed}-seed.iso"),
            format!("/pool/{direct_base}"),
            "/elsewhere/disk.img".to_owned(),
        ]);
        let plan = SweepPlan::default();
        let found = leftovers(&volumes, &domains, &disks, &HashMap::new(), &plan);
        assert_eq!(found, vec![format!("{gone}.qcow2")], "only what no domain uses");

        // The same pool judged by names alone would lose the renamed domain's disks.
        let by_name = leftovers(&volumes, &domains, &HashSet::new(), &HashMap::new(), &plan);
        assert!(by_name.contains(&format!("{renamed}.qcow2")) && by_name.contains(&direct_base));
    }
}
