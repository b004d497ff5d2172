//! The webhook's CSIVolumeAdmission decisions as in-apiserver ValidatingAdmissionPolicies, for
//! operators who want no webhook on the pod-create path: `csi-volume-admission policy` prints
//! them, generated from the same configuration the webhook runs with.
//!
//! **Where the drivers' profiles come from**: the CSIDriver objects themselves, as parameters
//! (`paramKind` CSIDriver, a binding whose `paramRef.selector` selects the CSIDrivers that can
//! violate something: [`drivers_that_can_violate`]). The apiserver evaluates the policy once per
//! selected CSIDriver and denies when any evaluation does, so a CSIDriver created or relabelled a
//! moment ago counts as soon as the apiserver's informer has it, with nothing of ours to run or
//! keep current. The price of one evaluation per driver is that an evaluation sees one driver,
//! and a pod none of whose drivers is selected is not evaluated at all: see
//! docs/native-policies.md for what the policies cannot say exactly as the webhook does.
//!
//! Read-only forcing is a MutatingAdmissionPolicy beside them (see [`read_only_policy`]).
//!
//! **How deny / warn / audit map**: per place a pod spec is carried (pods, pod-template
//! workloads, CronJobs, PodTemplates), two policies. The first, named like the validating
//! webhook entry (so its audit annotations carry the webhook's keys exactly, e.g.
//! `pods.csi-volume-admission.inlineguard.dev/enforce-violations`), holds the enforce check and
//! every audit annotation; its binding denies for pods and warns for workloads (denies when
//! `enforceOnWorkloads`). The second, `<name>-warn`, holds the warn check, bound with `Warn`
//! and only in namespaces where a warning can be due ([`warn_namespaces`]).

use inline_guard_policy::labels::{self, DRIVER_PROFILE, audit};
use inline_guard_policy::level::{Level, Mode};
use inline_guard_policy::settings::PolicySettings;
use serde_json::{Value, json};

use inline_guard_policy::settings::ReadOnlyDrivers;

use crate::webhook_configurations::{READ_ONLY_WEBHOOK, cel_string, guarded, read_only_condition};

mod expressions;

/// One place a pod spec is carried, and the objects that carry it there.
struct Carrier {
    /// The webhook entry's name, which the enforce policy takes.
    name: &'static str,
    /// `matchConstraints.resourceRules`.
    rules: Value,
    /// The CEL path of the pod spec below `object`.
    spec_steps: &'static [&'static str],
    /// Whether enforce violations only warn (pod-template workloads, unless configured otherwise).
    is_workload: bool,
}

fn carriers() -> [Carrier; 4] {
    let rule = |group: &str, operations: &[&str], resources: &[&str]| json!({"apiGroups": [group], "apiVersions": ["v1"], "operations": operations, "resources": resources});
    let create_update = ["CREATE", "UPDATE"];
    [
        Carrier {
            name: "pods.csi-volume-admission.inlineguard.dev",
            rules: json!([rule("", &["CREATE"], &["pods"])]),
            spec_steps: &["spec"],
            is_workload: false,
        },
        Carrier {
            name: "workloads.csi-volume-admission.inlineguard.dev",
            rules: json!([
                rule("", &create_update, &["replicationcontrollers"]),
                rule("apps", &create_update, &["replicasets", "deployments", "statefulsets", "daemonsets"]),
                rule("batch", &create_update, &["jobs"]),
            ]),
            spec_steps: &["spec", "template", "spec"],
            is_workload: true,
        },
        Carrier {
            name: "cronjobs.csi-volume-admission.inlineguard.dev",
            rules: json!([rule("batch", &create_update, &["cronjobs"])]),
            spec_steps: &["spec", "jobTemplate", "spec", "template", "spec"],
            is_workload: true,
        },
        Carrier {
            name: "podtemplates.csi-volume-admission.inlineguard.dev",
            rules: json!([rule("", &create_update, &["podtemplates"])]),
            spec_steps: &["template", "spec"],
            is_workload: true,
        },
    ]
}

