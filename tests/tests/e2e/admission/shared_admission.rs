//! SharedResourceAdmission through the real apiserver and the generated webhook entries: what the
//! driver would refuse at mount is refused at creation, with the driver's words: a
//! SharedProjection whose paths collide (on create and on update), a pod whose volume attributes
//! the driver refuses, a pod naming a share that does not exist, a pod whose service account RBAC
//! does not let `use` its share; a workload with such a template is admitted with the same words
//! as a warning, and admitted pods follow once the RoleBinding exists. A burst of 100 pods asks
//! RBAC a handful of times, counted at the webhook. Shares asked for by annotation are injected,
//! and judged like written ones. A pod mounting a share with `subPath` is admitted with the
//! warning that it will never see the share change.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{
    Answer, Outcome, POD_WEBHOOK, SHARED_RESOURCE_DRIVER, Suite, WORKLOAD_WEBHOOK, create, create_namespace, denied_by,
    deployment, deployments_path, dry_run_until, pod, pods_path, send, wait_established,
};

const NAMESPACE: &str = "shared-rules";
const PROJECTIONS_WEBHOOK: &str = "sharedprojections.csi-volume-admission.inlineguard.dev";

fn projections_path() -> String {
    format!("/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/{NAMESPACE}/sharedprojections")
}

fn projection(name: &str, second_path: &str) -> Value {
    json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
           "metadata": {"name": name},
           "spec": {"sources": [
               {"sharedSecret": {"name": "db", "items": [{"key": "password", "path": "conf"}]}},
               {"sharedConfigMap": {"name": "cfg", "items": [{"key": "level", "path": second_path}]}}]}})
}

/// PATCHes `patch` (a JSON merge patch) onto the object at `path`.
async fn merge_patch(client: &kube::Client, path: &str, patch: &Value) -> Result<Answer, String> {
    let request = http::Request::patch(path)
        .header("content-type", "application/merge-patch+json")
        .body(kube::client::Body::from(serde_json::to_vec(patch).map_err(|e| e.to_string())?))
        .map_err(|e| e.to_string())?;
    send(client, request).await
}

fn expect(what: &str, answer: &Answer, status: u16, message: &str) -> Outcome {
    if answer.status != status || (!message.is_empty() && answer.message() != message) {
        return Err(format!("{what}: expected {status} {message:?}, got {} {:?}", answer.status, answer.message()));
    }
    Ok(())
}

