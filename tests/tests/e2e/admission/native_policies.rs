//! The generated ValidatingAdmissionPolicies (`csi-volume-admission policy`) against the webhook,
//! on the real apiserver. Every object is created as a dry run twice, in namespaces of the same
//! Pod Security labels: once where the webhook judges it and once where only the policies do,
//! and every answer must agree ([`comparison`]). Two configurations, one after the other:
//! - the shipped one (`config/admission.yaml`): the table (pods, Deployments and CronJobs, one
//!   per driver profile: restricted, baseline, privileged, unlabeled, an invalid label; two
//!   drivers) and generated objects in hand-picked and generated namespaces, and the golden
//!   corpus (`config/examples/`) in its own namespaces; then read-only forcing;
//! - the OpenShift-compatible one with an exemption of each kind (namespace, user, runtime
//!   class): other defaults (a driver without a label is privileged, an unlabelled namespace
//!   restricted), workloads denied, exempt objects annotated and let through.

mod cases;
mod comparison;
mod invalid_labels;

use std::collections::BTreeSet;

use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{WebhookServer, admission_policy_path, generated_policies, register};
use serde_json::{Value, json};

use crate::admission::match_conditions::{self, add_debug_container, equivalence_cases, pod_with_read_only};
use crate::support::{
    Answer, Outcome, PROFILE, SERVICE_ACCOUNT, SHARED_RESOURCE_DRIVER, Suite, WEBHOOK_LABEL, create, create_csi_driver,
    create_namespace, deployment, dry_run_until, pod,
};
use cases::{
    AUDIT, DRIVERS, ENFORCE, Generator, Row, WARN, collection, cronjob, generated_objects, generated_rows,
    golden_corpus, large_pod, namespace_labels, plural_of, table,
};
use comparison::{Case, Pass, Tally, all_agree};

/// The label value selecting the namespaces only the policies judge.
const POLICIES: &str = "native-policies";

/// The second configuration's namespaces: judged by its webhook, and by its policies only.
const EXEMPT_WEBHOOK: &str = "native-exempt";
const EXEMPT_POLICIES: &str = "native-exempt-policies";
/// The second configuration's exemptions: this user, this runtime class, and row 4's namespaces.
const EXEMPT_USER: &str = "native-exempt-user";
const EXEMPT_RUNTIME_CLASS: &str = "native-exempt";
const EXEMPT_ROW: usize = 4;

/// Creates the generated policies and bindings; returns them for [`remove_policies`].
async fn create_policies(admin: &kube::Client, config: &std::path::Path, label: &str) -> Result<Vec<Value>, String> {
    let objects = generated_policies(config, &json!({"matchLabels": {WEBHOOK_LABEL: label}}))?;
    create_policies_from(admin, &objects).await
}

/// Creates `objects` (policies and bindings, in order); returns them for [`remove_policies`].
async fn create_policies_from(admin: &kube::Client, objects: &[Value]) -> Result<Vec<Value>, String> {
    for object in objects {
        let answer = create(admin, &admission_policy_path(object, false), object, false).await?;
        if answer.status != 201 {
            return Err(format!("{}: {} {}", object["metadata"]["name"], answer.status, answer.message()));
        }
    }
    Ok(objects.to_vec())
}

/// Deletes what [`create_policies`] created, bindings first (a policy without one does nothing).
async fn remove_policies(admin: &kube::Client, objects: &[Value]) -> Outcome {
    for object in objects.iter().rev() {
        let request = http::Request::delete(admission_policy_path(object, true))
            .body(kube::client::Body::empty())
            .map_err(|e| e.to_string())?;
        let answer = crate::support::send(admin, request).await?;
        if answer.status != 200 {
            return Err(format!("deleting {}: {} {}", object["metadata"]["name"], answer.status, answer.message()));
        }
    }
    Ok(())
}