/// `this evaluation's driver violates mode`: above the namespace's level, and not exempt. The
/// levels are compared first: an evaluation that passes never looks at the exemption.
fn violates(settings: &PolicySettings, spec: &str, mode: Mode) -> String {
    let above =
        format!("({}) > ({})", expressions::driver_level(settings), expressions::namespace_level(settings, mode));
    match expressions::exemption(settings, spec) {
        Some(exemption) => format!("{above} && ({exemption}) == ''"),
        None => above,
    }
}

/// `has an inline CSI volume of this evaluation's driver`, each step of the path guarded. The
/// apiserver evaluates the policy once per CSIDriver; every evaluation but those of the pod's own
/// drivers stops here, at the price of one look at the volumes.
fn uses_this_driver(spec_steps: &[&str]) -> Value {
    let (mut guards, path) = guarded(&[spec_steps, &["volumes"]].concat());
    guards.push(format!("{path}.exists(v, has(v.csi) && v.csi.driver == params.metadata.name)"));
    json!([{"name": "uses-this-driver", "expression": guards.join(" && ")}])
}

fn policy(name: String, carrier: &Carrier, validation: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver"},
            "matchConstraints": {"resourceRules": carrier.rules},
            "matchConditions": uses_this_driver(carrier.spec_steps),
            "validations": [validation],
            "auditAnnotations": annotations,
        }
    })
}

/// The CSIDrivers that can violate a namespace's level, the only ones worth an evaluation: those
/// whose profile label says anything but `restricted` (an invalid value counts as `privileged`),
/// and, unless the default profile is `restricted`, those without the label. Each CSIDriver
/// selected costs every pod the policy matches one more look at its volumes, pods without an
/// inline volume too, so a cluster's many drivers that never serve inline volumes (or serve them
/// as restricted) cost nothing.
fn drivers_that_can_violate(settings: &PolicySettings) -> Value {
    let mut requirements =
        vec![json!({"key": DRIVER_PROFILE, "operator": "NotIn", "values": [Level::Restricted.as_str()]})];
    if settings.defaults.driver_profile == Level::Restricted {
        requirements.insert(0, json!({"key": DRIVER_PROFILE, "operator": "Exists"}));
    }
    json!({"matchExpressions": requirements})
}

fn binding(name: &str, action: &str, settings: &PolicySettings, namespace_selector: Option<Value>) -> Value {
    let mut binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": [action],
            // No such CSIDriver: nothing any pod uses can violate anything.
            "paramRef": {"selector": drivers_that_can_violate(settings), "parameterNotFoundAction": "Allow"},
        }
    });
    if let Some(selector) = namespace_selector {
        binding["spec"]["matchResources"] = json!({"namespaceSelector": selector});
    }
    binding
}

/// The namespaces where a warning can be due: those whose warn level can be below
/// `privileged`. Every other namespace is left out by the binding, before any parameter is
/// fetched or any expression evaluated, which halves what a pod costs there (the apiserver
/// converts the pod once per policy, parameter and expression list). An invalid warn label
/// falls open to `privileged`, so a superset is exact: the policy itself still decides.
fn warn_namespaces(settings: &PolicySettings) -> Value {
    let (operator, values) = match settings.defaults.warn {
        // Unlabelled namespaces take the default: with `privileged` they never warn.
        Level::Privileged => ("In", json!([Level::Restricted.as_str(), Level::Baseline.as_str()])),
        _ => ("NotIn", json!([Level::Privileged.as_str()])),
    };
    json!({"matchExpressions": [{"key": labels::WARN_LEVEL, "operator": operator, "values": values}]})
}

/// The name of the read-only policy, the mutating webhook entry's.
pub const READ_ONLY_POLICY: &str = READ_ONLY_WEBHOOK;

