//! CSIVolumeAdmission, the validating plugin: looks up the facts a pod spec needs and hands them
//! to the pure decision in `inline-guard-policy`.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::verdict::distinct_csi_drivers;
use inline_guard_policy::{PolicySettings, Subject, SubjectKind, evaluate};

use crate::attributes::{Attributes, Operation};
use crate::error::{AdmissionError, Result};
use crate::facts::{ClusterFacts, FactsError};
use crate::object::PodSpecKind;
use crate::plugin::{Handler, ValidationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/CSIVolumeAdmission";

/// Applies the enforce / warn / audit matrix to the inline CSI volumes of pods and workloads.
pub struct CsiVolumeAdmission {
    settings: Arc<PolicySettings>,
    facts: Arc<dyn ClusterFacts>,
}

impl CsiVolumeAdmission {
    /// A plugin deciding with `settings` on facts from `facts`.
    pub fn new(settings: Arc<PolicySettings>, facts: Arc<dyn ClusterFacts>) -> CsiVolumeAdmission {
        CsiVolumeAdmission { settings, facts }
    }
}

impl Handler for CsiVolumeAdmission {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }
}

fn unavailable(error: FactsError) -> AdmissionError {
    AdmissionError::Internal(error.to_string())
}

#[async_trait]
impl ValidationInterface for CsiVolumeAdmission {
    async fn validate(&self, attributes: &Attributes, recorder: &mut Recorder) -> Result<()> {
        let Some(kind) = PodSpecKind::of(&attributes.resource) else {
            return Ok(());
        };
        // Pod volumes are immutable after creation, and subresources (status, binding,
        // ephemeralcontainers) cannot add volumes.
        if !attributes.subresource.is_empty() {
            return Ok(());
        }
        let is_workload_update = kind.is_workload() && attributes.operation == Operation::Update;
        if attributes.operation != Operation::Create && !is_workload_update {
            return Ok(());
        }
        let Some(object) = &attributes.object else {
            return Err(AdmissionError::BadRequest(format!("{} request carries no object", attributes.resource.resource)));
        };
        let Some(spec) = object.pod_spec() else {
            return Ok(());
        };
        if is_workload_update {
            let old_volumes = attributes.old_object.as_ref().and_then(|old| old.pod_spec()).map(|old| &old.volumes);
            if old_volumes == Some(&spec.volumes) {
                return Ok(());
            }
        }
        let drivers = distinct_csi_drivers(spec);
        if drivers.is_empty() {
            return Ok(());
        }

        let namespace_labels = self.facts.namespace_labels(&attributes.namespace).await.map_err(unavailable)?;
        let mut driver_labels = Vec::with_capacity(drivers.len());
        for driver in drivers {
            driver_labels.push((driver.to_string(), self.facts.csi_driver_labels(driver).await.map_err(unavailable)?));
        }

        let subject = Subject {
            kind: if kind.is_workload() { SubjectKind::Workload } else { SubjectKind::Pod },
            name: attributes.display_name(),
            namespace: &attributes.namespace,
            username: &attributes.user_info.username,
            spec,
        };
        let verdict = evaluate(&self.settings, &subject, namespace_labels.as_deref(), &driver_labels);
        for warning in verdict.warnings {
            recorder.warn(warning);
        }
        for (key, value) in verdict.audit_annotations {
            recorder.annotate(key, value);
        }
        match verdict.denial {
            Some(denial) => Err(AdmissionError::Forbidden(denial)),
            None => Ok(()),
        }
    }
}
