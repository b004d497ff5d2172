//! Pod-template workloads through the apiserver: an enforce violation is a warning plus an audit
//! annotation under the shipped default (the pods the controller creates are then denied), and a
//! denial under the OpenShift-compatible configuration (`enforceOnWorkloads: true`).

use serde_json::json;

use crate::support::{
    Outcome, Suite, WORKLOAD_WEBHOOK, annotations_from, audit_event, create, create_csi_driver, create_namespace,
    denied_by, deployment, deployments_path, pod_spec, violation,
};

const DRIVER: &str = "privileged.workloads.e2e.inlineguard.dev";
const CRONJOB_WEBHOOK: &str = "cronjobs.csi-volume-admission.inlineguard.dev";

pub async fn warned_by_default_denied_when_enforced(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    create_csi_driver(admin, DRIVER, Some("privileged")).await?;
    let enforce = [("pod-security.kubernetes.io/enforce", "restricted")];
    let mut wrong = Vec::new();

    // Shipped default: warned and annotated, by the workloads webhook.
    let namespace = "workloads-default";
    create_namespace(admin, namespace, "shared", &enforce).await?;
    let answer = create(admin, &deployments_path(namespace), &deployment("api", &[("v", DRIVER)]), false).await?;
    let message = violation("api", DRIVER, namespace, "enforce", "privileged");
    let event = audit_event(&suite.cluster, "deployments", namespace, "api").await?;
    let annotations = annotations_from(&event, WORKLOAD_WEBHOOK);
    if answer.status != 201
        || answer.warnings != [message.clone()]
        || annotations != [("enforce-violations".into(), message)]
    {
        wrong.push(format!("default deployment: {} {:?} {annotations:?}", answer.status, answer.warnings));
    }

    // A CronJob goes through its own webhook (its template sits one level deeper).
    let cronjob = json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "report"},
        "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": pod_spec(&[("v", DRIVER)])["containers"], "volumes": pod_spec(&[("v", DRIVER)])["volumes"]
        }}}}}
    });
    let answer = create(admin, &format!("/apis/batch/v1/namespaces/{namespace}/cronjobs"), &cronjob, false).await?;
    let message = violation("report", DRIVER, namespace, "enforce", "privileged");
    let event = audit_event(&suite.cluster, "cronjobs", namespace, "report").await?;
    let annotations = annotations_from(&event, CRONJOB_WEBHOOK);
    if answer.status != 201
        || answer.warnings != [message.clone()]
        || annotations != [("enforce-violations".into(), message)]
    {
        wrong.push(format!(
            "default cronjob: {} {:?} {annotations:?} {}",
            answer.status,
            answer.warnings,
            answer.message()
        ));
    }

    // enforceOnWorkloads: denied outright.
    let namespace = "workloads-openshift";
    create_namespace(admin, namespace, "openshift", &enforce).await?;
    let answer = create(admin, &deployments_path(namespace), &deployment("api", &[("v", DRIVER)]), false).await?;
    let expected = denied_by(WORKLOAD_WEBHOOK, &violation("api", DRIVER, namespace, "enforce", "privileged"));
    if answer.status != 403 || answer.message() != expected {
        wrong.push(format!("enforced deployment: {} {}", answer.status, answer.message()));
    }
    if wrong.is_empty() { Ok(()) } else { Err(wrong.join("\n")) }
}
