//! The webhook killed (SIGKILL, no drain) and restarted while pods are being created: with
//! failurePolicy Fail, no pod that must be denied is ever admitted, and admission resumes once
//! the server is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{WebhookServer, register};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::support::{
    Outcome, SERVICE_ACCOUNT, Suite, WEBHOOK_LABEL, create, create_csi_driver, create_namespace, pod, pods_path,
    wait_until_called,
};

const RESTARTS: usize = 3;

/// Creation counts by expectation and answer.
#[derive(Debug, Default)]
struct Tally {
    forbidden_admitted: Vec<String>,
    forbidden_denied: usize,
    forbidden_failed_closed: usize,
    fine_admitted: usize,
    fine_failed_closed: usize,
    /// Any other answer: a denial of a fine pod, a failure that is not the webhook's absence.
    unexpected: Vec<String>,
}

/// The apiserver's answer when a webhook with failurePolicy Fail cannot be called: 500, naming
/// the webhook ("failed calling webhook"). Only that counts as failing closed.
fn failed_closed(status: u16, message: &str) -> bool {
    status == 500 && message.contains("failed calling webhook")
}

pub async fn no_forbidden_pod_admitted(suite: &Suite) -> Outcome {
    let admin = suite.admin.clone();
    let identity = suite.cluster.kubeconfig_as(SERVICE_ACCOUNT)?;
    let config = repo_root().join("config/admission.yaml");
    let mut server = WebhookServer::start(&suite.cluster, "webhook-restart", &config, &identity)?;
    let registration = register(&admin, &server, "restart", json!({"matchLabels": {WEBHOOK_LABEL: "restart"}})).await?;
    wait_until_called(&admin, "restart").await?;
    let namespace = "restart";
    create_namespace(&admin, namespace, "restart", &[("pod-security.kubernetes.io/enforce", "restricted")]).await?;
    let (forbidden, fine) = ("forbidden.restart.e2e.inlineguard.dev", "fine.restart.e2e.inlineguard.dev");
    create_csi_driver(&admin, forbidden, Some("privileged")).await?;
    create_csi_driver(&admin, fine, Some("restricted")).await?;

    let running = Arc::new(AtomicBool::new(true));
    let creator = tokio::spawn({
        let (admin, running) = (admin.clone(), running.clone());
        async move {
            let mut tally = Tally::default();
            let mut n = 0;
            while running.load(Ordering::Relaxed) {
                n += 1;
                for (kind, driver) in [("forbidden", forbidden), ("fine", fine)] {
                    let name = format!("{kind}-{n}");
                    let answer = create(&admin, &pods_path(namespace), &pod(&name, &[("v", driver)]), false).await?;
                    let message = answer.message();
                    let closed = failed_closed(answer.status, message);
                    match (kind, answer.status) {
                        ("forbidden", 201) => tally.forbidden_admitted.push(name),
                        ("forbidden", 403) if message.contains(forbidden) => tally.forbidden_denied += 1,
                        ("forbidden", _) if closed => tally.forbidden_failed_closed += 1,
                        ("fine", 201) => tally.fine_admitted += 1,
                        ("fine", _) if closed => tally.fine_failed_closed += 1,
                        _ => tally.unexpected.push(format!(
                            "{name}: {} {}",
                            answer.status,
                            message.chars().take(300).collect::<String>()
                        )),
                    }
                }
            }
            Ok::<_, String>(tally)
        }
    });

    for _ in 0..RESTARTS {
        tokio::time::sleep(Duration::from_millis(400)).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Blocking is fine here: the creator task runs on the runtime's workers, not this thread.
        server.restart()?;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    running.store(false, Ordering::Relaxed);
    let tally = creator.await.map_err(|e| e.to_string())??;
    println!("across {RESTARTS} kills: {tally:?}");

    // The apiserver's own record, in case a create answered oddly but stored the pod anyway.
    let stored = Api::<Pod>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let leaked: Vec<String> =
        stored.items.iter().filter_map(|p| p.metadata.name.clone()).filter(|n| n.starts_with("forbidden")).collect();
    registration.remove().await?;
    drop(server);

    if !tally.forbidden_admitted.is_empty() || !leaked.is_empty() {
        return Err(format!(
            "pods that must be denied were admitted: {:?} / stored: {leaked:?}",
            tally.forbidden_admitted
        ));
    }
    if !tally.unexpected.is_empty() {
        return Err(format!("answers that are neither the webhook's nor its absence's: {:?}", tally.unexpected));
    }
    if tally.forbidden_failed_closed == 0 || tally.fine_admitted == 0 || tally.forbidden_denied == 0 {
        return Err(format!("the scenario did not exercise both states (server up and down): {tally:?}"));
    }
    Ok(())
}