pub async fn the_drivers_refusals_come_at_creation(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    wait_established(admin, "sharedprojections.sharedresource.inlineguard.dev").await?;
    create_namespace(admin, NAMESPACE, "shared", &[]).await?;

    let collision = "sources[0] (sharedSecret \"db\") and sources[1] (sharedConfigMap \"cfg\") collide at path \"conf/level\": \"conf\" is a file";
    let refused = create(admin, &projections_path(), &projection("colliding", "conf/level"), false).await?;
    expect("a colliding projection", &refused, 422, &denied_by(PROJECTIONS_WEBHOOK, collision))?;
    let created = create(admin, &projections_path(), &projection("app", "level"), false).await?;
    expect("a well-formed projection", &created, 201, "")?;
    let update = json!({"spec": projection("app", "conf/level")["spec"]});
    let updated = merge_patch(admin, &format!("{}/app", projections_path()), &update).await?;
    expect("an update making the projection collide", &updated, 422, &denied_by(PROJECTIONS_WEBHOOK, collision))?;

    let typo = "volumeAttributes[\"refreshResouce\"] is not an attribute of this driver: a sharedSecret volume takes \"sharedSecret\", \"refreshResource\" and \"optional\" only";
    let attributes = json!({"sharedSecret": "db", "refreshResouce": "false"});
    let mut bad_pod = pod("typo", &[("shared", SHARED_RESOURCE_DRIVER)]);
    bad_pod["spec"]["volumes"][0]["csi"]["volumeAttributes"] = attributes.clone();
    let message =
        format!("typo has volumes the shared-resource driver would refuse at mount: volume \"shared\": {typo}");
    let answer = create(admin, &pods_path(NAMESPACE), &bad_pod, true).await?;
    expect("a pod with a misspelt attribute", &answer, 422, &denied_by(POD_WEBHOOK, &message))?;

    let mut bad_deployment = deployment("typo", &[("shared", SHARED_RESOURCE_DRIVER)]);
    bad_deployment["spec"]["template"]["spec"]["volumes"][0]["csi"]["volumeAttributes"] = attributes;
    let answer = create(admin, &deployments_path(NAMESPACE), &bad_deployment, true).await?;
    expect("a deployment with a misspelt attribute", &answer, 201, "")?;
    if !answer.warnings.contains(&message) {
        return Err(format!("{WORKLOAD_WEBHOOK}: expected the warning {message:?}, got {:?}", answer.warnings));
    }

    let answer =
        create(admin, &pods_path(NAMESPACE), &pod("good", &[("shared", SHARED_RESOURCE_DRIVER)]), true).await?;
    expect("a pod naming a share", &answer, 201, "")?;
    if !answer.warnings.is_empty() {
        return Err(format!("a pod naming a share: expected no warning, got {:?}", answer.warnings));
    }

    let mut sub_path = pod("sub-path", &[("shared", SHARED_RESOURCE_DRIVER)]);
    sub_path["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("ca.crt");
    let answer = create(admin, &pods_path(NAMESPACE), &sub_path, true).await?;
    expect("a pod mounting a share with subPath", &answer, 201, "")?;
    let warning = "container \"app\" mounts volume \"shared\" of CSIDriver sharedresource.csi.inlineguard.dev with \
        subPath \"ca.crt\": it will never see an update or a revocation of the volume's content (kubelet binds what the \
        path was when the container started); mount the volume without subPath and read the file under its mountPath";
    if answer.warnings != [warning] {
        return Err(format!("{POD_WEBHOOK}: expected exactly the warning {warning:?}, got {:?}", answer.warnings));
    }
    access_is_checked_at_creation(suite).await
}

/// A pod of service account `app` reading SharedSecret `share`.
fn reader(name: &str, share: &str) -> Value {
    let mut object = pod(name, &[("shared", SHARED_RESOURCE_DRIVER)]);
    object["spec"]["serviceAccountName"] = json!("app");
    object["spec"]["volumes"][0]["csi"]["volumeAttributes"] = json!({"sharedSecret": share});
    object
}

/// A pod of the burst: service account `burst`, never asked about before the burst.
fn burst_pod(index: usize) -> Value {
    let mut object = reader(&format!("burst-{index}"), "rules-db");
    object["spec"]["serviceAccountName"] = json!("burst");
    object
}

/// `share_lookups` of `question` on the suite's webhook, summed by how they were served.
fn lookups(suite: &Suite, question: &str) -> Result<BTreeMap<String, u64>, String> {
    let prefix = format!("csi_volume_admission_share_lookups_total{{question=\"{question}\",served=\"");
    let mut counts = BTreeMap::new();
    for line in suite.shared.metrics()?.lines().filter(|line| line.starts_with(&prefix)) {
        let served = line[prefix.len()..].split('"').next().unwrap_or_default().to_string();
        let count = line.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()).unwrap_or_default() as u64;
        *counts.entry(served).or_default() += count;
    }
    Ok(counts)
}

/// The SubjectAccessReviews about `user` in the apiserver's audit log so far.
fn reviews_about(suite: &Suite, user: &str) -> Result<usize, String> {
    Ok(suite.cluster.audit_events()?.iter().filter(|event| event.asks_about(user)).count())
}

