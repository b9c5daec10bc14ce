//! Carrying out a [`Plan`]: its notices are told, its actions taken in
//! order through the store and the providers, and what they leave in
//! memory recorded (a delete requested, an instance created). The first
//! action that fails ends the plan with its error.

use std::time::Instant;

use tracing::Instrument;

use crate::provider::Provider;
use crate::resource::{ObjectKey, SPEC_HASH_ANNOTATION};
use crate::telemetry::events::{InstanceLost, InstanceReplaced};

use super::decide::{Action, Notice};
use super::status::StatusDraft;
use super::{Context, Memory, ReconcileError};

/// Tells one notice: an Event through the store, a log line, a metric.
pub(super) async fn tell(notice: Notice, key: &ObjectKey, uid: &str, ctx: &Context) {
    match notice {
        Notice::Event {
            reason,
            note,
            instance,
        } => {
            if let Some(id) = &instance {
                tracing::warn!(proxy = %key, providerID = %id, "{note}");
            }
            ctx.store.publish_event(key, uid, reason, &note, true).await;
        }
        Notice::Warn { instance, message } => {
            tracing::warn!(proxy = %key, providerID = %instance, "{message}");
        }
        Notice::Lost {
            provider,
            loss,
            reason,
            count,
            retry_in,
        } => InstanceLost {
            proxy: &key.to_string(),
            provider: &provider,
            loss: loss.as_str(),
            reason: &reason,
            count,
            retry_in,
        }
        .emit(),
        Notice::Replaced { provider } => InstanceReplaced {
            proxy: &key.to_string(),
            provider: &provider,
            reason: "spec_changed",
        }
        .emit(),
    }
}

/// Takes `actions` in order; what they create is written into `status`.
pub(super) async fn act(
    actions: Vec<Action>,
    key: &ObjectKey,
    uid: &str,
    ctx: &Context,
    status: &mut StatusDraft,
    memory: &mut Memory,
) -> Result<(), ReconcileError> {
    for action in actions {
        match action {
            Action::AddFinalizer => ctx.store.add_finalizer(key, uid).await?,
            Action::RemoveFinalizer => ctx.store.remove_finalizer(key, uid).await?,
            Action::SetSpecHash(hash) => {
                ctx.store
                    .set_annotation(key, uid, SPEC_HASH_ANNOTATION, Some(hash.as_str()))
                    .await?
            }
            Action::Create { provider, request } => {
                let id = configured(ctx, &provider)?.create(&request).await?;
                tracing::info!(proxy = %key, providerID = %id, provider = %provider, "instance created");
                status.created(&id);
            }
            Action::Delete { provider, id } => {
                configured(ctx, &provider)?
                    .delete(&id)
                    .instrument(tracing::info_span!("reconcile.deleteInstance", providerID = %id))
                    .await?;
                memory.delete_requested = Some((id, Instant::now()));
            }
            Action::Release { provider, id } => {
                configured(ctx, &provider)?.release(&id).await?;
                tracing::warn!(proxy = %key, providerID = %id, "skip-cleanup: instance marked released and left running");
            }
        }
    }
    Ok(())
}

fn configured<'a>(ctx: &'a Context, name: &str) -> Result<&'a dyn Provider, ReconcileError> {
    ctx.providers
        .get(name)
        .map(AsRef::as_ref)
        .ok_or_else(|| ReconcileError::NotConfigured(name.to_owned()))
}
