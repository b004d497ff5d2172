//! The controller's requests against an apiserver in memory (`apiserver::fake`), time paused: what
//! it applies, deletes and leaves alone, after which failures. The real apiserver's RBAC is proven
//! by the end-to-end suite (`tests/tests/e2e`, the read grants' scenarios).

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use serde_json::{Value, json};

use super::super::plan::{
    DriverAccount, GRANT_NAME, GrantOwner, MANAGED_BY, MANAGED_BY_LABEL, Readable, binding, role,
};
use super::run;
use crate::apiserver::fake::{FakeApiserver, Seen, until};
use sharedresource_api::object_name::{NamespaceName, ObjectName};

const SHARES: &str = "/apis/sharedresource.inlineguard.dev/v1alpha1";
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
const DRIVER_NAMESPACE: &str = "csi-driver";
const OWNER_UID: &str = "driver-namespace-uid";

fn driver() -> DriverAccount {
    DriverAccount::parse(&format!("{DRIVER_NAMESPACE}/sharedresource-csi-driver")).unwrap()
}

fn owner() -> GrantOwner {
    GrantOwner { namespace: NamespaceName::parse(DRIVER_NAMESPACE).unwrap(), uid: OWNER_UID.into() }
}

fn role_path(namespace: &str) -> String {
    format!("{RBAC}/namespaces/{namespace}/roles/{GRANT_NAME}")
}

fn binding_path(namespace: &str) -> String {
    format!("{RBAC}/namespaces/{namespace}/rolebindings/{GRANT_NAME}")
}

fn put_driver_namespace(apiserver: &FakeApiserver, uid: &str) {
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE, "uid": uid}});
    apiserver.put(&format!("/api/v1/namespaces/{DRIVER_NAMESPACE}"), namespace);
}

fn put_secret_share(apiserver: &FakeApiserver, share: &str, namespace: &str, name: &str) {
    let object = json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
        "metadata": {"name": share}, "spec": {"secretRef": {"namespace": namespace, "name": name}}});
    apiserver.put(&format!("{SHARES}/sharedsecrets/{share}"), object);
}

fn put_config_map_share(apiserver: &FakeApiserver, share: &str, namespace: &str, name: &str) {
    let object = json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedConfigMap",
        "metadata": {"name": share}, "spec": {"configMapRef": {"namespace": namespace, "name": name}}});
    apiserver.put(&format!("{SHARES}/sharedconfigmaps/{share}"), object);
}

/// Puts the grants the controller would make in `namespace` for Secrets `secrets`, as if made
/// before: owned by `owner` (none: by a version before owners).
fn put_grants(apiserver: &FakeApiserver, namespace: &str, secrets: &[&str], owner: Option<&GrantOwner>) {
    let name = NamespaceName::parse(namespace).unwrap();
    let readable = Readable {
        secrets: secrets.iter().map(|secret| ObjectName::parse(secret).unwrap()).collect(),
        config_maps: Default::default(),
    };
    apiserver.put(&role_path(namespace), serde_json::to_value(role(&name, &readable, owner)).unwrap());
    apiserver.put(&binding_path(namespace), serde_json::to_value(binding(&name, &driver(), owner)).unwrap());
}

fn start(apiserver: &Arc<FakeApiserver>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(apiserver.client(), driver(), Duration::from_secs(10)))
}

fn secret_names(role: &Value) -> Vec<Value> {
    let rules = role["rules"].as_array().cloned().unwrap_or_default();
    rules
        .iter()
        .filter(|rule| rule["resources"] == json!(["secrets"]))
        .map(|rule| rule["resourceNames"].clone())
        .collect()
}

