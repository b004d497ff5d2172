//! Tenants against the node's driver, with the shipped DaemonSet and its limits: a user with
//! rights in one namespace only (pods, Deployments and SharedProjections there, no grant of any
//! share) floods the driver's health port and the webhook's pods from a pod, then fills volumes
//! with a projection of 1 000 pod facts (no read of anything needed) in three pods of twelve
//! volumes each, written without `readOnly` so that the mutating webhook must answer during the
//! flood; a second such user of a second namespace fills volumes the same way, the two together
//! asking more than the node's whole content budget. Meanwhile the victim, a pod of a third
//! namespace reading a share, must see an update and lose its grant within 10 s, a new pod of
//! that namespace must mount while both namespaces are refused more, and the driver must neither
//! restart nor stop serving. What the node refused and how long the victim waited are printed
//! for the report. The first attacker also labels thirty workloads of a MiB each to restart on
//! change, naming the victim's share: the read-grants controller must list them without a
//! restart and record nothing of a share they may not use.

use std::time::{Duration, Instant};

use inline_guard_tests::cluster::namespace_defaults;
use inline_guard_tests::node::{BUSYBOX_IMAGE, Node};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Event, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use sharedresource_csi_driver::controllers::rollout::plan::{OBSERVED_ANNOTATION, RESTART_LABEL};

use crate::connections;
use crate::workload::{self, DRIVER};

/// The attacker's namespace.
pub const ATTACKER: &str = "deploy-attacker";
/// The second attacker's namespace: with the first, two namespaces filling the node.
pub const SECOND_ATTACKER: &str = "deploy-attacker-two";
/// The third namespace's pod made while both fill the node.
const LATE_READER: &str = "late-reader";
/// The projection the attacker mounts.
const FLOOD: &str = "flood";
/// Pod facts in the projection: each a file of a few bytes, which tmpfs charges a page and an
/// inode for, so a volume costs about 5 MiB of the driver's memory.
const ITEMS: usize = 1000;
/// Volumes per pod, and pods.
const VOLUMES: usize = 12;
const PODS: usize = 3;
/// Every volume one attacker asks for.
pub const ATTACKER_VOLUMES: usize = VOLUMES * PODS;
/// How long the victim may wait for an update or a revocation, during the attack and after.
const VICTIM_WAIT: Duration = Duration::from_secs(10);
/// Connections the flooding pod opens to the driver's health port, one byte sent on each.
const FLOOD_CONNECTIONS: usize = 400;
/// Connections it trickles at the webhook's pods, in all (the attack the webhook was tried with).
const WEBHOOK_CONNECTIONS: usize = 300;

/// Workloads the first attacker labels to restart on change, none of them running a pod, each
/// naming the victim's share (which it may not use) and carrying a MiB of environment: a page of
/// all of them is more than the read-grants controller's shipped 128 MiB would hold beside its
/// caches, and its record of them must say nothing of the share.
const FAT_WORKLOADS: usize = 30;
const FAT_ENV_BYTES: usize = 1 << 20;

/// What the attack left to report.
pub struct AttackReport {
    /// The victim's waits, in order: update during, revocation during, restore, update after.
    pub victim_waits: Vec<(String, Duration)>,
    /// Publishes the node refused the attacker, as kubelet's events tell them (one line each).
    pub refused: Vec<String>,
    /// The attacker's volumes mounted.
    pub mounted: usize,
}