/// One pair of namespaces per row, `<prefix>-w-<i>` for the webhook and `<prefix>-p-<i>` for the
/// policies; returns their names.
async fn namespace_pairs(
    admin: &kube::Client,
    prefix: &str,
    (webhook, policies): (&str, &str),
    rows: &[Row],
) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for (index, labels) in rows.iter().enumerate() {
        let pair = (format!("{prefix}-w-{index}"), format!("{prefix}-p-{index}"));
        create_namespace(admin, &pair.0, webhook, labels).await?;
        create_namespace(admin, &pair.1, policies, labels).await?;
        pairs.push(pair);
    }
    Ok(pairs)
}

/// Every object in every pair of namespaces.
fn every_object_everywhere(objects: &[Value], pairs: &[(String, String)], rows: &[Row], what: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    for ((webhook_namespace, policy_namespace), labels) in pairs.iter().zip(rows) {
        for object in objects {
            cases.push(Case {
                plural: plural_of(object),
                object: object.clone(),
                webhook_namespace: webhook_namespace.clone(),
                policy_namespace: policy_namespace.clone(),
                origin: format!("{what} in a namespace labelled {labels:?}"),
                by_exempt_user: false,
            });
        }
    }
    cases
}

/// Fails unless the answers denied, warned and annotated at least once each (and, where
/// something is exempt, reported an exemption): a table that never does cannot disagree.
fn not_vacuous(tally: &Tally, exemptions: bool) -> Outcome {
    if tally.denied == 0 || tally.warned == 0 || tally.annotated == 0 || (exemptions && tally.exempt == 0) {
        return Err(format!("the table proves nothing: {tally:?}"));
    }
    Ok(())
}

pub async fn native_policies_decide_as_the_webhook(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    for (driver, profile) in DRIVERS {
        create_csi_driver(admin, driver, profile).await?;
    }
    let (mut generator, seed) = Generator::seeded();
    println!("native policies: generated cases from seed {seed} (NATIVE_POLICIES_SEED={seed} replays them)");
    let policies = create_policies(admin, &suite.shared.config, POLICIES).await?;
    shipped_configuration_agrees(suite, &mut generator, seed).await?;
    invalid_labels::invalid_labels_read_as_the_webhook_reads_them(admin).await?;
    forcing_agrees(admin).await?;
    remove_policies(admin, &policies).await?;
    exemptions_agree(suite, &mut generator, seed).await
}

