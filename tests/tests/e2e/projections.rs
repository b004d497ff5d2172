//! Projections on the real apiserver: the shipped CRDs, driver RBAC and CSIDriver applied as
//! written, the driver (Kubernetes source) running as its ServiceAccount with real tmpfs mounts on
//! a real socket, and NodePublishVolume built from stored pods as kubelet builds it, tokens
//! included: for each audience the shipped CSIDriver's `tokenRequests` names, a TokenRequest for
//! the pod's service account bound to the pod, passed as kubelet passes it. One volume is built
//! from a SharedSecret, a SharedConfigMap, pod facts and a token; every change arrives through
//! the driver's watches (its periodic refresh is an hour away).

pub mod hostile;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use inline_guard_proto::csi::v1::NodePublishVolumeRequest;
use inline_guard_proto::csi::v1::node_client::NodeClient;
use inline_guard_tests::apply::objects;
use inline_guard_tests::repo_root;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tonic::Code;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::shares::{
    InProcessDriver, apply_file, create_object, create_shared_secret, unpublish_as_kubelet, wait_for_view,
};
use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_namespace, pods_path, wait_established};

const OWNER: &str = "projection-owner";
const CONSUMER: &str = "projection-consumer";
const STRANGER: &str = "projection-stranger";
/// 100 KiB per value: a torn write would show, and two versions of both fit the test volume's
/// 1 MiB tmpfs (the atomic writer holds the old version while it writes the new).
const VALUE_BYTES: usize = 100 * 1024;

/// A file of the volume: path below the target, content, permission bits.
type File = (String, String, u32);

/// Every file a container would see below `target` (`walk::visible_files_under`), with its
/// content and permission bits.
fn tree(target: &Path) -> Vec<File> {
    inline_guard_tests::walk::visible_files_under(target)
        .into_iter()
        .map(|(name, meta)| {
            let content = std::fs::read_to_string(target.join(&name)).unwrap_or_default();
            (name, content, meta.permissions().mode() & 0o777)
        })
        .collect()
}

/// None of `tokens` is in the driver's records in `state`, checked while volume `volume_id` is
/// published: its record is there (the positive control), so a leak would be seen.
fn no_token_in_records(state: &Path, volume_id: &str, tokens: &[&str]) -> Outcome {
    let mut records_seen = 0;
    for record in std::fs::read_dir(state).map_err(|e| e.to_string())?.flatten() {
        let text = String::from_utf8_lossy(&std::fs::read(record.path()).unwrap_or_default()).into_owned();
        if text.contains(volume_id) {
            records_seen += 1;
        }
        if tokens.iter().any(|token| text.contains(token)) {
            return Err(format!("a token reached the state directory: {}", record.path().display()));
        }
    }
    if records_seen != 1 {
        return Err(format!("expected the published volume's record in the state directory, found {records_seen}"));
    }
    Ok(())
}

/// Waits until `target` is mounted and holds exactly `expected`.
async fn wait_for_tree(target: &Path, what: &str, expected: &[File]) -> Outcome {
    let brief = |files: &Vec<File>| -> String {
        format!("{:?}", files.iter().map(|(p, c, m)| (p.clone(), c.len(), format!("{m:o}"))).collect::<Vec<_>>())
    };
    wait_for_view(target, what, tree, &expected.to_vec(), brief).await.map(drop)
}

fn file(path: &str, content: &str, mode: u32) -> File {
    (path.to_string(), content.to_string(), mode)
}

/// The audiences the shipped CSIDriver asks kubelet for.
fn shipped_audiences() -> Result<Vec<String>, String> {
    let drivers = objects(&repo_root().join("config/deploy/driver/csidriver.yaml"))?;
    let driver = drivers.first().ok_or("config/deploy/driver/csidriver.yaml holds no object")?;
    if driver["spec"]["requiresRepublish"] != json!(true) {
        return Err("the shipped CSIDriver does not set requiresRepublish: true".into());
    }
    let audiences: Vec<String> = driver["spec"]["tokenRequests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|request| request["audience"].as_str().map(str::to_string))
        .collect();
    if audiences.is_empty() {
        return Err("the shipped CSIDriver requests no token".into());
    }
    Ok(audiences)
}

/// What kubelet passes in `csi.storage.k8s.io/serviceAccount.tokens`: a token per audience for
/// the pod's service account, bound to the pod.
async fn kubelet_tokens(admin: &kube::Client, pod: &Pod, audiences: &[String], seconds: i64) -> Result<Value, String> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).ok_or("the pod names no account")?;
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &namespace);
    let mut tokens = serde_json::Map::new();
    for audience in audiences {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.clone()],
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let answer = accounts
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("TokenRequest for audience {audience:?}: {e}"))?;
        let status = answer.status.ok_or("a TokenRequest without status")?;
        tokens.insert(
            audience.clone(),
            json!({"token": status.token, "expirationTimestamp": status.expiration_timestamp.0.to_string()}),
        );
    }
    Ok(Value::Object(tokens))
}