/// `namespace` and a client acting as a user with rights there only: a service account bound to
/// a Role of its namespace that may create pods and SharedProjections.
async fn attacker_client(
    admin: &kube::Client,
    cluster: &inline_guard_tests::cluster::Cluster,
    namespace: &str,
) -> Result<kube::Client, String> {
    workload::apply(admin, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})).await?;
    namespace_defaults(admin, namespace, Duration::from_secs(60)).await?;
    workload::apply(
        admin,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": namespace}}),
    )
    .await?;
    workload::apply(
        admin,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "tenant", "namespace": namespace},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
                {"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedprojections"], "verbs": ["create", "get", "delete"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create", "get", "list", "delete"]}
            ]
        }),
    )
    .await?;
    workload::apply(
        admin,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "tenant", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]
        }),
    )
    .await?;
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), bound_object_ref: None },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request("tenant", &PostParams::default(), &request)
        .await
        .map_err(|e| format!("a token for the attacker: {e}"))?
        .status
        .ok_or("a TokenRequest without status")?
        .token;
    cluster.client_with_token(&token).await
}

/// A pod of the attacker's mounting the projection `VOLUMES` times.
fn attacker_pod(name: &str) -> Value {
    let volumes: Vec<Value> = (0..VOLUMES)
        .map(|n| json!({"name": format!("p{n}"), "csi": {"driver": DRIVER, "volumeAttributes": {"projection": FLOOD}}}))
        .collect();
    let mounts: Vec<Value> =
        (0..VOLUMES).map(|n| json!({"name": format!("p{n}"), "mountPath": format!("/p{n}")})).collect();
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "sleeper", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "sleep 3600"],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    })
}

/// A pod of the attacker's holding `count` connections to each (address, port) of `targets`,
/// one byte sent on each (a request head never finished), opened again as the server closes them.
fn flooding_pod(targets: &[(String, u16, usize)]) -> Value {
    let mut script = String::new();
    for (address, port, count) in targets {
        script += &format!(
            "i=0; while [ $i -lt {count} ]; do \
               (while true; do (printf G; sleep 20) | nc {address} {port} >/dev/null 2>&1; sleep 1; done) & \
               i=$((i+1)); \
             done; "
        );
    }
    script += "echo flooding; wait";
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "flooder"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "flooder", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        }
    })
}

/// How long the victim's reader took to print `content: WANTED`, failing beyond [`VICTIM_WAIT`].
async fn victim_sees(node: &Node, wanted: &str, seen: &mut usize, what: &str) -> Result<(String, Duration), String> {
    let started = Instant::now();
    *seen = workload::wait_for_content(node, "reader", wanted, *seen).await?;
    let waited = started.elapsed();
    if waited > VICTIM_WAIT {
        return Err(format!("the victim waited {waited:?} for {what}, more than {VICTIM_WAIT:?}"));
    }
    Ok((what.to_string(), waited))
}

/// The victim (`when`: "during" or "after" the attack) sees an update, loses its grant and gets
/// it back, each within [`VICTIM_WAIT`], its content `"{when}-attack"` afterwards; the driver has
/// not restarted since it had `restarts_before` restarts. The waits.
async fn victim_served(
    admin: &kube::Client,
    node: &Node,
    seen: &mut usize,
    when: &str,
    restarts_before: i32,
) -> Result<Vec<(String, Duration)>, String> {
    let content = format!("{when}-attack");
    workload::set_content(admin, &content).await?;
    let mut waits = vec![victim_sees(node, &content, seen, &format!("an update {when} the attack")).await?];
    workload::revoke(admin).await?;
    waits.push(victim_sees(node, "", seen, &format!("a revocation {when} the attack")).await?);
    workload::grant(admin).await?;
    waits.push(victim_sees(node, &content, seen, &format!("its grant back {when} the attack")).await?);
    let (restarts_now, oom) = restarts(admin, crate::DRIVER_LABEL).await?;
    if restarts_now != restarts_before || oom {
        return Err(format!(
            "the driver restarted {when} the attack ({restarts_before} → {restarts_now}, OOM killed: {oom})"
        ));
    }
    Ok(waits)
}