fn owner_uids(object: &Value) -> Vec<Value> {
    let references = object["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
    references.iter().map(|reference| reference["uid"].clone()).collect()
}

fn deletes(apiserver: &FakeApiserver) -> Vec<String> {
    apiserver.writes().into_iter().filter(|seen| seen.method == Method::DELETE).map(|seen| seen.path).collect()
}

fn patches_of(apiserver: &FakeApiserver, path: &str) -> Vec<Seen> {
    apiserver.writes().into_iter().filter(|seen| seen.method == Method::PATCH && seen.path == path).collect()
}

#[tokio::test(start_paused = true)]
async fn shares_get_grants_owned_by_the_drivers_namespace_and_grants_no_share_needs_go() {
    let apiserver = FakeApiserver::new();
    put_driver_namespace(&apiserver, OWNER_UID);
    put_secret_share(&apiserver, "db", "team-a", "db-creds");
    put_config_map_share(&apiserver, "settings", "team-b", "app-settings");
    put_grants(&apiserver, "gone", &["old"], Some(&owner()));
    // A Role of the same name that is not the controller's (no label): never touched.
    let theirs = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": GRANT_NAME}, "rules": []});
    apiserver.put(&role_path("tenant"), theirs.clone());
    assert!(apiserver.get(&role_path("gone")).is_some() && apiserver.get(&binding_path("gone")).is_some());
    let controller = start(&apiserver);

    until("team-a and team-b granted", || {
        apiserver.get(&binding_path("team-a")).is_some() && apiserver.get(&binding_path("team-b")).is_some()
    })
    .await;
    let team_a = apiserver.get(&role_path("team-a")).unwrap();
    assert_eq!(secret_names(&team_a), [json!(["db-creds"])], "exactly the named Secret: {team_a}");
    let team_b = apiserver.get(&role_path("team-b")).unwrap();
    assert_eq!(team_b["rules"][0]["resources"], json!(["configmaps"]));
    assert_eq!(team_b["rules"][0]["resourceNames"], json!(["app-settings"]));
    for object in [&team_a, &team_b, &apiserver.get(&binding_path("team-a")).unwrap()] {
        assert_eq!(owner_uids(object), [json!(OWNER_UID)], "owned by the driver's namespace: {object}");
        assert_eq!(object["metadata"]["labels"][MANAGED_BY_LABEL], json!(MANAGED_BY));
    }
    let subjects = &apiserver.get(&binding_path("team-a")).unwrap()["subjects"];
    assert_eq!(subjects[0]["name"], json!("sharedresource-csi-driver"));
    assert_eq!(subjects[0]["namespace"], json!(DRIVER_NAMESPACE));

    until("the grants no share needs removed", || {
        apiserver.get(&role_path("gone")).is_none() && apiserver.get(&binding_path("gone")).is_none()
    })
    .await;
    assert_eq!(apiserver.get(&role_path("tenant")).map(|role| role["rules"].clone()), Some(theirs["rules"].clone()));
    assert!(
        apiserver.seen().iter().all(|seen| !seen.path.contains("/namespaces/tenant/")),
        "nothing asked of a Role that is not the controller's"
    );

    // A share removed takes its namespace's grants with it; a share added brings them.
    apiserver.remove(&format!("{SHARES}/sharedsecrets/db"));
    put_secret_share(&apiserver, "cache", "team-c", "cache-token");
    until("team-a's grants removed", || apiserver.get(&role_path("team-a")).is_none()).await;
    until("team-c granted", || apiserver.get(&binding_path("team-c")).is_some()).await;
    assert!(apiserver.get(&binding_path("team-a")).is_none());
    assert!(apiserver.get(&role_path("team-b")).is_some(), "the other share's grants stay");
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn grants_already_right_are_left_alone_and_grants_without_their_owner_applied_again() {
    let apiserver = FakeApiserver::new();
    put_driver_namespace(&apiserver, OWNER_UID);
    put_secret_share(&apiserver, "right", "team-a", "a");
    put_secret_share(&apiserver, "unowned", "team-b", "b");
    put_grants(&apiserver, "team-a", &["a"], Some(&owner()));
    put_grants(&apiserver, "team-b", &["b"], None);
    assert!(owner_uids(&apiserver.get(&role_path("team-b")).unwrap()).is_empty(), "the positive control");
    let controller = start(&apiserver);

    until("team-b's grants owned", || {
        [role_path("team-b"), binding_path("team-b")]
            .iter()
            .all(|path| apiserver.get(path).is_some_and(|object| owner_uids(&object) == [json!(OWNER_UID)]))
    })
    .await;
    // Several passes (each change, the controller's own writes coming back, wakes one).
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(patches_of(&apiserver, &role_path("team-a")).len(), 0, "a grant already right is not applied");
    assert_eq!(patches_of(&apiserver, &binding_path("team-a")).len(), 0);
    assert_eq!(patches_of(&apiserver, &role_path("team-b")).len(), 1, "applied once, then right");
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_grant_already_deleted_counts_as_deleted_and_a_failed_delete_is_retried_before_the_role_goes() {
    let apiserver = FakeApiserver::new();
    put_driver_namespace(&apiserver, OWNER_UID);
    put_grants(&apiserver, "gone", &["old"], Some(&owner()));
    put_grants(&apiserver, "failing", &["old"], Some(&owner()));
    // The binding in "gone" was deleted by someone else (the apiserver says 404); the one in
    // "failing" cannot be deleted at the first try (500).
    apiserver.fail(Method::DELETE, &binding_path("gone"), 404, 1);
    apiserver.fail(Method::DELETE, &binding_path("failing"), 500, 1);
    let controller = start(&apiserver);

    until("both roles deleted", || {
        apiserver.get(&role_path("gone")).is_none() && apiserver.get(&role_path("failing")).is_none()
    })
    .await;
    let deletes = deletes(&apiserver);
    let first = |path: &str| deletes.iter().position(|deleted| deleted == path).unwrap();
    // "gone": the 404 is a binding deleted, and its Role goes in the same step, right after it.
    assert_eq!(first(&role_path("gone")), first(&binding_path("gone")) + 1, "{deletes:#?}");
    // "failing": the Role is deleted only after its binding was (a Role left bound grants
    // nothing, but a binding left to a Role made again would grant again).
    let binding_deletes: Vec<usize> =
        deletes.iter().enumerate().filter(|(_, path)| **path == binding_path("failing")).map(|(at, _)| at).collect();
    assert!(binding_deletes.len() >= 2, "the failed delete is retried: {deletes:#?}");
    assert!(first(&role_path("failing")) > binding_deletes[1], "{deletes:#?}");
    assert!(apiserver.get(&binding_path("failing")).is_none());
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn the_owner_is_asked_for_a_few_times_two_seconds_apart_then_the_grants_are_made_without_it() {
    // The driver's namespace appears at 3 s: read at the third try (4 s).
    let apiserver = FakeApiserver::new();
    put_secret_share(&apiserver, "db", "team-a", "db-creds");
    let started = tokio::time::Instant::now();
    let controller = start(&apiserver);
    tokio::time::sleep(Duration::from_secs(3)).await;
    put_driver_namespace(&apiserver, OWNER_UID);
    until("team-a granted", || apiserver.get(&role_path("team-a")).is_some()).await;
    assert_eq!(owner_uids(&apiserver.get(&role_path("team-a")).unwrap()), [json!(OWNER_UID)]);
    let reads: Vec<Duration> = apiserver
        .seen()
        .iter()
        .filter(|seen| seen.path == format!("/api/v1/namespaces/{DRIVER_NAMESPACE}"))
        .map(|seen| seen.at - started)
        .collect();
    assert_eq!(reads, [0, 2, 4].map(Duration::from_secs), "three reads, two seconds apart");
    controller.abort();

    // A namespace that never appears: five reads, and the grants are made without an owner
    // right after the fifth (not after one more wait).
    let apiserver = FakeApiserver::new();
    put_secret_share(&apiserver, "db", "team-a", "db-creds");
    let started = tokio::time::Instant::now();
    let controller = start(&apiserver);
    until("team-a granted", || apiserver.get(&role_path("team-a")).is_some()).await;
    let seen = apiserver.seen();
    let reads = seen.iter().filter(|seen| seen.path.starts_with("/api/v1/namespaces/")).count();
    assert_eq!(reads, 5);
    assert!(owner_uids(&apiserver.get(&role_path("team-a")).unwrap()).is_empty());
    let applied = patches_of(&apiserver, &role_path("team-a"))[0].at - started;
    assert!(applied < Duration::from_secs(9), "applied {applied:?} after the start: the last read is at 8 s");
    controller.abort();

    // A namespace without a uid is no owner.
    let apiserver = FakeApiserver::new();
    put_driver_namespace(&apiserver, "");
    put_secret_share(&apiserver, "db", "team-a", "db-creds");
    let controller = start(&apiserver);
    until("team-a granted", || apiserver.get(&role_path("team-a")).is_some()).await;
    assert!(owner_uids(&apiserver.get(&role_path("team-a")).unwrap()).is_empty(), "an owner of uid \"\" owns nothing");
    controller.abort();
}
