//! A rolling restart of the webhook Deployment while a client creates pods in a loop: every
//! answer must be the one the webhook gives (`failurePolicy: Fail` stays), so none that should
//! be admitted is lost and none that should be denied is admitted. Creates are dry runs: they
//! pass the whole admission chain, webhooks included, without loading the node with pods.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::kubectl::Kubectl;

/// What the loop saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Creates answered as the webhook answers: admitted and patched read-only, or denied with
    /// the exact message.
    pub as_expected: usize,
    /// Creates that should have been admitted and were not (a failed webhook call, mostly).
    pub lost: Vec<String>,
    /// Creates that should have been denied and were admitted.
    pub wrongly_admitted: Vec<String>,
    /// Creates that should have been denied and were refused for another reason (the webhook
    /// unreachable): not admitted, but not the webhook's answer either.
    pub refused_otherwise: Vec<String>,
    /// Creates the apiserver failed because the keep-alive connection it sent the webhook call
    /// on was being closed by an old pod as it drained (Go's transport does not retry a POST
    /// then), each created again as a client would, the last answer counted above.
    pub retried: Vec<String>,
}

impl Tally {
    /// The counts, and the first answers that were not the webhook's (each cut to 300 bytes).
    pub fn summary(&self) -> String {
        let unexpected: Vec<String> = [&self.lost, &self.wrongly_admitted, &self.refused_otherwise, &self.retried]
            .into_iter()
            .flatten()
            .take(6)
            .map(|answer| answer.chars().take(300).collect())
            .collect();
        format!(
            "{} creates as the webhook answers, {} lost, {} wrongly admitted, {} refused otherwise, {} created again after meeting a closing connection; first answers not the webhook's: {unexpected:?}",
            self.as_expected,
            self.lost.len(),
            self.wrongly_admitted.len(),
            self.refused_otherwise.len(),
            self.retried.len()
        )
    }
}

/// How many times one create is tried while it meets closing connections. An old pod closes all
/// its idle connections at once at the end of its drain, and the apiserver may hold several of
/// them: a retry at once can take the next one as it closes too, so a client waits a moment.
const ATTEMPTS: u32 = 4;

/// Whether a create failed on the apiserver's side of a webhook connection the old pod had
/// closed while it sat idle: Go's transport reports that it found the connection closed
/// (`use of closed network connection`, `server closed idle connection`), so the call never
/// reached the webhook. A reset or an EOF is not that race: the request may have been written
/// and the answer lost, so it counts as lost, never retried.
fn met_a_closing_connection(status: u16, body: &Value) -> bool {
    let message = body["message"].as_str().unwrap_or_default();
    status == 500
        && message.contains("failed calling webhook")
        && ["use of closed network connection", "server closed idle connection"]
            .iter()
            .any(|error| message.contains(error))
}

/// [`create`], created again (up to [`ATTEMPTS`] in all, after a growing pause) while it meets a
/// closing connection, each retry noted in `tally`.
async fn create_as_a_client(
    client: &kube::Client,
    namespace: &str,
    pod: &Value,
    tally: &mut Tally,
) -> Result<(u16, Value), String> {
    let mut attempt = 1;
    loop {
        let (status, body) = create(client, namespace, pod).await?;
        if attempt == ATTEMPTS || !met_a_closing_connection(status, &body) {
            return Ok((status, body));
        }
        tally.retried.push(format!("{status} {}", body["message"]));
        tokio::time::sleep(Duration::from_millis(100) * attempt).await;
        attempt += 1;
    }
}

/// Two pods to create over and over: one the webhook admits (patching it read-only), one it
/// denies with `denial`.
pub struct Probes {
    /// `(namespace, pod)` to be admitted.
    pub admitted: (String, Value),
    /// `(namespace, pod)` to be denied, and the apiserver's exact message.
    pub denied: (String, Value, String),
}

async fn create(client: &kube::Client, namespace: &str, pod: &Value) -> Result<(u16, Value), String> {
    let request = http::Request::post(format!("/api/v1/namespaces/{namespace}/pods?dryRun=All"))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(pod).map_err(|e| e.to_string())?))
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await.map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// Runs `kubectl rollout restart` and waits for `rollout status`, creating both probes in turn
/// from before the restart until the old pods are gone.
pub async fn restart_under_load(admin: &kube::Client, kubectl: &Kubectl, probes: Probes) -> Result<Tally, String> {
    let stop = Arc::new(AtomicBool::new(false));
    // Rounds (one create of each probe) answered as the webhook answers, seen from outside.
    let rounds = Arc::new(AtomicUsize::new(0));
    let looping = {
        let (admin, stop, rounds) = (admin.clone(), stop.clone(), rounds.clone());
        tokio::spawn(async move {
            let mut tally = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let (namespace, pod) = &probes.admitted;
                let (status, body) = create_as_a_client(&admin, namespace, pod, &mut tally).await?;
                if status == 201 && body["spec"]["volumes"][0]["csi"]["readOnly"] == json!(true) {
                    tally.as_expected += 1;
                } else {
                    tally.lost.push(format!("{status} {}", body["message"]));
                }
                let (namespace, pod, denial) = &probes.denied;
                let (status, body) = create_as_a_client(&admin, namespace, pod, &mut tally).await?;
                match status {
                    403 if body["message"] == json!(denial) => tally.as_expected += 1,
                    200..=299 => tally.wrongly_admitted.push(format!("{status}")),
                    _ => tally.refused_otherwise.push(format!("{status} {}", body["message"])),
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(tally)
        })
    };
    // The loop is seen answering before the restart (a condition, not a time: a cold machine
    // may take long for its first round).
    let deadline = Instant::now() + Duration::from_secs(120);
    while rounds.load(Ordering::Relaxed) < 2 {
        if looping.is_finished() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_restart = rounds.load(Ordering::Relaxed);
    let started = Instant::now();
    let restart = async {
        kubectl.run(&["rollout", "restart", "deployment/csi-volume-admission", "-n", "inline-guard-system"]).await?;
        kubectl
            .run(&[
                "rollout",
                "status",
                "deployment/csi-volume-admission",
                "-n",
                "inline-guard-system",
                "--timeout=240s",
            ])
            .await
    };
    let restarted = restart.await;
    let during_restart = rounds.load(Ordering::Relaxed) - before_restart;
    println!("deploy: webhook rollout restart completed in {:?}", started.elapsed());
    // `rollout status` returns once the new pods are available; the old ones drain after it
    // (preStop, then the server's shutdown delay). Keep creating until they are gone.
    let drained = old_pods_gone(admin).await;
    println!("deploy: the old webhook pods were gone {:?} after the restart", started.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let tally = looping.await.map_err(|e| e.to_string())??;
    restarted?;
    drained?;
    if before_restart < 2 || during_restart == 0 {
        return Err(format!(
            "the create loop was not seen working: {before_restart} rounds before the restart, {during_restart} during it: {tally:?}"
        ));
    }
    Ok(tally)
}

/// Waits (up to 120 s) until the webhook's pods are two, none terminating.
async fn old_pods_gone(admin: &kube::Client) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Pod;
    let pods = kube::Api::<Pod>::namespaced(admin.clone(), "inline-guard-system");
    let selector = kube::api::ListParams::default().labels("app.kubernetes.io/name=csi-volume-admission");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = pods.list(&selector).await.map_err(|e| e.to_string())?.items;
        if listed.len() == 2 && listed.iter().all(|p| p.metadata.deletion_timestamp.is_none()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{} webhook pods 120 s after the restart, some still terminating", listed.len()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
