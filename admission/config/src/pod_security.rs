//! The cluster's Pod Security configuration, read so that CSIVolumeAdmission assumes the same
//! namespace defaults and exemptions as Pod Security Admission. Accepts a `PodSecurityConfiguration`
//! file, or the `AdmissionConfiguration` file given to kube-apiserver with a `PodSecurity` plugin
//! entry (inline `configuration` or a `path`).

use std::path::{Path, PathBuf};

use inline_guard_policy::namespace_policy::{VERSION_EXPECTED, is_valid_version};
use inline_guard_policy::{Exemptions, Level};
use serde::Deserialize;

use crate::admission_config::{ExemptionsBlock, LevelField};
use crate::error::{Error, Result};
use crate::format::{decode, read_text};

const POD_SECURITY_GROUP: &str = "pod-security.admission.config.k8s.io/";
const ADMISSION_CONFIG_GROUP: &str = "apiserver.config.k8s.io/";

/// The namespace defaults and exemptions Pod Security Admission runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSecurityDefaults {
    /// Enforce level for unlabeled namespaces.
    pub enforce: Level,
    /// Warn level for unlabeled namespaces.
    pub warn: Level,
    /// Audit level for unlabeled namespaces.
    pub audit: Level,
    /// Requests Pod Security does not evaluate.
    pub exemptions: Exemptions,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeHeader {
    api_version: Option<String>,
    kind: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PodSecurityConfiguration {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    #[serde(default)]
    defaults: PodSecurityDefaultsBlock,
    #[serde(default)]
    exemptions: ExemptionsBlock,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodSecurityDefaultsBlock {
    enforce: Option<LevelField>,
    #[serde(rename = "enforce-version")]
    _enforce_version: Option<VersionField>,
    warn: Option<LevelField>,
    #[serde(rename = "warn-version")]
    _warn_version: Option<VersionField>,
    audit: Option<LevelField>,
    #[serde(rename = "audit-version")]
    _audit_version: Option<VersionField>,
}

/// A Pod Security version: validated, not used (driver profiles have no versions).
struct VersionField;

impl<'de> Deserialize<'de> for VersionField {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        if is_valid_version(&value) {
            Ok(VersionField)
        } else {
            Err(serde::de::Error::custom(format!("invalid version {value:?}: {VERSION_EXPECTED}")))
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionConfiguration {
    #[serde(default)]
    plugins: Vec<PluginEntry>,
}

#[derive(Deserialize)]
struct PluginEntry {
    name: String,
    path: Option<PathBuf>,
    configuration: Option<serde_json::Value>,
}

impl PodSecurityDefaults {
    /// Reads a `PodSecurityConfiguration` or an `AdmissionConfiguration` holding one.
    pub fn load(path: &Path) -> Result<PodSecurityDefaults> {
        let text = read_text(path)?;
        let header: TypeHeader = decode(path, &text)?;
        let api_version = header.api_version.unwrap_or_default();
        match header.kind.as_deref() {
            Some("PodSecurityConfiguration") if api_version.starts_with(POD_SECURITY_GROUP) => {
                Ok(decode::<PodSecurityConfiguration>(path, &text)?.into())
            }
            Some("AdmissionConfiguration") if api_version.starts_with(ADMISSION_CONFIG_GROUP) => {
                from_admission_configuration(path, &text)
            }
            _ => Err(Error::Invalid {
                path: path.to_path_buf(),
                field: "kind".into(),
                message: format!(
                    "expected a PodSecurityConfiguration ({POD_SECURITY_GROUP}*) or an AdmissionConfiguration ({ADMISSION_CONFIG_GROUP}*), found apiVersion {api_version:?}"
                ),
            }),
        }
    }
}

fn from_admission_configuration(path: &Path, text: &str) -> Result<PodSecurityDefaults> {
    let config: AdmissionConfiguration = decode(path, text)?;
    let invalid = |field: String, message: String| Error::Invalid { path: path.to_path_buf(), field, message };
    let Some((index, entry)) = config.plugins.into_iter().enumerate().find(|(_, p)| p.name == "PodSecurity") else {
        return Err(invalid("plugins".into(), "has no PodSecurity entry".into()));
    };
    match (entry.configuration, entry.path) {
        (Some(configuration), _) => {
            let field = format!("plugins[{index}].configuration");
            let decoded: PodSecurityConfiguration = serde_path_to_error::deserialize(configuration)
                .map_err(|error| invalid(format!("{field}.{}", error.path()), error.into_inner().to_string()))?;
            Ok(decoded.into())
        }
        (None, Some(plugin_path)) => {
            let resolved = match path.parent() {
                Some(dir) if plugin_path.is_relative() => dir.join(plugin_path),
                _ => plugin_path,
            };
            let text = read_text(&resolved)?;
            Ok(decode::<PodSecurityConfiguration>(&resolved, &text)?.into())
        }
        (None, None) => {
            Err(invalid(format!("plugins[{index}]"), "PodSecurity has neither configuration nor path".into()))
        }
    }
}

impl From<PodSecurityConfiguration> for PodSecurityDefaults {
    // Pod Security's own defaults for missing fields are privileged.
    fn from(config: PodSecurityConfiguration) -> PodSecurityDefaults {
        let level = |field: Option<LevelField>| field.map_or(Level::Privileged, |l| l.0);
        PodSecurityDefaults {
            enforce: level(config.defaults.enforce),
            warn: level(config.defaults.warn),
            audit: level(config.defaults.audit),
            exemptions: config.exemptions.into(),
        }
    }
}
