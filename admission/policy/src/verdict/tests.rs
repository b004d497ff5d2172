//! Table tests for the decision: every cell of the enforce, warn and audit tables, defaults,
//! invalid labels, exemptions, workloads and several volumes. Messages are compared exactly.

use std::collections::BTreeMap;

use super::*;
use crate::labels::{self, DRIVER_PROFILE};
use crate::level::Level;
use crate::pod_spec::{CsiVolumeView, PodSpecView, VolumeView};
use crate::settings::{Defaults, Exemptions};

const NS: &str = "apps";
const POD: &str = "web";

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn csi_volume<'a>(name: &'a str, driver: &'a str) -> VolumeView<'a> {
    VolumeView {
        name: name.into(),
        csi: Some(CsiVolumeView { driver: driver.into(), read_only: None, ..Default::default() }),
    }
}

fn spec(volumes: Vec<VolumeView>) -> PodSpecView {
    PodSpecView { volumes, ..Default::default() }
}

fn drivers(pairs: &[(&str, &str)]) -> BTreeMap<String, Labels> {
    pairs.iter().map(|(name, profile)| (name.to_string(), labels(&[(DRIVER_PROFILE, profile)]))).collect()
}

fn pod<'a>(spec: &'a PodSpecView) -> Subject<'a> {
    Subject { kind: SubjectKind::Pod, name: POD, namespace: NS, username: "alice", spec }
}

fn msg(driver: &str, mode: &str, level: &str) -> String {
    format!(
        "web uses an inline volume provided by CSIDriver {driver} and namespace apps has a pod security {mode} level that is lower than {level}"
    )
}

fn mode_label(mode: Mode) -> &'static str {
    match mode {
        Mode::Enforce => labels::ENFORCE_LEVEL,
        Mode::Warn => labels::WARN_LEVEL,
        Mode::Audit => labels::AUDIT_LEVEL,
    }
}

/// The design's table: a violation when the driver is more permissive than the namespace.
fn table_says_violation(namespace: Level, driver: Level) -> bool {
    matches!(
        (namespace, driver),
        (Level::Restricted, Level::Baseline)
            | (Level::Restricted, Level::Privileged)
            | (Level::Baseline, Level::Privileged)
    )
}

#[test]
fn every_cell_of_the_enforce_warn_and_audit_tables() {
    let settings = PolicySettings::default();
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    for mode in Mode::ALL {
        for namespace_level in Level::ALL {
            for driver_level in Level::ALL {
                let cell = format!("{mode} namespace={namespace_level} driver={driver_level}");
                let ns = labels(&[(mode_label(mode), namespace_level.as_str())]);
                let verdict = evaluate(
                    &settings,
                    &pod(&spec),
                    Some(&ns),
                    &drivers(&[("csi.example.com", driver_level.as_str())]),
                );
                let expected_message = msg("csi.example.com", mode.as_str(), driver_level.as_str());
                let mut expected = Verdict::default();
                if table_says_violation(namespace_level, driver_level) {
                    match mode {
                        Mode::Enforce => {
                            expected.denial = Some(expected_message.clone());
                            expected.audit_annotations.insert(audit::ENFORCE_VIOLATIONS, expected_message);
                        }
                        Mode::Warn => expected.warnings.push(expected_message),
                        Mode::Audit => {
                            expected.audit_annotations.insert(audit::AUDIT_VIOLATIONS, expected_message);
                        }
                    }
                }
                assert_eq!(verdict, expected, "{cell}");
            }
        }
    }
}

#[test]
fn an_unconfigured_install_changes_nothing() {
    let spec = spec(vec![csi_volume("v", "unlabeled.example.com")]);
    let verdict = evaluate(&PolicySettings::default(), &pod(&spec), None, &drivers(&[]));
    assert_eq!(verdict, Verdict::default());
}

#[test]
fn missing_namespace_labels_take_the_configured_defaults() {
    let settings =
        PolicySettings { defaults: Defaults { enforce: Level::Baseline, ..Defaults::default() }, ..Default::default() };
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let verdict =
        evaluate(&settings, &pod(&spec), Some(&Labels::new()), &drivers(&[("csi.example.com", "privileged")]));
    assert_eq!(verdict.denial, Some(msg("csi.example.com", "enforce", "privileged")));
}

