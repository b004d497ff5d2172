//! Whether the generated admission policies answered as the webhook did: the two answers made
//! comparable (the apiserver prefixes a webhook's and a policy's words differently, joins several
//! annotation values differently, and names a `generateName` object anew on each create), and
//! objects made smaller for reporting the least input that still disagrees.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The object's name as messages show it: its name, or for a `generateName` one the prefix and
/// `*` (the apiserver makes each create a different name).
pub fn shown_name(object: &Value) -> String {
    match (object["metadata"]["name"].as_str(), object["metadata"]["generateName"].as_str()) {
        (Some(name), _) if !name.is_empty() => name.to_string(),
        (_, Some(prefix)) => format!("{prefix}*"),
        _ => String::new(),
    }
}

/// `text` with the namespace made `NS` and a generated name made its prefix and `*`.
pub fn normalised(text: &str, namespace: &str, object: &Value) -> String {
    let text = text.replace(namespace, "NS");
    let Some(prefix) = object["metadata"]["generateName"].as_str().filter(|p| !p.is_empty()) else {
        return text;
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(prefix) {
        out.push_str(&rest[..at + prefix.len()]);
        rest = &rest[at + prefix.len()..];
        // The apiserver's suffix: five lowercase letters or digits.
        let suffix = rest.bytes().take(5).take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit()).count();
        if suffix == 5 {
            out.push('*');
            rest = &rest[5..];
        }
    }
    out.push_str(rest);
    out
}

/// The inner message of a denial or a warning: the apiserver prefixes a webhook's and a policy's
/// words with their names, differently.
pub fn inner(text: &str) -> &str {
    for marker in ["denied the request: ", "denied request: ", "': "] {
        if let Some((_, rest)) = text.split_once(marker) {
            return rest;
        }
    }
    text
}

/// The violations a joined text names, sorted: the webhook joins one object's violations with
/// `; `, the apiserver joins the policies' annotation values with `, ` (documented in
/// docs/native-policies.md); a violation itself never holds `, <object> uses`.
pub fn violations(text: &str, object: &str) -> Vec<String> {
    let boundary = format!("{object} uses an inline volume");
    let (semicolon, comma) = (format!("; {boundary}"), format!(", {boundary}"));
    let mut parts: Vec<String> = Vec::new();
    if text.is_empty() {
        return parts;
    }
    for piece in text.split(semicolon.as_str()).flat_map(|p| p.split(comma.as_str())) {
        // Every piece but the first lost the boundary it was split at.
        if parts.is_empty() { parts.push(piece.to_string()) } else { parts.push(format!("{boundary}{piece}")) }
    }
    parts.sort();
    parts
}

/// What a client sees of an answer (its status, warnings and message), and the audit
/// annotations of ours, normalised and each joined text taken apart into its violations.
pub fn observed(
    status: u16,
    warnings: &[String],
    message: &str,
    namespace: &str,
    object: &Value,
    annotations: &BTreeMap<String, String>,
) -> Value {
    let name = shown_name(object);
    let mut warnings: Vec<String> = warnings.iter().map(|w| normalised(inner(w), namespace, object)).collect();
    warnings.sort();
    let ours: BTreeMap<&String, Vec<String>> = annotations
        .iter()
        .filter(|(key, _)| key.contains(".csi-volume-admission.inlineguard.dev/"))
        .map(|(key, value)| (key, violations(&normalised(value, namespace, object), &name)))
        .collect();
    json!({"status": status, "warnings": warnings, "auditAnnotations": ours,
           "denial": violations(&normalised(inner(message), namespace, object), &name)})
}

/// Whether the policies answered as the webhook did: everything equal, except that a denial
/// names one of the violations the webhook's names (the apiserver reports the first failing
/// evaluation of a policy, one driver's).
pub fn agree(webhook: &Value, policy: &Value) -> bool {
    let without_denial = |value: &Value| {
        let mut value = value.clone();
        value["denial"] = Value::Null;
        value
    };
    let denial = |value: &Value| value["denial"].as_array().cloned().unwrap_or_default();
    let (all, one) = (denial(webhook), denial(policy));
    let denial_agrees = match (all.as_slice(), one.as_slice()) {
        ([], []) => true,
        (all, [one]) => all.contains(one),
        _ => false,
    };
    without_denial(webhook) == without_denial(policy) && denial_agrees
}

/// The path of the pod spec inside an object of `kind`.
fn pod_spec_steps(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &["spec"],
        "PodTemplate" => &["template", "spec"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        _ => &["spec", "template", "spec"],
    }
}

/// The pod spec inside `object`, wherever its kind carries it.
fn pod_spec_of(object: &mut Value) -> Option<&mut Value> {
    let steps = pod_spec_steps(object["kind"].as_str()?);
    steps.iter().try_fold(object, |value, step| value.get_mut(*step))
}