/// Read-only forcing as a MutatingAdmissionPolicy (`admissionregistration.k8s.io/v1beta1`,
/// feature gate `MutatingAdmissionPolicy`): the same condition as the mutating webhook entry,
/// and an apply configuration, merged as server-side apply merges, that sets `readOnly: true` on
/// every volume of a listed driver and every mount of one (containers, init containers,
/// ephemeral containers); on the ephemeral-containers subresource, on the new ephemeral
/// containers' mounts only. Lists merge by their keys (volumes and containers by name, mounts by
/// path), so nothing else in the pod changes.
fn read_only_policy(drivers: &ReadOnlyDrivers) -> [Value; 2] {
    let listed = drivers.0.iter().map(|driver| cel_string(driver)).collect::<Vec<_>>().join(", ");
    let mounts = |list: &str| {
        format!(
            "c.volumeMounts.filter(m, m.name in variables.listed).map(m, \
             Object.spec.{list}.volumeMounts{{name: m.name, mountPath: m.mountPath, readOnly: true}})"
        )
    };
    let containers = |list: &str, extra: &str| {
        format!(
            "?{list}: has(object.spec.{list}) ? optional.of(object.spec.{list}.filter(c, {extra}has(c.volumeMounts) && \
             c.volumeMounts.exists(m, m.name in variables.listed)).map(c, Object.spec.{list}{{name: c.name, volumeMounts: {}}})) : \
             optional.none()",
            mounts(list)
        )
    };
    let volumes = "volumes: object.spec.volumes.filter(v, has(v.csi) && v.csi.driver in variables.drivers).map(v, \
                   Object.spec.volumes{name: v.name, csi: Object.spec.volumes.csi{driver: v.csi.driver, readOnly: true}})";
    let whole = format!(
        "Object{{spec: Object.spec{{{volumes}, {}, {}, {}}}}}",
        containers("containers", ""),
        containers("initContainers", ""),
        containers("ephemeralContainers", "")
    );
    let new_only = format!(
        "Object{{spec: Object.spec{{{}}}}}",
        containers("ephemeralContainers", "!(c.name in variables.existing) && ")
    );
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": READ_ONLY_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/ephemeralcontainers"]},
            ]},
            "matchConditions": [read_only_condition(drivers)],
            "variables": [
                {"name": "drivers", "expression": format!("[{listed}]")},
                // A map, not a list: `m.name in` it is one step whatever the number of volumes,
                // so the mutation's cost grows with the mounts only (a list made it mounts ×
                // volumes, over the apiserver's CEL budget for a large enough pod).
                {"name": "listed", "expression":
                    "object.spec.volumes.filter(v, has(v.csi) && v.csi.driver in variables.drivers).transformMapEntry(i, v, {v.name: true})"},
                {"name": "existing", "expression":
                    "oldObject != null && has(oldObject.spec.ephemeralContainers) ? oldObject.spec.ephemeralContainers.map(c, c.name) : []"},
            ],
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": format!(
                "has(request.subResource) && request.subResource == 'ephemeralcontainers' ? {new_only} : {whole}"
            )}}],
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": READ_ONLY_POLICY},
        "spec": {"policyName": READ_ONLY_POLICY},
    });
    [policy, binding]
}

