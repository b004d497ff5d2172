//! `csi-volume-admission audit` against the live apiserver, as a person bound to the shipped
//! `inline-guard:csi-volume-audit` ClusterRole would run it before tightening a namespace.

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::run_cli;

use crate::support::{
    Outcome, Suite, create, create_csi_driver, create_namespace, deployment, deployments_path, label_namespace, pod,
    pods_path, violation,
};

const AUDITOR: &str = "e2e-auditor";

pub async fn reports_what_tightening_would_deny(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "e2e-auditor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "inline-guard:csi-volume-audit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": AUDITOR}]
    }))
    .map_err(|e| e.to_string())?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .map_err(|e| e.to_string())?;

    let namespace = "audit-command";
    let driver = "audited.e2e.inlineguard.dev";
    create_namespace(admin, namespace, "shared", &[]).await?;
    create_csi_driver(admin, driver, Some("privileged")).await?;
    for answer in [
        create(admin, &pods_path(namespace), &pod("running", &[("v", driver)]), false).await?,
        create(admin, &deployments_path(namespace), &deployment("rolling", &[("v", driver)]), false).await?,
    ] {
        if answer.status != 201 {
            return Err(format!("setup: {} {}", answer.status, answer.message()));
        }
    }
    label_namespace(admin, namespace, "pod-security.kubernetes.io/enforce", Some("restricted")).await?;

    let kubeconfig = suite.cluster.kubeconfig_as(AUDITOR)?;
    let config = repo_root().join("config/admission.yaml");
    let args = [
        "audit",
        "--kubeconfig",
        kubeconfig.to_str().unwrap_or_default(),
        "--config",
        config.to_str().unwrap_or_default(),
        "-o",
        "json",
    ]
    .map(String::from);
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || run_cli(&args.each_ref().map(String::as_str)))
        .await
        .map_err(|e| e.to_string())??;
    if code != 1 {
        return Err(format!("audit exited {code} (expected 1: something would be denied)\n{stdout}\n{stderr}"));
    }
    let findings: Vec<Value> = stdout.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let about = |name: &str| {
        // Exactly this object: the Deployment's ReplicaSet is `rolling-HASH`.
        findings.iter().find(|f| f["object"].as_str().is_some_and(|o| o.ends_with(&format!(" {namespace}/{name}"))))
    };

    let pod_message = violation("running", driver, namespace, "enforce", "privileged");
    let denied = about("running").ok_or_else(|| format!("no finding for pod running:\n{stdout}"))?;
    if denied["response"]["allowed"] != json!(false) || denied["response"]["status"]["message"] != json!(pod_message) {
        return Err(format!("pod finding: {denied}\nexpected a denial saying: {pod_message}"));
    }
    let workload_message = violation("rolling", driver, namespace, "enforce", "privileged");
    let warned = about("rolling").ok_or_else(|| format!("no finding for deployment rolling:\n{stdout}"))?;
    if warned["response"]["allowed"] != json!(true) || warned["response"]["warnings"] != json!([workload_message]) {
        return Err(format!("deployment finding: {warned}\nexpected a warning saying: {workload_message}"));
    }
    println!("audit as {AUDITOR}: {} findings across the cluster, ours among them", findings.len());
    Ok(())
}
