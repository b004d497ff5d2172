//! Typed, already-validated settings the decision core runs with. Parsing and validating files is
//! the config crate's job; by the time values arrive here they are known good.

use std::collections::BTreeSet;

use crate::level::Level;

/// This project's driver, whose mounts are forced read-only unless configured otherwise.
pub const SHARED_RESOURCE_DRIVER: &str = sharedresource_api::DRIVER_NAME;

/// Levels assumed when a label is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// For a CSIDriver without a profile label, or a driver with no CSIDriver object.
    pub driver_profile: Level,
    /// For a namespace without `pod-security.kubernetes.io/enforce`.
    pub enforce: Level,
    /// For a namespace without `pod-security.kubernetes.io/warn`.
    pub warn: Level,
    /// For a namespace without `pod-security.kubernetes.io/audit`.
    pub audit: Level,
}

impl Default for Defaults {
    /// The design's defaults: drivers `restricted`, namespaces `privileged`, so an unconfigured
    /// install changes nothing.
    fn default() -> Self {
        Defaults {
            driver_profile: Level::Restricted,
            enforce: Level::Privileged,
            warn: Level::Privileged,
            audit: Level::Privileged,
        }
    }
}

/// Requests that are never evaluated, in Pod Security Admission's shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exemptions {
    /// Authenticated usernames (the requesting user, not the pod's service account).
    pub usernames: BTreeSet<String>,
    /// Namespace names.
    pub namespaces: BTreeSet<String>,
    /// RuntimeClass names, matched against the pod spec's `runtimeClassName`.
    pub runtime_classes: BTreeSet<String>,
}

/// Drivers whose volumes and mounts are forced read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOnlyDrivers(pub BTreeSet<String>);

impl ReadOnlyDrivers {
    /// True when `driver` is in the list.
    pub fn contains(&self, driver: &str) -> bool {
        self.0.contains(driver)
    }
}

impl Default for ReadOnlyDrivers {
    fn default() -> Self {
        ReadOnlyDrivers([SHARED_RESOURCE_DRIVER.to_string()].into())
    }
}

/// Everything the decision core is configured with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySettings {
    /// Levels assumed for missing labels.
    pub defaults: Defaults,
    /// Requests not evaluated.
    pub exemptions: Exemptions,
    /// Deny workloads (Deployments and the like) on enforce violations, as OpenShift does, instead
    /// of warning as Pod Security Admission does.
    pub enforce_on_workloads: bool,
    /// Drivers whose mounts are forced read-only.
    pub read_only_drivers: ReadOnlyDrivers,
}
