//! `csi-volume-admission audit` against the live apiserver, as a person bound to the shipped
//! `inline-guard:csi-volume-audit` ClusterRole would run it before tightening a namespace, and
//! to find the pods the shared-resource driver would refuse at their next mount.

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::run_cli;

use crate::support::{
    Outcome, SHARED_RESOURCE_DRIVER, Suite, create, create_csi_driver, create_namespace, deployment, deployments_path,
    label_namespace, pod, pods_path, violation,
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
    pods_the_driver_would_refuse(suite).await?;

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
    let about_in = |namespace: &str, name: &str| {
        // Exactly this object: the Deployment's ReplicaSet is `rolling-HASH`.
        findings.iter().find(|f| f["object"].as_str().is_some_and(|o| o.ends_with(&format!(" {namespace}/{name}"))))
    };
    let about = |name: &str| about_in(namespace, name);

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
    for (name, status, why) in SHARE_FINDINGS {
        let message =
            format!("{name} has volumes the shared-resource driver would refuse at mount: volume \"v\": {why}");
        let found = about_in(SHARES_NAMESPACE, name).ok_or_else(|| format!("no finding for pod {name}:\n{stdout}"))?;
        let response = &found["response"];
        if response["allowed"] != json!(false)
            || response["status"]["code"] != json!(status)
            || response["status"]["message"] != json!(message)
        {
            return Err(format!("pod {name} finding: {found}\nexpected {status} saying: {message}"));
        }
    }
    println!("audit as {AUDITOR}: {} findings across the cluster, ours among them", findings.len());
    Ok(())
}

/// The namespace of pods the shared-resource driver would refuse, created where no webhook
/// judges them.
const SHARES_NAMESPACE: &str = "audit-shares";

/// `(pod, status, why)`: what `audit` must report of each pod [`pods_the_driver_would_refuse`]
/// makes, asking the live cluster as the webhook does.
const SHARE_FINDINGS: [(&str, u16, &str); 2] = [
    ("absent-share", 422, "SharedSecret \"audit-absent\" not found"),
    (
        "no-access",
        403,
        "service account audit-shares/default may not use SharedSecret \"audit-db\": grant it the verb \"use\" on \
         sharedsecrets.sharedresource.inlineguard.dev \"audit-db\" (a Role and RoleBinding in namespace audit-shares)",
    ),
];

/// Pods created before any webhook judged them: one naming a share that does not exist, one
/// whose service account may not use the share it names.
async fn pods_the_driver_would_refuse(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    create_namespace(admin, SHARES_NAMESPACE, "none", &[]).await?;
    let share = json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
                       "metadata": {"name": "audit-db"}, "spec": {"secretRef": {"namespace": SHARES_NAMESPACE, "name": "db"}}});
    let shares = "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets";
    for (name, share_name) in [("absent-share", "audit-absent"), ("no-access", "audit-db")] {
        let mut object = pod(name, &[("v", SHARED_RESOURCE_DRIVER)]);
        object["spec"]["volumes"][0]["csi"]["volumeAttributes"] = json!({"sharedSecret": share_name});
        // Read-only as the driver demands: the findings are the share's, not the read-only check's.
        object["spec"]["volumes"][0]["csi"]["readOnly"] = json!(true);
        object["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(true);
        for answer in [
            create(admin, shares, &share, false).await?,
            create(admin, &pods_path(SHARES_NAMESPACE), &object, false).await?,
        ] {
            if answer.status != 201 && answer.status != 409 {
                return Err(format!("setup of {name}: {} {}", answer.status, answer.message()));
            }
        }
    }
    Ok(())
}
