//! A namespace user attacking through projections, on the real apiserver with the driver as its
//! ServiceAccount: share names that would be a query, a subresource or a path (`?watch=true`,
//! `s1/status`, `..`, `%2f`, `#`, 30 000 bytes) are refused at publish, naming the source, and
//! never reach the apiserver (its audit log is read back); a projection edited to name one
//! empties its volume, and so does an edit that only the data can refuse (a missing key),
//! while another namespace's revocation still arrives; messages carry neither the driver's
//! identity nor a `%`.

use std::path::Path;
use std::time::Instant;

use inline_guard_proto::csi::v1::node_client::NodeClient;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tonic::Code;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::shares::{
    DRIVER_USER, InProcessDriver, WITHIN, apply_file, create_object, create_shared_secret, still_mounted,
    unpublish_as_kubelet, wait_for_view,
};
use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_namespace, pods_path, wait_established};

const OWNER: &str = "hostile-owner";
const ATTACKER: &str = "hostile-attacker";
const VICTIM: &str = "hostile-victim";
const SHARE: &str = "hostile-db";

fn projection_path(namespace: &str) -> String {
    format!("/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/{namespace}/sharedprojections")
}

fn projection(name: &str, share: &str) -> Value {
    json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
        "metadata": {"name": name},
        "spec": {"sources": [{"sharedSecret": {"name": share, "items": [{"key": "password", "path": "db/password"}]}}]}
    })
}

fn pod(name: &str, attribute: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "serviceAccountName": "reader",
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            "volumes": [{"name": "v", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true, "volumeAttributes": {attribute: value}}}]
        }
    })
}

async fn store_pod(suite: &Suite, namespace: &str, object: Value) -> Result<Pod, String> {
    let answer = create(&suite.admin, &pods_path(namespace), &object, false).await?;
    if answer.status != 201 {
        return Err(format!("creating a pod in {namespace}: {} {}", answer.status, answer.message()));
    }
    serde_json::from_value(answer.body).map_err(|e| e.to_string())
}

/// Waits until `target` is mounted and shows exactly the names `expected`; how long that took.
async fn wait_for(target: &Path, what: &str, expected: &[&str]) -> Result<std::time::Duration, String> {
    let names = |target: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(target)
            .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.retain(|name| !name.starts_with(".."));
        names.sort();
        names
    };
    let expected: Vec<String> = expected.iter().map(|name| name.to_string()).collect();
    wait_for_view(target, what, names, &expected, |names| format!("{names:?}")).await
}

/// The driver's requests whose path and query contain `fragment`, from the audit log.
fn driver_requests(suite: &Suite, fragment: &str) -> Result<Vec<String>, String> {
    Ok(suite
        .cluster
        .audit_events()?
        .into_iter()
        .filter(|e| e.acting_user() == DRIVER_USER && e.request_uri.contains(fragment))
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect())
}