/// `request` carrying `tokens` as kubelet passes them.
fn with_tokens(mut request: NodePublishVolumeRequest, tokens: &Value) -> NodePublishVolumeRequest {
    request.volume_context.insert("csi.storage.k8s.io/serviceAccount.tokens".into(), tokens.to_string());
    request
}

fn projection(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
        "metadata": {"name": name}, "spec": spec
    })
}

fn app_config(audience: &str) -> Value {
    projection(
        "app-config",
        json!({
            "defaultMode": 0o440,
            "sources": [
                {"sharedSecret": {"name": "projected-db", "items": [{"key": "password", "path": "db/password", "mode": 0o400}]}},
                {"sharedConfigMap": {"name": "projected-settings"}},
                {"podInfo": {"items": [
                    {"path": "pod/name", "fieldPath": "metadata.name"},
                    {"path": "pod/labels", "fieldPath": "metadata.labels"},
                    {"path": "pod/annotations", "fieldPath": "metadata.annotations"}
                ]}},
                {"serviceAccountToken": {"audience": audience, "path": "token"}}
            ]
        }),
    )
}

fn pod_with(name: &str, projection: &str, metadata: Value) -> Value {
    let mut metadata = metadata;
    metadata["name"] = json!(name);
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {
            "serviceAccountName": "reader",
            "containers": [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": [{"name": "config", "mountPath": "/config"}]}],
            "volumes": [{"name": "config", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {"projection": projection}}}]
        }
    })
}

async fn store_pod(admin: &kube::Client, namespace: &str, pod: Value) -> Result<Pod, String> {
    let answer = create(admin, &pods_path(namespace), &pod, false).await?;
    if answer.status != 201 {
        return Err(format!("creating a pod in {namespace}: {} {}", answer.status, answer.message()));
    }
    serde_json::from_value(answer.body).map_err(|e| e.to_string())
}

/// The two values of the `a` and `b` keys at `version`: equal, and long.
fn version_value(version: u32) -> String {
    format!("{version}:{}", "v".repeat(VALUE_BYTES))
}

/// Stops the reader when dropped, however the scenario ends (a blocking task left looping would
/// hold the runtime's shutdown forever).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Reads the volume in a loop until told to stop, as a container would: each pass resolves the
/// current version once and reads `a` and `b` from it (they must agree), and reads `a` through
/// the visible name (it must be a whole value). Returns the versions seen, or the first torn read.
fn watch_reads(target: PathBuf, stop: Arc<AtomicBool>) -> Result<BTreeMap<String, usize>, String> {
    let mut seen = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let Ok(version) = std::fs::read_link(target.join("..data")) else { continue };
        let dir = target.join(version);
        let (Ok(a), Ok(b)) = (std::fs::read_to_string(dir.join("a")), std::fs::read_to_string(dir.join("b"))) else {
            continue; // that version was swapped out and removed between the reads
        };
        if a != b {
            return Err(format!(
                "one version holds a {:?}... and b {:?}...",
                &a[..a.len().min(8)],
                &b[..b.len().min(8)]
            ));
        }
        let visible = std::fs::read_to_string(target.join("a")).unwrap_or_default();
        let whole = visible.split_once(':').is_some_and(|(_, rest)| rest.len() == VALUE_BYTES);
        if !visible.is_empty() && !whole {
            return Err(format!("a was read torn: {} bytes", visible.len()));
        }
        *seen.entry(a.split(':').next().unwrap_or_default().to_string()).or_default() += 1;
    }
    Ok(seen)
}