async fn access_is_checked_at_creation(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let shares = "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets";
    let share = json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
                       "metadata": {"name": "rules-db"}, "spec": {"secretRef": {"namespace": NAMESPACE, "name": "db"}}});
    expect("the share", &create(admin, shares, &share, false).await?, 201, "")?;
    let accounts = format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts");
    for name in ["app", "burst"] {
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
        expect("an account", &create(admin, &accounts, &account, false).await?, 201, "")?;
    }

    let missing = create(admin, &pods_path(NAMESPACE), &reader("absent", "rules-absent"), true).await?;
    let message = "absent has volumes the shared-resource driver would refuse at mount: volume \"shared\": SharedSecret \"rules-absent\" not found";
    expect("a pod naming a share that does not exist", &missing, 422, &denied_by(POD_WEBHOOK, message))?;
    // Marked optional, a share that does not exist is no refusal; a share its pod may not use
    // still is.
    let mut optional = reader("optional", "rules-absent");
    optional["spec"]["volumes"][0]["csi"]["volumeAttributes"]["optional"] = json!("true");
    let refused = create(admin, &pods_path(NAMESPACE), &optional, true).await?;
    let message = format!(
        "optional has volumes the shared-resource driver would refuse at mount: volume \"shared\": service account \
         {NAMESPACE}/app may not use SharedSecret \"rules-absent\": grant it the verb \"use\" on \
         sharedsecrets.sharedresource.inlineguard.dev \"rules-absent\" (a Role and RoleBinding in namespace {NAMESPACE})"
    );
    expect(
        "an optional volume of a missing share its pod may not use",
        &refused,
        403,
        &denied_by(POD_WEBHOOK, &message),
    )?;

    let denial = format!(
        "service account {NAMESPACE}/app may not use SharedSecret \"rules-db\": grant it the verb \"use\" on sharedsecrets.sharedresource.inlineguard.dev \"rules-db\" (a Role and RoleBinding in namespace {NAMESPACE})"
    );
    let refusal = |name: &str| {
        format!("{name} has volumes the shared-resource driver would refuse at mount: volume \"shared\": {denial}")
    };
    let refused = create(admin, &pods_path(NAMESPACE), &reader("early", "rules-db"), true).await?;
    expect("a pod whose account may not use the share", &refused, 403, &denied_by(POD_WEBHOOK, &refusal("early")))?;

    let mut early = deployment("early", &[]);
    early["spec"]["template"]["spec"] = reader("early", "rules-db")["spec"].clone();
    let answer = create(admin, &deployments_path(NAMESPACE), &early, false).await?;
    expect("a deployment created before its RoleBinding", &answer, 201, "")?;
    if !answer.warnings.contains(&refusal("early")) {
        return Err(format!(
            "{WORKLOAD_WEBHOOK}: expected the warning {:?}, got {:?}",
            refusal("early"),
            answer.warnings
        ));
    }

    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-rules-db"},
        "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"],
                   "resourceNames": ["rules-db", "rules-later"], "verbs": ["use"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "app-uses-rules-db"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-rules-db"},
        "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": NAMESPACE},
                     {"kind": "ServiceAccount", "name": "burst", "namespace": NAMESPACE}]});
    let rbac = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}");
    expect("the role", &create(admin, &format!("{rbac}/roles"), &role, false).await?, 201, "")?;
    expect("the binding", &create(admin, &format!("{rbac}/rolebindings"), &binding, false).await?, 201, "")?;
    // The refusal is held for up to 5 s: the early Deployment's pod is admitted once it expires
    // (waited for, bounded far above the hold).
    dry_run_until(admin, &pods_path(NAMESPACE), &reader("early-0", "rules-db"), |answer| answer.status == 201).await?;
    // Granted a share that does not exist yet: optional, admitted; required, refused as missing.
    let mut later = reader("later", "rules-later");
    later["spec"]["volumes"][0]["csi"]["volumeAttributes"]["optional"] = json!("true");
    dry_run_until(admin, &pods_path(NAMESPACE), &later, |answer| answer.status == 201).await?;
    let required = create(admin, &pods_path(NAMESPACE), &reader("later", "rules-later"), true).await?;
    let message = "later has volumes the shared-resource driver would refuse at mount: volume \"shared\": SharedSecret \"rules-later\" not found";
    expect(
        "a required volume of a granted share that does not exist",
        &required,
        422,
        &denied_by(POD_WEBHOOK, message),
    )?;

    let before = lookups(suite, "access")?;
    let burst_user = format!("system:serviceaccount:{NAMESPACE}:burst");
    let reviews_before = reviews_about(suite, &burst_user)?;
    let started = Instant::now();
    let (path, pods): (String, Vec<Value>) = (pods_path(NAMESPACE), (0..100).map(burst_pod).collect());
    let burst = pods.iter().map(|pod| create(admin, &path, pod, true));
    let answers: Vec<Result<Answer, String>> = futures_util::future::join_all(burst).await;
    let elapsed = started.elapsed();
    for answer in answers {
        expect("a pod of the burst", &answer?, 201, "")?;
    }
    let after = lookups(suite, "access")?;
    let delta = |served: &str| {
        let (before, after) =
            (before.get(served).copied().unwrap_or_default(), after.get(served).copied().unwrap_or_default());
        after
            .checked_sub(before)
            .ok_or_else(|| format!("lookups served {served:?}: the counter went back from {before} to {after}"))
    };
    let (asked, held, joined) = (delta("asked")?, delta("held")?, delta("joined")?);
    // Counted again where the webhook cannot count: the apiserver's audit log of the reviews it
    // was sent about the burst's account. Its ResponseComplete events are written once the
    // answer has gone out, so the last one may land just after the webhook counted its answer:
    // the log is read again for a while before the two counts are said to differ.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reviewed = reviews_about(suite, &burst_user)? - reviews_before;
    while reviewed < asked as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        reviewed = reviews_about(suite, &burst_user)? - reviews_before;
    }
    if reviewed != asked as usize {
        return Err(format!(
            "the webhook counts {asked} SubjectAccessReviews for the burst, the apiserver's audit log {reviewed}"
        ));
    }
    println!(
        "shared admission: 100 pods of one account and share over {elapsed:?}: {asked} SubjectAccessReviews, {held} held answers, {joined} joined"
    );
    // The burst's account had never been asked about: its first pod asks.
    if asked == 0 {
        return Err(format!("100 pods of a new account asked no SubjectAccessReview ({held} held, {joined} joined)"));
    }
    if asked + held + joined != 100 {
        return Err(format!("100 pods, but {asked} asked + {held} held + {joined} joined access lookups"));
    }
    // An answer is held 5 s and asked once at a time: at most one review per 5 s the burst
    // lasted, plus the first, however slow the machine (a slow burst only lasts longer).
    let bound = elapsed.as_secs() / 5 + 1;
    if asked > bound {
        return Err(format!(
            "a burst of 100 pods over {elapsed:?} asked {asked} SubjectAccessReviews (at most {bound})"
        ));
    }
    shares_are_injected_by_annotation(suite).await
}