/// A carrier's two policies, each followed by its binding: the enforce check with every audit
/// annotation, and the warn check.
fn carrier_policies(settings: &PolicySettings, carrier: &Carrier) -> [Value; 4] {
    let enforce_denies = !carrier.is_workload || settings.enforce_on_workloads;
    let spec = format!("object.{}", carrier.spec_steps.join("."));
    let violates = |mode| violates(settings, &spec, mode);
    // A message is read only when its test fails but evaluated every time: testing again is
    // cheaper than building a message nobody reads.
    let reported = |test: &str, mode| format!("{test} ? {} : ''", expressions::message(settings, mode));
    let annotation = |key: &str, value: String| json!({"key": key, "valueExpression": value});
    // An annotation whose value is '' is left out.
    let label_errors = expressions::label_errors(settings);
    let mut annotations = match expressions::exemption(settings, &spec) {
        Some(exemption) => vec![
            annotation(audit::EXEMPT, exemption.clone()),
            annotation(audit::NAMESPACE_LABEL_ERRORS, format!("({exemption}) == '' ? {label_errors} : ''")),
        ],
        None => vec![annotation(audit::NAMESPACE_LABEL_ERRORS, label_errors)],
    };
    for (key, mode) in [(audit::ENFORCE_VIOLATIONS, Mode::Enforce), (audit::AUDIT_VIOLATIONS, Mode::Audit)] {
        annotations.push(annotation(key, reported(&violates(mode), mode)));
    }
    let enforced = violates(Mode::Enforce);
    let enforce = json!({"expression": format!("!({enforced})"),
                         "messageExpression": reported(&enforced, Mode::Enforce), "reason": "Forbidden"});
    // Warned only when enforce is not violated: a violation is reported once, at its highest mode.
    let warned = format!(
        "{} && !(({}) > ({}))",
        violates(Mode::Warn),
        expressions::driver_level(settings),
        expressions::namespace_level(settings, Mode::Enforce)
    );
    let warn = json!({"expression": format!("!({warned})"), "messageExpression": reported(&warned, Mode::Warn)});
    let warn_name = carrier.name.replacen('.', "-warn.", 1);
    [
        policy(carrier.name.to_string(), carrier, enforce, json!(annotations)),
        binding(carrier.name, if enforce_denies { "Deny" } else { "Warn" }, settings, None),
        policy(warn_name.clone(), carrier, warn, json!([])),
        binding(&warn_name, "Warn", settings, Some(warn_namespaces(settings))),
    ]
}

/// Every policy and binding, in apply order (a binding after its policy).
pub fn native_policies(settings: &PolicySettings) -> Vec<Value> {
    let mut objects = Vec::new();
    for carrier in carriers() {
        objects.extend(carrier_policies(settings, &carrier));
    }
    if !settings.read_only_drivers.0.is_empty() {
        objects.extend(read_only_policy(&settings.read_only_drivers));
    }
    objects
}

/// For the e2e proof of invalid namespace labels, which Pod Security Admission keeps out of a
/// running cluster's namespaces (it refuses them): the expressions that read a namespace's
/// levels and label errors, reading a ConfigMap's labels instead, in a policy and binding that
/// refuse every ConfigMap created in `namespace` with `<enforce> <warn> <audit>|<errors>` (the
/// levels as ranks) as the message.
#[cfg(any(test, feature = "test-util"))]
pub fn namespace_labels_probe(settings: &PolicySettings, namespace: &str) -> [Value; 2] {
    let ranks =
        Mode::ALL.map(|mode| format!("string({})", expressions::namespace_level(settings, mode))).join(" + ' ' + ");
    let message =
        format!("{ranks} + '|' + {}", expressions::label_errors(settings)).replace("namespaceObject.", "object.");
    let name = "namespace-labels-probe.e2e.inlineguard.dev";
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "validations": [{"expression": "false", "messageExpression": message}],
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            }
        }),
    ]
}

/// What the YAML stream says about itself.
const HEADER: &str = "\
# Generated by `csi-volume-admission policy --config FILE` from the admission.yaml the webhook
# runs with (`UPDATE_POLICIES=1 cargo test -p inline-guard-config policies` rewrites it): the
# webhook's CSIVolumeAdmission decisions as ValidatingAdmissionPolicies, and read-only forcing
# as a MutatingAdmissionPolicy (admissionregistration.k8s.io/v1beta1: in 1.35 the apiserver needs
# the MutatingAdmissionPolicy feature gate and that API version), for clusters that want no
# webhook on the pod-create path. Apply these instead of the webhook configurations'
# CSIVolumeAdmission and read-only entries, not beside them. What they cannot say exactly as the
# webhook does is listed in docs/native-policies.md.
";

/// Every object as one commented YAML stream: what `config/native/policies.yaml` holds.
pub fn native_policies_yaml(settings: &PolicySettings) -> Result<String, String> {
    let mut text = String::from(HEADER);
    for object in native_policies(settings) {
        text.push_str("---\n");
        text.push_str(&serde_saphyr::to_string(&object).map_err(|e| e.to_string())?);
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