/// The shipped configuration: the table and generated objects in the table's and generated
/// namespaces, and the golden corpus in its own.
async fn shipped_configuration_agrees(suite: &Suite, generator: &mut Generator, seed: u64) -> Outcome {
    let admin = &suite.admin;
    let mut rows = namespace_labels();
    rows.extend(generated_rows(generator, 4));
    let pairs = namespace_pairs(admin, "native", ("shared", POLICIES), &rows).await?;
    // Each policy answers for its own objects once loaded: row 1 (enforce restricted) has every
    // enforce policy speak, row 3 (warn baseline) every warn policy.
    let privileged = DRIVERS[2].0;
    for (row, object) in [
        (1, pod("probe", &[("v", privileged)])),
        (1, deployment("probe", &[("v", privileged)])),
        (1, cronjob("probe", &[("v", privileged)])),
        (3, pod("probe", &[("v", privileged)])),
        (3, deployment("probe", &[("v", privileged)])),
        (3, cronjob("probe", &[("v", privileged)])),
    ] {
        let path = collection(&pairs[row].1, plural_of(&object));
        dry_run_until(admin, &path, &object, |answer| answer.status == 403 || !answer.warnings.is_empty()).await?;
    }
    let mut objects = table();
    objects.extend(generated_objects(generator, 24, true));
    let mut cases = every_object_everywhere(&objects, &pairs, &rows, "the table");

    let corpus = golden_corpus()?;
    for driver in &corpus.drivers {
        let answer = create(admin, "/apis/storage.k8s.io/v1/csidrivers", driver, false).await?;
        // The shared-resource driver's CSIDriver is the suite's, as shipped.
        if answer.status != 201 && answer.status != 409 {
            return Err(format!(
                "the corpus's CSIDriver {}: {} {}",
                driver["metadata"]["name"],
                answer.status,
                answer.message()
            ));
        }
    }
    for (name, labels) in &corpus.namespaces {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        create_namespace(admin, &format!("native-golden-w-{name}"), "shared", &labels).await?;
        create_namespace(admin, &format!("native-golden-p-{name}"), POLICIES, &labels).await?;
    }
    let golden = corpus.objects.len();
    for (namespace, object) in corpus.objects {
        cases.push(Case {
            plural: plural_of(&object),
            object,
            webhook_namespace: format!("native-golden-w-{namespace}"),
            policy_namespace: format!("native-golden-p-{namespace}"),
            origin: format!("the golden corpus, namespace {namespace}"),
            by_exempt_user: false,
        });
    }
    // Default profile restricted: only drivers labelled otherwise can violate anything.
    let mut evaluated_drivers: BTreeSet<String> = DRIVERS
        .iter()
        .filter(|(_, profile)| profile.is_some_and(|p| p != "restricted"))
        .map(|(d, _)| d.to_string())
        .collect();
    evaluated_drivers.extend(
        corpus
            .drivers
            .iter()
            .filter(|driver| {
                driver["metadata"]["labels"][PROFILE].as_str().is_some_and(|profile| profile != "restricted")
            })
            .filter_map(|driver| driver["metadata"]["name"].as_str().map(str::to_string)),
    );
    let pass = Pass { admin, exempt_user: admin, evaluated_drivers: &evaluated_drivers };
    let tally = all_agree(suite, &pass, &cases, seed).await?;
    println!(
        "native policies, shipped configuration: {} objects answered alike by the webhook and the policies, \
         {golden} of them the golden corpus's ({tally:?}); left out of the corpus:\n  {}",
        tally.answers,
        corpus.left_out.join("\n  ")
    );
    if golden < 30 {
        return Err(format!("only {golden} objects of the golden corpus were compared"));
    }
    not_vacuous(&tally, false)
}

