//! The generated matchConditions, on the real apiserver: they keep the webhooks off the path of
//! everything they have nothing to say about (counted at the webhook itself), they never change
//! an answer (a table of pods answered through generated and through broad conditions side by
//! side), and a mutating configuration that fell behind `readOnlyDrivers` is refused loudly by the
//! validating read-only check instead of letting a writable volume through.

use inline_guard_config::webhook_configurations::READ_ONLY_WEBHOOK;
use inline_guard_policy::INJECT_ANNOTATION;
use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{WebhookServer, generated_configurations, register, register_configurations};
use serde_json::{Value, json};

use crate::support::{
    Answer, Outcome, SERVICE_ACCOUNT, SHARED_RESOURCE_DRIVER, Suite, WEBHOOK_LABEL, container, create,
    create_csi_driver, create_namespace, denied_by, deployment, deployments_path, dry_run_until, pod, pods_path,
    wait_until_called,
};

/// Requests the server has answered on `path` (`/validate` or `/mutate`), summed over decisions.
fn answered(server: &WebhookServer, path: &str) -> Result<u64, String> {
    let prefix = format!("csi_volume_admission_requests_total{{path=\"{path}\",");
    Ok(server
        .metrics()?
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Calls answered on /validate and /mutate while `work` runs.
async fn calls_during<F: std::future::Future<Output = Result<(), String>>>(
    server: &WebhookServer,
    work: F,
) -> Result<(u64, u64), String> {
    let before = (answered(server, "/validate")?, answered(server, "/mutate")?);
    work.await?;
    let after = (answered(server, "/validate")?, answered(server, "/mutate")?);
    let since = |path: &str, before: u64, after: u64| {
        after.checked_sub(before).ok_or_else(|| format!("{path}: the counter went back from {before} to {after}"))
    };
    Ok((since("/validate", before.0, after.0)?, since("/mutate", before.1, after.1)?))
}

/// A pod with one volume of `driver` whose `csi.readOnly` and mount `readOnly` are as given
/// (`None`: the field is left out).
pub(crate) fn pod_with_read_only(name: &str, driver: &str, volume: Option<bool>, mount: Option<bool>) -> Value {
    let mut object = pod(name, &[("v", driver)]);
    if let Some(read_only) = volume {
        object["spec"]["volumes"][0]["csi"]["readOnly"] = json!(read_only);
    }
    if let Some(read_only) = mount {
        object["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(read_only);
    }
    object
}

async fn created(admin: &kube::Client, namespace: &str, object: &Value) -> Outcome {
    let answer = create(admin, &pods_path(namespace), object, true).await?;
    if answer.status != 201 {
        return Err(format!("{}: {} {}", object["metadata"]["name"], answer.status, answer.message()));
    }
    Ok(())
}

pub async fn only_objects_with_csi_volumes_are_sent(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let identity = suite.cluster.kubeconfig_as(SERVICE_ACCOUNT)?;
    let server =
        WebhookServer::start(&suite.cluster, "webhook-counted", &repo_root().join("config/admission.yaml"), &identity)?;
    let registration = register(admin, &server, "counted", json!({"matchLabels": {WEBHOOK_LABEL: "counted"}})).await?;
    wait_until_called(admin, "counted").await?;
    let namespace = "match-conditions";
    create_namespace(admin, namespace, "counted", &[]).await?;

    let mut plain = pod("no-csi", &[]);
    plain["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    let mut plain_deployment = deployment("no-csi", &[]);
    plain_deployment["spec"]["template"]["spec"]["volumes"] = json!(null);
    let without_csi = calls_during(&server, async {
        for (path, object) in [(pods_path(namespace), &plain), (deployments_path(namespace), &plain_deployment)] {
            let answer = create(admin, &path, object, false).await?;
            if answer.status != 201 {
                return Err(format!("{path}: {} {}", answer.status, answer.message()));
            }
        }
        Ok(())
    })
    .await?;
    let unlisted = pod("unlisted", &[("v", "any.e2e.inlineguard.dev")]);
    let unlisted = calls_during(&server, created(admin, namespace, &unlisted)).await?;
    let writable = pod_with_read_only("writable", SHARED_RESOURCE_DRIVER, None, Some(false));
    let writable = calls_during(&server, created(admin, namespace, &writable)).await?;
    let read_only = pod_with_read_only("read-only", SHARED_RESOURCE_DRIVER, Some(true), Some(true));
    let read_only = calls_during(&server, created(admin, namespace, &read_only)).await?;
    // No volume at all, one share asked for by annotation: injected (read-only already, so the
    // read-only webhook is not called after it), then validated.
    let mut annotated = pod("annotated", &[]);
    annotated["metadata"]["annotations"] = json!({INJECT_ANNOTATION: "sharedconfigmap/cluster-ca:/etc/ca"});
    let annotated = calls_during(&server, created(admin, namespace, &annotated)).await?;
    registration.remove().await?;
    drop(server);

    let counted = [
        ("two objects without CSI volumes", without_csi, (0, 0)),
        ("a pod with a volume of an unlisted driver", unlisted, (1, 0)),
        ("a pod with a writable volume of the read-only driver", writable, (1, 1)),
        ("a pod whose read-only driver volume and mount are read-only already", read_only, (1, 0)),
        ("a pod without volumes asking for a share by annotation", annotated, (1, 1)),
    ];
    let mut wrong = Vec::new();
    for (what, (validate, mutate), expected) in counted {
        println!("{what}: {validate} /validate, {mutate} /mutate");
        if (validate, mutate) != expected {
            wrong.push(format!(
                "{what}: expected {} /validate and {} /mutate, counted {validate} and {mutate}",
                expected.0, expected.1
            ));
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(wrong.join("\n")) }
}

/// One pod of the equivalence table.
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) pod: Value,
}

/// Every combination of: the read-only driver's volume `readOnly` (absent, false, true); the app
/// container's mount of it (none, absent, false, true); an init container's mount of it (none,
/// absent, true); and a second volume (none, a baseline driver, a privileged driver, a driver with
/// no CSIDriver object).
pub(crate) fn equivalence_cases(baseline: &str, privileged: &str) -> Vec<Case> {
    let volumes = [None, Some(false), Some(true)];
    let mounts = [None, Some(None), Some(Some(false)), Some(Some(true))];
    let init_mounts = [None, Some(None), Some(Some(true))];
    let others = [None, Some(baseline), Some(privileged), Some("unknown.equiv.e2e.inlineguard.dev")];
    let mut cases = Vec::new();
    for volume in volumes {
        for mount in mounts {
            for init_mount in init_mounts {
                for other in others {
                    let name = format!("case-{}", cases.len());
                    let pod = table_pod(&name, volume, mount, init_mount, other);
                    cases.push(Case { name, pod });
                }
            }
        }
    }
    cases
}

/// One pod of the table: the read-only driver's volume `shared` with `readOnly` as `volume`
/// says; the app's and an init container's mounts of it as `mount` and `init_mount` say (`None`:
/// no mount; `Some(None)`: a mount without `readOnly`); a scratch volume; and a second CSI
/// volume of `other`, mounted by the app.
fn table_pod(
    name: &str,
    volume: Option<bool>,
    mount: Option<Option<bool>>,
    init_mount: Option<Option<bool>>,
    other: Option<&str>,
) -> Value {
    let mount_of_shared = |read_only: Option<bool>| {
        let mut entry = json!({"name": "shared", "mountPath": "/shared"});
        if let Some(read_only) = read_only {
            entry["readOnly"] = json!(read_only);
        }
        entry
    };
    let mut shared = json!({"name": "shared", "csi": {"driver": SHARED_RESOURCE_DRIVER}});
    if let Some(read_only) = volume {
        shared["csi"]["readOnly"] = json!(read_only);
    }
    let mut volumes = vec![shared, json!({"name": "scratch", "emptyDir": {}})];
    let mut app_mounts = vec![json!({"name": "scratch", "mountPath": "/scratch"})];
    app_mounts.extend(mount.map(mount_of_shared));
    if let Some(driver) = other {
        volumes.push(json!({"name": "other", "csi": {"driver": driver}}));
        app_mounts.push(json!({"name": "other", "mountPath": "/other"}));
    }
    let mut app = container("app", &[]);
    app["volumeMounts"] = json!(app_mounts);
    let mut spec = json!({"containers": [app], "volumes": volumes});
    if let Some(read_only) = init_mount {
        let mut init = container("init", &[]);
        init["volumeMounts"] = json!([mount_of_shared(read_only)]);
        spec["initContainers"] = json!([init]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

/// What a client can tell about one answer, with the namespace's name and the token volume's
/// random suffix taken out.
pub(crate) fn observed(answer: &Answer, namespace: &str) -> Value {
    let observed = observed_as_sent(answer, namespace);
    serde_json::from_str(&without_token_suffix(&observed.to_string())).unwrap_or(observed)
}

/// `text` with every `kube-api-access-XXXXX` (the ServiceAccount admission plugin's token volume,
/// its suffix random per pod) made `kube-api-access-*`.
fn without_token_suffix(text: &str) -> String {
    const PREFIX: &str = "kube-api-access-";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(PREFIX) {
        out.push_str(&rest[..at + PREFIX.len()]);
        out.push('*');
        rest = rest[at + PREFIX.len()..].trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    }
    out.push_str(rest);
    out
}

fn observed_as_sent(answer: &Answer, namespace: &str) -> Value {
    let mounts = |list: &str| {
        let containers = answer.body["spec"][list].as_array().cloned().unwrap_or_default();
        containers.iter().map(|c| c["volumeMounts"].clone()).collect::<Vec<_>>()
    };
    json!({
        "status": answer.status,
        "message": answer.message().replace(namespace, "NS"),
        "warnings": answer.warnings.iter().map(|w| w.replace(namespace, "NS")).collect::<Vec<_>>(),
        "volumes": answer.body["spec"]["volumes"],
        "containers": mounts("containers"),
        "initContainers": mounts("initContainers"),
        "ephemeralContainers": mounts("ephemeralContainers"),
    })
}

/// Adds an ephemeral container mounting `shared` without `readOnly` to the existing pod `name`,
/// as a dry run, through the `ephemeralcontainers` subresource.
pub(crate) async fn add_debug_container(admin: &kube::Client, namespace: &str, name: &str) -> Result<Answer, String> {
    // The scheduler binds the pod meanwhile: a conflict means "read it again".
    for _ in 0..10 {
        let answer = try_add_debug_container(admin, namespace, name).await?;
        if answer.status != 409 {
            return Ok(answer);
        }
    }
    Err(format!("{namespace}/{name}: the ephemeral container's update conflicted ten times"))
}

async fn try_add_debug_container(admin: &kube::Client, namespace: &str, name: &str) -> Result<Answer, String> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    let request = http::Request::get(&path).body(Vec::new()).map_err(|e| e.to_string())?;
    let bytes = admin.request_text(request).await.map_err(|e| format!("GET {path}: {e}"))?;
    let mut object: Value = serde_json::from_str(&bytes).map_err(|e| e.to_string())?;
    let mut debug = container("debug", &[]);
    debug["volumeMounts"] = json!([{"name": "shared", "mountPath": "/shared"}]);
    object["spec"]["ephemeralContainers"] = json!([debug]);
    let uri = format!("{path}/ephemeralcontainers?dryRun=All");
    let request = http::Request::put(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&object).map_err(|e| e.to_string())?))
        .map_err(|e| e.to_string())?;
    let response = admin.send(request).await.map_err(|e| format!("PUT ephemeralcontainers: {e}"))?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await.map_err(|e| e.to_string())?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer { status, warnings: Vec::new(), body, audit_id: None })
}

pub async fn generated_conditions_change_no_answer(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    // Its own server, so that the calls counted are this table's only.
    let identity = suite.cluster.kubeconfig_as(SERVICE_ACCOUNT)?;
    let server =
        &WebhookServer::start(&suite.cluster, "webhook-equiv", &repo_root().join("config/admission.yaml"), &identity)?;
    // Broad: the mutating webhook called for every pod with a CSI volume, as before conditions
    // were generated. Generated: exactly what `webhooks` prints.
    let generated = generated_configurations(&server.config)?;
    let mut broad = generated.clone();
    let has_csi = broad[0]["webhooks"][0]["matchConditions"].clone();
    let read_only = broad[1]["webhooks"]
        .as_array_mut()
        .and_then(|webhooks| webhooks.iter_mut().find(|w| w["name"] == READ_ONLY_WEBHOOK))
        .ok_or("no read-only webhook generated")?;
    read_only["matchConditions"] = has_csi;
    let labels =
        [("pod-security.kubernetes.io/enforce", "baseline"), ("pod-security.kubernetes.io/warn", "restricted")];
    let mut registrations = Vec::new();
    for (name, configurations) in [("equiv-broad", broad), ("equiv-generated", generated)] {
        let selector = json!({"matchLabels": {WEBHOOK_LABEL: name}});
        registrations.push(register_configurations(admin, server.endpoint(), configurations, name, selector).await?);
        wait_until_called(admin, name).await?;
        create_namespace(admin, name, name, &labels).await?;
    }
    let baseline = "baseline.equiv.e2e.inlineguard.dev";
    let privileged = "privileged.equiv.e2e.inlineguard.dev";
    create_csi_driver(admin, baseline, Some("baseline")).await?;
    create_csi_driver(admin, privileged, Some("privileged")).await?;

    let cases = equivalence_cases(baseline, privileged);
    let mut answers: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    let mut calls = Vec::new();
    for (index, namespace) in ["equiv-broad", "equiv-generated"].into_iter().enumerate() {
        let answers = &mut answers[index];
        let counted = calls_during(server, async {
            for case in &cases {
                answers.push(observed(&create(admin, &pods_path(namespace), &case.pod, true).await?, namespace));
            }
            // The ephemeral-containers subresource: on a stored pod whose volume is read-only.
            let stored = pod_with_read_only("stored", SHARED_RESOURCE_DRIVER, Some(true), Some(true));
            let mut stored = stored;
            stored["spec"]["volumes"][0]["name"] = json!("shared");
            stored["spec"]["containers"][0]["volumeMounts"][0]["name"] = json!("shared");
            // Bound to a node that does not exist: no scheduler or kubelet update adds webhook calls.
            stored["spec"]["nodeName"] = json!("no-such-node.e2e.inlineguard.dev");
            let answer = create(admin, &pods_path(namespace), &stored, false).await?;
            if answer.status != 201 {
                return Err(format!("{namespace}/stored: {} {}", answer.status, answer.message()));
            }
            answers.push(observed(&add_debug_container(admin, namespace, "stored").await?, namespace));
            Ok(())
        })
        .await?;
        calls.push(counted);
    }
    for registration in registrations {
        registration.remove().await?;
    }

    let [broad, generated] = &answers;
    let mut differing = Vec::new();
    for (index, (b, g)) in broad.iter().zip(generated).enumerate() {
        if b != g {
            let name = cases.get(index).map_or("stored/ephemeralcontainers", |c| c.name.as_str());
            differing.push(format!("{name}:\n  broad     {b}\n  generated {g}"));
        }
    }
    let denied = broad.iter().filter(|a| a["status"] == 403).count();
    let warned = broad.iter().filter(|a| a["warnings"].as_array().is_some_and(|w| !w.is_empty())).count();
    let forced_debug = broad.last().is_some_and(|a| a["ephemeralContainers"][0][0]["readOnly"] == json!(true));
    println!(
        "{} answers each, identical ({denied} denied, {warned} warned); calls (/validate, /mutate): broad {:?}, generated {:?}",
        broad.len(),
        calls[0],
        calls[1]
    );
    if !differing.is_empty() {
        return Err(format!("{} answers differ:\n{}", differing.len(), differing.join("\n")));
    }
    // The table must exercise what it claims: denials, warnings and a forced ephemeral container.
    if denied == 0 || warned == 0 || !forced_debug {
        return Err(format!(
            "the table proved too little: {denied} denied, {warned} warned, debug container forced: {forced_debug} ({})",
            broad.last().map(Value::to_string).unwrap_or_default()
        ));
    }
    // Every pod created goes through /validate (the table's and the stored one); through the
    // generated condition, /mutate is called exactly for the pods forcing has something to patch
    // and for the ephemeral container (the stored pod is read-only already), where the broad
    // condition calls it for every one.
    // Spelled out, not computed with the product's own rule. Every one of the 144 pods (3 states
    // of the volume's readOnly × 4 of the app's mount × 3 of the init container's mount × 4 other
    // volumes) uses the read-only driver; forcing has nothing to patch only where the volume is
    // `readOnly: true` and each mount is absent or `readOnly: true`: 1 × 2 × 2 × 4 = 16 pods.
    // So /mutate is called for 128 of them, plus the ephemeral container.
    if cases.len() != 144 {
        return Err(format!("the table has {} pods, the counts below are for 144", cases.len()));
    }
    let expected = [(145, 146), (145, 129)];
    if calls != expected {
        return Err(format!(
            "calls (/validate, /mutate): expected broad {:?} and generated {:?}, got {:?} and {:?}",
            expected[0], expected[1], calls[0], calls[1]
        ));
    }
    Ok(())
}

pub async fn a_stale_mutating_configuration_is_refused_not_silently_admitted(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let server = &suite.shared;
    let namespace = "stale-read-only";
    // The configuration as it was before the shared-resource driver was listed.
    let before = suite.cluster.run_dir().join("admission-before.yaml");
    std::fs::write(&before, "readOnlyDrivers: [other.e2e.inlineguard.dev]\n").map_err(|e| e.to_string())?;
    let mut configurations = generated_configurations(&server.config)?;
    configurations[1] = generated_configurations(&before)?.swap_remove(1);
    let selector = json!({"matchLabels": {WEBHOOK_LABEL: "stale"}});
    let stale = register_configurations(admin, server.endpoint(), configurations, "stale", selector.clone()).await?;
    create_namespace(admin, namespace, "stale", &[]).await?;

    let writable = pod_with_read_only("writable", SHARED_RESOURCE_DRIVER, None, None);
    let expected = denied_by(
        "pods.csi-volume-admission.inlineguard.dev",
        "writable has inline volumes that must be read-only but are not: volume \"v\" (CSIDriver sharedresource.csi.inlineguard.dev), \
         mount of \"v\" in container \"app\". The read-only webhook did not force them; its MutatingWebhookConfiguration is missing \
         or older than the readOnlyDrivers list (regenerate it with `csi-volume-admission webhooks`)",
    );
    let refused = answered_with(admin, namespace, &writable, 403).await?;
    stale.remove().await?;
    if refused.message() != expected {
        return Err(format!("expected 403 {expected:?}, got {:?}", refused.message()));
    }

    // Regenerated: the same pod is admitted, forced read-only.
    let current = register(admin, server, "regenerated", selector).await?;
    let forced = answered_with(admin, namespace, &writable, 201).await;
    current.remove().await?;
    let forced = forced?;
    let volume = &forced.body["spec"]["volumes"][0]["csi"]["readOnly"];
    let mount = &forced.body["spec"]["containers"][0]["volumeMounts"][0]["readOnly"];
    if volume != &json!(true) || mount != &json!(true) {
        return Err(format!("admitted without forcing: volume readOnly {volume}, mount readOnly {mount}"));
    }
    println!("stale configuration: 403 naming the volume and its mount; regenerated: admitted and forced");
    Ok(())
}

/// Creates `object` as a dry run until the apiserver answers `status` (a new webhook
/// configuration takes the apiserver a moment to load).
async fn answered_with(admin: &kube::Client, namespace: &str, object: &Value, status: u16) -> Result<Answer, String> {
    dry_run_until(admin, &pods_path(namespace), object, |answer| answer.status == status).await
}
