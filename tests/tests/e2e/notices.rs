//! When notices stop reaching a node, a revocation and a share's edit still do, within the
//! documented bound. Once the controller has answered the node's view, its notices are cut (a
//! test-only ValidatingAdmissionPolicy refuses writes to this node's status) while a Lease the
//! scenario renews tells the node that notices are kept: a revoked grant and a share retargeted
//! to another Secret are then not seen (the positive control: only the fallback delivers them).
//! Then a pod of a namespace new to the node: its status cut, the namespace is never told, so it
//! lags, and the node asks about it alone: its revocation is seen within [`VIEW_GRACE`] + the
//! fallback, the share's edit above still is not. The scenario stops renewing, as a controller that died
//! would, and one volume is emptied and the other shows the new Secret within [`LEASE_SECONDS`] +
//! `accessFallbackSeconds` (+ one refresh pass) of the last renewal.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use sharedresource_api::node_view::{LEASE_SECONDS, LeaseRef, SharedResourceNode};
use sharedresource_csi_driver::content::cluster::NoticeSettings;
use sharedresource_csi_driver::content::cluster::notice_lease::VIEW_GRACE;

use crate::driver::kubelet_publish::{channel, kubelet_request, publish_as_kubelet};
use crate::shares::{
    InProcessDriver, WITHIN, create_object, create_shared_secret, create_use_grant, files, unpublish_as_kubelet,
    wait_for_files,
};
use crate::support::{Outcome, Suite, create, create_namespace, create_service_account, pods_path};

const OWNER: &str = "notices-owner";
const CONSUMER: &str = "notices-consumer";
/// A namespace whose first pod comes while the node's status is cut: it lags.
const LATE: &str = "notices-late";
const SHARE: &str = "notices-db";
/// A second share of the same Secret, retargeted while the notices are cut.
const RETARGETED: &str = "notices-retargeted";
const NODE: &str = "e2e-notices-cut";
const LEASE: &str = "e2e-notices-lease";
const POLICY: &str = "e2e-notices-cut";
/// How often the fallback asks again: short, so the bound is mostly the lease's.
const FALLBACK: Duration = Duration::from_secs(3);

/// Renews the scenario's Lease as the controller would, until dropped.
async fn renew(admin: kube::Client) {
    let leases = Api::<Lease>::namespaced(admin, "inline-guard-driver");
    loop {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": "e2e", "leaseDurationSeconds": 40,
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now())
            }
        });
        let _ = leases.patch(LEASE, &PatchParams::apply("e2e-notices").force(), &Patch::Apply(lease)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The policy cutting the controller's writes to [`NODE`]'s object, and its binding.
fn cut() -> Vec<serde_json::Value> {
    cut_node(NODE, POLICY)
}

/// The policy `policy` cutting every write to `node`'s status, and its binding.
fn cut_node(node: &str, policy: &str) -> Vec<serde_json::Value> {
    vec![
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["sharedresourcenodes/status"]}]},
                "matchConditions": [{"name": "this-node", "expression": format!("object.metadata.name == '{node}'")}],
                "validations": [{"expression": "false", "message": "this node hears no grant changes (e2e)", "reason": "Forbidden"}]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]}
        }),
    ]
}

/// Publishes `pod`'s volume `db` as kubelet would, and waits for its Secret's first content.
async fn publish_reader(
    driver: &InProcessDriver,
    node: &mut inline_guard_proto::csi::v1::node_client::NodeClient<tonic::transport::Channel>,
    pod: &Pod,
) -> Result<(std::path::PathBuf, inline_guard_proto::csi::v1::NodePublishVolumeRequest), String> {
    let target = driver.dir.path().join("pods/reader/volumes/kubernetes.io~csi/db/mount");
    let request = kubelet_request(pod, "db", &target)?;
    publish_as_kubelet(node, &request).await.map_err(|e| format!("publish: {e}"))?;
    wait_for_files(&target, "published", &[("password", "s3cret")]).await?;
    Ok((target, request))
}

