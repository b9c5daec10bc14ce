//! Carrying out what a pool's turn decided, through the store port, in
//! this order:
//!
//! 1. **delete** drained members (one deleted already — by an earlier turn
//!    whose answer was lost, or by someone else — is `Gone`: fine);
//! 2. **retire** due members: the retiring annotation, then the event (log
//!    line, metric, an Event on the pool); any failure here, `Gone`
//!    included, ends the turn before anything is created;
//! 3. **annotate** members whose quarantine annotation is behind (a member
//!    gone meanwhile needs none);
//! 4. **create** new members (a drawn name that is taken — `AlreadyExists`
//!    — is skipped: the next turn draws another; any other failure stops
//!    the creates and is told in the `ReplicaFailure` condition);
//! 5. **write the status**, when it changed (a pool gone meanwhile: `Gone`,
//!    fine).
//!
//! Deletions come first so that a create the provider or the API refuses
//! cannot keep drained members alive; annotations come before creates so
//! that a member waiting for an address has the quarantine before its next
//! try. Any other store error ends the turn with it; the next turn looks
//! again.
//!
//! Each change is an internal event (`egress_proxies_telemetry::events`): its log
//! line and its metrics, labelled by pool.

use jiff::Timestamp;

use super::step::{Step, invalid_spec_status, note_creates};
use crate::resource::{
    ObjectKey, ProxyPool, ProxyPoolStatus, QUARANTINED_ADDRESSES_ANNOTATION, RETIRING_ANNOTATION,
};
use crate::resource_store::{PoolStore, ProxyStore, StoreError};
use egress_proxies_telemetry::events::{PoolMemberCreated, PoolMemberDeleted, PoolMemberRetiring};

/// Carries out `decided` for the pool `key` (as observed: `pool`) at `now`:
/// the writes of a valid turn, or only the status of an invalid spec. The
/// status written (or found unchanged) is returned.
pub async fn execute(
    key: &ObjectKey,
    pool: &ProxyPool,
    decided: Result<Step, Vec<String>>,
    pools: &dyn PoolStore,
    proxies: &dyn ProxyStore,
    now: Timestamp,
) -> Result<ProxyPoolStatus, StoreError> {
    let mut decided = match decided {
        Ok(decided) => decided,
        Err(problems) => {
            tracing::error!(pool = %key, problems = %problems.join("; "), "pool spec is invalid; nothing changes");
            let status = invalid_spec_status(pool, &problems, now);
            write_status(pools, key, pool, &status).await?;
            return Ok(status);
        }
    };
    let pool_name = key.to_string();
    let pool_uid = pool.metadata.uid.clone().unwrap_or_default();
    for (member, uid) in &decided.delete {
        match pools.delete_member(member, uid).await {
            Ok(()) => PoolMemberDeleted {
                pool: &pool_name,
                member: &member.to_string(),
            }
            .emit(),
            Err(StoreError::Gone { .. }) => {
                tracing::debug!(pool = %key, proxy = %member, "pool member gone already")
            }
            Err(e) => return Err(e),
        }
    }
    for (member, uid, value, reason) in &decided.retire {
        proxies
            .set_annotation(member, uid, RETIRING_ANNOTATION, Some(value))
            .await?;
        let name = member.to_string();
        PoolMemberRetiring {
            pool: &pool_name,
            member: &name,
            reason: reason.as_str(),
        }
        .emit();
        let note = format!(
            "member {name} retiring ({}): no new leases; deleted once drained",
            reason.as_str()
        );
        pools
            .publish_pool_event(key, &pool_uid, (member, uid), "MemberRetiring", &note)
            .await;
    }
    for (member, uid, value) in &decided.annotate {
        match proxies
            .set_annotation(member, uid, QUARANTINED_ADDRESSES_ANNOTATION, Some(value))
            .await
        {
            Ok(()) | Err(StoreError::Gone { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let mut failed_create = None;
    for member in &decided.create {
        match pools.create_member(member).await {
            Ok(()) => PoolMemberCreated {
                pool: &pool_name,
                member: &ObjectKey::of(member).to_string(),
            }
            .emit(),
            Err(StoreError::AlreadyExists(taken)) => {
                tracing::debug!(pool = %key, proxy = %taken, "member name taken")
            }
            Err(e) => {
                tracing::warn!(pool = %key, error = %e, "creating a pool member failed; trying again next turn");
                failed_create = Some(e.to_string());
                break;
            }
        }
    }
    let created = !decided.create.is_empty() && failed_create.is_none();
    note_creates(
        &mut decided.status,
        failed_create.as_deref(),
        created,
        pool.metadata.generation,
        now,
    );
    write_status(pools, key, pool, &decided.status).await?;
    Ok(decided.status)
}

/// Writes `status` unless the pool already has it.
async fn write_status(
    pools: &dyn PoolStore,
    key: &ObjectKey,
    pool: &ProxyPool,
    status: &ProxyPoolStatus,
) -> Result<(), StoreError> {
    if pool.status.as_ref() == Some(status) {
        return Ok(());
    }
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    match pools.write_pool_status(key, &uid, status).await {
        Ok(()) | Err(StoreError::Gone { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