/// Restarts of the pods labelled `labels` in the driver's namespace (the DaemonSet's one on this
/// node, or the read-grants controller's replicas), summed, and whether any last ended OOM killed.
async fn restarts(admin: &kube::Client, labels: &str) -> Result<(i32, bool), String> {
    let pods = Api::<Pod>::namespaced(admin.clone(), crate::DRIVER_NAMESPACE)
        .list(&ListParams::default().labels(labels))
        .await
        .map_err(|e| format!("listing the pods {labels}: {e}"))?;
    let statuses: Vec<_> = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref()?.first().cloned())
        .collect();
    if statuses.is_empty() {
        return Err(format!("no pod {labels} with a container status"));
    }
    let oom = statuses.iter().any(|status| {
        status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
    });
    Ok((statuses.iter().map(|status| status.restart_count).sum(), oom))
}

/// The first attacker's labelled workloads ([`FAT_WORKLOADS`]), made with its own rights.
async fn workload_flood(tenant: &kube::Client) -> Result<Api<Deployment>, String> {
    let deployments = Api::<Deployment>::namespaced(tenant.clone(), ATTACKER);
    let filler = "x".repeat(FAT_ENV_BYTES);
    for i in 0..FAT_WORKLOADS {
        let name = format!("fat-{i}");
        let mut template =
            json!({"metadata": {"labels": {"app": name}}, "spec": workload::share_reader(&name)["spec"]});
        template["spec"]["containers"][0]["env"] = json!([{"name": "FILLER", "value": filler}]);
        let object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ATTACKER, "labels": {RESTART_LABEL: "true"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": template}
        });
        let object: Deployment = serde_json::from_value(object).map_err(|e| e.to_string())?;
        deployments
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("the attacker's labelled workload {name}: {}", short(&e)))?;
    }
    Ok(deployments)
}

/// Whether any of the attacker's workloads' records names the share: (workloads, records
/// naming it).
async fn records_naming_the_share(deployments: &Api<Deployment>) -> Result<(usize, Vec<String>), String> {
    let mut listed = 0;
    let mut naming = Vec::new();
    let mut params = ListParams::default().limit(5);
    loop {
        let page = deployments.list_metadata(&params).await.map_err(|e| format!("listing the workloads: {e}"))?;
        for workload in &page.items {
            listed += 1;
            let record = workload.metadata.annotations.as_ref().and_then(|a| a.get(OBSERVED_ANNOTATION));
            if let Some(record) = record.filter(|record| record.contains(workload::SHARE)) {
                naming.push(format!("{}: {record}", workload.metadata.name.as_deref().unwrap_or_default()));
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((listed, naming)),
        }
    }
}

/// `error`'s message, cut at 400 characters (an apiserver's refusal lists every field).
fn short(error: &impl std::fmt::Display) -> String {
    error.to_string().chars().take(400).collect()
}

/// The IPs of the running pods of `namespace` that `labels` selects.
async fn pod_addresses(admin: &kube::Client, namespace: &str, labels: &str) -> Result<Vec<String>, String> {
    let pods = Api::<Pod>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default().labels(labels))
        .await
        .map_err(|e| format!("listing the pods {labels} of {namespace}: {e}"))?;
    let addresses: Vec<String> = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    if addresses.is_empty() {
        return Err(format!("no running pod {labels} of {namespace} has an IP"));
    }
    Ok(addresses)
}