/// Removes the cut of `node` (`policy` and its binding) and the node's object.
async fn uncut(admin: &kube::Client, nodes: &Api<SharedResourceNode>, (node, policy): (&str, &str)) {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()).delete(policy, &DeleteParams::default()).await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(admin.clone()).delete(policy, &DeleteParams::default()).await;
    let _ = nodes.delete(node, &DeleteParams::default()).await;
}

/// Waits until the writes to `node`'s status are refused: the admin's too, so its refusal says
/// the policy applies (policies load a moment after creation).
async fn until_cut(nodes: &Api<SharedResourceNode>, node: &str) -> Outcome {
    let deadline = Instant::now() + WITHIN;
    for attempt in 1.. {
        // A change of the status (a write that changes nothing may not be admitted at all);
        // the node looks at every volume again, which finds nothing revoked yet.
        let probe = Patch::Merge(json!({"status": {"everyNamespace": -attempt}}));
        match nodes.patch_status(node, &PatchParams::default(), &probe).await {
            Err(kube::Error::Api(status)) if status.code == 403 => break,
            answer if Instant::now() > deadline => {
                let answer = answer.map(|node| node.status).map_err(|e| e.to_string());
                return Err(format!(
                    "the cut was not in force within {WITHIN:?}: the status write answered {answer:?}"
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    Ok(())
}

pub async fn a_node_that_hears_no_notices_still_sees_a_revocation(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    for namespace in [OWNER, CONSUMER, LATE] {
        create_namespace(admin, namespace, "none", &[]).await?;
    }
    for namespace in [CONSUMER, LATE] {
        create_service_account(admin, namespace, "reader").await?;
    }
    for (secret, password) in [("db", "s3cret"), ("db-next", "next")] {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}, "stringData": {"password": password}
        });
        create_object(suite, &format!("/api/v1/namespaces/{OWNER}/secrets"), secret).await?;
    }
    for share in [SHARE, RETARGETED] {
        create_shared_secret(suite, share, OWNER, "db").await?;
        create_use_grant(suite, CONSUMER, "sharedsecrets", share).await?;
    }
    create_use_grant(suite, LATE, "sharedsecrets", SHARE).await?;
    let pod_of = crate::shares::pod_mounting_share;
    let answer = create(admin, &pods_path(CONSUMER), &pod_of("reader", SHARE), false).await?;
    let pod: Pod = serde_json::from_value(answer.body).map_err(|e| e.to_string())?;
    let answer = create(admin, &pods_path(CONSUMER), &pod_of("retargeted", RETARGETED), false).await?;
    let retargeted_pod: Pod = serde_json::from_value(answer.body).map_err(|e| e.to_string())?;

    let nodes = Api::<SharedResourceNode>::all(admin.clone());
    // The driver may read this Lease as it reads the shipped one: by name.
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/namespaces/inline-guard-driver/roles", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": LEASE},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE], "verbs": ["get", "list", "watch"]}]
    }))
    .await?;
    create_object(suite, "/apis/rbac.authorization.k8s.io/v1/namespaces/inline-guard-driver/rolebindings", json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": LEASE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEASE},
        "subjects": [{"kind": "ServiceAccount", "name": "sharedresource-csi-driver", "namespace": "inline-guard-driver"}]
    }))
    .await?;
    let renewing = tokio::spawn(renew(admin.clone()));
    let lease = LeaseRef::parse(&format!("inline-guard-driver/{LEASE}"))?;
    let driver = InProcessDriver::start_hearing(suite, NODE, NoticeSettings { lease, fallback: FALLBACK }).await?;
    let mut node = inline_guard_proto::csi::v1::node_client::NodeClient::new(channel(driver.socket.clone()).await?);
    let result = async {
        let (target, request) = publish_reader(&driver, &mut node, &pod).await?;
        let other = driver.dir.path().join("pods/retargeted/volumes/kubernetes.io~csi/db/mount");
        let other_request = kubelet_request(&retargeted_pod, "db", &other)?;
        publish_as_kubelet(&mut node, &other_request).await.map_err(|e| format!("publish: {e}"))?;
        wait_for_files(&other, "published", &[("password", "s3cret")]).await?;
        // The node's view says it serves the namespace and reads both shares, and the controller
        // has answered it.
        let deadline = Instant::now() + WITHIN;
        loop {
            let object = nodes.get(NODE).await.map_err(|e| e.to_string())?;
            let status = object.status.clone().unwrap_or_default();
            let told = status.of(CONSUMER).is_some() && object.spec.objects.iter().all(|o| status.of_object(o).is_some());
            if object.spec.namespaces == [CONSUMER] && object.spec.objects.len() == 2 && told {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("node {NODE}'s view did not list {CONSUMER}, told, within {WITHIN:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The driver hears notices: the lease renewed, its object current and answered.
        crate::shares::wait_for_metric(&driver.metrics, "sharedresource_csi_driver_access_notices_heard", |v| v == 1.0)
            .await?;
        // Then the cut: the controller's writes to this node's status refused.
        inline_guard_tests::apply::apply(admin, &cut(), false).await?;
        until_cut(&nodes, NODE).await?;

        // The answer held: an update of the Secret reaches the volume through its watch and
        // costs no access check (an answer asked while answers were being forgotten, by the
        // probes above or a notice's later looks, is not held: the next refresh asks again).
        let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), OWNER);
        let mut password = "s3cret".to_string();
        for round in 0.. {
            let before = crate::shares::settled_access_checks(&driver.metrics).await?;
            password = format!("v{round}");
            let update = Patch::Merge(json!({"stringData": {"password": password}}));
            secrets.patch("db", &PatchParams::default(), &update).await.map_err(|e| e.to_string())?;
            wait_for_files(&target, "the Secret's update", &[("password", password.as_str())]).await?;
            if crate::shares::settled_access_checks(&driver.metrics).await? == before {
                break;
            }
            if round == 5 {
                return Err("six updates of the Secret each made the driver ask for access again".into());
            }
        }
        Api::<RoleBinding>::namespaced(admin.clone(), CONSUMER)
            .delete(&format!("reader-uses-{SHARE}"), &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let shares = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &crate::shares::shared_secrets());
        let retarget = json!({"spec": {"secretRef": {"namespace": OWNER, "name": "db-next"}}});
        shares.patch(RETARGETED, &PatchParams::default(), &Patch::Merge(&retarget)).await.map_err(|e| e.to_string())?;
        // The positive control: with notices cut and the lease renewed, neither the revocation
        // nor the share's edit is seen (the held answer serves for 600 s, the share is held until
        // told, the periodic refresh is an hour away).
        tokio::time::sleep(Duration::from_secs(5)).await;
        if files(&other) != [("password".to_string(), password.clone())] {
            return Err(format!("the share's edit reached the node while its notices were cut: {:?}", files(&other)));
        }
        if files(&target) != [("password".to_string(), password.clone())] {
            let object = nodes.get(NODE).await.map_err(|e| e.to_string())?;
            return Err(format!(
                "the revocation reached the node while its notices were cut: {:?}; its object {:?}; its metrics:\n{}",
                files(&target),
                (object.spec, object.status),
                driver.metrics.encode().lines().filter(|l| l.contains("notices") || l.contains("access_checks")).collect::<Vec<_>>().join("\n")
            ));
        }

        // A pod of a namespace new to the node, its status still cut: the node writes the
        // namespace into its spec, and no entry for it ever comes, so that namespace lags. The
        // node asks about it on its own (its grant's deletion empties its volume within the
        // grace, the fallback and a look), and about nothing else: the share's edit above stays
        // unseen (forgetting everything, as a lagging node once did, reads it again: shown
        // failing so). The revocation above is not watched here: a look at the consumer's
        // namespace that the controller's last told change scheduled before the cut (the looks
        // go on for 30 s) may still find it, as it would without any lag.
        let late_pod: Pod = serde_json::from_value(
            create(admin, &pods_path(LATE), &pod_of("late", SHARE), false).await?.body,
        )
        .map_err(|e| e.to_string())?;
        let late = driver.dir.path().join("pods/late/volumes/kubernetes.io~csi/db/mount");
        let late_request = kubelet_request(&late_pod, "db", &late)?;
        publish_as_kubelet(&mut node, &late_request).await.map_err(|e| format!("publish: {e}"))?;
        wait_for_files(&late, "published", &[("password", password.as_str())]).await?;
        Api::<RoleBinding>::namespaced(admin.clone(), LATE)
            .delete(&format!("reader-uses-{SHARE}"), &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let lagging_revoked = Instant::now();
        let bound = VIEW_GRACE + FALLBACK + WITHIN;
        while !files(&late).is_empty() {
            if lagging_revoked.elapsed() > bound {
                let object = nodes.get(NODE).await.map_err(|e| e.to_string())?;
                return Err(format!(
                    "the revocation in {LATE}, a namespace the node's status never told, did not reach it within \
                     {bound:?}: {:?}; its object {:?}",
                    files(&late),
                    (object.spec, object.status)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "notices: a namespace never told (the status cut) saw its revocation after {:?} (bound: {VIEW_GRACE:?} + {FALLBACK:?})",
            lagging_revoked.elapsed()
        );
        if files(&other) != [("password".to_string(), password.clone())] {
            return Err(format!(
                "while only {LATE} lagged, the node read again a share that notices tell: the retargeted volume \
                 shows {:?}",
                files(&other)
            ));
        }
        unpublish_as_kubelet(&mut node, late_request.volume_id, late_request.target_path).await?;
        renewing.abort();
        let stopped = Instant::now();
        let bound = Duration::from_secs(LEASE_SECONDS) + FALLBACK + WITHIN;
        let started = Instant::now();
        let (mut revoked, mut edited) = (None, None);
        loop {
            if revoked.is_none() && files(&target).is_empty() {
                revoked = Some(stopped.elapsed());
            }
            if edited.is_none() && files(&other) == [("password".to_string(), "next".to_string())] {
                edited = Some(stopped.elapsed());
            }
            if revoked.is_some() && edited.is_some() {
                break;
            }
            if started.elapsed() > bound {
                return Err(format!(
                    "within {bound:?} of the lease's last renewal: the revocation {}, the share's edit {}",
                    if revoked.is_some() { "arrived" } else { "did not arrive" },
                    if edited.is_some() { "arrived" } else { "did not arrive" },
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "notices: with notices cut, the revocation arrived {:?} and the share's edit {:?} after the lease's renewals stopped (bound: {LEASE_SECONDS} s + {FALLBACK:?})",
            revoked.unwrap_or_default(),
            edited.unwrap_or_default()
        );
        unpublish_as_kubelet(&mut node, other_request.volume_id, other_request.target_path).await?;
        unpublish_as_kubelet(&mut node, request.volume_id, request.target_path).await
    }
    .await;
    renewing.abort();
    let stopped = driver.stop().await;
    uncut(admin, &nodes, (NODE, POLICY)).await;
    let _ =
        Api::<Lease>::namespaced(admin.clone(), "inline-guard-driver").delete(LEASE, &DeleteParams::default()).await;
    let _ = Api::<RoleBinding>::namespaced(admin.clone(), "inline-guard-driver")
        .delete(LEASE, &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), "inline-guard-driver")
        .delete(LEASE, &DeleteParams::default())
        .await;
    result.and(stopped)
}

const BROADCAST_OWNER: &str = "broadcast-owner";
const BROADCAST_CONSUMER: &str = "broadcast-consumer";
const BROADCAST_SHARE: &str = "broadcast-db";
const BROADCAST_NODE: &str = "e2e-broadcast";
const BROADCAST_POLICY: &str = "e2e-broadcast-cut";

/// The revocations' broadcast: a node that follows the shipped controller's Lease, and whose
/// status no one may write (the same test-only policy), still sees a revocation within
/// seconds: the controller writes the revoked question on the Lease, and the node holds it
/// denied at once (no status confirming it, it asks itself 10 s later). The positive control:
/// the node's status still says the question is
/// allowed when the volume is emptied, and with the lease renewed and its object current, the
/// node never falls back to looking on its own (its fallback is an hour away).
pub async fn a_revocation_reaches_a_node_through_the_lease_before_its_status(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    for namespace in [BROADCAST_OWNER, BROADCAST_CONSUMER] {
        create_namespace(admin, namespace, "none", &[]).await?;
    }
    create_service_account(admin, BROADCAST_CONSUMER, "reader").await?;
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": "s3cret"}
    });
    create_object(suite, &format!("/api/v1/namespaces/{BROADCAST_OWNER}/secrets"), secret).await?;
    create_shared_secret(suite, BROADCAST_SHARE, BROADCAST_OWNER, "db").await?;
    create_use_grant(suite, BROADCAST_CONSUMER, "sharedsecrets", BROADCAST_SHARE).await?;
    let answer = create(
        admin,
        &pods_path(BROADCAST_CONSUMER),
        &crate::shares::pod_mounting_share("reader", BROADCAST_SHARE),
        false,
    )
    .await?;
    let pod: Pod = serde_json::from_value(answer.body).map_err(|e| e.to_string())?;
    let question = format!("{BROADCAST_CONSUMER}/reader/sharedsecrets/{BROADCAST_SHARE}");

    let nodes = Api::<SharedResourceNode>::all(admin.clone());
    let hour = Duration::from_secs(3600);
    let notices = NoticeSettings { fallback: hour, ..NoticeSettings::default() };
    let driver = InProcessDriver::start_hearing(suite, BROADCAST_NODE, notices).await?;
    let mut node = inline_guard_proto::csi::v1::node_client::NodeClient::new(channel(driver.socket.clone()).await?);
    let result = async {
        let (target, request) = publish_reader(&driver, &mut node, &pod).await?;
        // The controller has answered the node's question: it knows the grant, so it can see
        // it revoked.
        let deadline = Instant::now() + WITHIN;
        while nodes.get(BROADCAST_NODE).await.ok().and_then(|n| n.status).and_then(|s| s.answer(&question))
            != Some(true)
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "the controller did not answer {question} for node {BROADCAST_NODE} within {WITHIN:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        crate::shares::wait_for_metric(&driver.metrics, "sharedresource_csi_driver_access_notices_heard", |v| v == 1.0)
            .await?;
        inline_guard_tests::apply::apply(admin, &cut_node(BROADCAST_NODE, BROADCAST_POLICY), false).await?;
        until_cut(&nodes, BROADCAST_NODE).await?;

        let revoked_at = Instant::now();
        Api::<RoleBinding>::namespaced(admin.clone(), BROADCAST_CONSUMER)
            .delete(&format!("reader-uses-{BROADCAST_SHARE}"), &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        while !files(&target).is_empty() {
            if revoked_at.elapsed() > WITHIN {
                return Err(format!(
                    "the revocation did not reach the node within {WITHIN:?} while its status was cut"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let emptied = revoked_at.elapsed();
        // Heard as a notice, not found by the fallback (an hour away, and not started: the lease
        // renewed, the object current).
        let heard = crate::shares::metric(&driver.metrics, "sharedresource_csi_driver_access_notices_heard");
        if heard != Some(1.0) {
            return Err(format!(
                "the node stopped hearing notices (access_notices_heard {heard:?}): not the broadcast's proof"
            ));
        }
        let status = nodes.get(BROADCAST_NODE).await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        if status.answer(&question) != Some(true) {
            return Err(format!("the node's status was written despite the cut: {status:?}"));
        }
        let lease = Api::<Lease>::namespaced(admin.clone(), "inline-guard-driver")
            .get("sharedresource-access-notices")
            .await
            .map_err(|e| e.to_string())?;
        let broadcast = lease.metadata.annotations.unwrap_or_default();
        let lines = broadcast.get(sharedresource_api::revocations::ANNOTATION).cloned().unwrap_or_default();
        if !lines.lines().any(|line| line.ends_with(&format!(" {question}"))) {
            return Err(format!("the lease does not carry the revocation of {question}: {lines:?}"));
        }
        println!("notices: a revocation reached a node whose status was cut in {emptied:?}, through the lease");
        unpublish_as_kubelet(&mut node, request.volume_id, request.target_path).await
    }
    .await;
    let stopped = driver.stop().await;
    uncut(admin, &nodes, (BROADCAST_NODE, BROADCAST_POLICY)).await;
    result.and(stopped)
}