/// The OpenShift-compatible configuration with one exemption of each kind, under its own
/// webhook server and its own generated policies.
async fn exemptions_agree(suite: &Suite, generator: &mut Generator, seed: u64) -> Outcome {
    let admin = &suite.admin;
    let shipped = std::fs::read_to_string(repo_root().join("config/openshift-compatible.yaml"))
        .map_err(|e| format!("config/openshift-compatible.yaml: {e}"))?;
    let config = suite.cluster.run_dir().join("native-exempt.yaml");
    let exemptions = format!(
        "exemptions:\n  usernames: [{EXEMPT_USER}]\n  namespaces: [{EXEMPT_WEBHOOK}-w-{EXEMPT_ROW}, {EXEMPT_WEBHOOK}-p-{EXEMPT_ROW}]\n  runtimeClasses: [{EXEMPT_RUNTIME_CLASS}]\n"
    );
    std::fs::write(&config, format!("{shipped}\n{exemptions}")).map_err(|e| format!("{}: {e}", config.display()))?;
    let identity = suite.cluster.kubeconfig_as(SERVICE_ACCOUNT)?;
    let server = WebhookServer::start(&suite.cluster, "webhook-native-exempt", &config, &identity)?;
    let registration =
        register(admin, &server, EXEMPT_WEBHOOK, json!({"matchLabels": {WEBHOOK_LABEL: EXEMPT_WEBHOOK}})).await?;
    let policies = create_policies(admin, &config, EXEMPT_POLICIES).await?;
    let runtime_class = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": EXEMPT_RUNTIME_CLASS}, "handler": "runc"});
    let answer = create(admin, "/apis/node.k8s.io/v1/runtimeclasses", &runtime_class, false).await?;
    if answer.status != 201 {
        return Err(format!("RuntimeClass {EXEMPT_RUNTIME_CLASS}: {} {}", answer.status, answer.message()));
    }

    let mut rows: Vec<Row> = vec![
        vec![],
        vec![(ENFORCE, "privileged")],
        vec![(ENFORCE, "baseline"), (WARN, "restricted")],
        vec![(ENFORCE, "privileged"), (WARN, "baseline"), (AUDIT, "restricted")],
        vec![(ENFORCE, "restricted")],
    ];
    rows.extend(generated_rows(generator, 2));
    let pairs = namespace_pairs(admin, EXEMPT_WEBHOOK, (EXEMPT_WEBHOOK, EXEMPT_POLICIES), &rows).await?;
    // Active once an unlabelled namespace (restricted by default here) denies a privileged
    // driver's pod, Deployment and CronJob (workloads are denied here), on both sides, and an
    // enforce-privileged one warns of a baseline driver (warn is restricted by default here).
    let (privileged, baseline) = (DRIVERS[2].0, DRIVERS[1].0);
    for namespace in [&pairs[0].0, &pairs[0].1] {
        for object in [
            pod("probe", &[("v", privileged)]),
            deployment("probe", &[("v", privileged)]),
            cronjob("probe", &[("v", privileged)]),
        ] {
            let path = collection(namespace, plural_of(&object));
            dry_run_until(admin, &path, &object, |answer| answer.status == 403).await?;
        }
    }
    for object in [
        pod("probe", &[("v", baseline)]),
        deployment("probe", &[("v", baseline)]),
        cronjob("probe", &[("v", baseline)]),
    ] {
        let path = collection(&pairs[1].1, plural_of(&object));
        dry_run_until(admin, &path, &object, |answer| !answer.warnings.is_empty()).await?;
    }

    let mut objects = table();
    for object in [pod("exempt-class", &[("v", privileged)]), deployment("exempt-class", &[("v", privileged)])] {
        let mut object = object;
        let spec = if object["kind"] == "Pod" { &mut object["spec"] } else { &mut object["spec"]["template"]["spec"] };
        spec["runtimeClassName"] = json!(EXEMPT_RUNTIME_CLASS);
        objects.push(object);
    }
    // No driver without a CSIDriver object: here the webhook gives it the default profile
    // `privileged`, which no policy evaluation sees (docs/native-policies.md).
    objects.extend(generated_objects(generator, 8, false));
    let mut cases = every_object_everywhere(&objects, &pairs, &rows, "the exemptions' table");
    let by_user = [pod("by-exempt-user", &[("v", privileged)]), deployment("by-exempt-user", &[("v", privileged)])];
    for mut case in every_object_everywhere(&by_user, &pairs[..3], &rows[..3], "the exempt user") {
        case.by_exempt_user = true;
        cases.push(case);
    }
    let exempt_user = suite.cluster.client_as(EXEMPT_USER, &["system:masters"]).await?;
    // Default profile privileged: every driver not labelled restricted can violate something.
    let evaluated_drivers: BTreeSet<String> =
        DRIVERS.iter().filter(|(_, profile)| *profile != Some("restricted")).map(|(d, _)| d.to_string()).collect();
    let pass = Pass { admin, exempt_user: &exempt_user, evaluated_drivers: &evaluated_drivers };
    let tally = all_agree(suite, &pass, &cases, seed).await?;
    println!(
        "native policies, OpenShift-compatible configuration with exemptions: {} objects answered alike ({tally:?})",
        tally.answers
    );
    not_vacuous(&tally, true)?;
    remove_policies(admin, &policies).await?;
    registration.remove().await
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
    dry_run_until(admin, &collection(policy_namespace, "pods"), &probe, |answer| {
        answer.body["spec"]["volumes"][0]["csi"]["readOnly"] == json!(true)
    })
    .await?;
    let cases = equivalence_cases(DRIVERS[1].0, DRIVERS[2].0);
    // About as large as a pod etcd still stores (created for real, not as a dry run: with the
    // managed fields the apiserver adds, about 1 MB of etcd's 1.5 MB): 250 volumes of the
    // read-only driver and 250 of another, each mounted in 8 containers and 8 init containers
    // (8 000 mounts). The CEL cost of looking at it grows with volumes × mounts.
    let share = json!({"sharedConfigMap": "cluster-ca"});
    let large = large_pod("large", &[SHARED_RESOURCE_DRIVER, DRIVERS[1].0], 250, 8, &share);
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
        let answer = create(admin, &collection(namespace, "pods"), &large, false).await?;
        answers[index].push(observed_forcing(&answer, namespace));
    }
    let [by_webhook, by_policy] = &answers;
    let differing: Vec<String> = by_webhook
        .iter()
        .zip(by_policy)
        .enumerate()
        .filter(|(_, (w, p))| w != p)
        .map(|(index, (w, p))| {
            let name = match cases.get(index) {
                Some(case) => case.name.as_str(),
                None if index == cases.len() => "stored/ephemeralcontainers",
                None => "large",
            };
            format!("{name}:\n  webhook {w}\n  policy  {p}")
        })
        .collect();
    let admitted = by_webhook.iter().filter(|a| a["status"] == 201).count();
    let read_only = by_webhook.iter().filter(|a| a["volumes"][0]["csi"]["readOnly"] == json!(true)).count();
    let forced_debug =
        by_webhook.get(cases.len()).is_some_and(|a| a["ephemeralContainers"][0][0]["readOnly"] == json!(true));
    let large_forced = by_webhook.last().is_some_and(|a| {
        a["status"] == 201
            && a["initContainers"][7][249]["readOnly"] == json!(true)
            && a["volumes"][249]["csi"]["readOnly"] == json!(true)
    });
    println!(
        "native read-only forcing: {} answers alike ({admitted} admitted, {read_only} stored with a read-only volume)",
        by_webhook.len()
    );
    if !differing.is_empty() {
        return Err(format!("{} answers differ:\n{}", differing.len(), differing.join("\n")));
    }
    if admitted < cases.len() || read_only < cases.len() || !forced_debug || !large_forced {
        return Err(format!(
            "the table proved too little: {admitted} admitted, {read_only} read-only, debug container forced: \
             {forced_debug}, the large pod forced: {large_forced}"
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

/// On the oldest minor (1.33) the generated policies' read-only forcing cannot be created: its
/// apiserver serves MutatingAdmissionPolicy as `v1alpha1` only (`v1beta1` came in 1.34), what
/// docs/compatibility.md says. The ValidatingAdmissionPolicies and their bindings, which decide
/// everything but the forcing, are accepted (dry run): the positive control.
pub async fn not_served_on_the_oldest_minor(s: &Suite) -> Outcome {
    let config = repo_root().join("config/admission.yaml");
    let objects = generated_policies(&config, &json!({"matchLabels": {WEBHOOK_LABEL: POLICIES}}))?;
    let (mut validating, mut mutating) = (0, 0);
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let answer = create(&s.admin, &admission_policy_path(object, false), object, true).await?;
        if kind.starts_with("Mutating") {
            mutating += 1;
            if answer.status != 404 {
                return Err(format!(
                    "{kind} v1beta1 answered {} on {}, not 404: {}",
                    answer.status,
                    s.cluster.version,
                    answer.message()
                ));
            }
        } else {
            validating += 1;
            if answer.status != 201 {
                return Err(format!(
                    "{kind} answered {} on {}: {}",
                    answer.status,
                    s.cluster.version,
                    answer.message()
                ));
            }
        }
    }
    if validating < 2 || mutating < 2 {
        return Err(format!("the generated policies hold {validating} validating and {mutating} mutating objects"));
    }
    Ok(())
}