/// The CSI drivers of `object`'s inline volumes.
pub fn drivers_of(object: &Value) -> Vec<String> {
    let steps = pod_spec_steps(object["kind"].as_str().unwrap_or_default());
    let spec = steps.iter().fold(object, |value, step| &value[*step]);
    let volumes = spec["volumes"].as_array().map(Vec::as_slice).unwrap_or_default();
    volumes.iter().filter_map(|volume| volume["csi"]["driver"].as_str().map(str::to_string)).collect()
}

/// `webhook`'s observed answer without the audit annotations the policies give only from an
/// evaluation of a driver that can violate something (`exempt`, `namespace-label-errors`): for
/// an object none of whose drivers can, no evaluation happens (docs/native-policies.md).
pub fn without_evaluation_only_annotations(webhook: &Value) -> Value {
    let mut webhook = webhook.clone();
    if let Some(annotations) = webhook["auditAnnotations"].as_object_mut() {
        annotations.retain(|key, _| !key.ends_with("/exempt") && !key.ends_with("/namespace-label-errors"));
    }
    webhook
}

/// `object` without its volume `index` and every mount of it.
pub fn without_volume(object: &Value, index: usize) -> Option<Value> {
    let mut smaller = object.clone();
    let spec = pod_spec_of(&mut smaller)?;
    let volumes = spec["volumes"].as_array_mut()?;
    if volumes.len() < 2 || index >= volumes.len() {
        return None;
    }
    let name = volumes.remove(index)["name"].clone();
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            if let Some(mounts) = container["volumeMounts"].as_array_mut() {
                mounts.retain(|mount| mount["name"] != name);
            }
        }
    }
    Some(smaller)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_name_is_shown_as_its_prefix_wherever_it_appears() {
        let object = json!({"metadata": {"generateName": "api-7c9f8d-"}});
        let text = "api-7c9f8d-x2k9q uses ...; api-7c9f8d-x2k9q uses ... in native-golden-p-x";
        assert_eq!(
            normalised(text, "native-golden-p-x", &object),
            "api-7c9f8d-* uses ...; api-7c9f8d-* uses ... in NS"
        );
        assert_eq!(shown_name(&object), "api-7c9f8d-*");
    }

    #[test]
    fn joined_violations_compare_alike_whichever_separator_joined_them() {
        let one = "p uses an inline volume provided by CSIDriver a and namespace NS has ...";
        let two = "p uses an inline volume provided by CSIDriver b and namespace NS has ...";
        let by_webhook = violations(&format!("{two}; {one}"), "p");
        assert_eq!(by_webhook, violations(&format!("{one}, {two}"), "p"));
        assert_eq!(by_webhook, vec![one.to_string(), two.to_string()]);
        assert!(violations("", "p").is_empty());
    }

    #[test]
    fn a_policy_denial_agrees_when_it_names_one_of_the_webhooks_violations_and_nothing_else_differs() {
        let answer =
            |denial: &[&str], warnings: &[&str]| json!({"status": 403, "warnings": warnings, "denial": denial});
        assert!(agree(&answer(&["a", "b"], &[]), &answer(&["b"], &[])));
        assert!(!agree(&answer(&["a", "b"], &[]), &answer(&["c"], &[])));
        assert!(!agree(&answer(&["a"], &[]), &answer(&[], &[])));
        assert!(!agree(&answer(&["a"], &["w"]), &answer(&["a"], &[])));
    }

    #[test]
    fn drivers_are_read_wherever_the_kind_carries_the_pod_spec() {
        let spec = json!({"volumes": [{"name": "a", "csi": {"driver": "x"}}, {"name": "b", "emptyDir": {}}]});
        let cronjob = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}});
        assert_eq!(drivers_of(&cronjob), ["x"]);
        assert_eq!(drivers_of(&json!({"kind": "Pod", "spec": spec})), ["x"]);
        assert!(drivers_of(&json!({"kind": "Pod"})).is_empty());
    }

    #[test]
    fn a_volume_is_dropped_with_its_mounts_and_the_last_one_is_kept() {
        let mount = |name: &str| json!({"name": name, "mountPath": format!("/{name}")});
        let object = json!({"kind": "Deployment", "spec": {"template": {"spec": {
            "containers": [{"name": "app", "volumeMounts": [mount("a"), mount("b")]}],
            "volumes": [{"name": "a", "csi": {"driver": "x.example.com"}}, {"name": "b", "csi": {"driver": "y.example.com"}}]
        }}}});
        let smaller = without_volume(&object, 0).expect("two volumes");
        let spec = &smaller["spec"]["template"]["spec"];
        assert_eq!(spec["volumes"].as_array().map(Vec::len), Some(1));
        assert!(!spec.to_string().contains("\"a\""), "{spec}");
        assert_eq!(without_volume(&smaller, 0), None);
    }
}
