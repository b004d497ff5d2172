//! The driver reads exactly what shares name, as the apiserver sees the driver's own token (a
//! TokenRequest for its ServiceAccount, authenticated, not impersonated): the shipped driver role
//! grants no Secret, the read-grants controller (running as its own shipped
//! ServiceAccount) grants a Secret by name when a share names it, repairs its grant when someone
//! deletes it, and takes it away when the share goes. (That the grants are *enough* is proven by
//! every shares and projections scenario: their drivers run as this identity.)

use std::time::{Duration, Instant};

use inline_guard_tests::apply::objects;
use inline_guard_tests::repo_root;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::shares::{DRIVER_USER, WITHIN, create_shared_secret};
use crate::support::{Outcome, Suite, allowed, create_namespace};

const NAMESPACE: &str = "grants-owner";
const SHARE: &str = "grants-e2e";
/// The Role and RoleBinding the controller keeps (`read_grants::plan::GRANT_NAME`, spelled out:
/// the suite checks what an operator sees).
const GRANT: &str = "sharedresource-csi-driver-reads";

/// What the driver's identity may do with the Secrets of [`NAMESPACE`].
#[derive(Debug, PartialEq, Eq)]
struct DriverSees {
    named: bool,
    unnamed: bool,
    list_namespace: bool,
    watch_named: bool,
}

async fn driver_sees(driver: &kube::Client) -> Result<DriverSees, String> {
    let secrets = Api::<Secret>::namespaced(driver.clone(), NAMESPACE);
    let one = ListParams::default().fields("metadata.name=named");
    Ok(DriverSees {
        named: allowed(secrets.get("named").await)?,
        unnamed: allowed(secrets.get("unnamed").await)?,
        list_namespace: allowed(secrets.list_metadata(&ListParams::default()).await)?,
        watch_named: allowed(secrets.list_metadata(&one).await)?,
    })
}

