//! The providers configuration (`--providers-config`): named provider
//! instances, each of one type, validated all at once with every problem
//! reported against its field path.
//!
//! ```yaml
//! providers:
//!   - name: kvm-home          # what Proxy.spec.provider names
//!     type: kvm               # kubernetes | gcp | kvm | local
//!     kvm: { ... }            # the block named after the type
//! ```

mod bind_address;
mod gateway;
mod gcp;
mod kubernetes;
mod kvm;
mod local;
mod outgoing_addresses;
mod problems;
mod standalone;
mod unauthenticated_limits;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use bind_address::{BindAddress, BindAddressError};
pub use gateway::{BODY_SCAN_LIMIT, BlockRule, GatewaySettings, GatewaySettingsError, SiteLearningSettings};
pub use gcp::GcpConfig;
pub use kubernetes::{DEFAULT_SQUID_IMAGE, KubernetesConfig};
pub use kvm::{
    DEFAULT_LIBVIRT_SOCKET, DEFAULT_MAX_IMAGE_SIZE_GB, DomainType, Firmware, ImageFormat, KvmConfig, KvmHost,
    KvmImage, MachineType, is_sha256_hex,
};
pub use local::{DEFAULT_RUN_DIRECTORY, DEFAULT_SQUID_USER, LocalConfig, LocalImplementation};
pub use outgoing_addresses::{OutgoingAddressError, OutgoingNetwork};
pub use problems::{IDENTIFIER_RULE, Problem, is_identifier};
pub use standalone::{StandaloneConfig, StandaloneConfigError};
pub use unauthenticated_limits::UnauthenticatedLimits;

use problems::Problems;

/// A validated providers configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProvidersConfig {
    pub providers: Vec<ProviderInstance>,
}

/// One named provider instance.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderInstance {
    /// Unique name that `Proxy.spec.provider` refers to.
    pub name: String,
    pub settings: ProviderSettings,
}

/// The type of a provider instance with its settings.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderSettings {
    Kubernetes(KubernetesConfig),
    Gcp(GcpConfig),
    Kvm(KvmConfig),
    Local(LocalConfig),
}

impl ProviderSettings {
    /// The `type:` value.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderSettings::Kubernetes(_) => "kubernetes",
            ProviderSettings::Gcp(_) => "gcp",
            ProviderSettings::Kvm(_) => "kvm",
            ProviderSettings::Local(_) => "local",
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML for a providers config: {message}")]
    Syntax { path: String, message: String },
    #[error("{path}: {} problem(s):\n{}", problems.len(), render(problems))]
    Invalid { path: String, problems: Vec<Problem> },
}