const INJECTION_WEBHOOK: &str = "inject.csi-volume-admission.inlineguard.dev";

/// A pod of service account `account` with one container mounting a scratch volume at `/data`,
/// asking for `annotation` to be injected.
fn annotated(name: &str, account: &str, annotation: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "annotations": {"sharedresource.inlineguard.dev/inject": annotation}},
           "spec": {"serviceAccountName": account, "containers": [{"name": "app", "image": "busybox",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "emptyDir": {}}]}})
}

/// The injection webhook through the real apiserver (dry-run creates, the answers the client
/// sees): an annotated pod is admitted with the volume and mount; a pod that already has them is
/// admitted unchanged (one volume, one mount: injecting is idempotent); a malformed entry and a
/// taken mount path are refused by the injection webhook naming them; the injected share is then
/// judged like a written one (an account without `use` is refused by the pods webhook); a
/// Deployment whose template asks for a missing share is warned.
async fn shares_are_injected_by_annotation(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let path = pods_path(NAMESPACE);
    let answer = create(admin, &path, &annotated("injected", "app", "sharedsecret/rules-db:/etc/db"), true).await?;
    expect("an annotated pod", &answer, 201, "")?;
    let volume = json!({"name": "inject-secret-rules-db", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true,
                        "volumeAttributes": {"sharedSecret": "rules-db"}}});
    let mount = json!({"name": "inject-secret-rules-db", "mountPath": "/etc/db", "readOnly": true});
    let has =
        |list: &Value, wanted: &Value| list.as_array().into_iter().flatten().filter(|item| *item == wanted).count();
    let (volumes, mounts) = (&answer.body["spec"]["volumes"], &answer.body["spec"]["containers"][0]["volumeMounts"]);
    if has(volumes, &volume) != 1 || has(mounts, &mount) != 1 {
        return Err(format!("the annotated pod was not injected once: volumes {volumes}, mounts {mounts}"));
    }

    let mut injected_already = annotated("again", "app", "sharedsecret/rules-db:/etc/db");
    injected_already["spec"]["volumes"].as_array_mut().ok_or("no volumes")?.push(volume.clone());
    injected_already["spec"]["containers"][0]["volumeMounts"].as_array_mut().ok_or("no mounts")?.push(mount.clone());
    let answer = create(admin, &path, &injected_already, true).await?;
    expect("a pod injected already", &answer, 201, "")?;
    let (volumes, mounts) = (&answer.body["spec"]["volumes"], &answer.body["spec"]["containers"][0]["volumeMounts"]);
    if has(volumes, &volume) != 1 || has(mounts, &mount) != 1 {
        return Err(format!("injecting twice changed the pod: volumes {volumes}, mounts {mounts}"));
    }

    let prefix = "annotation \"sharedresource.inlineguard.dev/inject\": entry";
    let malformed = create(admin, &path, &annotated("malformed", "app", "secret/rules-db:/etc/db"), true).await?;
    let message = format!(
        "malformed: {prefix} \"secret/rules-db:/etc/db\": kind \"secret\" is not one of \"sharedsecret\", \"sharedconfigmap\", \"projection\""
    );
    expect("a malformed annotation", &malformed, 422, &denied_by(INJECTION_WEBHOOK, &message))?;
    let taken = create(admin, &path, &annotated("taken", "app", "sharedsecret/rules-db:/data"), true).await?;
    let message = format!(
        "taken: {prefix} \"sharedsecret/rules-db:/data\": container \"app\" already mounts volume \"data\" at \"/data\""
    );
    expect("a mount path already taken", &taken, 422, &denied_by(INJECTION_WEBHOOK, &message))?;

    let stranger =
        create(admin, &path, &annotated("stranger", "default", "sharedsecret/rules-db:/etc/db"), true).await?;
    let message = format!(
        "stranger has volumes the shared-resource driver would refuse at mount: volume \"inject-secret-rules-db\": \
         service account {NAMESPACE}/default may not use SharedSecret \"rules-db\": grant it the verb \"use\" on \
         sharedsecrets.sharedresource.inlineguard.dev \"rules-db\" (a Role and RoleBinding in namespace {NAMESPACE})"
    );
    expect("an injected share the account may not use", &stranger, 403, &denied_by(POD_WEBHOOK, &message))?;

    let mut workload = deployment("asks", &[]);
    workload["spec"]["template"] = json!({"metadata": {"labels": {"app": "asks"},
        "annotations": {"sharedresource.inlineguard.dev/inject": "sharedsecret/rules-absent:/etc/absent"}},
        "spec": annotated("asks", "app", "")["spec"].clone()});
    let answer = create(admin, &deployments_path(NAMESPACE), &workload, true).await?;
    expect("a deployment asking for a missing share", &answer, 201, "")?;
    let warning = "asks has volumes the shared-resource driver would refuse at mount: volume \"inject-secret-rules-absent\": \
                   SharedSecret \"rules-absent\" not found";
    if !answer.warnings.iter().any(|w| w == warning) {
        return Err(format!("{WORKLOAD_WEBHOOK}: expected the warning {warning:?}, got {:?}", answer.warnings));
    }
    let template = &answer.body["spec"]["template"]["spec"]["volumes"];
    if template.as_array().is_none_or(|volumes| volumes.len() != 1) {
        return Err(format!("the Deployment's template was changed: volumes {template}"));
    }
    println!(
        "share injection: injected once, idempotent, malformed and taken refused, injected share judged, workload warned"
    );
    Ok(())
}
