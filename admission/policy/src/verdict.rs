//! The decision: one evaluation of a pod spec against its namespace's policy, fanned out into a
//! denial, warnings and audit annotations.

use std::collections::BTreeMap;

use crate::Labels;
use crate::driver_profile::{DriverLabelSource, DriverProfile};
use crate::exemption::Exemption;
use crate::labels::audit;
use crate::level::Mode;
use crate::message;
use crate::namespace_policy::NamespacePolicy;
use crate::pod_spec::PodSpecView;
use crate::settings::PolicySettings;

/// What kind of object carries the pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// A Pod: enforce violations deny it.
    Pod,
    /// A pod-template workload (Deployment, Job, ...): enforce violations are downgraded to
    /// warnings unless the settings enforce on workloads.
    Workload,
}

/// The object being evaluated, reduced to what the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Pod or workload.
    pub kind: SubjectKind,
    /// The name used in messages.
    pub name: &'a str,
    /// The namespace the object lives in.
    pub namespace: &'a str,
    /// The requesting user, for username exemptions.
    pub username: &'a str,
    /// The pod spec (a workload's template spec).
    pub spec: &'a PodSpecView,
}

/// The outcome of one evaluation. Messages are exact API strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why the request is denied; `None` when it is allowed.
    pub denial: Option<String>,
    /// One admission warning per violating driver.
    pub warnings: Vec<String>,
    /// Audit annotations by key (see [`crate::labels::audit`]).
    pub audit_annotations: BTreeMap<&'static str, String>,
}

impl Verdict {
    /// True unless an enforce violation denies the request.
    pub fn is_allowed(&self) -> bool {
        self.denial.is_none()
    }
}

const SEPARATOR: &str = "; ";

/// Evaluates every inline CSI volume of `subject` against the namespace's Pod Security labels
/// (`None`: namespace unknown, so the defaults apply) and each driver's profile label.
///
/// A driver that violates enforce is not warned about again at warn level: its denial, or for a
/// workload its downgraded warning, already names it.
pub fn evaluate<D: DriverLabelSource + ?Sized>(
    settings: &PolicySettings,
    subject: &Subject<'_>,
    namespace_labels: Option<&Labels>,
    drivers: &D,
) -> Verdict {
    let mut verdict = Verdict::default();
    let runtime_class = subject.spec.runtime_class_name.as_deref();
    if let Some(exemption) = Exemption::find(&settings.exemptions, subject.namespace, subject.username, runtime_class) {
        verdict.audit_annotations.insert(audit::EXEMPT, exemption.as_str().to_string());
        return verdict;
    }

    let no_labels = Labels::new();
    let (policy, label_errors) =
        NamespacePolicy::from_labels(namespace_labels.unwrap_or(&no_labels), &settings.defaults);
    if !label_errors.is_empty() {
        let errors: Vec<String> = label_errors.iter().map(ToString::to_string).collect();
        verdict.audit_annotations.insert(audit::NAMESPACE_LABEL_ERRORS, errors.join(SEPARATOR));
    }
    if policy.is_fully_privileged() {
        return verdict;
    }

    let enforce_denies = subject.kind == SubjectKind::Pod || settings.enforce_on_workloads;
    let mut enforce_violations = Vec::new();
    let mut audit_violations = Vec::new();
    for driver in distinct_csi_drivers(subject.spec) {
        let profile = DriverProfile::resolve(drivers.driver_labels(driver), settings.defaults.driver_profile);
        let level = profile.level();
        let violation = |mode| message::violation(subject.name, driver, subject.namespace, mode, &profile);
        let violates_enforce = level > policy.level(Mode::Enforce);
        if violates_enforce {
            let message = violation(Mode::Enforce);
            if !enforce_denies {
                verdict.warnings.push(message.clone());
            }
            enforce_violations.push(message);
        } else if level > policy.level(Mode::Warn) {
            verdict.warnings.push(violation(Mode::Warn));
        }
        if level > policy.level(Mode::Audit) {
            audit_violations.push(violation(Mode::Audit));
        }
    }

    if !enforce_violations.is_empty() {
        let joined = joined(enforce_violations);
        if enforce_denies {
            verdict.denial = Some(joined.clone());
        }
        verdict.audit_annotations.insert(audit::ENFORCE_VIOLATIONS, joined);
    }
    if !audit_violations.is_empty() {
        verdict.audit_annotations.insert(audit::AUDIT_VIOLATIONS, joined(audit_violations));
    }
    verdict
}

/// The messages separated by `; `; a single message (the common case) is moved, not copied.
fn joined(mut messages: Vec<String>) -> String {
    if messages.len() == 1 {
        return messages.swap_remove(0);
    }
    messages.join(SEPARATOR)
}

/// The drivers of the spec's inline CSI volumes, each once, in order of first use. Only
/// `volumes[].csi` counts: PVCs and generic `ephemeral` volumes are governed elsewhere.
pub fn distinct_csi_drivers(spec: &PodSpecView) -> Vec<&str> {
    let mut drivers: Vec<&str> = Vec::new();
    for volume in &spec.volumes {
        if let Some(csi) = &volume.csi
            && !drivers.contains(&csi.driver.as_str())
        {
            drivers.push(&csi.driver);
        }
    }
    drivers
}

#[cfg(test)]
mod tests;