pub async fn hostile_share_names_never_reach_the_apiserver_and_revocation_still_arrives(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    apply_file(suite, "config/deploy/driver/crds.yaml").await?;
    wait_established(admin, "sharedprojections.sharedresource.inlineguard.dev").await?;
    apply_file(suite, "config/deploy/driver/rbac.yaml").await?;
    for namespace in [OWNER, ATTACKER, VICTIM] {
        create_namespace(admin, namespace, "none", &[]).await?;
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}});
        create_object(suite, &format!("/api/v1/namespaces/{namespace}/serviceaccounts"), account).await?;
    }
    create_object(suite, &format!("/api/v1/namespaces/{OWNER}/secrets"), json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hostile-creds"}, "stringData": {"password": "s3cret"}
    }))
    .await?;
    create_shared_secret(suite, SHARE, OWNER, "hostile-creds").await?;
    for namespace in [ATTACKER, VICTIM] {
        create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"), json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "use-db"},
            "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedsecrets"], "resourceNames": [SHARE], "verbs": ["use"]}]
        }))
        .await?;
        create_object(suite, &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"), json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader-uses-db"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-db"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]
        }))
        .await?;
    }
    create_object(suite, &projection_path(ATTACKER), projection("app", SHARE)).await?;
    let long = "x".repeat(30_003);
    let hostile = [
        "?watch=true",
        "s1/status",
        "..",
        ".",
        "../../api/v1/namespaces/hostile-owner/secrets/hostile-creds",
        "a%2fb",
        "a#b",
        long.as_str(),
    ];
    for (index, name) in hostile.iter().enumerate() {
        // The CRD accepts any non-empty name (the apiserver cannot tell a share name's use).
        create_object(suite, &projection_path(ATTACKER), projection(&format!("hostile-{index}"), name)).await?;
    }
    let attacker_pod = store_pod(suite, ATTACKER, pod("app", "projection", "app")).await?;
    let victim_pod = store_pod(suite, VICTIM, pod("app", "sharedSecret", SHARE)).await?;
    let mut hostile_pods = Vec::new();
    for index in 0..hostile.len() {
        hostile_pods.push(
            store_pod(suite, ATTACKER, pod(&format!("h{index}"), "projection", &format!("hostile-{index}"))).await?,
        );
    }

    let driver = InProcessDriver::start(suite).await?;
    let dir = &driver.dir;
    let mut node = NodeClient::new(channel(driver.socket.clone()).await?);
    let result = async {
        let attacker_target = dir.path().join("pods/attacker/volumes/kubernetes.io~csi/v/mount");
        let victim_target = dir.path().join("pods/victim/volumes/kubernetes.io~csi/v/mount");
        let attacker_request = kubelet_request(&attacker_pod, "v", &attacker_target)?;
        publish_as_kubelet(&mut node, &attacker_request).await.map_err(|e| format!("publishing the attacker's projection: {e}"))?;
        let victim_request = kubelet_request(&victim_pod, "v", &victim_target)?;
        publish_as_kubelet(&mut node, &victim_request).await.map_err(|e| format!("publishing the victim's share: {e}"))?;
        wait_for(&attacker_target, "the attacker's projection published", &["db"]).await?;
        wait_for(&victim_target, "the victim's share published", &["password"]).await?;

        // Each hostile name is refused at publish, naming the source, before any request.
        for (index, (name, pod)) in hostile.iter().zip(&hostile_pods).enumerate() {
            let target = dir.path().join(format!("pods/h{index}/volumes/kubernetes.io~csi/v/mount"));
            let answer = node.node_publish_volume(kubelet_request(pod, "v", &target)?).await;
            let Err(status) = answer else { return Err(format!("the share name {name:?} was published")) };
            let prefix = format!("SharedProjection {ATTACKER}/\"hostile-{index}\": sources[0] (sharedSecret \"");
            if status.code() != Code::InvalidArgument
                || !status.message().starts_with(&prefix)
                || !status.message().contains("is not a valid object name")
            {
                return Err(format!("the share name {name:?}: expected INVALID_ARGUMENT starting {prefix:?}, got {status:?}"));
            }
            if status.message().contains('%') || status.message().contains("system:serviceaccount") || status.message().len() > 1024 {
                return Err(format!("the refusal of {name:?} carries a % or the driver's identity, or is unbounded: {:?}", status.message()));
            }
            if target.exists() {
                return Err(format!("the refused name {name:?} left its target"));
            }
        }

        // An edit only the data can refuse (a key the Secret lacks) empties the volume, mounted.
        let projections = Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), ATTACKER, &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("sharedresource.inlineguard.dev", "v1alpha1", "SharedProjection"),
            "sharedprojections",
        ));
        let edit = |sources: Value| Patch::Merge(json!({"spec": {"sources": sources}}));
        let missing_key = json!([{"sharedSecret": {"name": SHARE, "items": [{"key": "nope", "path": "db/password"}]}}]);
        projections.patch("app", &PatchParams::default(), &edit(missing_key)).await.map_err(|e| e.to_string())?;
        wait_for(&attacker_target, "after an edit naming a missing key", &[]).await?;
        projections.patch("app", &PatchParams::default(), &edit(projection("app", SHARE)["spec"]["sources"].clone())).await.map_err(|e| e.to_string())?;
        wait_for(&attacker_target, "after the edit was undone", &["db"]).await?;

        // The published projection edited to name `?watch=true` beside its share: emptied.
        let with_watch = json!([
            {"sharedSecret": {"name": SHARE, "items": [{"key": "password", "path": "db/password"}]}},
            {"sharedSecret": {"name": "?watch=true"}}
        ]);
        projections.patch("app", &PatchParams::default(), &edit(with_watch)).await.map_err(|e| e.to_string())?;
        wait_for(&attacker_target, "after the projection named ?watch=true", &[]).await?;

        // Meanwhile another namespace's grant is revoked: its volume is emptied as usual.
        Api::<RoleBinding>::namespaced(admin.clone(), VICTIM)
            .delete("reader-uses-db", &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let revoked_in = wait_for(&victim_target, "the victim's volume after its RoleBinding was deleted", &[]).await?;

        // Both pods go away: unpublished, nothing left.
        unpublish_as_kubelet(&mut node, attacker_request.volume_id.clone(), attacker_request.target_path.clone()).await?;
        unpublish_as_kubelet(&mut node, victim_request.volume_id.clone(), victim_request.target_path.clone()).await?;
        for (whose, target) in [("attacker", &attacker_target), ("victim", &victim_target)] {
            if target.exists() || still_mounted(target) {
                return Err(format!("the {whose}'s volume was left behind"));
            }
        }

        // The audit log: the same filter finds the driver's read of the real Secret (the positive
        // control), and no request naming any refused name.
        let deadline = Instant::now() + WITHIN;
        while driver_requests(suite, "/secrets/hostile-creds")?.is_empty() {
            if Instant::now() > deadline {
                return Err("the audit log never showed the driver reading the shared Secret: the filter is wrong".into());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        for name in &hostile {
            let fragment = format!("sharedsecrets/{}", &name[..name.len().min(64)]);
            let found = driver_requests(suite, &fragment)?;
            if !found.is_empty() {
                return Err(format!("the driver asked the apiserver for the refused name {name:?}: {found:?}"));
            }
        }
        println!(
            "hostile projections: {} names refused before any request; invalid edits emptied the volume; another namespace's revocation took {revoked_in:?}",
            hostile.len()
        );
        Ok(())
    }
    .await;
    // The scenario's failure first; a driver failure or a leftover mount otherwise.
    result.and(driver.stop().await)
}
