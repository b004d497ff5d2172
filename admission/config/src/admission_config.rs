//! The CSIVolumeAdmission configuration file: the design's `defaults` block, exemptions in Pod
//! Security's shape, workload enforcement, the read-only driver list, and optionally the cluster's
//! Pod Security configuration whose defaults and exemptions then apply.
//!
//! ```yaml
//! apiVersion: admission.inlineguard.dev/v1   # optional
//! kind: CSIVolumeAdmissionConfiguration      # optional
//! defaults:
//!   csi-ephemeral-volume-profile: restricted
//!   pod-security-enforce-profile: privileged
//!   pod-security-warn-profile: privileged
//!   pod-security-audit-profile: privileged
//! exemptions: {usernames: [], namespaces: [], runtimeClasses: []}
//! enforceOnWorkloads: false
//! readOnlyDrivers: [sharedresource.csi.inlineguard.dev]
//! podSecurityConfiguration: /etc/kubernetes/pod-security.yaml   # optional
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use inline_guard_policy::level::MUST_BE_A_LEVEL;
use inline_guard_policy::{Defaults, Exemptions, Level, PolicySettings, ReadOnlyDrivers};
use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};
use crate::format::{decode, read_text};
use crate::pod_security::PodSecurityDefaults;

/// The `apiVersion` this file may declare.
pub const CONFIG_API_VERSION: &str = "admission.inlineguard.dev/v1";
/// The `kind` this file may declare.
pub const CONFIG_KIND: &str = "CSIVolumeAdmissionConfiguration";

/// The documented default configuration, shipped as `config/admission.yaml`: a no-op install.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../config/admission.yaml");

/// A loaded, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// What the decision core runs with.
    pub settings: PolicySettings,
    /// The Pod Security configuration file the namespace defaults and exemptions came from.
    pub pod_security_source: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    defaults: DefaultsBlock,
    exemptions: Option<ExemptionsBlock>,
    #[serde(default)]
    enforce_on_workloads: bool,
    read_only_drivers: Option<Vec<String>>,
    pod_security_configuration: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsBlock {
    #[serde(rename = "csi-ephemeral-volume-profile")]
    driver_profile: Option<LevelField>,
    #[serde(rename = "pod-security-enforce-profile")]
    enforce: Option<LevelField>,
    #[serde(rename = "pod-security-warn-profile")]
    warn: Option<LevelField>,
    #[serde(rename = "pod-security-audit-profile")]
    audit: Option<LevelField>,
}

/// Exemptions as Pod Security writes them; shared with the Pod Security configuration reader.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ExemptionsBlock {
    #[serde(default)]
    usernames: Vec<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    runtime_classes: Vec<String>,
}

impl From<ExemptionsBlock> for Exemptions {
    fn from(block: ExemptionsBlock) -> Exemptions {
        Exemptions {
            usernames: block.usernames.into_iter().collect(),
            namespaces: block.namespaces.into_iter().collect(),
            runtime_classes: block.runtime_classes.into_iter().collect(),
        }
    }
}

/// A level written as one of its three exact spellings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LevelField(pub Level);

impl<'de> Deserialize<'de> for LevelField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        Level::parse(&value)
            .map(LevelField)
            .ok_or_else(|| serde::de::Error::custom(format!("invalid level {value:?}: {MUST_BE_A_LEVEL}")))
    }
}

impl AdmissionConfig {
    /// The embedded default (identical to `config/admission.yaml`).
    pub fn embedded_default() -> AdmissionConfig {
        AdmissionConfig { settings: PolicySettings::default(), pod_security_source: None }
    }

    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<AdmissionConfig> {
        AdmissionConfig::parse(path, &read_text(path)?)
    }

    /// The file at `path` when one is given, else the embedded default: what every command's
    /// `--config` means.
    pub fn load_or_default(path: Option<&Path>) -> Result<AdmissionConfig> {
        path.map_or_else(|| Ok(AdmissionConfig::embedded_default()), AdmissionConfig::load)
    }

