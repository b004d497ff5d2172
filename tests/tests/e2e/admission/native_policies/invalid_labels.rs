//! Invalid namespace labels, read by the generated expressions on the real apiserver. Pod
//! Security Admission refuses a namespace with an invalid level or version, so no namespace here
//! can have one; the same expressions reading a ConfigMap's labels instead
//! (`namespace_labels_probe`) answer for every label combination, and each answer must be what
//! the webhook's own reading (`NamespacePolicy::from_labels`) gives: the three levels (invalid
//! enforce falls back to restricted, warn and audit to privileged; unset takes the default) and
//! the label errors in the webhook's words and order.

use inline_guard_config::native_policies::namespace_labels_probe;
use inline_guard_policy::Labels;
use inline_guard_policy::labels;
use inline_guard_policy::level::Level;
use inline_guard_policy::namespace_policy::NamespacePolicy;
use inline_guard_policy::settings::PolicySettings;
use inline_guard_tests::policy_equivalence::inner;
use serde_json::{Value, json};

use super::create_policies_from;
use crate::support::{Outcome, create, dry_run_until};

const NAMESPACE: &str = "native-label-probe";
/// What each label takes in turn (`None`: not set): valid, invalid, empty.
const LEVELS: [Option<&str>; 6] =
    [None, Some("restricted"), Some("baseline"), Some("privileged"), Some("superuser"), Some("")];
const VERSIONS: [Option<&str>; 7] =
    [None, Some("latest"), Some("v1.30"), Some("v1.0"), Some("v1.01"), Some("v2.0"), Some("")];

/// Every level and version value of each mode with the other modes unset, and every mode's
/// labels invalid at once (the errors' order).
fn label_sets() -> Vec<Labels> {
    let modes = [
        (labels::ENFORCE_LEVEL, labels::ENFORCE_VERSION),
        (labels::WARN_LEVEL, labels::WARN_VERSION),
        (labels::AUDIT_LEVEL, labels::AUDIT_VERSION),
    ];
    let mut sets = Vec::new();
    for (level_key, version_key) in modes {
        for level in LEVELS {
            for version in VERSIONS {
                let mut set = Labels::new();
                set.extend(level.map(|value| (level_key.to_string(), value.to_string())));
                set.extend(version.map(|value| (version_key.to_string(), value.to_string())));
                sets.push(set);
            }
        }
    }
    let all_invalid: Labels = modes
        .iter()
        .flat_map(|(level, version)| [(level.to_string(), "x".into()), (version.to_string(), "v9".into())])
        .collect();
    sets.push(all_invalid);
    sets
}

/// The probe's message for `labels`, as the webhook reads them.
fn expected(labels: &Labels, settings: &PolicySettings) -> String {
    let (policy, errors) = NamespacePolicy::from_labels(labels, &settings.defaults);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} {} {}|{}", policy.enforce.rank(), policy.warn.rank(), policy.audit.rank(), errors.join("; "))
}

fn config_map(labels: &Labels) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe", "labels": labels}})
}

pub async fn invalid_labels_read_as_the_webhook_reads_them(admin: &kube::Client) -> Outcome {
    // Defaults apart from the shipped ones, so an unset label's default shows.
    let mut settings = PolicySettings::default();
    settings.defaults.enforce = Level::Baseline;
    settings.defaults.warn = Level::Restricted;
    settings.defaults.audit = Level::Baseline;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let made = create(admin, "/api/v1/namespaces", &namespace, false).await?;
    if made.status != 201 {
        return Err(format!("namespace {NAMESPACE}: {} {}", made.status, made.message()));
    }
    let probe = create_policies_from(admin, &namespace_labels_probe(&settings, NAMESPACE)).await?;
    let path = format!("/api/v1/namespaces/{NAMESPACE}/configmaps");
    // In force once a policy refuses the ConfigMap (nothing else here does).
    dry_run_until(admin, &path, &config_map(&Labels::new()), |answer| answer.message().contains("denied request: "))
        .await?;
    let (mut disagreements, mut with_errors) = (Vec::new(), 0);
    let sets = label_sets();
    for labels in &sets {
        let answer = create(admin, &path, &config_map(labels), true).await?;
        let wanted = expected(labels, &settings);
        with_errors += usize::from(!wanted.ends_with('|'));
        if inner(answer.message()) != wanted {
            disagreements
                .push(format!("labels {labels:?}: the webhook reads {wanted:?}, the policies {:?}", answer.message()));
        }
    }
    super::remove_policies(admin, &probe).await?;
    if !disagreements.is_empty() {
        let shown: Vec<&String> = disagreements.iter().take(10).collect();
        return Err(format!("{} of {} label sets read differently: {shown:#?}", disagreements.len(), sets.len()));
    }
    if with_errors == 0 {
        return Err("no label set was invalid: the comparison proves nothing".into());
    }
    println!(
        "native policies, invalid namespace labels (through a ConfigMap's): {} label sets read alike, {with_errors} of them with errors",
        sets.len()
    );
    Ok(())
}
