//! The `instances.insert` request body, field by field (pure).

use serde_json::{Map, Value, json};

use crate::domain::config::GcpConfig;
use crate::domain::provider_contract::CreateRequest;

/// Label marking the operator's VMs (label keys allow no dots or slashes).
pub const MANAGED_LABEL: &str = "egress-proxies-managed";
/// Label carrying the owning Proxy's UID.
pub const UID_LABEL: &str = "egress-proxies-uid";
/// Label carrying the owning Proxy's namespace (a DNS label: always a valid label value).
pub const NAMESPACE_LABEL: &str = "egress-proxies-namespace";
/// Label carrying the installation that created the VM.
pub const INSTALLATION_LABEL: &str = "egress-proxies-installation";
/// Label a VM released with skip-cleanup carries (`"true"`) instead of [`MANAGED_LABEL`].
pub const RELEASED_LABEL: &str = "egress-proxies-released";
/// The instance metadata key cloud-init reads its user-data from.
pub const USER_DATA_KEY: &str = "user-data";

/// A placement the request cannot be built from (the Proxy is Failed: retrying cannot help).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("placement.{0} is required for gcp proxies")]
    Missing(&'static str),
    #[error(
        "cloud-init must be UTF-8 text for Compute Engine metadata (gzip/binary user-data is not supported)"
    )]
    BinaryCloudInit,
}

/// Zone, machine type and image of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement<'a> {
    pub zone: &'a str,
    pub machine_type: &'a str,
    pub image: &'a str,
}

fn field<'a>(value: &'a Option<String>, name: &'static str) -> Result<&'a str, BodyError> {
    value
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .ok_or(BodyError::Missing(name))
}

pub fn placement(req: &CreateRequest) -> Result<Placement<'_>, BodyError> {
    Ok(Placement {
        zone: field(&req.placement.zone, "zone")?,
        machine_type: field(&req.placement.machine_type, "machineType")?,
        image: field(&req.placement.image, "image")?,
    })
}

/// The instance to insert: machine type, boot disk from the image, one NIC
/// with an ephemeral external IP, the network tag, the operator's labels
/// and the cloud-init as `user-data` metadata.
pub fn instance_body(config: &GcpConfig, req: &CreateRequest) -> Result<Value, BodyError> {
    let place = placement(req)?;
    let user_data = match &req.cloud_init {
        Some(bytes) => Some(String::from_utf8(bytes.0.clone()).map_err(|_| BodyError::BinaryCloudInit)?),
        None => None,
    };
    let mut body = json!({
        "name": req.name.as_str(),
        "machineType": format!("zones/{}/machineTypes/{}", place.zone, place.machine_type),
        "disks": [{
            "boot": true,
            "autoDelete": true,
            "initializeParams": {
                "sourceImage": place.image,
                // int64 fields travel as strings in Google's JSON.
                "diskSizeGb": config.disk_size_gb.to_string(),
            },
        }],
        "networkInterfaces": [{
            "network": config.network,
            "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}],
        }],
        "labels": {
            MANAGED_LABEL: "true",
            UID_LABEL: req.uid,
            NAMESPACE_LABEL: req.namespace,
            INSTALLATION_LABEL: req.installation.as_str(),
        },
    });
    if let Some(tag) = &config.network_tag {
        body["tags"] = json!({"items": [tag]});
    }
    if let Some(user_data) = user_data {
        body["metadata"] = json!({"items": [{"key": USER_DATA_KEY, "value": user_data}]});
    }
    Ok(body)
}

