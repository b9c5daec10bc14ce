//! One shard of the lease checkpoint as a ConfigMap: what the leader writes
//! over the version it last read or wrote, and who changed the shard when a
//! guarded write meets a newer version.
//!
//! The writer owns four things in a shard: the `leases.json` key (its
//! in-memory book is the truth while it leads, so another replica's late
//! write never adds or drops a lease), the `app.kubernetes.io/managed-by`
//! label, the journal's own labels (a member's `crawl.example.com/lease-journal`)
//! and the [`WRITER_ANNOTATION`]. Everything else — labels and
//! annotations a GitOps tool or an admission controller added, other data
//! keys — is someone else's and is kept as found.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The data key holding a shard's JSON.
pub const DATA_KEY: &str = "leases.json";
/// Names the replica (its identity) that last wrote the shard's leases.
pub const WRITER_ANNOTATION: &str = "crawl.example.com/checkpoint-writer";
/// The field manager of the operator's writes (as `managedFields` show it).
pub const FIELD_MANAGER: &str = "egress-proxies-operator";
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "egress-proxies-operator");

/// The ConfigMap to write: `base` (the version last read or written; None
/// to create it) carrying `json` as this leader's leases, written by
/// `writer`, with the journal's `labels`.
pub fn desired(
    name: &str,
    base: Option<&ConfigMap>,
    json: &str,
    writer: &str,
    labels: &BTreeMap<String, String>,
) -> ConfigMap {
    let mut cm = base.cloned().unwrap_or_else(|| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    });
    // Server-owned: an update that leaves them out keeps them.
    cm.metadata.managed_fields = None;
    let ours = cm.metadata.labels.get_or_insert_with(BTreeMap::new);
    ours.insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
    ours.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    cm.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(WRITER_ANNOTATION.to_owned(), writer.to_owned());
    cm.data
        .get_or_insert_with(BTreeMap::new)
        .insert(DATA_KEY.to_owned(), json.to_owned());
    cm
}

/// The leases a shard holds as JSON (`{}` when it has none).
pub fn leases_json(cm: &ConfigMap) -> &str {
    cm.data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .map_or("{}", String::as_str)
}

/// Who changed a shard since this leader last wrote or read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConflictCause {
    /// Another replica of the operator (the writer annotation names it): a
    /// late write of an earlier leader.
    Replica(String),
    /// Another client, by the field manager of its latest change.
    Client(String),
    /// The shard was deleted.
    Deleted,
    /// Nobody named: no foreign writer annotation nor field manager.
    Unknown,
}

impl ConflictCause {
    /// The metric label: a fixed set of values.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Replica(_) => "other_replica",
            Self::Client(_) => "other_client",
            Self::Deleted => "deleted",
            Self::Unknown => "unknown",
        }
    }

    /// The writer as logs and Events name it.
    pub fn writer(&self) -> String {
        match self {
            Self::Replica(identity) => format!("replica {identity}"),
            Self::Client(manager) => format!("field manager {manager}"),
            Self::Deleted => "a deletion".to_owned(),
            Self::Unknown => "an unknown client".to_owned(),
        }
    }
}

/// Who changed the shard that now reads `current` (None: deleted), given
/// that this leader is `me`.
pub fn who_changed(current: Option<&ConfigMap>, me: &str) -> ConflictCause {
    let Some(cm) = current else {
        return ConflictCause::Deleted;
    };
    let writer = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WRITER_ANNOTATION));
    if let Some(writer) = writer.filter(|w| w.as_str() != me) {
        return ConflictCause::Replica(writer.clone());
    }
    cm.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| {
            let manager = entry.manager.as_deref()?;
            (manager != FIELD_MANAGER).then(|| (entry.time.as_ref().map(|t| t.0), manager))
        })
        .max()
        .map_or(ConflictCause::Unknown, |(_, manager)| {
            ConflictCause::Client(manager.to_owned())
        })
}

/// The Event note of a conflict on shard `name`.
pub fn conflict_note(name: &str, cause: &ConflictCause, replaced_leases: bool) -> String {
    let what = if replaced_leases {
        "its lease data was not this leader's and was replaced"
    } else {
        "its lease data was unchanged"
    };
    format!(
        "{name} was changed by {} since this leader last wrote it; re-read it and wrote this \
         leader's leases again, keeping the labels, annotations and keys others set ({what})",
        cause.writer()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    fn entry(manager: &str, second: i64) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_owned()),
            operation: Some("Update".to_owned()),
            time: Some(Time(
                jiff::Timestamp::from_second(1_900_000_000 + second).unwrap(),
            )),
            ..ManagedFieldsEntry::default()
        }
    }

    fn shard(writer: &str, managers: Vec<ManagedFieldsEntry>) -> ConfigMap {
        let mut cm = desired(
            "egress-proxies-leases-03",
            None,
            r#"{"leases":{}}"#,
            writer,
            &BTreeMap::new(),
        );
        cm.metadata.managed_fields = Some(managers);
        cm
    }

    #[test]
    fn a_write_keeps_what_others_set_and_replaces_only_the_leases() {
        let mut theirs = shard("old", vec![entry(FIELD_MANAGER, 1)]);
        theirs.metadata.resource_version = Some("42".into());
        theirs
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "crawl".into());
        theirs
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("argocd.argoproj.io/tracking-id".into(), "x".into());
        theirs
            .data
            .as_mut()
            .unwrap()
            .insert("notes".into(), "keep me".into());
        let journal = BTreeMap::from([(
            "crawl.example.com/lease-journal".to_owned(),
            "0a1b2c3d".to_owned(),
        )]);
        let ours = desired(
            "egress-proxies-leases-03",
            Some(&theirs),
            r#"{"leases":{"a":1}}"#,
            "me",
            &journal,
        );
        assert_eq!(
            ours.metadata.resource_version.as_deref(),
            Some("42"),
            "guarded by the version read"
        );
        assert_eq!(ours.metadata.managed_fields, None);
        let labels = ours.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "crawl");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "egress-proxies-operator");
        assert_eq!(labels["crawl.example.com/lease-journal"], "0a1b2c3d");
        let annotations = ours.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[WRITER_ANNOTATION], "me");
        assert_eq!(annotations["argocd.argoproj.io/tracking-id"], "x");
        assert_eq!(ours.data.as_ref().unwrap()["notes"], "keep me");
        assert_eq!(leases_json(&ours), r#"{"leases":{"a":1}}"#);
        assert_eq!(leases_json(&ConfigMap::default()), "{}");
    }

    #[test]
    fn the_writer_is_named_by_the_annotation_then_the_latest_foreign_manager() {
        let late = shard("old-leader", vec![entry(FIELD_MANAGER, 5)]);
        assert_eq!(
            who_changed(Some(&late), "me"),
            ConflictCause::Replica("old-leader".into())
        );
        let labelled = shard(
            "me",
            vec![
                entry(FIELD_MANAGER, 5),
                entry("kubectl-label", 9),
                entry("argocd-controller", 7),
            ],
        );
        let cause = who_changed(Some(&labelled), "me");
        assert_eq!(cause, ConflictCause::Client("kubectl-label".into()));
        assert_eq!(cause.reason(), "other_client");
        assert!(
            conflict_note("egress-proxies-leases-03", &cause, false).contains("field manager kubectl-label")
        );
        assert_eq!(
            who_changed(Some(&shard("me", vec![entry(FIELD_MANAGER, 5)])), "me"),
            ConflictCause::Unknown
        );
        assert_eq!(who_changed(None, "me"), ConflictCause::Deleted);
        assert_eq!(ConflictCause::Deleted.reason(), "deleted");
    }
}