/// The flooding pod's address, once kubelet has written it to the pod's status (its container
/// may run, and log, before that).
async fn flooder_address(pods: &Api<Pod>) -> Result<std::net::Ipv4Addr, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pod = pods.get("flooder").await.map_err(|e| format!("the flooding pod: {e}"))?;
        if let Some(ip) = pod.status.and_then(|s| s.pod_ip) {
            return ip.parse().map_err(|e| format!("the flooding pod's address {ip}: {e}"));
        }
        if Instant::now() > deadline {
            return Err("the flooding pod has no address in its status after 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// kubelet's failed probes (Warning `Unhealthy` Events) in the driver's namespace (only the
/// driver's pods have probes there), one line per occurrence.
async fn failed_probes(admin: &kube::Client) -> Result<Vec<String>, String> {
    let mut failed = Vec::new();
    for namespace in [crate::DRIVER_NAMESPACE] {
        let events = Api::<Event>::namespaced(admin.clone(), namespace)
            .list(&ListParams::default().fields("reason=Unhealthy"))
            .await
            .map_err(|e| format!("listing the Unhealthy Events of {namespace}: {e}"))?;
        for event in events.items {
            let line = format!(
                "{namespace}/{}: {}",
                event.involved_object.name.unwrap_or_default(),
                event.message.unwrap_or_default().chars().take(300).collect::<String>()
            );
            let times = event.count.unwrap_or(1).max(1) as usize;
            failed.extend(std::iter::repeat_n(line, times));
        }
    }
    Ok(failed)
}

/// How many CSI volumes of the pods `uids` are mounted on the host now (the driver's mounts
/// reach the host's mount table through the DaemonSet's Bidirectional propagation).
fn csi_mounts_of(uids: &[String]) -> Result<usize, String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("reading the mount table: {e}"))?;
    let points: Vec<&str> = table.lines().filter_map(|line| line.split(' ').nth(4)).collect();
    let mounted = uids
        .iter()
        .map(|uid| format!("/pods/{uid}/volumes/kubernetes.io~csi/"))
        .map(|below| points.iter().filter(|point| point.contains(&below) && point.ends_with("/mount")).count())
        .sum();
    Ok(mounted)
}

/// kubelet's FailedMount events for the pods of `namespace` that name the content budget.
async fn budget_refusals(admin: &kube::Client, namespace: &str) -> Result<Vec<String>, String> {
    let events = Api::<Event>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing the attacker's events: {e}"))?;
    Ok(events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedMount"))
        .filter_map(|e| e.message.clone())
        .filter(|m| m.contains("namespaceContentBudget") || m.contains("contentBudget"))
        .collect())
}

/// The projection of [`ITEMS`] pod facts, made in `namespace` by its `tenant`: the projections'
/// API, to delete it with.
async fn flood_projection(tenant: &kube::Client, namespace: &str) -> Result<Api<kube::core::DynamicObject>, String> {
    let items: Vec<Value> =
        (0..ITEMS).map(|n| json!({"path": format!("name-{n}"), "fieldPath": "metadata.name"})).collect();
    let projection = json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
        "metadata": {"name": FLOOD, "namespace": namespace},
        "spec": {"sources": [{"podInfo": {"items": items}}]}
    });
    let resource = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "sharedresource.inlineguard.dev",
        "v1alpha1",
        "SharedProjection",
    ));
    let projections = Api::<kube::core::DynamicObject>::namespaced_with(tenant.clone(), namespace, &resource);
    let projection = serde_json::from_value(projection).map_err(|e| e.to_string())?;
    projections
        .create(&PostParams::default(), &projection)
        .await
        .map_err(|e| format!("the projection of {namespace}: {}", short(&e)))?;
    Ok(projections)
}

/// The [`PODS`] filling pods of `namespace`, made by its `tenant`, each patched read-only by the
/// webhook: their uids.
async fn fill(tenant: &kube::Client, namespace: &str) -> Result<Vec<String>, String> {
    let pods = Api::<Pod>::namespaced(tenant.clone(), namespace);
    let mut uids = Vec::new();
    for n in 0..PODS {
        let pod: Pod = serde_json::from_value(attacker_pod(&format!("filler-{n}"))).map_err(|e| e.to_string())?;
        let created =
            pods.create(&PostParams::default(), &pod).await.map_err(|e| format!("{namespace}'s pod {n}: {e}"))?;
        let volumes = created.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        if volumes.iter().any(|v| v.csi.as_ref().is_some_and(|c| c.read_only != Some(true))) {
            return Err(format!(
                "{namespace}/filler-{n} was stored without csi.readOnly: the mutating webhook did not answer"
            ));
        }
        uids.push(created.metadata.uid.unwrap_or_default());
    }
    Ok(uids)
}

