//! Rollout on change: the read-grants controller as its shipped ServiceAccount, with
//! `rollout-on-change.yaml` applied and `--rollout-on-change`, against the real apiserver and
//! kube-controller-manager's Deployment controller. A labelled Deployment whose share's Secret
//! changes is restarted once (its template's restartedAt set once, and the Deployment controller's
//! ReplicaSets, an independent count, one more); a label-only change, the share's deletion (a revocation) and its return
//! with the same content restart nothing; a workload whose pods may not `use` a share it mounts
//! is never restarted for it, and its record never names it (not at first sight, not after a
//! change), while the share it may use is recorded; two shares of Secrets with the same content
//! are recorded with different versions, none of them the content's plain SHA-256, and under
//! the id of the key the controller made in its Secret; an unlabelled one is never touched; a namespace labelling more
//! workloads than the controller follows gets only its bound while another namespace is served;
//! a change made while the controller is down restarts once when it is back.

use std::time::{Duration, Instant};

use inline_guard_tests::cluster::ChildProcess;
use inline_guard_tests::node::plugin::start_read_grants_as;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use sharedresource_csi_driver::DRIVER_NAME;
use sharedresource_csi_driver::controllers::rollout::plan::{
    OBSERVED_ANNOTATION, RESTART_LABEL, RESTARTED_AT_ANNOTATION,
};

use crate::shares::{WITHIN, apply_file, create_object, create_shared_secret, create_use_grant, shared_secrets};
use crate::support::{
    Outcome, READ_GRANTS_USER, Suite, create, create_namespace, create_service_account, deployments_path,
    wait_established,
};

const OWNER: &str = "rollout-owner";
const APP: &str = "rollout-app";
const DENIED: &str = "rollout-denied";
const FLOOD: &str = "rollout-flood";
/// A share of a Secret holding what [`DB`]'s first holds.
const TWIN: &str = "rollout-twin";

/// The id of the key in the controller's Secret, as records carry it.
async fn record_key_id(admin: &kube::Client) -> Result<String, String> {
    let secrets = Api::<Secret>::namespaced(admin.clone(), "inline-guard-driver");
    let secret = secrets.get("sharedresource-rollout-key").await.map_err(|e| format!("the key's Secret: {e}"))?;
    let bytes = secret.data.and_then(|data| data.get("key").cloned()).ok_or("the key's Secret holds no key")?;
    let key = sharedresource_csi_driver::controllers::rollout::content_version::RecordKey::from_bytes(&bytes.0)?;
    Ok(key.id().to_owned())
}

/// The first 16 hex digits of the SHA-256 of `entries`, each key and value length-prefixed: what
/// records held before they were keyed, which anyone could compute from a guess.
fn plain_digest(entries: &[(&str, &[u8])]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for (key, value) in entries {
        context.update(&(key.len() as u64).to_be_bytes());
        context.update(key.as_bytes());
        context.update(&(value.len() as u64).to_be_bytes());
        context.update(value);
    }
    context.finish().as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}
const DB: &str = "rollout-db";
const CONTROL: &str = "rollout-control";
/// The controller's bound per namespace in this scenario.
const PER_NAMESPACE: usize = 3;
/// How many workloads [`FLOOD`] labels: more than the bound.
const FLOODED: usize = 5;

fn deployment(name: &str, share: &str, labelled: bool) -> Value {
    deployment_of(name, &[share], labelled)
}

/// A Deployment whose pods mount each of `shares`.
fn deployment_of(name: &str, shares: &[&str], labelled: bool) -> Value {
    let labels = if labelled { json!({RESTART_LABEL: "true"}) } else { json!({}) };
    let volumes: Vec<Value> = shares
        .iter()
        .map(|share| json!({"name": share, "csi": {"driver": DRIVER_NAME, "readOnly": true, "volumeAttributes": {"sharedSecret": share}}}))
        .collect();
    let mounts: Vec<Value> =
        shares.iter().map(|share| json!({"name": share, "mountPath": format!("/{share}")})).collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "serviceAccountName": "reader",
                    "containers": [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": mounts}],
                    "volumes": volumes
                }
            }
        }
    })
}

/// What the apiserver holds of a Deployment: its template's restartedAt, its record, and how many
/// ReplicaSets the Deployment controller made for it (one per template it rolled out). (Not its
/// generation: a Deployment's moves with its annotations too.)
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    restarted_at: Option<String>,
    observed: Option<String>,
    replica_sets: usize,
}

