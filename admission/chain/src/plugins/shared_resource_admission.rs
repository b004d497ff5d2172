//! SharedResourceAdmission, a validating plugin: what the shared-resource driver would refuse at
//! mount is refused at creation, in the driver's words. A pod whose volumes of the driver have
//! attributes the driver refuses is denied (a workload is warned: its pods are judged when
//! they are made, so a template fixed later is not lost); a `SharedProjection` that the driver's
//! `check_spec` refuses is denied on create and update.

use async_trait::async_trait;
use inline_guard_policy::{refused_volumes_message, shared_volumes};
use sharedresource_api::projection::check_spec;

use crate::attributes::{Attributes, Operation};
use crate::error::{AdmissionError, Result};
use crate::object::{PodSpecKind, is_shared_projection};
use crate::plugin::{Handler, ValidationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/SharedResourceAdmission";

/// Checks pods, workloads and SharedProjections against the driver's own rules.
#[derive(Debug, Default)]
pub struct SharedResourceAdmission;

impl SharedResourceAdmission {
    /// The plugin.
    pub fn new() -> SharedResourceAdmission {
        SharedResourceAdmission
    }
}

impl Handler for SharedResourceAdmission {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }
}

#[async_trait]
impl ValidationInterface for SharedResourceAdmission {
    async fn validate(&self, attributes: &Attributes<'_>, recorder: &mut Recorder) -> Result<()> {
        // Subresources (status, binding, ephemeralcontainers) add no volume and change no spec.
        if !attributes.subresource.is_empty() {
            return Ok(());
        }
        if is_shared_projection(&attributes.resource) {
            return check_projection(attributes);
        }
        let Some(kind) = PodSpecKind::of(&attributes.resource) else {
            return Ok(());
        };
        // Pod volumes are immutable after creation; a workload's template may change.
        let is_workload_update = kind.is_workload() && attributes.operation == Operation::Update;
        if attributes.operation != Operation::Create && !is_workload_update {
            return Ok(());
        }
        let Some(spec) = attributes.object.as_ref().and_then(|object| object.pod_spec()) else {
            return Ok(());
        };
        let volumes = shared_volumes(spec);
        let Some(message) = refused_volumes_message(attributes.display_name(), &volumes) else {
            return Ok(());
        };
        if kind.is_workload() {
            recorder.warn(message);
            return Ok(());
        }
        Err(AdmissionError::Invalid(message))
    }
}

/// A SharedProjection's spec by the driver's `check_spec`, its message as the driver gives it.
fn check_projection(attributes: &Attributes<'_>) -> Result<()> {
    let Some(object) = &attributes.object else {
        return Err(AdmissionError::BadRequest("sharedprojections request carries no object".into()));
    };
    let Some(spec) = &object.projection else {
        return Err(AdmissionError::Invalid("the SharedProjection has no spec".into()));
    };
    check_spec(spec).map_err(|invalid| AdmissionError::Invalid(invalid.0))
}

#[cfg(test)]
mod tests;
