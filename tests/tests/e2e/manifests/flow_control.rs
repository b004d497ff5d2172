//! The shipped priority levels on the real apiserver: each component's requests fall in a level
//! of its own, as the apiserver's own answers to them say (its flow control names the level in
//! `X-Kubernetes-PF-PriorityLevel-UID`, on every answer, a refusal included): every node's
//! driver in `sharedresource-csi-driver` (`config/deploy/driver/node-priority.yaml`), the
//! read-grants controller in `sharedresource-read-grants` (`read-grants.yaml`), where both
//! would otherwise share `workload-low` with every other ServiceAccount of the cluster.

use std::time::{Duration, Instant};

use k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration;
use kube::api::Api;
use serde_json::Value;

use crate::shares::WITHIN;
use crate::support::{Outcome, Suite};

/// The header naming the priority level a request was given.
const LEVEL_HEADER: &str = "X-Kubernetes-PF-PriorityLevel-UID";

/// The flow-control objects of `file`.
fn flow_control_of(file: &str) -> Result<Vec<Value>, String> {
    let objects = inline_guard_tests::apply::objects(&inline_guard_tests::repo_root().join(file))?;
    Ok(objects
        .into_iter()
        .filter(|object| object["apiVersion"].as_str().is_some_and(|v| v.starts_with("flowcontrol.apiserver.k8s.io/")))
        .collect())
}

/// The uid of the priority level the apiserver gives a request of `client`'s.
async fn level_of(client: &kube::Client) -> Result<String, String> {
    // Any request is classified, whatever the authorizer then answers.
    let request = http::Request::get("/api/v1/namespaces/default/secrets/flow-control-probe")
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| e.to_string())?;
    let answer = client.send(request).await.map_err(|e| format!("GET as the component: {e}"))?;
    let level = answer.headers().get(LEVEL_HEADER).and_then(|value| value.to_str().ok());
    Ok(level.unwrap_or("(no level named)").to_string())
}

pub async fn each_components_requests_fall_in_its_own_priority_level(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    for (file, account) in [
        ("config/deploy/driver/node-priority.yaml", "sharedresource-csi-driver"),
        ("config/deploy/driver/read-grants.yaml", "sharedresource-read-grants"),
    ] {
        let flow = flow_control_of(file)?;
        let kinds: Vec<&str> = flow.iter().filter_map(|object| object["kind"].as_str()).collect();
        if kinds != ["PriorityLevelConfiguration", "FlowSchema"] {
            return Err(format!("{file} ships flow-control objects {kinds:?}: wanted a level and its schema"));
        }
        inline_guard_tests::apply::apply(admin, &flow, false).await?;
        let level = Api::<PriorityLevelConfiguration>::all(admin.clone()).get(account).await;
        let uid = level.map_err(|e| format!("the level {account}: {e}"))?.metadata.uid.unwrap_or_default();
        let user = format!("system:serviceaccount:inline-guard-driver:{account}");
        let groups = ["system:serviceaccounts", "system:serviceaccounts:inline-guard-driver", "system:authenticated"];
        let client = suite.cluster.client_as(&user, &groups).await?;
        // The apiserver takes a new schema up in the background: asked until it does.
        let deadline = Instant::now() + WITHIN;
        loop {
            let given = level_of(&client).await?;
            if given == uid {
                println!("flow control: {account}'s requests are in its own level {uid}");
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{account}'s requests are given level {given}, not {account} ({uid}), after {WITHIN:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // A ServiceAccount of no component stays where the apiserver puts every other one.
    let other = suite
        .cluster
        .client_as("system:serviceaccount:default:bystander", &["system:serviceaccounts", "system:authenticated"])
        .await?;
    let given = level_of(&other).await?;
    let ours = Api::<PriorityLevelConfiguration>::all(admin.clone());
    for account in ["sharedresource-csi-driver", "sharedresource-read-grants"] {
        let uid = ours.get(account).await.map_err(|e| e.to_string())?.metadata.uid.unwrap_or_default();
        if given == uid {
            return Err(format!("another ServiceAccount's request was given {account}'s level"));
        }
    }
    Ok(())
}