pub async fn sources_compose_update_atomically_revoke_as_one_and_tokens_follow_republish(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/crds.yaml").await?;
    wait_established(admin, "sharedprojections.sharedresource.inlineguard.dev").await?;
    apply_file(suite, "config/deploy/driver/rbac.yaml").await?;
    let audiences = shipped_audiences()?;
    let audience = audiences[0].clone();
    for namespace in [OWNER, CONSUMER, STRANGER] {
        create_namespace(admin, namespace, "none", &[]).await?;
        create_object(
            suite,
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}}),
        )
        .await?;
    }
    create_object(suite, &format!("/api/v1/namespaces/{OWNER}/secrets"), json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-creds"}, "stringData": {"password": "s3cret", "user": "app"}
    }))
    .await?;
    create_object(
        suite,
        &format!("/api/v1/namespaces/{OWNER}/configmaps"),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-settings"},
            "data": {"a": version_value(0), "b": version_value(0)}
        }),
    )
    .await?;
    create_shared_secret(suite, "projected-db", OWNER, "db-creds").await?;
    create_object(suite, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedconfigmaps", json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedConfigMap",
        "metadata": {"name": "projected-settings"}, "spec": {"configMapRef": {"namespace": OWNER, "name": "app-settings"}}
    }))
    .await?;
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-projected"},
        "rules": [
            {"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "resourceNames": ["projected-db"], "verbs": ["use"]},
            {"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedconfigmaps"], "resourceNames": ["projected-settings"], "verbs": ["use"]}
        ]
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader-uses-projected"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-projected"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": CONSUMER}]
    });
    let projections_path = |namespace: &str| {
        format!("/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/{namespace}/sharedprojections")
    };
    create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{CONSUMER}/roles"), role).await?;
    create_object(
        suite,
        &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{CONSUMER}/rolebindings"),
        binding.clone(),
    )
    .await?;
    for namespace in [CONSUMER, STRANGER] {
        create_object(suite, &projections_path(namespace), app_config(&audience)).await?;
    }

    // Refused at creation by the CRD: a source of two kinds.
    let two_kinds = projection(
        "two-kinds",
        json!({"sources": [{"sharedSecret": {"name": "projected-db"}, "podInfo": {"items": []}}]}),
    );
    let answer = create(admin, &projections_path(CONSUMER), &two_kinds, false).await?;
    let expected = "a source sets exactly one of sharedSecret, sharedConfigMap, podInfo, serviceAccountToken";
    if answer.status != 422 || !answer.message().contains(expected) {
        return Err(format!(
            "a source of two kinds: expected 422 naming the rule, got {} {}",
            answer.status,
            answer.message()
        ));
    }
    // Accepted at creation, refused at publish: what only the data or the order can tell.
    let clash = projection(
        "clash",
        json!({"sources": [
            {"sharedSecret": {"name": "projected-db"}},
            {"sharedConfigMap": {"name": "projected-settings", "items": [{"key": "a", "path": "password/a"}]}}
        ]}),
    );
    let twice = projection(
        "twice",
        json!({"sources": [
            {"sharedSecret": {"name": "projected-db", "items": [{"key": "user", "path": "conf"}]}},
            {"sharedConfigMap": {"name": "projected-settings", "items": [{"key": "a", "path": "conf"}]}}
        ]}),
    );
    let unrequested = projection(
        "unrequested",
        json!({"sources": [{"serviceAccountToken": {"audience": "not-requested", "path": "token"}}]}),
    );
    for object in [clash, twice, unrequested] {
        create_object(suite, &projections_path(CONSUMER), object).await?;
    }

    // Label values are plain; an annotation shows the escaping.
    let metadata = json!({"labels": {"app": "web", "tier": "back"}, "annotations": {"note": "say \"hi\"\n"}});
    let app = store_pod(admin, CONSUMER, pod_with("app", "app-config", metadata)).await?;
    let stranger = store_pod(admin, STRANGER, pod_with("app", "app-config", json!({}))).await?;
    let mut refused = Vec::new();
    for name in ["clash", "twice", "unrequested", "missing"] {
        refused.push(store_pod(admin, CONSUMER, pod_with(name, name, json!({}))).await?);
    }

    let driver = InProcessDriver::start(suite).await?;
    let dir = &driver.dir;
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);

    let result = async {
        let target = dir.path().join("pods/app/volumes/kubernetes.io~csi/config/mount");
        let tokens = kubelet_tokens(admin, &app, &audiences, 3600).await?;
        let token = tokens[&audience]["token"].as_str().unwrap_or_default().to_string();
        let request = with_tokens(kubelet_request(&app, "config", &target)?, &tokens);
        publish_as_kubelet(&mut node, &request).await.map_err(|e| format!("publishing the projection: {e}"))?;
        no_token_in_records(&dir.path().join("state"), &request.volume_id, &[&token])?;
        // kubelet's rendering: sorted, Go-quoted, no final newline.
        let annotations = "note=\"say \\\"hi\\\"\\n\"";
        let expected = |version: u32, labels: &str, token: &str| {
            vec![
                file("a", &version_value(version), 0o440),
                file("b", &version_value(version), 0o440),
                file("db/password", "s3cret", 0o400),
                file("pod/annotations", annotations, 0o440),
                file("pod/labels", labels, 0o440),
                file("pod/name", "app", 0o440),
                file("token", token, 0o440),
            ]
        };
        let first_labels = "app=\"web\"\ntier=\"back\"";
        wait_for_tree(&target, "published", &expected(0, first_labels, &token)).await?;
        // The file holds a token the apiserver accepts, for the pod's account and the audience.
        let review: TokenReview = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": std::fs::read_to_string(target.join("token")).unwrap_or_default(), "audiences": [audience]}
        }))
        .map_err(|e| e.to_string())?;
        let reviewed = Api::<TokenReview>::all(admin.clone()).create(&PostParams::default(), &review).await.map_err(|e| e.to_string())?;
        let user = reviewed.status.and_then(|s| s.authenticated.filter(|a| *a).and(s.user)).and_then(|u| u.username);
        if user.as_deref() != Some(&format!("system:serviceaccount:{CONSUMER}:reader")) {
            return Err(format!("the token file does not authenticate as the pod's account: {user:?}"));
        }

        // The stranger's namespace has the same projection but no grant: refused, naming a share.
        let stranger_target = dir.path().join("pods/stranger/volumes/kubernetes.io~csi/config/mount");
        let stranger_tokens = kubelet_tokens(admin, &stranger, &audiences, 3600).await?;
        let denied = node
            .node_publish_volume(with_tokens(kubelet_request(&stranger, "config", &stranger_target)?, &stranger_tokens))
            .await
            .err()
            .ok_or("a pod without access to the shares was published")?;
        let named = format!("service account {STRANGER}/reader may not use SharedSecret \"projected-db\"");
        if denied.code() != Code::PermissionDenied || !denied.message().starts_with(&named) {
            return Err(format!("expected PERMISSION_DENIED starting {named:?}, got {denied:?}"));
        }
        if stranger_target.exists() {
            return Err("a refused publish left its target".into());
        }
        // What only publish can tell: each refused with its code and message, nothing left.
        let refusals = [
            (Code::InvalidArgument, format!("SharedProjection {CONSUMER}/\"clash\": sources[0] (sharedSecret \"projected-db\") and sources[1] (sharedConfigMap \"projected-settings\") collide at path \"password/a\": \"password\" is a file")),
            (Code::InvalidArgument, format!("SharedProjection {CONSUMER}/\"twice\": sources[0] (sharedSecret \"projected-db\") and sources[1] (sharedConfigMap \"projected-settings\") collide at path \"conf\": both name it")),
            (Code::InvalidArgument, format!("SharedProjection {CONSUMER}/\"unrequested\": sources[0] (serviceAccountToken \"not-requested\"): kubelet passed no token for audience \"not-requested\": the CSIDriver's tokenRequests must name it")),
            (Code::NotFound, format!("SharedProjection {CONSUMER}/\"missing\" not found")),
        ];
        for (pod, (code, message)) in refused.iter().zip(refusals) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let target = dir.path().join(format!("pods/{name}/volumes/kubernetes.io~csi/config/mount"));
            let tokens = kubelet_tokens(admin, pod, &audiences, 3600).await?;
            let answer = node.node_publish_volume(with_tokens(kubelet_request(pod, "config", &target)?, &tokens)).await;
            match answer {
                Err(status) if status.code() == code && status.message() == message => {}
                other => return Err(format!("projection {name}: expected {code:?} {message:?}, got {other:?}")),
            }
            if target.exists() {
                return Err(format!("the refused projection {name} left its target"));
            }
        }

        // One source updated, five times, while a container reads: never two versions in one.
        let config_maps = Api::<ConfigMap>::namespaced(admin.clone(), OWNER);
        let stop_reading = StopOnDrop(Arc::new(AtomicBool::new(false)));
        let reader = tokio::task::spawn_blocking({
            let (target, stop) = (target.clone(), stop_reading.0.clone());
            move || watch_reads(target, stop)
        });
        for version in 1..=5 {
            let values = json!({"data": {"a": version_value(version), "b": version_value(version)}});
            config_maps.patch("app-settings", &PatchParams::default(), &Patch::Merge(&values)).await.map_err(|e| e.to_string())?;
            wait_for_tree(&target, &format!("after update {version}"), &expected(version, first_labels, &token)).await?;
        }
        drop(stop_reading);
        let seen = reader.await.map_err(|e| e.to_string())??;
        if seen.len() < 2 {
            return Err(format!("the reader saw only the versions {seen:?}: it did not overlap the updates"));
        }

        // The pod's labels change; they are read again with the content (the next change).
        let pods = Api::<Pod>::namespaced(admin.clone(), CONSUMER);
        pods.patch("app", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": {"tier": "front"}}})))
            .await
            .map_err(|e| e.to_string())?;
        let values = json!({"data": {"a": version_value(6), "b": version_value(6)}});
        config_maps.patch("app-settings", &PatchParams::default(), &Patch::Merge(&values)).await.map_err(|e| e.to_string())?;
        let new_labels = "app=\"web\"\ntier=\"front\"";
        wait_for_tree(&target, "after a label change and an update", &expected(6, new_labels, &token)).await?;

        // One share's access revoked: the whole volume is emptied and stays mounted; back: back.
        let bindings = Api::<RoleBinding>::namespaced(admin.clone(), CONSUMER);
        bindings.delete("reader-uses-projected", &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        wait_for_tree(&target, "after the RoleBinding was removed", &[]).await?;
        if !std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().contains(&target.to_string_lossy().into_owned()) {
            return Err("the emptied volume is no longer mounted".into());
        }
        let binding: RoleBinding = serde_json::from_value(binding).map_err(|e| e.to_string())?;
        bindings.create(&PostParams::default(), &binding).await.map_err(|e| e.to_string())?;
        wait_for_tree(&target, "after the RoleBinding came back", &expected(6, new_labels, &token)).await?;
        // One share deleted: emptied; recreated: back.
        let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("sharedresource.inlineguard.dev", "v1alpha1", "SharedConfigMap"),
            "sharedconfigmaps",
        ));
        let share = shares.get("projected-settings").await.map_err(|e| e.to_string())?;
        shares.delete("projected-settings", &DeleteParams::default()).await.map_err(|e| e.to_string())?;
        wait_for_tree(&target, "after the SharedConfigMap was deleted", &[]).await?;
        create_object(suite, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedconfigmaps", json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedConfigMap",
            "metadata": {"name": "projected-settings"}, "spec": share.data["spec"].clone()
        }))
        .await?;
        wait_for_tree(&target, "after the SharedConfigMap came back", &expected(6, new_labels, &token)).await?;

        // The projection itself edited: its volume follows.
        let mut edited = app_config(&audience);
        edited["spec"]["sources"][0]["sharedSecret"]["items"][0]["path"] = json!("db/pass");
        Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), CONSUMER, &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("sharedresource.inlineguard.dev", "v1alpha1", "SharedProjection"),
            "sharedprojections",
        ))
        .patch("app-config", &PatchParams::default(), &Patch::Merge(&json!({"spec": edited["spec"]})))
        .await
        .map_err(|e| e.to_string())?;
        let mut moved = expected(6, new_labels, &token);
        moved[2].0 = "db/pass".into();
        wait_for_tree(&target, "after the projection was edited", &moved).await?;

        // kubelet republishes with the same tokens: nothing is rewritten; with new ones: the
        // token file follows at once.
        let version_before = std::fs::read_link(target.join("..data")).map_err(|e| e.to_string())?;
        node.node_publish_volume(request.clone()).await.map_err(|e| format!("republish: {e}"))?;
        if std::fs::read_link(target.join("..data")).map_err(|e| e.to_string())? != version_before {
            return Err("a republish with the same tokens rewrote the volume".into());
        }
        let renewed = kubelet_tokens(admin, &app, &audiences, 3700).await?;
        let new_token = renewed[&audience]["token"].as_str().unwrap_or_default().to_string();
        if new_token == token {
            return Err("the apiserver issued the same token twice".into());
        }
        node.node_publish_volume(with_tokens(request.clone(), &renewed)).await.map_err(|e| format!("republish: {e}"))?;
        let mut wanted = moved.clone();
        wanted[6].1 = new_token.clone();
        if tree(&target) != wanted {
            return Err("the republish with a new token did not rewrite the token file before answering".into());
        }

        // No token reached the driver's records after the republish with the new token either.
        no_token_in_records(&dir.path().join("state"), &request.volume_id, &[&token, &new_token])?;
        unpublish_as_kubelet(&mut node, request.volume_id.clone(), request.target_path.clone()).await?;
        if target.exists() {
            return Err("unpublish left the target".into());
        }
        println!("projections: composed from 4 sources, 5 atomic updates under a reader ({seen:?}), labels, revocation, deletion, edit, token republish");
        Ok(())
    }
    .await;
    // The scenario's failure first; a driver failure or a leftover mount otherwise.
    result.and(driver.stop().await)
}
