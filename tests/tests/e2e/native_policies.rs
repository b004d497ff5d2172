//! The generated ValidatingAdmissionPolicies (`csi-volume-admission policy`) against the webhook,
//! on the real apiserver: every object of a table (pods, Deployments and CronJobs, one per driver
//! profile: restricted, baseline, privileged, unlabeled, an invalid label), and generated ones, is
//! created as a dry run in namespaces of every kind of valid Pod Security labels (defaults, each
//! mode, versions; and generated ones), once where the webhook judges it and once where only the
//! policies do, and every
//! answer must agree: the status, the message and the warnings (each without the apiserver's own
//! prefix, which names the webhook or the policy), and the audit annotations (whose keys are the
//! same: each enforce policy is named like its webhook entry). A disagreement fails with both
//! answers and the input.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use inline_guard_tests::webhook::{admission_policy_path, generated_policies};
use serde_json::{Value, json};

use crate::match_conditions::{self, add_debug_container, equivalence_cases, pod_with_read_only};
use crate::support::{
    Answer, Outcome, SHARED_RESOURCE_DRIVER, Suite, WEBHOOK_LABEL, create, create_csi_driver, create_namespace,
    deployment, pod,
};

/// The label value selecting the namespaces only the policies judge.
const POLICIES: &str = "native-policies";

/// The drivers of the table, by profile label (`None`: no label).
const DRIVERS: [(&str, Option<&str>); 5] = [
    ("restricted.native.e2e.inlineguard.dev", Some("restricted")),
    ("baseline.native.e2e.inlineguard.dev", Some("baseline")),
    ("privileged.native.e2e.inlineguard.dev", Some("privileged")),
    ("unlabeled.native.e2e.inlineguard.dev", None),
    ("invalid.native.e2e.inlineguard.dev", Some("trusted")),
];

/// Namespaces' Pod Security labels, one set per row. Only valid ones: this apiserver runs Pod
/// Security Admission, which refuses a namespace with an invalid level or version.
fn namespace_labels() -> Vec<Vec<(&'static str, &'static str)>> {
    let e = "pod-security.kubernetes.io/enforce";
    let w = "pod-security.kubernetes.io/warn";
    let a = "pod-security.kubernetes.io/audit";
    vec![
        vec![],
        vec![(e, "restricted")],
        vec![(e, "baseline"), (w, "restricted")],
        vec![(w, "baseline"), (a, "restricted")],
        vec![(a, "baseline"), (w, "restricted"), ("pod-security.kubernetes.io/audit-version", "latest")],
        vec![(e, "baseline"), ("pod-security.kubernetes.io/enforce-version", "v1.35"), (a, "restricted")],
        vec![(w, "baseline"), ("pod-security.kubernetes.io/warn-version", "v1.0"), (a, "privileged")],
    ]
}

/// A small deterministic generator (xorshift64*): seeded from `NATIVE_POLICIES_SEED`, else the
/// clock, and the seed printed, so that any disagreement it finds can be replayed.
struct Generator(u64);

impl Generator {
    fn seeded() -> (Generator, u64) {
        let seed = std::env::var("NATIVE_POLICIES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        (Generator(seed | 1), seed)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Generated namespaces: each mode's level set or not, and sometimes its version.
fn generated_rows(generator: &mut Generator, count: usize) -> Vec<Vec<(&'static str, &'static str)>> {
    let modes = [
        ("pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/enforce-version"),
        ("pod-security.kubernetes.io/warn", "pod-security.kubernetes.io/warn-version"),
        ("pod-security.kubernetes.io/audit", "pod-security.kubernetes.io/audit-version"),
    ];
    (0..count)
        .map(|_| {
            let mut labels = Vec::new();
            for (level, version) in modes {
                if generator.below(3) > 0 {
                    labels.push((level, *generator.pick(&["privileged", "baseline", "restricted"])));
                }
                if generator.below(3) == 0 {
                    labels.push((version, *generator.pick(&["latest", "v1.0", "v1.28", "v1.35"])));
                }
            }
            labels
        })
        .collect()
}

/// Generated objects: a pod, a Deployment or a CronJob with one to three inline volumes, each
/// of a driver of the table or of one with no CSIDriver object.
fn generated_objects(generator: &mut Generator, count: usize) -> Vec<(&'static str, &'static str, Value)> {
    let mut drivers: Vec<&str> = DRIVERS.iter().map(|(driver, _)| *driver).collect();
    drivers.push("missing.native.e2e.inlineguard.dev");
    (0..count)
        .map(|index| {
            let volumes: Vec<(String, &str)> =
                (0..=generator.below(3)).map(|v| (format!("v{v}"), *generator.pick(&drivers))).collect();
            let volumes: Vec<(&str, &str)> = volumes.iter().map(|(name, driver)| (name.as_str(), *driver)).collect();
            let name = format!("gen-{index}");
            match generator.below(3) {
                0 => ("pods", "pods", pod(&name, &volumes)),
                1 => ("deployments", "deployments", deployment(&name, &volumes)),
                _ => {
                    let template = deployment(&name, &volumes)["spec"]["template"].clone();
                    let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
                        "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": template}}}});
                    ("cronjobs", "cronjobs", cronjob)
                }
            }
        })
        .collect()
}