#[test]
fn unlabeled_and_unknown_drivers_take_the_configured_driver_default() {
    let ns = labels(&[(labels::ENFORCE_LEVEL, "baseline")]);
    let spec = spec(vec![csi_volume("a", "unlabeled.example.com"), csi_volume("b", "missing.example.com")]);
    let unlabeled: BTreeMap<String, Labels> = [("unlabeled.example.com".to_string(), labels(&[("app", "x")]))].into();

    let restricted_default = PolicySettings::default();
    assert!(evaluate(&restricted_default, &pod(&spec), Some(&ns), &unlabeled).is_allowed());

    let privileged_default = PolicySettings {
        defaults: Defaults { driver_profile: Level::Privileged, ..Defaults::default() },
        ..Default::default()
    };
    let verdict = evaluate(&privileged_default, &pod(&spec), Some(&ns), &unlabeled);
    assert_eq!(
        verdict.denial,
        Some(format!(
            "{}; {}",
            msg("unlabeled.example.com", "enforce", "privileged"),
            msg("missing.example.com", "enforce", "privileged")
        ))
    );
}

#[test]
fn invalid_driver_label_is_privileged_and_every_message_says_so() {
    let ns = labels(&[
        (labels::ENFORCE_LEVEL, "baseline"),
        (labels::WARN_LEVEL, "restricted"),
        (labels::AUDIT_LEVEL, "restricted"),
    ]);
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let verdict = evaluate(&PolicySettings::default(), &pod(&spec), Some(&ns), &drivers(&[("csi.example.com", "")]));
    let suffix = " (CSIDriver csi.example.com has an invalid security.openshift.io/csi-ephemeral-volume-profile label \"\": must be one of privileged, baseline, restricted)";
    let enforce = msg("csi.example.com", "enforce", "privileged") + suffix;
    let audit = msg("csi.example.com", "audit", "privileged") + suffix;
    assert_eq!(verdict.denial.as_deref(), Some(enforce.as_str()));
    assert_eq!(verdict.audit_annotations.get(audit::ENFORCE_VIOLATIONS), Some(&enforce));
    assert_eq!(verdict.audit_annotations.get(audit::AUDIT_VIOLATIONS), Some(&audit));
    // Enforce already names the driver, so warn does not repeat it.
    assert!(verdict.warnings.is_empty());
}

#[test]
fn invalid_enforce_label_denies_as_restricted_and_records_the_error() {
    let ns = labels(&[(labels::ENFORCE_LEVEL, "privileged-ish")]);
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let verdict =
        evaluate(&PolicySettings::default(), &pod(&spec), Some(&ns), &drivers(&[("csi.example.com", "baseline")]));
    assert_eq!(verdict.denial, Some(msg("csi.example.com", "enforce", "baseline")));
    assert_eq!(
        verdict.audit_annotations.get(audit::NAMESPACE_LABEL_ERRORS).map(String::as_str),
        Some(
            r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "privileged-ish": must be one of privileged, baseline, restricted"#
        )
    );
}

#[test]
fn invalid_warn_label_fails_open_and_records_the_error() {
    let ns = labels(&[(labels::WARN_LEVEL, "restricted "), (labels::AUDIT_LEVEL, "nope")]);
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let verdict =
        evaluate(&PolicySettings::default(), &pod(&spec), Some(&ns), &drivers(&[("csi.example.com", "privileged")]));
    assert!(verdict.is_allowed());
    assert!(verdict.warnings.is_empty());
    assert_eq!(
        verdict.audit_annotations.get(audit::NAMESPACE_LABEL_ERRORS).map(String::as_str),
        Some(concat!(
            r#"metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: "restricted ": must be one of privileged, baseline, restricted; "#,
            r#"metadata.labels[pod-security.kubernetes.io/audit]: Invalid value: "nope": must be one of privileged, baseline, restricted"#
        ))
    );
}

#[test]
fn only_inline_csi_volumes_count() {
    let ns = labels(&[(labels::ENFORCE_LEVEL, "restricted")]);
    let spec: PodSpecView = serde_json::from_str(
        r#"{"volumes":[{"name":"claim","persistentVolumeClaim":{"claimName":"data"}},{"name":"generic","ephemeral":{"volumeClaimTemplate":{"spec":{}}}}]}"#,
    )
    .unwrap();
    let verdict = evaluate(&PolicySettings::default(), &pod(&spec), Some(&ns), &drivers(&[]));
    assert_eq!(verdict, Verdict::default());
}

