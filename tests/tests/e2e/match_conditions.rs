//! The shipped matchConditions keep the webhook off the path of everything without inline CSI
//! volumes: counted at the webhook itself, on a server no other scenario sends to.

use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{WebhookServer, register};
use serde_json::json;

use crate::support::{
    Outcome, SERVICE_ACCOUNT, Suite, WEBHOOK_LABEL, create, create_namespace, deployment, deployments_path, pod,
    pods_path, wait_until_called,
};

/// Requests the server has answered, summed over paths and decisions.
fn answered(server: &WebhookServer) -> u64 {
    server
        .metrics()
        .lines()
        .filter(|line| line.starts_with("csi_volume_admission_requests_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
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

    let before = answered(&server);
    let mut plain = pod("no-csi", &[]);
    plain["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    let mut plain_deployment = deployment("no-csi", &[]);
    plain_deployment["spec"]["template"]["spec"]["volumes"] = json!(null);
    for (path, object) in [(pods_path(namespace), &plain), (deployments_path(namespace), &plain_deployment)] {
        let answer = create(admin, &path, object, false).await?;
        if answer.status != 201 {
            return Err(format!("{path}: {} {}", answer.status, answer.message()));
        }
    }
    let after_plain = answered(&server);

    let answer =
        create(admin, &pods_path(namespace), &pod("with-csi", &[("v", "any.e2e.inlineguard.dev")]), false).await?;
    let after_csi = answered(&server);
    registration.remove().await?;
    drop(server);

    println!(
        "webhook requests: {} for two objects without CSI volumes, {} for one pod with one",
        after_plain - before,
        after_csi - after_plain
    );
    if answer.status != 201 {
        return Err(format!("the pod with a CSI volume: {} {}", answer.status, answer.message()));
    }
    // A CSI pod goes to the validating and the mutating webhook: two requests.
    if after_plain != before || after_csi - after_plain != 2 {
        return Err(format!(
            "expected 0 requests for objects without CSI volumes and 2 for the pod with one; counted {} and {}",
            after_plain - before,
            after_csi - after_plain
        ));
    }
    Ok(())
}
