//! SharedResourceAdmission through the real apiserver and the generated webhook entries: what the
//! driver would refuse at mount is refused at creation, with the driver's words: a
//! SharedProjection whose paths collide (on create and on update), a pod whose volume attributes
//! the driver refuses, a pod naming a share that does not exist, a pod whose service account RBAC
//! does not let `use` its share; a workload with such a template is admitted with the same words
//! as a warning, and admitted pods follow once the RoleBinding exists. A burst of 100 pods asks
//! RBAC a handful of times, counted at the webhook.

use serde_json::{Value, json};

use crate::support::{
    Answer, Outcome, POD_WEBHOOK, SHARED_RESOURCE_DRIVER, Suite, WORKLOAD_WEBHOOK, create, create_namespace, denied_by,
    deployment, deployments_path, pod, pods_path, send, wait_established,
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

    let typo = "volumeAttributes[\"refreshResouce\"] is not an attribute of this driver: a sharedSecret volume takes \"sharedSecret\" and \"refreshResource\" only";
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
    expect("a pod naming a share", &answer, 201, "")
}