#[test]
fn every_violating_driver_is_reported_once_in_order_of_first_use() {
    let ns = labels(&[
        (labels::ENFORCE_LEVEL, "baseline"),
        (labels::WARN_LEVEL, "restricted"),
        (labels::AUDIT_LEVEL, "restricted"),
    ]);
    let spec = spec(vec![
        csi_volume("a1", "a.example.com"),
        csi_volume("ok", "ok.example.com"),
        csi_volume("b", "b.example.com"),
        csi_volume("a2", "a.example.com"),
        csi_volume("c", "c.example.com"),
    ]);
    let drivers = drivers(&[
        ("a.example.com", "privileged"),
        ("ok.example.com", "restricted"),
        ("b.example.com", "baseline"),
        ("c.example.com", "privileged"),
    ]);
    let verdict = evaluate(&PolicySettings::default(), &pod(&spec), Some(&ns), &drivers);
    let denial =
        format!("{}; {}", msg("a.example.com", "enforce", "privileged"), msg("c.example.com", "enforce", "privileged"));
    assert_eq!(verdict.denial.as_deref(), Some(denial.as_str()));
    assert_eq!(verdict.warnings, [msg("b.example.com", "warn", "baseline")]);
    assert_eq!(
        verdict.audit_annotations.get(audit::AUDIT_VIOLATIONS),
        Some(&format!(
            "{}; {}; {}",
            msg("a.example.com", "audit", "privileged"),
            msg("b.example.com", "audit", "baseline"),
            msg("c.example.com", "audit", "privileged")
        ))
    );
}

#[test]
fn workload_enforce_violation_is_a_warning_and_an_audit_annotation() {
    let ns = labels(&[(labels::ENFORCE_LEVEL, "restricted"), (labels::WARN_LEVEL, "restricted")]);
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let subject = Subject { kind: SubjectKind::Workload, ..pod(&spec) };
    let verdict =
        evaluate(&PolicySettings::default(), &subject, Some(&ns), &drivers(&[("csi.example.com", "baseline")]));
    let enforce = msg("csi.example.com", "enforce", "baseline");
    assert!(verdict.is_allowed());
    assert_eq!(verdict.warnings, std::slice::from_ref(&enforce));
    assert_eq!(verdict.audit_annotations.get(audit::ENFORCE_VIOLATIONS), Some(&enforce));
}

#[test]
fn workload_enforce_violation_denies_when_workloads_are_enforced() {
    let ns = labels(&[(labels::ENFORCE_LEVEL, "restricted")]);
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let subject = Subject { kind: SubjectKind::Workload, ..pod(&spec) };
    let settings = PolicySettings { enforce_on_workloads: true, ..Default::default() };
    let verdict = evaluate(&settings, &subject, Some(&ns), &drivers(&[("csi.example.com", "baseline")]));
    assert_eq!(verdict.denial, Some(msg("csi.example.com", "enforce", "baseline")));
    assert!(verdict.warnings.is_empty());
}

#[test]
fn exempt_requests_are_allowed_silently_with_the_reason_audited() {
    let settings = PolicySettings {
        exemptions: Exemptions {
            usernames: ["ci-bot".into()].into(),
            namespaces: ["kube-system".into()].into(),
            runtime_classes: ["kata".into()].into(),
        },
        ..Default::default()
    };
    let ns = labels(&[
        (labels::ENFORCE_LEVEL, "restricted"),
        (labels::WARN_LEVEL, "restricted"),
        (labels::AUDIT_LEVEL, "restricted"),
    ]);
    let drivers = drivers(&[("csi.example.com", "privileged")]);
    let plain = spec(vec![csi_volume("v", "csi.example.com")]);
    let kata = PodSpecView { runtime_class_name: Some("kata".into()), ..plain.clone() };
    struct Case<'a> {
        name: &'a str,
        subject: Subject<'a>,
        reason: &'a str,
    }
    let cases = [
        Case { name: "namespace", subject: Subject { namespace: "kube-system", ..pod(&plain) }, reason: "namespace" },
        Case { name: "user", subject: Subject { username: "ci-bot", ..pod(&plain) }, reason: "user" },
        Case { name: "runtime class", subject: pod(&kata), reason: "runtimeClass" },
    ];
    for case in cases {
        let verdict = evaluate(&settings, &case.subject, Some(&ns), &drivers);
        let expected =
            Verdict { audit_annotations: [(audit::EXEMPT, case.reason.to_string())].into(), ..Default::default() };
        assert_eq!(verdict, expected, "{}", case.name);
    }
    assert!(!evaluate(&settings, &pod(&plain), Some(&ns), &drivers).is_allowed());
}

#[test]
fn fully_privileged_namespace_never_looks_at_drivers() {
    struct Panics;
    impl DriverLabelSource for Panics {
        fn driver_labels(&self, driver: &str) -> Option<&Labels> {
            panic!("looked up {driver}")
        }
    }
    let spec = spec(vec![csi_volume("v", "csi.example.com")]);
    let verdict = evaluate(&PolicySettings::default(), &pod(&spec), None, &Panics);
    assert_eq!(verdict, Verdict::default());
}
