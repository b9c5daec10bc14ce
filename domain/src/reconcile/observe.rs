//! Looking at what one reconcile needs besides the object: the provider
//! its spec names, the resolved cloud-init and the spec hash, the proxy's
//! credentials, the recorded instance (`get`), an External endpoint's
//! credentials and admission. Reads only; what goes wrong is kept as a
//! value for [`decide`](super::decide) to weigh with the rest. Reads stop
//! where the decision cannot use more: nothing after a failed cloud-init,
//! no endpoint while a managed instance is left.

use crate::credentials::{ProxyCredentials, names_realm};
use crate::provider_contract::{CloudInitBytes, Provider, ProviderId, spec_hash};
use crate::resource::{
    CredentialsSecretRef, Endpoint, Mode, ObjectKey, Proxy, ROTATE_CREDENTIALS_ANNOTATION,
};
use crate::resource_store::CloudInitError;

use super::decide::{Desired, EndpointSeen, ManagedSeen, Recorded, Seen, annotation, has_finalizer};
use super::{ProxyMemory, ReconcileContext, ReconcileError, endpoint_admission};
use crate::credentials::Salt;

/// Looks at what deciding about `proxy` needs.
pub(super) async fn observe(proxy: &Proxy, ctx: &ReconcileContext, memory: &mut ProxyMemory) -> Seen {
    let provider = proxy
        .spec
        .provider
        .as_deref()
        .and_then(|name| ctx.providers.get(name))
        .map(AsRef::as_ref);
    if proxy.metadata.deletion_timestamp.is_some() {
        // Without the finalizer nothing of the operator's is left to look at.
        return Seen::Deleting(match has_finalizer(proxy) {
            true => recorded(proxy, provider).await,
            false => Recorded::None,
        });
    }
    match proxy.spec.mode {
        Mode::Managed => Seen::Managed(managed(proxy, ctx, memory, provider).await),
        Mode::External => {
            let leftover = recorded(proxy, provider).await;
            let endpoint = match &proxy.spec.endpoint {
                Some(declared) if leftover.is_gone() => Some(endpoint(proxy, ctx, declared).await),
                _ => None,
            };
            Seen::External { leftover, endpoint }
        }
    }
}

fn provider_id(proxy: &Proxy) -> Option<ProviderId> {
    let id = proxy.status.as_ref()?.provider_id.as_deref()?;
    (!id.is_empty()).then(|| ProviderId(id.to_owned()))
}

async fn recorded(proxy: &Proxy, provider: Option<&dyn Provider>) -> Recorded {
    let Some(id) = provider_id(proxy) else {
        return Recorded::None;
    };
    match provider {
        Some(provider) => {
            let answer = provider.get(&id).await;
            Recorded::Seen(id, answer)
        }
        None => Recorded::Unreachable(id),
    }
}

async fn managed(
    proxy: &Proxy,
    ctx: &ReconcileContext,
    memory: &mut ProxyMemory,
    provider: Option<&dyn Provider>,
) -> ManagedSeen {
    let name = proxy.spec.provider.clone().unwrap_or_default();
    let Some(provider) = provider else {
        let configured = ctx.providers.names().into_iter().map(str::to_owned).collect();
        return ManagedSeen::NoProvider { name, configured };
    };
    let cloud_init = match resolve_cloud_init(proxy, ctx).await {
        Ok(c) => c,
        Err(e) => return ManagedSeen::Unresolved(e.into()),
    };
    let placement = proxy.spec.placement.clone().unwrap_or_default();
    let hash = spec_hash(
        &name,
        &placement,
        proxy.spec.port,
        cloud_init.as_ref().map(|c| c.0.as_slice()),
    )
    .rotated(annotation(proxy, ROTATE_CREDENTIALS_ANNOTATION));
    let credentials = match credentials(proxy, ctx, memory, hash.as_str()).await {
        Ok(c) => c,
        Err(e) => return ManagedSeen::Unresolved(e),
    };
    let salt = match Salt::draw(ctx.random.as_ref()) {
        Ok(s) => s,
        Err(e) => return ManagedSeen::Unresolved(e.into()),
    };
    let names_realm = provider.names_own_realm() || cloud_init.as_ref().is_some_and(|c| names_realm(&c.0));
    let realm = names_realm.then(|| credentials.realm());
    let recorded = match recorded(proxy, Some(provider)).await {
        Recorded::Seen(id, answer) => Some((id, answer)),
        Recorded::None | Recorded::Unreachable(_) => None,
    };
    ManagedSeen::Resolved {
        desired: Box::new(Desired {
            provider: name,
            cloud_init,
            hash,
            credentials,
            salt,
            realm,
        }),
        recorded,
    }
}

