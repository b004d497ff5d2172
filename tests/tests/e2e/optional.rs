//! Optional objects on the real apiserver: a volume marking its share optional (and a
//! projection whose share source is optional) is published while the share, then its Secret,
//! do not exist; each absence is told on the pod once; the files arrive when the Secret is
//! created and leave when it is deleted, the volume staying served; a pod that may not use the
//! share is refused all along, optional or not. The driver runs in process as its
//! ServiceAccount with the shipped RBAC, beside the suite's read-grants controller.

use std::time::{Duration, Instant};

use inline_guard_proto::csi::v1::node_client::NodeClient;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject};
use serde_json::{Value, json};
use sharedresource_csi_driver::DRIVER_NAME;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::rotation_events::{events_about, told_times};
use crate::shares::{
    InProcessDriver, apply_file, create_object, create_shared_secret, create_use_grant, files, shared_secrets,
    unpublish_as_kubelet, wait_for_conditions, wait_for_files,
};
use crate::support::{Outcome, Suite, create, create_namespace, create_service_account, pods_path, wait_established};

const OWNER: &str = "optional-owner";
const CONSUMER: &str = "optional-consumer";
/// A namespace granted nothing.
const STRANGER: &str = "optional-stranger";
const SHARE: &str = "optional-app";
/// The ceiling of every wait: far above any machine's pace; the times taken are printed.
const WITHIN: Duration = Duration::from_secs(60);

/// A pod of `namespace` mounting the share optionally (`app`) and through projection `app`
/// (`composed`).
fn reader(namespace: &str) -> Value {
    let csi = |attributes: Value| json!({"driver": DRIVER_NAME, "readOnly": true, "volumeAttributes": attributes});
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader", "namespace": namespace},
        "spec": {
            "serviceAccountName": "reader",
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            "volumes": [
                {"name": "app", "csi": csi(json!({"sharedSecret": SHARE, "optional": "true"}))},
                {"name": "composed", "csi": csi(json!({"projection": "app"}))}
            ]
        }
    })
}

/// Projection `app`: the share's `password` at `db/password` (its source optional), and the
/// pod's name.
fn projection() -> Value {
    json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
        "metadata": {"name": "app"},
        "spec": {"sources": [
            {"sharedSecret": {"name": SHARE, "optional": true, "items": [{"key": "password", "path": "db/password"}]}},
            {"podInfo": {"items": [{"path": "pod", "fieldPath": "metadata.name"}]}}
        ]}
    })
}

/// Creates pod `reader` in `namespace`; the stored pod.
async fn create_reader(suite: &Suite, namespace: &str) -> Result<Pod, String> {
    let answer = create(&suite.admin, &pods_path(namespace), &reader(namespace), false).await?;
    if answer.status != 201 {
        return Err(format!("creating {namespace}/reader: {} {}", answer.status, answer.message()));
    }
    serde_json::from_value(answer.body).map_err(|e| e.to_string())
}

/// The files of a projected volume (the composed one has a directory, `db`).
fn composed(target: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for (path, _) in files(target) {
        found.push(path);
    }
    if let Ok(password) = std::fs::read_to_string(target.join("db/password")) {
        found.push(format!("db/password={password}"));
    }
    found.sort();
    found
}