/// The labels of a released VM: the current ones without [`MANAGED_LABEL`]
/// (so no installation's GC lists it) and with [`RELEASED_LABEL`]; the
/// owner's labels and any an admin added stay.
pub fn released_labels(current: &Map<String, Value>) -> Map<String, Value> {
    let mut labels = current.clone();
    labels.remove(MANAGED_LABEL);
    labels.insert(RELEASED_LABEL.to_owned(), Value::from("true"));
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::provider_contract::{CloudInitBytes, instance_name};
    use crate::domain::resource::Placement as ProxyPlacement;

    fn config() -> GcpConfig {
        serde_json::from_value(
            json!({"project": "crawl-prod", "networkTag": "egress-proxy", "diskSizeGb": 20}),
        )
        .unwrap()
    }

    fn request() -> CreateRequest {
        let uid = "0b5f2a64-8a4c-4d4e-9d1e-3f9c5b7a1234";
        CreateRequest {
            name: instance_name(uid),
            uid: uid.into(),
            namespace: "crawl".into(),
            installation: "prod-eu".parse().unwrap(),
            cloud_init: Some(CloudInitBytes(b"#cloud-config\npackages: [squid]\n".to_vec())),
            placement: ProxyPlacement {
                zone: Some("europe-west1-b".into()),
                machine_type: Some("e2-micro".into()),
                image: Some("projects/debian-cloud/global/images/family/debian-12".into()),
                region: None,
            },
            port: 3128,
            credentials: None,
            quarantined: Vec::new(),
        }
    }

    #[test]
    fn every_field_of_the_insert_body() {
        let req = request();
        let body = instance_body(&config(), &req).unwrap();
        assert_eq!(body["name"], req.name.as_str());
        assert_eq!(body["machineType"], "zones/europe-west1-b/machineTypes/e2-micro");
        let disk = &body["disks"][0];
        assert_eq!((&disk["boot"], &disk["autoDelete"]), (&json!(true), &json!(true)));
        assert_eq!(
            disk["initializeParams"],
            json!({"sourceImage": "projects/debian-cloud/global/images/family/debian-12", "diskSizeGb": "20"})
        );
        assert_eq!(body["disks"].as_array().unwrap().len(), 1);
        assert_eq!(
            body["networkInterfaces"],
            json!([{"network": "global/networks/default",
                    "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}])
        );
        assert_eq!(body["tags"], json!({"items": ["egress-proxy"]}));
        assert_eq!(
            body["labels"],
            json!({"egress-proxies-managed": "true", "egress-proxies-uid": req.uid,
                   "egress-proxies-namespace": "crawl", "egress-proxies-installation": "prod-eu"})
        );
        assert_eq!(
            body["metadata"],
            json!({"items": [{"key": "user-data", "value": "#cloud-config\npackages: [squid]\n"}]})
        );
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "disks",
                "labels",
                "machineType",
                "metadata",
                "name",
                "networkInterfaces",
                "tags"
            ],
            "nothing beyond the documented fields"
        );
    }

    #[test]
    fn optional_parts_are_left_out() {
        let mut cfg = config();
        cfg.network_tag = None;
        let mut req = request();
        req.cloud_init = None;
        let body = instance_body(&cfg, &req).unwrap();
        assert!(
            body.get("tags").is_none() && body.get("metadata").is_none(),
            "{body}"
        );
    }

    #[test]
    fn missing_placement_fields_are_named() {
        for (field, clear) in [
            (
                "zone",
                (|p: &mut ProxyPlacement| p.zone = None) as fn(&mut ProxyPlacement),
            ),
            ("machineType", |p| p.machine_type = Some(" ".into())),
            ("image", |p| p.image = None),
        ] {
            let mut req = request();
            clear(&mut req.placement);
            let err = instance_body(&config(), &req).unwrap_err();
            assert_eq!(err, BodyError::Missing(field));
            assert_eq!(
                err.to_string(),
                format!("placement.{field} is required for gcp proxies")
            );
        }
    }

    #[test]
    fn binary_cloud_init_is_refused() {
        let mut req = request();
        req.cloud_init = Some(CloudInitBytes(vec![0x1f, 0x8b, 0x08, 0x00, 0xff]));
        assert_eq!(
            instance_body(&config(), &req).unwrap_err(),
            BodyError::BinaryCloudInit
        );
    }

    #[test]
    fn released_labels_drop_managed_and_keep_the_rest() {
        let current = json!({"egress-proxies-managed": "true", "egress-proxies-uid": "u-1",
            "egress-proxies-namespace": "crawl", "egress-proxies-installation": "prod-eu", "team": "web"});
        let released = released_labels(current.as_object().unwrap());
        assert_eq!(
            Value::Object(released.clone()),
            json!({"egress-proxies-released": "true", "egress-proxies-uid": "u-1",
                "egress-proxies-namespace": "crawl", "egress-proxies-installation": "prod-eu", "team": "web"})
        );
        assert_eq!(
            released_labels(&released),
            released,
            "releasing twice changes nothing"
        );
    }
}
