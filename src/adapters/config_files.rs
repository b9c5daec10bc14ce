//! Reading the operator's configuration files. The domain parses and
//! validates their text (`domain::config`); this is where the files are
//! opened and relative paths are anchored.

use std::path::Path;

use crate::domain::config::{
    ConfigError, GatewaySettings, GatewaySettingsError, ProvidersConfig, StandaloneConfig,
    StandaloneConfigError,
};

/// The providers configuration (`--providers-config`).
pub fn providers_config(path: &Path) -> Result<ProvidersConfig, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    ProvidersConfig::parse(&text, &shown)
}

/// The gateway's settings file (`--gateway-config`).
pub fn gateway_settings(path: &Path) -> Result<GatewaySettings, GatewaySettingsError> {
    let text = std::fs::read_to_string(path).map_err(|source| GatewaySettingsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    GatewaySettings::from_file_text(&text, path)
}

/// The standalone configuration (`--config`), its relative paths taken
/// from its own directory.
pub fn standalone_config(path: &Path) -> Result<StandaloneConfig, StandaloneConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| StandaloneConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    // `standalone.yaml` has the empty path as its parent: the current directory.
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = std::path::absolute(parent).map_err(|e| StandaloneConfigError::Invalid {
        path: shown,
        message: e.to_string(),
    })?;
    StandaloneConfig::parse(&text, path, &base)
}