/// `(path below the namespace, resource, object)` for each object of the table.
fn table() -> Vec<(&'static str, &'static str, Value)> {
    let mut objects = Vec::new();
    for (index, (driver, _)) in DRIVERS.iter().enumerate() {
        objects.push(("pods", "pods", pod(&format!("pod-{index}"), &[("v", driver)])));
        let name = format!("deploy-{index}");
        objects.push(("deployments", "deployments", deployment(&name, &[("v", driver)])));
        let template = deployment(&name, &[("v", driver)])["spec"]["template"].clone();
        let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": format!("cron-{index}")},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": template}}}});
        objects.push(("cronjobs", "cronjobs", cronjob));
    }
    // Two drivers: the policies see one per evaluation (see [`agree`] and [`violations`]).
    let two = [("v", DRIVERS[1].0), ("w", DRIVERS[2].0)];
    objects.push(("pods", "pods", pod("pod-two", &two)));
    objects.push(("deployments", "deployments", deployment("deploy-two", &two)));
    objects
}

fn collection(namespace: &str, plural: &str) -> String {
    match plural {
        "pods" => format!("/api/v1/namespaces/{namespace}/pods"),
        "deployments" => format!("/apis/apps/v1/namespaces/{namespace}/deployments"),
        _ => format!("/apis/batch/v1/namespaces/{namespace}/cronjobs"),
    }
}

