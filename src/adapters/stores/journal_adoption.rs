//! Adopting a lease journal its writer left behind: a dead member's
//! `egress-proxies-leases-<tag>-NN`, or the leader journal of a version
//! before per-member journals.
//!
//! The adopter reads every shard into one [`LeaseSnapshot`], merges it into
//! its own book (idempotent: reading the same journal twice merges the same
//! leases), makes that durable in its own journal, and only then deletes
//! the shards — each guarded by the resourceVersion it read, so a shard
//! written after the read is never deleted unread: the delete meets a 409,
//! and [`JournalAdoption::delete`] hands back the journal as it now is to
//! merge again. A member's shards are found by their label, the leader's
//! unlabelled ones by name.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};

use crate::adapters::stores::checkpoint_shard;
use crate::adapters::stores::configmap_lease_journal::{JOURNAL_LABEL, JournalName};
use crate::domain::lease::journal::{JournalError, JournalState, LeaseSnapshot};
use crate::domain::membership::MemberTag;

/// A shard as read: what its delete must be guarded by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardVersion {
    pub name: String,
    pub resource_version: String,
    pub uid: Option<String>,
}

/// Every shard of a journal, read at once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdoptedJournal {
    /// What the shards held, all of them together.
    pub snapshot: LeaseSnapshot,
    /// The shards read (none: the journal is gone).
    pub shards: Vec<ShardVersion>,
}

impl AdoptedJournal {
    /// Whether no shard of the journal exists.
    pub fn is_gone(&self) -> bool {
        self.shards.is_empty()
    }
}

/// What deleting a journal's shards came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Deletion {
    /// Every shard read is gone.
    Done,
    /// Some shard changed after it was read and was kept: the journal as
    /// it is now, to merge and delete again.
    ChangedSince(AdoptedJournal),
}

/// Reads and deletes one journal's shards.
pub struct JournalAdoption {
    api: Api<ConfigMap>,
    journal: JournalName,
}

impl JournalAdoption {
    pub fn new(client: kube::Client, namespace: &str, journal: JournalName) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            journal,
        }
    }

    /// The journal this adopts.
    pub fn journal(&self) -> &JournalName {
        &self.journal
    }

    fn failed(&self, message: String) -> JournalError {
        JournalError::Checkpoint {
            name: self.journal.prefix.trim_end_matches('-').to_owned(),
            message,
        }
    }

    /// Every shard of the journal in one snapshot: by label when the
    /// journal has one, else by name.
    pub async fn read(&self) -> Result<AdoptedJournal, JournalError> {
        let found: Vec<ConfigMap> = match self.journal.selector() {
            Some(selector) => self
                .api
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| self.failed(e.to_string()))?
                .items
                .into_iter()
                .filter(|cm| cm.metadata.name.as_deref().is_some_and(|n| self.journal.owns(n)))
                .collect(),
            None => {
                let mut found = Vec::new();
                for index in 0..self.journal.shards {
                    let name = self.journal.shard(index);
                    if let Some(cm) = self
                        .api
                        .get_opt(&name)
                        .await
                        .map_err(|e| self.failed(format!("{name}: {e}")))?
                    {
                        found.push(cm);
                    }
                }
                found
            }
        };
        let mut adopted = AdoptedJournal::default();
        for cm in found {
            let name = cm.metadata.name.clone().unwrap_or_default();
            let state: JournalState = serde_json::from_str(checkpoint_shard::leases_json(&cm))
                .map_err(|e| self.failed(format!("{name}: unreadable checkpoint: {e}")))?;
            state.into_snapshot(&mut adopted.snapshot)?;
            adopted.shards.push(ShardVersion {
                name,
                resource_version: cm.metadata.resource_version.clone().unwrap_or_default(),
                uid: cm.metadata.uid.clone(),
            });
        }
        Ok(adopted)
    }

    /// Deletes the shards of `read`, each only at the version read. Call
    /// once what `read` held is durable in the adopter's own journal.
    pub async fn delete(&self, read: &AdoptedJournal) -> Result<Deletion, JournalError> {
        let mut changed = false;
        for shard in &read.shards {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(shard.resource_version.clone()),
                    uid: shard.uid.clone(),
                }),
                ..DeleteParams::default()
            };
            match self.api.delete(&shard.name, &params).await {
                Ok(_) => {}
                // Gone already: another adopter (or a person) deleted it.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                // Written after the read: keep it, read it again below.
                Err(kube::Error::Api(s)) if s.code == 409 => changed = true,
                Err(e) => return Err(self.failed(format!("deleting {}: {e}", shard.name))),
            }
        }
        if !changed {
            return Ok(Deletion::Done);
        }
        let again = self.read().await?;
        Ok(if again.is_gone() {
            Deletion::Done
        } else {
            Deletion::ChangedSince(again)
        })
    }
}

/// The tags of every member journal in `namespace` (a journal whose tag
/// has no live member is the leader's to adopt).
pub async fn journal_tags(
    client: kube::Client,
    namespace: &str,
) -> Result<BTreeSet<MemberTag>, JournalError> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let list = api
        .list(&ListParams::default().labels(JOURNAL_LABEL))
        .await
        .map_err(|e| JournalError::Checkpoint {
            name: JOURNAL_LABEL.to_owned(),
            message: e.to_string(),
        })?;
    Ok(list
        .items
        .iter()
        .filter_map(|cm| cm.metadata.labels.as_ref()?.get(JOURNAL_LABEL))
        .filter_map(|tag| MemberTag::parse(tag))
        .collect())
}