/// Waits until the node has refused a publish of `namespace`'s for the content budget (kubelet's
/// events say so); the refusals.
async fn refused_for_budget(admin: &kube::Client, namespace: &str) -> Result<Vec<String>, String> {
    let started = Instant::now();
    loop {
        let refused = budget_refusals(admin, namespace).await?;
        if !refused.is_empty() {
            return Ok(refused);
        }
        if started.elapsed() > Duration::from_secs(180) {
            return Err(format!("no publish of {namespace}'s was refused for the content budget within 180 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A new pod of the victim's namespace, made while the two attackers fill the node, mounts the
/// share and shows `content`; deleted afterwards.
async fn a_third_namespace_still_mounts(admin: &kube::Client, node: &Node, content: &str) -> Result<(), String> {
    let pod: Pod = serde_json::from_value(workload::share_reader(LATE_READER)).map_err(|e| e.to_string())?;
    Api::<Pod>::namespaced(admin.clone(), workload::CONSUMER)
        .create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("{}/{LATE_READER}: {e}", workload::CONSUMER))?;
    workload::wait_for_content(node, LATE_READER, content, 0).await?;
    inline_guard_tests::node::delete_and_wait(admin, workload::CONSUMER, LATE_READER).await
}

/// The attack, while the victim (`reader` of [`CONSUMER`], reading the share whose content is
/// `content` now, `seen` lines printed) keeps being served. Leaves the victim's grant in place and
/// the content `"after-attack"`; removes everything of the attacker's.
pub async fn tenants_cannot_take_the_node(
    admin: &kube::Client,
    cluster: &inline_guard_tests::cluster::Cluster,
    node: &Node,
    seen: &mut usize,
) -> Result<AttackReport, String> {
    let (restarts_before, _) = restarts(admin, crate::DRIVER_LABEL).await?;
    let (grants_restarts_before, _) = restarts(admin, crate::READ_GRANTS_LABEL).await?;
    let probes_failed_before = failed_probes(admin).await?;
    let tenant = attacker_client(admin, cluster, ATTACKER).await?;
    let second = attacker_client(admin, cluster, SECOND_ATTACKER).await?;
    let projections = flood_projection(&tenant, ATTACKER).await?;
    let second_projections = flood_projection(&second, SECOND_ATTACKER).await?;

    // The flood first: the driver's health port, and every webhook pod's HTTPS port.
    let pods = Api::<Pod>::namespaced(tenant.clone(), ATTACKER);
    let driver = pod_addresses(admin, crate::DRIVER_NAMESPACE, crate::DRIVER_LABEL).await?;
    let webhooks = pod_addresses(admin, crate::SYSTEM, "app.kubernetes.io/name=csi-volume-admission").await?;
    let mut targets: Vec<(String, u16, usize)> = driver.into_iter().map(|ip| (ip, 9808, FLOOD_CONNECTIONS)).collect();
    let per_webhook = WEBHOOK_CONNECTIONS.div_ceil(webhooks.len());
    targets.extend(webhooks.into_iter().map(|ip| (ip, 8443, per_webhook)));
    let flooder: Pod = serde_json::from_value(flooding_pod(&targets)).map_err(|e| e.to_string())?;
    pods.create(&PostParams::default(), &flooder).await.map_err(|e| format!("the flooding pod: {e}"))?;
    let started = Instant::now();
    while !node.container_log(ATTACKER, "flooder", "flooder").iter().any(|line| line == "flooding") {
        if started.elapsed() > Duration::from_secs(120) {
            return Err("the positive control: the flooding pod never started its connections".into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The positive control: the flood holds connections to the driver's health port and to
    // the webhook's port, as the node's kernel counts them in each pod's network namespace.
    let flooder_ip = flooder_address(&pods).await?;
    for (program, port) in [("sharedresource-csi-driver", 9808), ("csi-volume-admission", 8443)] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let held: usize = connections::processes_running(program)
                .into_iter()
                .map(|pid| connections::established_from(pid, port, flooder_ip))
                .sum();
            if held > 0 {
                println!("deploy: attack: the flood holds {held} connections to {program}'s port {port}");
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the positive control: no connection of the flood ({flooder_ip}) to {program}'s port {port} established within 60 s"
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // Then the volumes of both namespaces, each pod patched read-only by the webhook through
    // the flood: together they ask more than the node's whole budget.
    let uids = fill(&tenant, ATTACKER).await?;
    let second_uids = fill(&second, SECOND_ATTACKER).await?;
    // And the rollout controller's list: the first attacker's fat labelled workloads.
    let fat = workload_flood(&tenant).await?;

    // The node refuses each attacker beyond its part: kubelet's events say so.
    let mut refused = refused_for_budget(admin, ATTACKER).await?;
    refused.extend(refused_for_budget(admin, SECOND_ATTACKER).await?);

    let mut victim_waits = victim_served(admin, node, seen, "during", restarts_before).await?;
    // Two namespaces do not fill the node: a third one's new pod mounts.
    a_third_namespace_still_mounts(admin, node, "during-attack").await?;
    let mounted = csi_mounts_of(&uids)?;
    let second_mounted = csi_mounts_of(&second_uids)?;
    if mounted == 0 || second_mounted == 0 {
        return Err(format!(
            "the positive control: the attackers' volumes were not both mounted ({mounted} and {second_mounted})"
        ));
    }

    // After it: the attackers' pods deleted, the victim still served.
    for (namespace, projections) in [(ATTACKER, &projections), (SECOND_ATTACKER, &second_projections)] {
        for n in 0..PODS {
            inline_guard_tests::node::delete_and_wait(admin, namespace, &format!("filler-{n}")).await?;
        }
        projections
            .delete(FLOOD, &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting the projection of {namespace}: {e}"))?;
    }
    inline_guard_tests::node::delete_and_wait(admin, ATTACKER, "flooder").await?;
    victim_waits.extend(victim_served(admin, node, seen, "after", restarts_before).await?);
    // The victim's share changed twice meanwhile, each change read by the rollout controller
    // (the overlay opts it in): it listed every fat workload without a restart, and recorded
    // nothing of the share the attacker may not use.
    let (listed, naming) = records_naming_the_share(&fat).await?;
    if listed != FAT_WORKLOADS {
        return Err(format!(
            "the positive control: {listed} of the attacker's {FAT_WORKLOADS} labelled workloads listed"
        ));
    }
    if !naming.is_empty() {
        return Err(format!("the rollout record tells an ungranted tenant of the share: {naming:?}"));
    }
    let (grants_restarts, oom) = restarts(admin, crate::READ_GRANTS_LABEL).await?;
    if grants_restarts != grants_restarts_before {
        return Err(format!(
            "the read-grants controller restarted under the attacker's labelled workloads \
             ({grants_restarts_before} → {grants_restarts}, OOM killed: {oom})"
        ));
    }
    // The driver's every probe answered throughout, not only too few failed to restart it:
    // kubelet told no new failed probe of it (its Events reach the apiserver: the startup
    // taint's step reads its FailedMount). Its probes ask over its own socket (5 s each), so the
    // flood of its TCP health port cannot reach them; a failure here is the attack's doing.
    let probes_failed = failed_probes(admin).await?;
    if probes_failed.len() > probes_failed_before.len() {
        return Err(format!(
            "kubelet told failed probes of the driver during the attack ({} before, {} after): {:?}",
            probes_failed_before.len(),
            probes_failed.len(),
            probes_failed.iter().take(10).collect::<Vec<_>>()
        ));
    }
    Api::<Deployment>::namespaced(admin.clone(), ATTACKER)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .map_err(|e| format!("deleting the attacker's labelled workloads: {e}"))?;
    Ok(AttackReport { victim_waits, refused, mounted: mounted + second_mounted })
}