fn render(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigError {
    /// Every problem found (one for unreadable or unparseable files).
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid { problems, .. } => problems.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

/// The file as written: provider entries stay untyped so that one broken
/// entry does not hide the problems of the others.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    providers: Vec<Value>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawInstance {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kubernetes: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gcp: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kvm: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    local: Option<Value>,
}

const KINDS: [&str; 4] = ["kubernetes", "gcp", "kvm", "local"];

impl ProvidersConfig {
    /// Parses and validates YAML; `origin` names the source in messages.
    pub fn parse(yaml: &str, origin: &str) -> Result<Self, ConfigError> {
        let raw: RawFile = if yaml.trim().is_empty() {
            RawFile {
                providers: Vec::new(),
            }
        } else {
            serde_saphyr::from_str(yaml).map_err(|e| ConfigError::Syntax {
                path: origin.to_owned(),
                message: e.to_string(),
            })?
        };

        let mut problems = Vec::new();
        let mut providers = Vec::new();
        let mut first_index: HashMap<String, usize> = HashMap::new();
        for (i, entry) in raw.providers.into_iter().enumerate() {
            let label = entry
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned();
            let mut p = Problems::under(format!("providers[{i}] ({label})"));
            if let Some(instance) = parse_instance(entry, &mut p) {
                if let Some(j) = first_index.get(&instance.name) {
                    p.report(
                        "name",
                        format!(
                            "{:?} is already used by providers[{j}]: instance names must be unique",
                            instance.name
                        ),
                    );
                } else {
                    first_index.insert(instance.name.clone(), i);
                }
                providers.push(instance);
            }
            problems.extend(p.into_vec());
        }

        if problems.is_empty() {
            Ok(Self { providers })
        } else {
            Err(ConfigError::Invalid {
                path: origin.to_owned(),
                problems,
            })
        }
    }

    /// The instance `Proxy.spec.provider` names.
    pub fn get(&self, name: &str) -> Option<&ProviderInstance> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// The configuration as YAML in the same shape it is read from.
    pub fn to_yaml(&self) -> Result<String, serde_saphyr::ser::Error> {
        #[derive(Serialize)]
        struct Out {
            providers: Vec<RawInstance>,
        }
        let providers = self.providers.iter().map(ProviderInstance::to_raw).collect();
        serde_saphyr::to_string(&Out { providers })
    }
}

fn parse_instance(entry: Value, p: &mut Problems) -> Option<ProviderInstance> {
    let raw: RawInstance = match serde_path_to_error::deserialize(entry) {
        Ok(raw) => raw,
        Err(e) => {
            p.report(field_path("", e.path()), e.into_inner().to_string());
            return None;
        }
    };
    if !is_identifier(&raw.name) {
        p.report(
            "name",
            format!(
                "{:?} {IDENTIFIER_RULE}: it names the provider in Proxy specs, metrics and logs",
                raw.name
            ),
        );
    }
    for (kind, block) in [
        ("kubernetes", &raw.kubernetes),
        ("gcp", &raw.gcp),
        ("kvm", &raw.kvm),
        ("local", &raw.local),
    ] {
        if block.is_some() && kind != raw.kind {
            p.report(
                kind,
                format!("block does not match type {:?}; remove it", raw.kind),
            );
        }
    }
    for (kind, block) in [("gcp", &raw.gcp), ("kvm", &raw.kvm)] {
        if block.as_ref().is_some_and(|b| b.get("destinations").is_some()) {
            p.report(
                format!("{kind}.destinations"),
                format!(
                    "is not applied by type {kind}: its VMs' Squid is configured by the cloud-init you supply; \
                     edit the destination rules there (see docs/security.md) and remove this field"
                ),
            );
            return None;
        }
    }
    let settings = match raw.kind.as_str() {
        "kubernetes" => ProviderSettings::Kubernetes(typed_block("kubernetes", raw.kubernetes, true, p)?),
        "gcp" => ProviderSettings::Gcp(typed_block("gcp", raw.gcp, false, p)?),
        "kvm" => ProviderSettings::Kvm(typed_block("kvm", raw.kvm, false, p)?),
        "local" => ProviderSettings::Local(typed_block("local", raw.local, true, p)?),
        other => {
            p.report(
                "type",
                format!("{other:?} is not a provider type (one of {})", KINDS.join(", ")),
            );
            return None;
        }
    };
    match &settings {
        ProviderSettings::Kubernetes(c) => c.validate(p),
        ProviderSettings::Gcp(c) => c.validate(p),
        ProviderSettings::Kvm(c) => c.validate(p),
        ProviderSettings::Local(c) => c.validate(p),
    }
    Some(ProviderInstance {
        name: raw.name,
        settings,
    })
}

/// Deserializes the type's block; a missing block is an empty one when every
/// field has a default (`optional`), and a problem otherwise.
fn typed_block<T: serde::de::DeserializeOwned>(
    kind: &str,
    block: Option<Value>,
    optional: bool,
    p: &mut Problems,
) -> Option<T> {
    let block = match block {
        Some(Value::Null) | None if optional => Value::Object(Default::default()),
        Some(mut b) => {
            drop_nulls(&mut b);
            b
        }
        None => {
            p.report(kind, format!("block is required for type {kind}"));
            return None;
        }
    };
    match serde_path_to_error::deserialize(block) {
        Ok(v) => Some(v),
        Err(e) => {
            p.report(field_path(kind, e.path()), e.into_inner().to_string());
            None
        }
    }
}

/// A key written with no value (`machineTypes:`) means "not set": drop it so
/// the field's default applies, as YAML users expect.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// `kvm` + `.hosts[0].address` → `kvm.hosts[0].address`.
fn field_path(kind: &str, path: &serde_path_to_error::Path) -> String {
    let inner = path.to_string();
    match (kind.is_empty(), inner.as_str()) {
        (_, ".") => kind.to_owned(),
        (true, _) => inner,
        (false, _) => format!("{kind}.{inner}"),
    }
}

impl ProviderInstance {
    fn to_raw(&self) -> RawInstance {
        let mut raw = RawInstance {
            name: self.name.clone(),
            kind: self.settings.kind().to_owned(),
            kubernetes: None,
            gcp: None,
            kvm: None,
            local: None,
        };
        // Serializing plain data structs into a JSON value cannot fail.
        let to_value = |v: Result<Value, serde_json::Error>| v.ok();
        match &self.settings {
            ProviderSettings::Kubernetes(c) => raw.kubernetes = to_value(serde_json::to_value(c)),
            ProviderSettings::Gcp(c) => raw.gcp = to_value(serde_json::to_value(c)),
            ProviderSettings::Kvm(c) => raw.kvm = to_value(serde_json::to_value(c)),
            ProviderSettings::Local(c) => raw.local = to_value(serde_json::to_value(c)),
        }
        raw
    }
}