/// The inner message of a denial or a warning: the apiserver prefixes a webhook's and a policy's
/// words with their names, differently.
fn inner(text: &str) -> &str {
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
fn violations(text: &str, object: &str) -> Vec<String> {
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

/// What a client sees of an answer, and the audit annotations of ours, the namespace made `NS`
/// and each joined text taken apart into its violations.
fn observed(answer: &Answer, namespace: &str, object: &str, annotations: &BTreeMap<String, String>) -> Value {
    let mut warnings: Vec<String> = answer.warnings.iter().map(|w| inner(w).replace(namespace, "NS")).collect();
    warnings.sort();
    let ours: BTreeMap<&String, Vec<String>> = annotations
        .iter()
        .filter(|(key, _)| key.contains(".csi-volume-admission.inlineguard.dev/"))
        .map(|(key, value)| (key, violations(&value.replace(namespace, "NS"), object)))
        .collect();
    json!({"status": answer.status, "warnings": warnings, "auditAnnotations": ours,
           "denial": violations(&inner(answer.message()).replace(namespace, "NS"), object)})
}

/// Whether the policies answered as the webhook did: everything equal, except that a denial
/// names one of the violations the webhook's names (the apiserver reports the first failing
/// evaluation of a policy, one driver's).
fn agree(webhook: &Value, policy: &Value) -> bool {
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

/// Creates `object` as a dry run in the policies' namespace `namespace` until `wanted` holds of
/// the answer (up to 60 s): a new policy takes the apiserver a moment to load.
async fn until_active(admin: &kube::Client, path: &str, object: &Value, wanted: impl Fn(&Answer) -> bool) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = create(admin, path, object, true).await?;
        if wanted(&answer) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the policies were not active after 60 s: {} {:?} {:?}",
                answer.status,
                answer.message(),
                answer.warnings
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn native_policies_decide_as_the_webhook(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    for (driver, profile) in DRIVERS {
        create_csi_driver(admin, driver, profile).await?;
    }
    // The table, and beside it generated namespaces and objects (every object in every namespace).
    let (mut generator, seed) = Generator::seeded();
    println!("native policies: generated cases from seed {seed} (NATIVE_POLICIES_SEED={seed} replays them)");
    let mut rows = namespace_labels();
    rows.extend(generated_rows(&mut generator, 4));
    for (index, labels) in rows.iter().enumerate() {
        create_namespace(admin, &format!("native-webhook-{index}"), "shared", labels).await?;
        create_namespace(admin, &format!("native-policy-{index}"), POLICIES, labels).await?;
    }
    let objects = generated_policies(&suite.shared.config, &json!({"matchLabels": {WEBHOOK_LABEL: POLICIES}}))?;
    for object in &objects {
        let answer = create(admin, &admission_policy_path(object, false), object, false).await?;
        if answer.status != 201 {
            return Err(format!("{}: {} {}", object["metadata"]["name"], answer.status, answer.message()));
        }
    }
    // Each policy answers for its own objects once loaded: row 1 (enforce restricted) has every
    // enforce policy speak, row 2 (warn restricted) every warn policy.
    let privileged = DRIVERS[2].0;
    for (row, plural, object) in [
        (1, "pods", pod("probe", &[("v", privileged)])),
        (1, "deployments", deployment("probe", &[("v", privileged)])),
        (3, "pods", pod("probe", &[("v", privileged)])),
        (3, "deployments", deployment("probe", &[("v", privileged)])),
    ] {
        let path = collection(&format!("native-policy-{row}"), plural);
        until_active(admin, &path, &object, |answer| answer.status == 403 || !answer.warnings.is_empty()).await?;
    }

    let mut table = table();
    table.extend(generated_objects(&mut generator, 24));
    let mut answers = Vec::new();
    for index in 0..rows.len() {
        for (plural, _, object) in &table {
            let webhook_namespace = format!("native-webhook-{index}");
            let policy_namespace = format!("native-policy-{index}");
            let by_webhook = create(admin, &collection(&webhook_namespace, plural), object, true).await?;
            let by_policy = create(admin, &collection(&policy_namespace, plural), object, true).await?;
            answers.push((index, object.clone(), by_webhook, by_policy));
        }
    }
    // The audit log has every event within moments; read it once all are there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let events = suite.cluster.audit_events()?;
        let count = events.iter().filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "create"
                && e.object_ref.as_ref().is_some_and(|o| o.namespace.starts_with("native-"))
        });
        if count.count() >= answers.len() * 2 {
            break events;
        }
        if Instant::now() > deadline {
            return Err("the audit log lacks events of the table after 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let annotations_of = |resource: &str, namespace: &str, name: &str| {
        events
            .iter()
            .rev()
            .find(|e| e.verb == "create" && e.is_about(resource, namespace, name))
            .map(|e| e.annotations.clone())
            .unwrap_or_default()
    };
    let mut disagreements = Vec::new();
    let mut denied = 0;
    let mut warned = 0;
    let mut annotated = 0;
    for ((index, object, by_webhook, by_policy), (_, resource, _)) in answers.iter().zip(table.iter().cycle()) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let (webhook_namespace, policy_namespace) =
            (format!("native-webhook-{index}"), format!("native-policy-{index}"));
        let webhook =
            observed(by_webhook, &webhook_namespace, name, &annotations_of(resource, &webhook_namespace, name));
        let policy = observed(by_policy, &policy_namespace, name, &annotations_of(resource, &policy_namespace, name));
        denied += usize::from(by_webhook.status == 403);
        annotated += usize::from(webhook["auditAnnotations"].as_object().is_some_and(|a| !a.is_empty()));
        warned += usize::from(!by_webhook.warnings.is_empty());
        if !agree(&webhook, &policy) {
            disagreements.push(format!(
                "{resource} {name} in a namespace labelled {:?} (seed {seed}):\n  object:  {object}\n  webhook: {webhook}\n  policy:  {policy}",
                rows[*index]
            ));
        }
    }
    println!(
        "native policies: {} objects answered alike by the webhook and the policies ({denied} denied, {warned} warned, {annotated} with audit annotations)",
        answers.len()
    );
    if denied == 0 || warned == 0 || annotated == 0 {
        return Err(format!("the table proves nothing: {denied} denied, {warned} warned, {annotated} annotated"));
    }
    if !disagreements.is_empty() {
        return Err(disagreements.join("\n"));
    }
    forcing_agrees(admin).await
}

/// Read-only forcing: the generated MutatingAdmissionPolicy against the webhook, on the table of
/// every combination of `readOnly` on the read-only driver's volume and its mounts (144 pods,
/// `match_conditions::equivalence_cases`, their shared volume naming the suite's share so the
/// webhook's other checks pass), and a new ephemeral container of a stored pod: the volumes and
/// mounts stored must be the same.
async fn forcing_agrees(admin: &kube::Client) -> Outcome {
    let (webhook_namespace, policy_namespace) = ("native-force-webhook", "native-force-policy");
    create_namespace(admin, webhook_namespace, "shared", &[]).await?;
    create_namespace(admin, policy_namespace, POLICIES, &[]).await?;
    let with_share = |mut pod: Value| {
        pod["spec"]["volumes"][0]["csi"]["volumeAttributes"] = json!({"sharedConfigMap": "cluster-ca"});
        pod
    };
    let probe = with_share(pod_with_read_only("probe", SHARED_RESOURCE_DRIVER, None, None));
    until_active(admin, &collection(policy_namespace, "pods"), &probe, |answer| {
        answer.body["spec"]["volumes"][0]["csi"]["readOnly"] == json!(true)
    })
    .await?;
    let cases = equivalence_cases(DRIVERS[1].0, DRIVERS[2].0);
    let mut answers: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    for (index, namespace) in [webhook_namespace, policy_namespace].into_iter().enumerate() {
        for case in &cases {
            let answer = create(admin, &collection(namespace, "pods"), &with_share(case.pod.clone()), true).await?;
            answers[index].push(observed_forcing(&answer, namespace));
        }
        let mut stored = with_share(pod_with_read_only("stored", SHARED_RESOURCE_DRIVER, Some(true), Some(true)));
        stored["spec"]["volumes"][0]["name"] = json!("shared");
        stored["spec"]["containers"][0]["volumeMounts"][0]["name"] = json!("shared");
        stored["spec"]["nodeName"] = json!("no-such-node.e2e.inlineguard.dev");
        let answer = create(admin, &collection(namespace, "pods"), &stored, false).await?;
        if answer.status != 201 {
            return Err(format!("{namespace}/stored: {} {}", answer.status, answer.message()));
        }
        answers[index].push(observed_forcing(&add_debug_container(admin, namespace, "stored").await?, namespace));
    }
    let [by_webhook, by_policy] = &answers;
    let differing: Vec<String> = by_webhook
        .iter()
        .zip(by_policy)
        .enumerate()
        .filter(|(_, (w, p))| w != p)
        .map(|(index, (w, p))| {
            let name = cases.get(index).map_or("stored/ephemeralcontainers", |c| c.name.as_str());
            format!("{name}:\n  webhook {w}\n  policy  {p}")
        })
        .collect();
    let admitted = by_webhook.iter().filter(|a| a["status"] == 201).count();
    let read_only = by_webhook.iter().filter(|a| a["volumes"][0]["csi"]["readOnly"] == json!(true)).count();
    let forced_debug = by_webhook.last().is_some_and(|a| a["ephemeralContainers"][0][0]["readOnly"] == json!(true));
    println!(
        "native read-only forcing: {} answers alike ({admitted} admitted, {read_only} stored with a read-only volume)",
        by_webhook.len()
    );
    if !differing.is_empty() {
        return Err(format!("{} answers differ:\n{}", differing.len(), differing.join("\n")));
    }
    if admitted < cases.len() || read_only < cases.len() || !forced_debug {
        return Err(format!(
            "the table proved too little: {admitted} admitted, {read_only} read-only, debug container forced: {forced_debug}"
        ));
    }
    Ok(())
}

/// The status, and the volumes and mounts as stored, of a forcing answer.
fn observed_forcing(answer: &Answer, namespace: &str) -> Value {
    let mut seen = match_conditions::observed(answer, namespace);
    seen["warnings"] = Value::Null;
    seen
}
