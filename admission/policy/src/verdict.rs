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
    pub spec: &'a PodSpecView<'a>,
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
    let mut enforce_violations: Option<String> = None;
    let mut audit_violations: Option<String> = None;
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
            append(&mut enforce_violations, message);
        } else if level > policy.level(Mode::Warn) {
            verdict.warnings.push(violation(Mode::Warn));
        }
        if level > policy.level(Mode::Audit) {
            append(&mut audit_violations, violation(Mode::Audit));
        }
    }

    if let Some(joined) = enforce_violations {
        if enforce_denies {
            verdict.denial = Some(joined.clone());
        }
        verdict.audit_annotations.insert(audit::ENFORCE_VIOLATIONS, joined);
    }
    if let Some(joined) = audit_violations {
        verdict.audit_annotations.insert(audit::AUDIT_VIOLATIONS, joined);
    }
    verdict
}

/// Adds `message` to the messages joined so far, separated by `; `. The first is kept as it is,
/// so the common case of one violation neither copies it nor allocates a list.
fn append(joined: &mut Option<String>, message: String) {
    match joined {
        None => *joined = Some(message),
        Some(joined) => {
            joined.push_str(SEPARATOR);
            joined.push_str(&message);
        }
    }
}

/// The drivers of the spec's inline CSI volumes, each once, in order of first use. Only
/// `volumes[].csi` counts: PVCs and generic `ephemeral` volumes are governed elsewhere.
pub fn distinct_csi_drivers<'s>(spec: &'s PodSpecView<'_>) -> Vec<&'s str> {
    let mut drivers: Vec<&str> = Vec::new();
    for volume in &spec.volumes {
        if let Some(csi) = &volume.csi
            && !drivers.contains(&&*csi.driver)
        {
            drivers.push(&csi.driver);
        }
    }
    drivers
}

#[cfg(test)]
mod tests;
