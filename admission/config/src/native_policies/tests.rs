//! The generated policies' layout. What they decide is proven against the webhook on the real
//! apiserver (the e2e scenario `admission::native_policies_decide_as_the_webhook`).

use inline_guard_policy::level::Level;

use super::*;
use crate::shipped_files::{assert_shipped, shipped_config};

#[test]
fn the_shipped_policies_are_generated_from_the_shipped_configuration() {
    let settings = shipped_config().settings;
    let shipped =
        assert_shipped("config/native/policies.yaml", &native_policies_yaml(&settings).unwrap(), "UPDATE_POLICIES");
    assert_eq!(shipped, native_policies(&settings), "YAML and JSON forms agree");
}

fn actions(settings: &PolicySettings) -> Vec<(String, String)> {
    native_policies(settings)
        .iter()
        .filter(|object| object["kind"] == "ValidatingAdmissionPolicyBinding")
        .map(|binding| {
            (
                binding["metadata"]["name"].as_str().unwrap().to_string(),
                binding["spec"]["validationActions"][0].to_string(),
            )
        })
        .collect()
}

#[test]
fn pods_are_denied_workloads_warned_and_the_warn_mode_always_warns() {
    let expected = [
        ("pods.csi-volume-admission.inlineguard.dev", "\"Deny\""),
        ("pods-warn.csi-volume-admission.inlineguard.dev", "\"Warn\""),
        ("workloads.csi-volume-admission.inlineguard.dev", "\"Warn\""),
        ("workloads-warn.csi-volume-admission.inlineguard.dev", "\"Warn\""),
        ("cronjobs.csi-volume-admission.inlineguard.dev", "\"Warn\""),
        ("cronjobs-warn.csi-volume-admission.inlineguard.dev", "\"Warn\""),
        ("podtemplates.csi-volume-admission.inlineguard.dev", "\"Warn\""),
        ("podtemplates-warn.csi-volume-admission.inlineguard.dev", "\"Warn\""),
    ]
    .map(|(name, action)| (name.to_string(), action.to_string()));
    assert_eq!(actions(&PolicySettings::default()), expected);
    let enforcing = PolicySettings { enforce_on_workloads: true, ..PolicySettings::default() };
    let denied: Vec<String> =
        actions(&enforcing).into_iter().filter(|(_, action)| action == "\"Deny\"").map(|(name, _)| name).collect();
    assert_eq!(
        denied,
        [
            "pods.csi-volume-admission.inlineguard.dev",
            "workloads.csi-volume-admission.inlineguard.dev",
            "cronjobs.csi-volume-admission.inlineguard.dev",
            "podtemplates.csi-volume-admission.inlineguard.dev",
        ]
    );
}