/// Waits until the composed volume at `target` shows `expected`.
async fn wait_for_composed(target: &std::path::Path, what: &str, expected: &[&str]) -> Outcome {
    let deadline = Instant::now() + WITHIN;
    loop {
        let found = composed(target);
        if found == expected {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: the composed volume shows {found:?}, expected {expected:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A share naming the optional share's Secret that no volume reads: the read-grants controller
/// grants the driver its read before the optional share names it.
const GRANTING_SHARE: &str = "optional-app-grant";

/// Waits (up to [`WITHIN`]) until the driver's identity may read Secret `namespace/name`, which
/// does not exist: its read answers 404, not 403.
async fn until_readable_but_absent(suite: &Suite, namespace: &str, name: &str) -> Outcome {
    let secrets = Api::<Secret>::namespaced(crate::shares::driver_client(suite).await?, namespace);
    let deadline = Instant::now() + WITHIN;
    loop {
        match secrets.get_metadata(name).await {
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            answer if Instant::now() > deadline => {
                return Err(format!(
                    "the driver could not read Secret {namespace}/{name} within {WITHIN:?}: {:?}",
                    answer.map(drop)
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

pub async fn an_optional_share_is_served_empty_until_its_secret_exists(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/crds.yaml").await?;
    wait_established(admin, "sharedsecrets.sharedresource.inlineguard.dev").await?;
    wait_established(admin, "sharedprojections.sharedresource.inlineguard.dev").await?;
    apply_file(suite, "config/deploy/driver/rbac.yaml").await?;
    for namespace in [OWNER, CONSUMER, STRANGER] {
        create_namespace(admin, namespace, "none", &[]).await?;
    }
    for namespace in [CONSUMER, STRANGER] {
        create_service_account(admin, namespace, "reader").await?;
        create_object(
            suite,
            &format!("/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/{namespace}/sharedprojections"),
            projection(),
        )
        .await?;
    }
    // Granted by name before the share exists, as a team asking for it would be.
    create_use_grant(suite, CONSUMER, "sharedsecrets", SHARE).await?;
    let pod = create_reader(suite, CONSUMER).await?;
    let stranger = create_reader(suite, STRANGER).await?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();

    let driver = InProcessDriver::start_telling_events(suite, 1 << 20).await?;
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);
    let target = |pod: &str, volume: &str| {
        driver.dir.path().join(format!("pods/{pod}/volumes/kubernetes.io~csi/{volume}/mount"))
    };
    let (app, composed_at) = (target("reader", "app"), target("reader", "composed"));
    let outcome = async {
        // The share does not exist: an empty volume, and the pod told why.
        let app_request = kubelet_request(&pod, "app", &app)?;
        publish_as_kubelet(&mut node, &app_request).await.map_err(|e| format!("publish app: {e}"))?;
        let composed_request = kubelet_request(&pod, "composed", &composed_at)?;
        publish_as_kubelet(&mut node, &composed_request).await.map_err(|e| format!("publish composed: {e}"))?;
        if !files(&app).is_empty() || composed(&composed_at) != ["pod"] {
            return Err(format!("with no share: app holds {:?}, composed {:?}", files(&app), composed(&composed_at)));
        }
        let (kind, note) = told_times(admin, CONSUMER, &uid, "OptionalObjectMissing", 2, WITHIN).await?;
        let notes: Vec<String> = events_about(admin, CONSUMER, &uid).await?.into_iter().map(|(_, _, note)| note).collect();
        let expected = [
            format!("volume \"app\" (SharedSecret \"{SHARE}\") is served without what it marks optional, until that exists: SharedSecret \"{SHARE}\" not found"),
            format!("volume \"composed\" (SharedProjection \"app\") is served without what it marks optional, until that exists: SharedSecret \"{SHARE}\" not found"),
        ];
        if kind != "Normal" || expected.iter().any(|wanted| !notes.contains(wanted)) {
            return Err(format!("expected Normal Events {expected:?}; the last was {kind} {note:?}, all: {notes:?}"));
        }

        // The stranger's pod may not use the share: refused, optional or not.
        for volume in ["app", "composed"] {
            let request = kubelet_request(&stranger, volume, &target("stranger", volume))?;
            match publish_as_kubelet(&mut node, &request).await {
                Err(status) if status.code() == tonic::Code::PermissionDenied => {}
                other => return Err(format!("{STRANGER}'s {volume} volume: expected PERMISSION_DENIED, got {other:?}")),
            }
        }

        // The share, naming a Secret not made yet: still empty, the new absence told. The
        // read-grants controller grants the Secret's read first (through another share no volume
        // reads), so that the driver's read finds it absent rather than not yet readable, however
        // fast the controller is.
        create_shared_secret(suite, GRANTING_SHARE, OWNER, "app-creds").await?;
        until_readable_but_absent(suite, OWNER, "app-creds").await?;
        create_shared_secret(suite, SHARE, OWNER, "app-creds").await?;
        told_times(admin, CONSUMER, &uid, "OptionalObjectMissing", 3, WITHIN).await?;
        let notes: Vec<String> = events_about(admin, CONSUMER, &uid).await?.into_iter().map(|(_, _, note)| note).collect();
        let secret_missing = format!("Secret {OWNER}/app-creds, shared by SharedSecret \"{SHARE}\", not found");
        if !notes.iter().any(|note| note.ends_with(&secret_missing)) {
            return Err(format!("no Event told {secret_missing:?}: {notes:?}"));
        }
        if !files(&app).is_empty() {
            return Err(format!("the share without its Secret: app holds {:?}", files(&app)));
        }
        // The share's status says so, and what optional volumes get.
        wait_for_conditions(admin, SHARE, &[("BackingObjectExists", "False")]).await?;
        let share = Api::<DynamicObject>::all_with(admin.clone(), &shared_secrets()).get(SHARE).await;
        let share = share.map_err(|e| e.to_string())?;
        let exists = share.data["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "BackingObjectExists");
        let message = exists.and_then(|c| c["message"].as_str()).unwrap_or_default();
        if !message.contains("volumes marking the share optional are served without it until it does") {
            return Err(format!("the share's BackingObjectExists condition says {message:?}"));
        }

        // The Secret arrives: its files appear in both volumes.
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-creds"}, "stringData": {"password": "first"}});
        let created = Instant::now();
        create_object(suite, &format!("/api/v1/namespaces/{OWNER}/secrets"), secret).await?;
        wait_for_files(&app, "the Secret created", &[("password", "first")]).await?;
        println!("optional objects: the Secret's files in the optional volume {:?} after its creation", created.elapsed());
        wait_for_composed(&composed_at, "the Secret created", &["db", "db/password=first", "pod"]).await?;
        told_times(admin, CONSUMER, &uid, "ContentUpdated", 2, WITHIN).await?;

        // The Secret deleted: the volumes are emptied of it, still served, and the pod told.
        Api::<Secret>::namespaced(admin.clone(), OWNER)
            .delete("app-creds", &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        wait_for_files(&app, "the Secret deleted", &[]).await?;
        wait_for_composed(&composed_at, "the Secret deleted", &["pod"]).await?;
        told_times(admin, CONSUMER, &uid, "OptionalObjectMissing", 6, WITHIN).await?;
        if !crate::shares::still_mounted(&app) {
            return Err("the optional volume is no longer mounted after its Secret's deletion".into());
        }
        // Each absence told once, when it began: two volumes, three beginnings each.
        let told: Vec<_> = events_about(admin, CONSUMER, &uid).await?.into_iter().filter(|(_, r, _)| r == "OptionalObjectMissing").collect();
        if told.len() != 6 {
            return Err(format!("expected 6 OptionalObjectMissing Events (2 volumes × 3 absences begun), got {}: {told:?}", told.len()));
        }
        unpublish_as_kubelet(&mut node, app_request.volume_id, app_request.target_path).await?;
        unpublish_as_kubelet(&mut node, composed_request.volume_id, composed_request.target_path).await
    }
    .await;
    let stopped = driver.stop().await;
    // Counted again once the driver has stopped, not only the moment the sixth arrived: an
    // absence told twice would have been written by now.
    let outcome = match outcome {
        Ok(()) => {
            let told = events_about(admin, CONSUMER, &uid).await?;
            let missing = told.iter().filter(|(_, reason, _)| reason == "OptionalObjectMissing").count();
            if missing == 6 { Ok(()) } else { Err(format!("after the driver stopped the pod was told {told:?}")) }
        }
        failed => failed,
    };
    outcome.and(stopped)
}