/// The credentials of spec generation `generation`, from memory or the store.
async fn credentials(
    proxy: &Proxy,
    ctx: &ReconcileContext,
    memory: &mut ProxyMemory,
    generation: &str,
) -> Result<ProxyCredentials, ReconcileError> {
    if let Some((kept_for, kept)) = &memory.credentials
        && kept_for == generation
    {
        return Ok(kept.clone());
    }
    let uid = proxy.metadata.uid.as_deref().unwrap_or_default();
    let credentials = ctx
        .store
        .proxy_credentials(&ObjectKey::of(proxy), uid, generation)
        .await?;
    memory.credentials = Some((generation.to_owned(), credentials.clone()));
    Ok(credentials)
}

async fn resolve_cloud_init(
    proxy: &Proxy,
    ctx: &ReconcileContext,
) -> Result<Option<CloudInitBytes>, CloudInitError> {
    let Some(ci) = &proxy.spec.cloud_init else {
        return Ok(None);
    };
    if let Some(inline) = &ci.inline {
        return Ok(Some(CloudInitBytes(inline.as_bytes().to_vec())));
    }
    let Some(secret) = &ci.secret_ref else {
        return Ok(None);
    };
    let namespace = ObjectKey::of(proxy).namespace;
    Ok(Some(CloudInitBytes(
        ctx.store.cloud_init(&namespace, secret).await?,
    )))
}

/// An External endpoint: its credentials, and whether it is admitted.
async fn endpoint(
    proxy: &Proxy,
    ctx: &ReconcileContext,
    declared: &Endpoint,
) -> Result<EndpointSeen, ReconcileError> {
    let credentials = match &declared.credentials_secret_ref {
        Some(r) => Some(external_credentials(ctx, &ObjectKey::of(proxy).namespace, r).await?),
        None => None,
    };
    let refused = match &ctx.external_endpoints {
        Some(policy) => endpoint_admission::admit(policy, ctx.names.as_ref(), &declared.host, declared.port)
            .await
            .err(),
        None => None,
    };
    Ok(EndpointSeen {
        host: declared.host.clone(),
        port: declared.port,
        credentials,
        refused,
    })
}

/// The credentials an External proxy declares by Secret reference.
async fn external_credentials(
    ctx: &ReconcileContext,
    namespace: &str,
    r: &CredentialsSecretRef,
) -> Result<ProxyCredentials, ReconcileError> {
    let read = async |key: &str| -> Result<String, ReconcileError> {
        let bytes = ctx
            .store
            .secret_key(namespace, &r.name, key)
            .await
            .map_err(ReconcileError::ExternalCredentials)?;
        String::from_utf8(bytes).map_err(|_| {
            ReconcileError::ExternalCredentials(CloudInitError::Backend {
                namespace: namespace.to_owned(),
                name: r.name.clone(),
                reason: format!("key {key:?} is not UTF-8"),
            })
        })
    };
    let (username, password) = (read(&r.username_key).await?, read(&r.password_key).await?);
    Ok(ProxyCredentials::new(
        username.trim_end_matches('\n'),
        password.trim_end_matches('\n'),
    )?)
}
