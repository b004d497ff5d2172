//! Read-only forcing, the mutating plugin: makes the volumes of listed drivers, and their mounts,
//! read-only on pod creation and on new ephemeral containers.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::{MountScope, PatchOperation, PolicySettings, force_read_only};

use crate::attributes::{Attributes, Operation};
use crate::error::Result;
use crate::object::{AdmissionObject, PodSpecKind};
use crate::plugin::{Handler, MutationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/ReadOnlyForcing";

/// The subresource through which ephemeral containers are added to a running pod.
const EPHEMERAL_CONTAINERS: &str = "ephemeralcontainers";

/// Forces `readOnly: true` for the drivers in the settings' read-only list. Exemptions do not
/// apply: the driver refuses writable publishes anyway, so skipping the patch would only make
/// the pod fail later, on the node.
pub struct ReadOnlyForcing {
    settings: Arc<PolicySettings>,
}

impl ReadOnlyForcing {
    /// A plugin forcing the drivers listed in `settings`.
    pub fn new(settings: Arc<PolicySettings>) -> ReadOnlyForcing {
        ReadOnlyForcing { settings }
    }
}

impl Handler for ReadOnlyForcing {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }
}

#[async_trait]
impl MutationInterface for ReadOnlyForcing {
    async fn admit(&self, attributes: &mut Attributes<'_>, _recorder: &mut Recorder) -> Result<Vec<PatchOperation>> {
        if PodSpecKind::of(&attributes.resource) != Some(PodSpecKind::Pod) {
            return Ok(Vec::new());
        }
        let existing: Vec<&str> = match (attributes.operation, &*attributes.subresource) {
            (Operation::Create, "") => Vec::new(),
            (Operation::Update, EPHEMERAL_CONTAINERS) => attributes
                .old_object
                .as_ref()
                .and_then(AdmissionObject::pod_spec)
                .map(|spec| spec.ephemeral_containers.iter().map(|c| &*c.name).collect())
                .unwrap_or_default(),
            _ => return Ok(Vec::new()),
        };
        let scope = if attributes.subresource.is_empty() {
            MountScope::WholePod
        } else {
            MountScope::NewEphemeralContainers { existing: &existing }
        };
        let Some(spec) = attributes.object.as_mut().and_then(AdmissionObject::pod_spec_mut) else {
            return Ok(Vec::new());
        };
        Ok(force_read_only(spec, &self.settings.read_only_drivers, scope))
    }
}