#[test]
fn defaults_and_exemptions_are_written_into_the_expressions_as_quoted_literals() {
    let mut settings = PolicySettings::default();
    settings.defaults.enforce = Level::Baseline;
    settings.defaults.driver_profile = Level::Privileged;
    settings.exemptions.namespaces.insert("kube-system".into());
    settings.exemptions.usernames.insert("ci\"bot".into());
    let policy = &native_policies(&settings)[0];
    let enforce = policy["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(
        enforce.contains(&format!("({})", expressions::namespace_level(&settings, Mode::Enforce))),
        "the enforce check reads the namespace's enforce level: {enforce}"
    );
    // The rank of a label that is not set, in each lookup's map.
    assert!(
        expressions::namespace_level(&settings, Mode::Enforce).contains("' ': 1}"),
        "an unlabeled namespace enforces baseline (1)"
    );
    assert!(expressions::driver_level(&settings).contains("' ': 2}"), "an unlabeled driver is privileged (2)");
    let exempt = &policy["spec"]["auditAnnotations"][0];
    assert_eq!(exempt["key"], "exempt");
    let exemption = exempt["valueExpression"].as_str().unwrap();
    assert!(exemption.contains(r#"in ["kube-system"]"#), "{exemption}");
    assert!(exemption.contains(r#"in ["ci\"bot"]"#), "{exemption}");
    assert_eq!(policy["spec"]["paramKind"], json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver"}));
}

#[test]
fn only_warn_bindings_leave_out_namespaces_and_only_those_that_can_never_be_warned() {
    let selectors = |settings: &PolicySettings| -> Vec<(String, Value)> {
        native_policies(settings)
            .iter()
            .filter(|object| object["kind"] == "ValidatingAdmissionPolicyBinding")
            .map(|binding| {
                (
                    binding["metadata"]["name"].as_str().unwrap().to_string(),
                    binding["spec"]["matchResources"]["namespaceSelector"].clone(),
                )
            })
            .collect()
    };
    let requirement = |operator: &str, values: &[&str]| json!({"matchExpressions": [{"key": "pod-security.kubernetes.io/warn", "operator": operator, "values": values}]});
    // Unlabelled namespaces warn at the default `privileged`: only a restricted or baseline
    // label can warn (an invalid one falls open to privileged).
    for (name, selector) in selectors(&PolicySettings::default()) {
        let expected =
            if name.contains("-warn.") { requirement("In", &["restricted", "baseline"]) } else { Value::Null };
        assert_eq!(selector, expected, "{name}");
    }
    // With a lower default, unlabelled namespaces can warn too: only `privileged` is left out.
    let mut settings = PolicySettings::default();
    settings.defaults.warn = Level::Baseline;
    for (name, selector) in selectors(&settings) {
        let expected = if name.contains("-warn.") { requirement("NotIn", &["privileged"]) } else { Value::Null };
        assert_eq!(selector, expected, "{name}");
    }
}

#[test]
fn only_csidrivers_that_can_violate_something_are_parameters() {
    let selector = |settings: &PolicySettings| {
        let objects = native_policies(settings);
        let bindings: Vec<&Value> =
            objects.iter().filter(|object| object["kind"] == "ValidatingAdmissionPolicyBinding").collect();
        assert_eq!(bindings.len(), 8);
        assert!(bindings.iter().all(|b| b["spec"]["paramRef"] == bindings[0]["spec"]["paramRef"]));
        assert_eq!(bindings[0]["spec"]["paramRef"]["parameterNotFoundAction"], "Allow");
        bindings[0]["spec"]["paramRef"]["selector"].clone()
    };
    let not_restricted = json!({"key": DRIVER_PROFILE, "operator": "NotIn", "values": ["restricted"]});
    // Unlabeled drivers are restricted by default, and a restricted driver violates nothing.
    assert_eq!(
        selector(&PolicySettings::default()),
        json!({"matchExpressions": [{"key": DRIVER_PROFILE, "operator": "Exists"}, not_restricted]})
    );
    // With a more permissive default, an unlabeled driver can violate: NotIn selects it too.
    let mut settings = PolicySettings::default();
    settings.defaults.driver_profile = Level::Baseline;
    assert_eq!(selector(&settings), json!({"matchExpressions": [not_restricted]}));
}

#[test]
fn a_configuration_without_exemptions_never_asks_about_one() {
    let settings = PolicySettings::default();
    assert!(settings.exemptions.namespaces.is_empty() && settings.exemptions.usernames.is_empty());
    let policy = &native_policies(&settings)[0];
    let keys: Vec<&str> =
        policy["spec"]["auditAnnotations"].as_array().unwrap().iter().map(|a| a["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["namespace-label-errors", "enforce-violations", "audit-violations"]);
    let text = policy.to_string();
    assert!(!text.contains("userInfo") && !text.contains("runtimeClassName"), "{text}");
    let mut exempting = settings.clone();
    exempting.exemptions.runtime_classes.insert("kata".into());
    let text = native_policies(&exempting)[0].to_string();
    assert!(text.contains("runtimeClassName") && !text.contains("userInfo"), "only the kind configured is asked");
}
