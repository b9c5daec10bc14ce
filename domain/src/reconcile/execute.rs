//! Carrying out a [`Plan`]: its notices are told, its actions taken in
//! order through the store and the providers, and what they leave in
//! memory recorded (a delete requested, an instance created, a first
//! status held). The first action that fails ends the plan with its error.

use tracing::Instrument;

use crate::provider_contract::Provider;
use crate::resource::{ObjectKey, SPEC_HASH_ANNOTATION};
use egress_proxies_telemetry::events::{InstanceLost, InstanceReplaced};

use super::decide::{Action, Notice, Plan};
use super::status::StatusDraft;
use super::{Next, ProxyMemory, ReconcileContext, ReconcileError};
use crate::health::ProbeTarget;
use crate::now::Now;

/// What carrying a plan out left.
pub(super) struct Executed {
    /// The status to write (the error still to be told in it, if any).
    pub status: StatusDraft,
    pub result: Result<Next, ReconcileError>,
    /// What the health engine should probe, when every action succeeded.
    pub serving: Option<ProbeTarget>,
}

/// Carries `plan` out for the Proxy `key` (UID `uid`).
pub(super) async fn execute(
    plan: Plan,
    key: &ObjectKey,
    uid: &str,
    ctx: &ReconcileContext,
    memory: &mut ProxyMemory,
    now: Now,
) -> Executed {
    let Plan {
        mut status,
        notices,
        actions,
        outcome,
        serve,
        recorded,
        held_since,
        forget,
    } = plan;
    for notice in notices {
        tell(notice, key, uid, ctx).await;
    }
    if forget {
        memory.delete_requested = None;
        memory.health = None;
    }
    let result = match act(actions, key, uid, ctx, &mut status, memory, now).await {
        Ok(()) => outcome,
        Err(e) => Err(e),
    };
    memory.held = None;
    if result.is_ok() {
        memory.recorded = recorded;
        memory.held = held_since.map(|since| (uid.to_owned(), since));
    }
    let serving = serve.filter(|_| result.is_ok());
    Executed {
        status,
        result,
        serving,
    }
}

/// Tells one notice: an Event through the store, a log line, a metric.
pub(super) async fn tell(notice: Notice, key: &ObjectKey, uid: &str, ctx: &ReconcileContext) {
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
async fn act(
    actions: Vec<Action>,
    key: &ObjectKey,
    uid: &str,
    ctx: &ReconcileContext,
    status: &mut StatusDraft,
    memory: &mut ProxyMemory,
    now: Now,
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
                memory.delete_requested = Some((id, now.mono));
            }
            Action::Release { provider, id } => {
                configured(ctx, &provider)?.release(&id).await?;
                tracing::warn!(proxy = %key, providerID = %id, "skip-cleanup: instance marked released and left running");
            }
        }
    }
    Ok(())
}

fn configured<'a>(ctx: &'a ReconcileContext, name: &str) -> Result<&'a dyn Provider, ReconcileError> {
    ctx.providers
        .get(name)
        .map(AsRef::as_ref)
        .ok_or_else(|| ReconcileError::NotConfigured(name.to_owned()))
}