async fn seen(admin: &kube::Client, namespace: &str, name: &str) -> Result<Seen, String> {
    let deployment = Api::<Deployment>::namespaced(admin.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("reading Deployment {namespace}/{name}: {e}"))?;
    let template = deployment.spec.and_then(|spec| spec.template.metadata).and_then(|meta| meta.annotations);
    let sets = Api::<ReplicaSet>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .map_err(|e| format!("listing the ReplicaSets of {namespace}/{name}: {e}"))?;
    Ok(Seen {
        replica_sets: sets.items.len(),
        restarted_at: template.and_then(|a| a.get(RESTARTED_AT_ANNOTATION).cloned()),
        observed: deployment.metadata.annotations.and_then(|a| a.get(OBSERVED_ANNOTATION).cloned()),
    })
}

/// Waits (up to [`WITHIN`]) until `namespace/name` is as `wanted` says; what it is then.
async fn wait_for(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    what: &str,
    wanted: impl Fn(&Seen) -> bool,
) -> Result<Seen, String> {
    let started = Instant::now();
    loop {
        let now = seen(admin, namespace, name).await?;
        if wanted(&now) {
            println!("{namespace}/{name}: {what} after {:?}", started.elapsed());
            return Ok(now);
        }
        if started.elapsed() > WITHIN {
            return Err(format!("{namespace}/{name}: not {what} within {WITHIN:?}; it is {now:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn set_secret(admin: &kube::Client, name: &str, patch: Value) -> Outcome {
    Api::<Secret>::namespaced(admin.clone(), OWNER)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| format!("changing Secret {OWNER}/{name}: {e}"))
}

/// Changes the control share's Secret and waits until its workload is restarted again: a pass of
/// the controller that saw everything done before.
async fn control_round(admin: &kube::Client, value: &str) -> Outcome {
    let before = seen(admin, APP, CONTROL).await?.restarted_at;
    set_secret(admin, CONTROL, json!({"stringData": {"k": value}})).await?;
    wait_for(admin, APP, CONTROL, "restarted for the control change", |s| s.restarted_at != before).await.map(drop)
}

fn start_controller(suite: &Suite) -> Result<ChildProcess, String> {
    let kubeconfig = suite.cluster.kubeconfig_as(READ_GRANTS_USER)?;
    let bound = PER_NAMESPACE.to_string();
    // The suite's own controller tells the nodes of grant changes; a second would write their
    // objects too (the shares scenario counts those writes). It runs beside the suite's, which
    // leads on the shipped Lease: this one elects no leader.
    let args = [
        "--rollout-on-change",
        "--rollout-workloads-per-namespace",
        bound.as_str(),
        "--no-access-notices",
        "--no-leader-election",
    ];
    start_read_grants_as("read-grants-rollout", &kubeconfig, suite.cluster.run_dir(), &args)
}

async fn flood_seen(admin: &kube::Client) -> Result<Vec<Seen>, String> {
    let mut all = Vec::new();
    for i in 0..FLOODED {
        all.push(seen(admin, FLOOD, &format!("f{i}")).await?);
    }
    Ok(all)
}

pub async fn labelled_workloads_restart_once_per_change_never_for_a_revocation(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/rollout-on-change.yaml").await?;
    wait_established(admin, "sharedsecrets.sharedresource.inlineguard.dev").await?;
    for namespace in [OWNER, APP, DENIED, FLOOD] {
        create_namespace(admin, namespace, "none", &[]).await?;
        create_service_account(admin, namespace, "reader").await?;
    }
    for (name, value) in [(DB, "v1"), (CONTROL, "c0")] {
        let secret =
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"k": value}});
        create_object(suite, &format!("/api/v1/namespaces/{OWNER}/secrets"), secret).await?;
        create_shared_secret(suite, name, OWNER, name).await?;
    }
    // A share of a Secret with DB's content, under another name.
    let twin = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": TWIN}, "stringData": {"k": "v1"}});
    create_object(suite, &format!("/api/v1/namespaces/{OWNER}/secrets"), twin).await?;
    create_shared_secret(suite, TWIN, OWNER, TWIN).await?;
    // APP and FLOOD may use every share; DENIED only TWIN (whose Secret never changes here).
    for namespace in [APP, FLOOD] {
        for share in [DB, CONTROL, TWIN] {
            create_use_grant(suite, namespace, "sharedsecrets", share).await?;
        }
    }
    create_use_grant(suite, DENIED, "sharedsecrets", TWIN).await?;
    let mut workloads = vec![
        (APP, deployment("web", DB, true)),
        (APP, deployment(CONTROL, CONTROL, true)),
        (APP, deployment("unlabelled", DB, false)),
        (APP, deployment_of("twins", &[DB, TWIN], true)),
        (DENIED, deployment_of("web", &[DB, TWIN], true)),
    ];
    workloads.extend((0..FLOODED).map(|i| (FLOOD, deployment(&format!("f{i}"), DB, true))));
    for (namespace, object) in workloads {
        create_object(suite, &deployments_path(namespace), object).await?;
    }
    let mut controller = start_controller(suite)?;

    // First sight: recorded, not restarted.
    let recorded = |s: &Seen| s.observed.is_some();
    let first = wait_for(admin, APP, "web", "recorded", recorded).await?;
    wait_for(admin, APP, CONTROL, "recorded", recorded).await?;
    let denied_first = wait_for(admin, DENIED, "web", "recorded", recorded).await?;
    for (namespace, seen) in [(APP, &first), (DENIED, &denied_first)] {
        if seen.restarted_at.is_some() {
            return Err(format!("{namespace}/web was restarted on first sight: {seen:?}"));
        }
    }
    // FLOOD's: as many recorded as the bound (a workload created just before a change and not
    // yet recorded takes the changed content as its first sight, docs/driver.md).
    let started = Instant::now();
    while flood_seen(admin).await?.iter().filter(|s| s.observed.is_some()).count() < PER_NAMESPACE {
        if started.elapsed() > WITHIN {
            return Err(format!("{FLOOD}: not {PER_NAMESPACE} workloads recorded within {WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The record: under the id of the key in the controller's Secret, DB's version.
    let key_id = record_key_id(admin).await?;
    let db_entry = first.observed.clone().unwrap_or_default();
    if !db_entry.starts_with(&format!("@{key_id},SharedSecret/rollout-db=")) {
        return Err(format!("the record of {APP}/web is {db_entry:?}, not under key {key_id}"));
    }
    // DENIED's workload: recorded (TWIN, which it may use), DB never named.
    let denied_record = denied_first.observed.clone().unwrap_or_default();
    if !denied_record.contains("SharedSecret/rollout-twin=") || denied_record.contains(DB) {
        return Err(format!("{DENIED}/web's record names what it may not use, or not what it may: {denied_record:?}"));
    }
    // Two Secrets of the same content: two versions, neither the content's plain digest.
    let twins = wait_for(admin, APP, "twins", "recorded", recorded).await?.observed.unwrap_or_default();
    let version = |share: &str| {
        twins.split(',').find_map(|entry| entry.strip_prefix(&format!("SharedSecret/{share}="))).map(str::to_owned)
    };
    let (db_version, twin_version) = (version(DB), version(TWIN));
    if db_version.is_none() || db_version == twin_version {
        return Err(format!("the same content under two shares reads alike in the record {twins:?}"));
    }
    if let Some(version) = &db_version
        && plain_digest(&[("k", b"v1")]).starts_with(version.as_str())
    {
        return Err(format!("the record {twins:?} holds the content's plain SHA-256"));
    }

    // The Secret changes: the labelled workload restarts once.
    let changed = Instant::now();
    set_secret(admin, DB, json!({"stringData": {"k": "v2"}})).await?;
    wait_for(admin, APP, "web", "restarted", |s| s.restarted_at.is_some()).await?;
    println!("restarted {:?} after the Secret's update", changed.elapsed());
    // The Deployment controller rolled it: a second ReplicaSet.
    let restarted = wait_for(admin, APP, "web", "rolled out anew", |s| s.replica_sets == 2).await?;
    if restarted.observed == first.observed {
        return Err(format!("after one change {APP}/web is {restarted:?} (first {first:?})"));
    }
    // Its pods may not use the share: neither restarted nor recorded (seen after a control round,
    // a pass that came after the change).
    control_round(admin, "c0b").await?;
    let denied = seen(admin, DENIED, "web").await?;
    if denied != denied_first {
        return Err(format!(
            "{DENIED}/web, whose pods may not use the changed share, changed: {denied:?}, was {denied_first:?}"
        ));
    }

    // A label-only change, then the share deleted (a revocation), then back with the same
    // content: no restart, each seen past by a control round.
    control_round(admin, "c1").await?;
    set_secret(admin, DB, json!({"metadata": {"labels": {"touched": "yes"}}})).await?;
    control_round(admin, "c2").await?;
    let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &shared_secrets());
    shares.delete(DB, &DeleteParams::default()).await.map_err(|e| format!("deleting the share: {e}"))?;
    control_round(admin, "c3").await?;
    create_shared_secret(suite, DB, OWNER, DB).await?;
    control_round(admin, "c4").await?;
    let after_revocation = seen(admin, APP, "web").await?;
    if after_revocation != restarted {
        return Err(format!("{APP}/web changed without a content change: {after_revocation:?}, was {restarted:?}"));
    }

    // The bound: of FLOOD's labelled workloads, exactly PER_NAMESPACE are followed (recorded and
    // restarted), while APP's were served above.
    let flood = flood_seen(admin).await?;
    let followed = flood.iter().filter(|s| s.observed.is_some()).count();
    let flood_restarted = flood.iter().filter(|s| s.restarted_at.is_some()).count();
    if (followed, flood_restarted) != (PER_NAMESPACE, PER_NAMESPACE) {
        return Err(format!(
            "{FLOOD} labels {FLOODED} workloads: {followed} followed and {flood_restarted} restarted, wanted {PER_NAMESPACE} each: {flood:?}"
        ));
    }
    if !controller.log_text().contains("not restarted on a share's change") {
        return Err(format!(
            "the controller did not log the workloads it does not follow:\n{}",
            controller.log_tail(20)
        ));
    }

    // Changed while the controller is down: restarted once when it is back.
    drop(controller);
    set_secret(admin, DB, json!({"stringData": {"k": "v3"}})).await?;
    controller = start_controller(suite)?;
    let again = wait_for(admin, APP, "web", "restarted after the controller's return", |s| {
        s.restarted_at != restarted.restarted_at && s.replica_sets == 3
    })
    .await?;
    control_round(admin, "c5").await?;
    let settled = seen(admin, APP, "web").await?;
    if settled != again || again.observed == restarted.observed {
        return Err(format!("after the controller's return {APP}/web is {settled:?} (restarted as {again:?})"));
    }
    let unlabelled = seen(admin, APP, "unlabelled").await?;
    if unlabelled != (Seen { restarted_at: None, observed: None, replica_sets: 1 }) {
        return Err(format!("the unlabelled Deployment was touched: {unlabelled:?}"));
    }
    drop(controller);
    Ok(())
}

const POLICY: &str = "rollout-policy";

/// The shipped ValidatingAdmissionPolicy holds the read-grants controller's `patch` of workloads
/// to what it writes: the template's restartedAt and the workload's record. As the controller's
/// identity (dry runs): its own patch is admitted; a change of the image, a template label, the
/// replicas, a label, another annotation is refused naming what it may change; the same changes
/// by another identity are not the policy's business.
pub async fn the_rollout_controller_may_patch_only_its_two_annotations(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/rollout-on-change.yaml").await?;
    create_namespace(admin, POLICY, "none", &[]).await?;
    let created = create(admin, &deployments_path(POLICY), &deployment("app", DB, true), false).await?;
    if created.status != 201 {
        return Err(format!("creating the Deployment: {} {}", created.status, created.message()));
    }
    let groups = ["system:serviceaccounts", "system:serviceaccounts:inline-guard-driver", "system:authenticated"];
    let controller = Api::<Deployment>::namespaced(suite.cluster.client_as(READ_GRANTS_USER, &groups).await?, POLICY);
    let as_admin = Api::<Deployment>::namespaced(admin.clone(), POLICY);
    let dry_run = PatchParams { dry_run: true, ..PatchParams::default() };
    let patch = |api: &Api<Deployment>, body: Value| {
        let api = api.clone();
        let params = dry_run.clone();
        async move { api.patch("app", &params, &Patch::Merge(&body)).await.map(drop) }
    };
    let template =
        "may change nothing of a workload's pod template but its kubectl.kubernetes.io/restartedAt annotation";
    let metadata = "may change nothing of a workload's metadata but its sharedresource.inlineguard.dev/observed-content annotation";
    let spec = "may change nothing of a workload's spec but its pod template's restartedAt annotation";
    let image =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "registry.invalid/other:1"}]}}}});
    // The policy takes effect once the apiserver has loaded it: waited for on the first refusal.
    let deadline = Instant::now() + WITHIN;
    loop {
        match patch(&controller, image.clone()).await {
            Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains(template) => break,
            other if Instant::now() > deadline => {
                return Err(format!("the controller's change of the image: expected 403 {template:?}, got {other:?}"));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let own = json!({
        "metadata": {"annotations": {OBSERVED_ANNOTATION: "{\"rollout-db\":\"0123456789abcdef\"}"}},
        "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: "2026-11-29T14:00:00.000000001Z"}}}}
    });
    patch(&controller, own).await.map_err(|e| format!("the controller's own patch was refused: {e}"))?;
    let refused = [
        (json!({"spec": {"template": {"metadata": {"labels": {"app": "app", "extra": "x"}}}}}), template),
        (json!({"spec": {"template": {"metadata": {"annotations": {"example.com/x": "y"}}}}}), template),
        (json!({"spec": {"template": {"metadata": {"name": "renamed"}}}}), template),
        (json!({"spec": {"replicas": 0}}), spec),
        (json!({"spec": {"paused": true}}), spec),
        (json!({"metadata": {"labels": {"example.com/x": "y"}}}), metadata),
        (json!({"metadata": {"annotations": {"example.com/x": "y"}}}), metadata),
    ];
    for (body, message) in refused {
        match patch(&controller, body.clone()).await {
            Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains(message) => {}
            other => return Err(format!("the controller's {body}: expected 403 {message:?}, got {other:?}")),
        }
    }
    // Not labelled to restart on change: not even its own patch.
    let plain = create(admin, &deployments_path(POLICY), &deployment("plain", DB, false), false).await?;
    if plain.status != 201 {
        return Err(format!("creating the unlabelled Deployment: {} {}", plain.status, plain.message()));
    }
    let unlabelled = "may patch only a workload labelled sharedresource.inlineguard.dev/restart-on-change=true";
    let own_of_plain = json!({"metadata": {"annotations": {OBSERVED_ANNOTATION: "@0a1b2c3d"}}});
    match controller.patch("plain", &dry_run, &Patch::Merge(&own_of_plain)).await {
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains(unlabelled) => {}
        other => {
            return Err(format!(
                "the controller's patch of an unlabelled workload: expected 403 {unlabelled:?}, got {other:?}"
            ));
        }
    }
    // Anyone else's changes are not the policy's business.
    patch(&as_admin, image).await.map_err(|e| format!("the admin's change of the image was refused: {e}"))?;
    println!("rollout policy: the controller's own patch admitted, six other changes refused");
    Ok(())
}

const FAT: &str = "rollout-fat";
/// How many labelled Deployments the tenant makes, and the size of each one's environment: about
/// a MiB each, far below etcd's object limit.
const FAT_WORKLOADS: usize = 30;
const FAT_ENV_BYTES: usize = 1 << 20;

/// A tenant labels many large workloads: the rollout controller lists them a few at a time and
/// keeps a summary of each, so its peak memory stays far below what one page of all of them
/// would take (the shipped limit is 128 MiB).
pub async fn a_tenants_fat_labelled_workloads_are_listed_a_few_at_a_time(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/rollout-on-change.yaml").await?;
    create_namespace(admin, FAT, "none", &[]).await?;
    create_service_account(admin, FAT, "reader").await?;
    // The control: a controller that lists no fat workload, its peak once it has listed.
    let before = fat_controller(suite, "read-grants-fat-control").await?;
    let baseline = before.peak_resident_bytes()?;
    drop(before);
    let fat = "x".repeat(FAT_ENV_BYTES);
    for i in 0..FAT_WORKLOADS {
        let mut object = deployment(&format!("fat-{i}"), DB, true);
        object["spec"]["replicas"] = json!(0);
        object["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "FILLER", "value": fat}]);
        create_object(suite, &deployments_path(FAT), object).await?;
    }
    let controller = fat_controller(suite, "read-grants-fat").await?;
    let peak = controller.peak_resident_bytes()?;
    drop(controller);
    let grown = peak.saturating_sub(baseline);
    println!(
        "rollout controller: peak resident {} MiB after listing {FAT_WORKLOADS} labelled workloads of {} MiB each, \
         {} MiB without them",
        peak >> 20,
        FAT_ENV_BYTES >> 20,
        baseline >> 20
    );
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone());
    let _ = namespaces.delete(FAT, &DeleteParams::default()).await;
    // A page of all of them (the watcher's default of 500) grew it by about 58 MiB here; pages
    // of two by about 10.
    let bound: u64 = 24 << 20;
    if grown > bound {
        return Err(format!(
            "listing the tenant's workloads grew the rollout controller's peak by {} MiB (bound {} MiB)",
            grown >> 20,
            bound >> 20
        ));
    }
    Ok(())
}

/// A rollout controller beside the suite's (no notices, no election), once it has listed.
async fn fat_controller(suite: &Suite, name: &str) -> Result<ChildProcess, String> {
    let kubeconfig = suite.cluster.kubeconfig_as(READ_GRANTS_USER)?;
    let args = ["--rollout-on-change", "--no-access-notices", "--no-leader-election"];
    let controller = start_read_grants_as(name, &kubeconfig, suite.cluster.run_dir(), &args)?;
    let started = Instant::now();
    let listed = "every watch has listed; restarting opted-in workloads";
    while !controller.log_text().contains(listed) {
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("{name} never listed the workloads:\n{}", controller.log_tail(20)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(controller)
}