    /// Validates configuration text; `path` names it in errors and anchors a relative
    /// `podSecurityConfiguration`.
    pub fn parse(path: &Path, text: &str) -> Result<AdmissionConfig> {
        let file: ConfigFile = decode(path, text)?;
        let invalid = |field: &str, message: String| Error::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        if let Some(api_version) = &file.api_version
            && api_version != CONFIG_API_VERSION
        {
            return Err(invalid("apiVersion", format!("{api_version:?} is not supported: use {CONFIG_API_VERSION:?}")));
        }
        if let Some(kind) = &file.kind
            && kind != CONFIG_KIND
        {
            return Err(invalid("kind", format!("{kind:?} is not supported: use {CONFIG_KIND:?}")));
        }

        let built_in = Defaults::default();
        let mut defaults = Defaults {
            driver_profile: file.defaults.driver_profile.map_or(built_in.driver_profile, |l| l.0),
            enforce: file.defaults.enforce.map_or(built_in.enforce, |l| l.0),
            warn: file.defaults.warn.map_or(built_in.warn, |l| l.0),
            audit: file.defaults.audit.map_or(built_in.audit, |l| l.0),
        };
        let mut exemptions: Exemptions = file.exemptions.map(Into::into).unwrap_or_default();

        let pod_security_source = match file.pod_security_configuration {
            None => None,
            Some(pod_security_path) => {
                // Two places setting the same default is how the plugins drift apart: refuse it.
                let namespace_defaults_set =
                    file.defaults.enforce.is_some() || file.defaults.warn.is_some() || file.defaults.audit.is_some();
                if namespace_defaults_set || exemptions != Exemptions::default() {
                    return Err(invalid(
                        "podSecurityConfiguration",
                        "takes the namespace defaults and exemptions from the Pod Security configuration; remove defaults.pod-security-*-profile and exemptions from this file".into(),
                    ));
                }
                let resolved = match path.parent() {
                    Some(dir) if pod_security_path.is_relative() => dir.join(&pod_security_path),
                    _ => pod_security_path,
                };
                let pod_security = PodSecurityDefaults::load(&resolved)?;
                defaults.enforce = pod_security.enforce;
                defaults.warn = pod_security.warn;
                defaults.audit = pod_security.audit;
                exemptions = pod_security.exemptions;
                Some(resolved)
            }
        };

        let read_only_drivers = match file.read_only_drivers {
            None => ReadOnlyDrivers::default(),
            Some(drivers) => {
                if let Some(index) = drivers.iter().position(|d| d.trim().is_empty()) {
                    return Err(invalid(
                        &format!("readOnlyDrivers[{index}]"),
                        "a driver name must not be empty".into(),
                    ));
                }
                // The apiserver refuses any other `csi.driver`, so such an entry could never match;
                // refusing it also keeps the names plain inside generated CEL.
                if let Some((index, driver)) = drivers.iter().enumerate().find(|(_, d)| !is_csi_driver_name(d)) {
                    let quoted: String = format!("{driver:?}").chars().take(80).collect();
                    return Err(invalid(
                        &format!("readOnlyDrivers[{index}]"),
                        format!(
                            "{quoted} is not a CSI driver name (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)"
                        ),
                    ));
                }
                ReadOnlyDrivers(drivers.into_iter().collect::<BTreeSet<_>>())
            }
        };

        Ok(AdmissionConfig {
            settings: PolicySettings {
                defaults,
                exemptions,
                enforce_on_workloads: file.enforce_on_workloads,
                read_only_drivers,
            },
            pod_security_source,
        })
    }
}

/// Kubernetes' rule for `csi.driver` (and CSIDriver names): at most 63 characters of
/// `[A-Za-z0-9-_.]`, beginning and ending with a letter or digit.
fn is_csi_driver_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    bytes.len() <= 63
        && edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests;
