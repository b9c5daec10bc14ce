//! Where a Kubernetes installation keeps its id: the ConfigMap
//! `egress-proxies-installation` in the operator's namespace, created by
//! the first replica that finds none. Two replicas racing to create it
//! both end up with the one that landed (the loser reads it back).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::domain::installation::{InstallationId, InvalidInstallationId};

/// Name of the ConfigMap holding the id.
pub const CONFIG_MAP: &str = "egress-proxies-installation";
/// Its data key.
const KEY: &str = "id";

/// The installation id could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum InstallationRecordError {
    #[error("reading or creating ConfigMap {CONFIG_MAP}: {0}")]
    Api(#[from] kube::Error),
    #[error("ConfigMap {CONFIG_MAP} has no data key {KEY:?}")]
    Missing,
    #[error("ConfigMap {CONFIG_MAP}: {0}")]
    Invalid(#[from] InvalidInstallationId),
}

/// The installation id kept in `namespace`, created when there is none.
pub async fn from_cluster(
    client: kube::Client,
    namespace: &str,
) -> Result<InstallationId, InstallationRecordError> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    if let Some(existing) = api.get_opt(CONFIG_MAP).await? {
        return read(&existing);
    }
    let id = InstallationId::generate();
    let record = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "egress-proxies-operator".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(KEY.to_owned(), id.to_string())])),
        ..ConfigMap::default()
    };
    match api.create(&PostParams::default(), &record).await {
        Ok(_) => Ok(id),
        // Another replica created it first: its id is the installation's.
        Err(kube::Error::Api(s)) if s.code == 409 => read(&api.get(CONFIG_MAP).await?),
        Err(e) => Err(e.into()),
    }
}

fn read(record: &ConfigMap) -> Result<InstallationId, InstallationRecordError> {
    let text = record
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .ok_or(InstallationRecordError::Missing)?;
    Ok(InstallationId::parse(text.trim())?)
}