/// Polls until the driver sees `wanted`, for at most [`WITHIN`]; prints how long it took.
async fn wait_until(driver: &kube::Client, what: &str, wanted: &DriverSees) -> Outcome {
    let started = Instant::now();
    loop {
        let seen = driver_sees(driver).await?;
        if &seen == wanted {
            println!("{what} after {:?}", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > WITHIN {
            return Err(format!("{what}: not within {WITHIN:?}; the driver sees {seen:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client with a token the apiserver issued to the driver's ServiceAccount, as the DaemonSet's
/// projected token is.
async fn driver_token_client(suite: &Suite) -> Result<kube::Client, String> {
    token_client(suite, "sharedresource-csi-driver", DRIVER_USER).await
}

/// The read-grants controller's identity.
const READ_GRANTS_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-read-grants";

/// A client with a token the apiserver issued to ServiceAccount `account` of the driver's
/// namespace, checked to authenticate as `user`.
async fn token_client(suite: &Suite, account: &str, user: &str) -> Result<kube::Client, String> {
    let accounts = Api::<ServiceAccount>::namespaced(suite.admin.clone(), "inline-guard-driver");
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), bound_object_ref: None },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("TokenRequest for ServiceAccount {account}: {e}"))?;
    let token = answer.status.ok_or("a TokenRequest without status")?.token;
    let driver = suite.cluster.client_with_token(&token).await?;
    // The apiserver knows the token as the driver's ServiceAccount.
    let review = serde_json::from_value(json!({"spec": {}})).map_err(|e| e.to_string())?;
    let me = Api::<SelfSubjectReview>::all(driver.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| format!("SelfSubjectReview with the driver's token: {e}"))?;
    let me = me.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_default();
    if me != user {
        return Err(format!("the token of {account} authenticates as {me:?}, not {user}"));
    }
    Ok(driver)
}

/// The controller writes Roles and RoleBindings of its own name only, and reads what the access
/// notices need: every Role and RoleBinding (metadata only, nothing of them kept: see
/// `access_notices`), every node's SharedResourceNode, whose status only it may write. Asked to
/// write a Role of another name, or a node's spec, the apiserver refuses it.
pub async fn the_read_grants_controller_sees_only_objects_of_its_own_name(suite: &Suite) -> Outcome {
    let controller = token_client(suite, "sharedresource-read-grants", READ_GRANTS_USER).await?;
    let every = ListParams::default().limit(1);
    let named = ListParams::default().fields(&format!("metadata.name={GRANT}"));
    let nodes = Api::<sharedresource_api::node_view::SharedResourceNode>::all(controller.clone());
    let seen = (
        allowed(Api::<Role>::all(controller.clone()).list_metadata(&named).await)?,
        allowed(Api::<RoleBinding>::all(controller.clone()).list_metadata(&every).await)?,
        allowed(nodes.list_metadata(&every).await)?,
    );
    if seen != (true, true, true) {
        return Err(format!(
            "the controller lists (its named Roles, every RoleBinding, every SharedResourceNode): {seen:?}, wanted all"
        ));
    }
    let other: Role = serde_json::from_value(json!({"metadata": {"name": "not-the-grant", "namespace": "default"}}))
        .map_err(|e| e.to_string())?;
    let node: sharedresource_api::node_view::SharedResourceNode = serde_json::from_value(json!({
        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedResourceNode",
        "metadata": {"name": "not-its-own"}, "spec": {"namespaces": ["default"]}
    }))
    .map_err(|e| e.to_string())?;
    let written = (
        allowed(Api::<Role>::namespaced(controller.clone(), "default").create(&PostParams::default(), &other).await)?,
        allowed(nodes.create(&PostParams::default(), &node).await)?,
    );
    if written != (false, false) {
        return Err(format!(
            "the controller writes (a Role of another name, a node's spec): {written:?}, wanted neither"
        ));
    }
    Ok(())
}

pub async fn driver_reads_only_what_shares_name(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let driver = driver_token_client(suite).await?;
    create_namespace(admin, NAMESPACE, "none", &[]).await?;
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    for name in ["named", "unnamed"] {
        let secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}}))
            .map_err(|e| e.to_string())?;
        secrets.create(&PostParams::default(), &secret).await.map_err(|e| format!("creating Secret {name}: {e}"))?;
    }
    let nothing = DriverSees { named: false, unnamed: false, list_namespace: false, watch_named: false };
    let before = driver_sees(&driver).await?;
    if before != nothing {
        return Err(format!("before any share names it, the driver sees {before:?}"));
    }
    // Nor any Secret, ConfigMap or pod anywhere through its own role (pods: the suite opts in
    // to reading them, so they are checked against the shipped role alone in `rbac.yaml`).
    let cluster_wide = ListParams::default().limit(1);
    if allowed(Api::<Secret>::all(driver.clone()).list_metadata(&cluster_wide).await)?
        || allowed(Api::<ConfigMap>::all(driver.clone()).list_metadata(&cluster_wide).await)?
    {
        return Err("the driver lists Secrets or ConfigMaps cluster-wide".into());
    }
    // No RBAC object either: grant changes reach it through its node's own object, whose status
    // (what it is told) only the access-notices controller writes.
    if allowed(Api::<RoleBinding>::all(driver.clone()).list_metadata(&cluster_wide).await)?
        || allowed(Api::<Role>::all(driver.clone()).list_metadata(&cluster_wide).await)?
    {
        return Err("the driver lists Roles or RoleBindings".into());
    }
    let told = kube::api::Patch::Merge(json!({"status": {"everyNamespace": 1}}));
    let nodes = Api::<sharedresource_api::node_view::SharedResourceNode>::all(driver.clone());
    if allowed(nodes.patch_status("any-node", &kube::api::PatchParams::default(), &told).await)? {
        return Err("the driver may write what a node is told (a SharedResourceNode's status)".into());
    }
    let shipped = objects(&repo_root().join("config/deploy/driver/rbac.yaml"))?;
    let resources: Vec<&str> = shipped
        .iter()
        .filter(|object| object["kind"] == "ClusterRole")
        .flat_map(|role| role["rules"].as_array().into_iter().flatten())
        .flat_map(|rule| rule["resources"].as_array().into_iter().flatten())
        .filter_map(|resource| resource.as_str())
        .collect();
    if !resources.contains(&"sharedsecrets") || resources.iter().any(|r| ["secrets", "configmaps", "pods"].contains(r))
    {
        return Err(format!("the driver's shipped role names {resources:?}"));
    }

    create_shared_secret(suite, SHARE, NAMESPACE, "named").await?;
    let granted = DriverSees { named: true, unnamed: false, list_namespace: false, watch_named: true };
    wait_until(&driver, "a share names the Secret: the driver may read and watch it, and nothing else", &granted)
        .await?;
    // The grant is the controller's, as an operator finds it.
    let role = Api::<Role>::namespaced(admin.clone(), NAMESPACE).get(GRANT).await.map_err(|e| e.to_string())?;
    let rules = serde_json::to_value(role.rules.unwrap_or_default()).map_err(|e| e.to_string())?;
    let expected = json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["named"], "verbs": ["get", "list", "watch"]}]);
    if rules != expected {
        return Err(format!("Role {NAMESPACE}/{GRANT} grants {rules}, not {expected}"));
    }
    // It belongs to the driver's Namespace, so the grants go when the driver is uninstalled
    // (the garbage collector's part is the deploy scenario's: `kubectl delete -k`, `helm uninstall`).
    let driver_namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .get("inline-guard-driver")
        .await
        .map_err(|e| e.to_string())?;
    let owners: Vec<(String, String, String)> = role
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .map(|owner| (owner.kind, owner.name, owner.uid))
        .collect();
    let wanted =
        ("Namespace".to_string(), "inline-guard-driver".to_string(), driver_namespace.metadata.uid.unwrap_or_default());
    if owners != [wanted.clone()] {
        return Err(format!("Role {NAMESPACE}/{GRANT} is owned by {owners:?}, not {wanted:?}"));
    }

    // Someone deletes the binding: the controller puts it back.
    // (The authorizer's cache may not see the deletion before the repair: a new binding, a new
    // uid, is what shows the repair.)
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE);
    let deleted = bindings.get(GRANT).await.map_err(|e| e.to_string())?.metadata.uid;
    bindings.delete(GRANT, &DeleteParams::default()).await.map_err(|e| format!("deleting the binding: {e}"))?;
    let started = Instant::now();
    loop {
        let now = bindings.get_opt(GRANT).await.map_err(|e| e.to_string())?;
        if now.is_some_and(|binding| binding.metadata.uid != deleted) {
            break;
        }
        if started.elapsed() > WITHIN {
            return Err(format!("the binding deleted by hand was not made again within {WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(&driver, "the binding deleted by hand is back", &granted).await?;

    let shares = kube::api::Api::<kube::api::DynamicObject>::all_with(admin.clone(), &crate::shares::shared_secrets());
    shares.delete(SHARE, &DeleteParams::default()).await.map_err(|e| format!("deleting the share: {e}"))?;
    wait_until(&driver, "the share deleted: the permission went with it", &nothing).await?;
    let roles = Api::<Role>::namespaced(admin.clone(), NAMESPACE);
    let left = (
        roles.get_opt(GRANT).await.map_err(|e| e.to_string())?.is_some(),
        bindings.get_opt(GRANT).await.map_err(|e| e.to_string())?.is_some(),
    );
    if left != (false, false) {
        return Err(format!("the grant's Role and RoleBinding should be gone (present: {left:?})"));
    }
    Ok(())
}
