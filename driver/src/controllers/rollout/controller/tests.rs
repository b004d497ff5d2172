//! The controller's requests against an apiserver in memory (`apiserver::fake`), time paused: which
//! workloads it records and restarts, after whose access review, what it watches and for how
//! long. The real apiserver's side is proven by the end-to-end suite (`tests/tests/e2e`, the
//! rollout's scenarios).

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Method;
use serde_json::{Value, json};

use super::super::plan::{OBSERVED_ANNOTATION, RESTART_LABEL, RESTARTED_AT_ANNOTATION};
use super::{RolloutSettings, run};
use crate::DRIVER_NAME;
use crate::apiserver::fake::{FakeApiserver, until};
use sharedresource_api::NamespacedObject;

const SHARES: &str = "/apis/sharedresource.inlineguard.dev/v1alpha1";
const SECRET: &str = "/api/v1/namespaces/team-a/secrets/db-creds";
/// The one account the access reviews allow.
const ALLOWED: &str = "system:serviceaccount:app:app-sa";

fn deployment_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/app/deployments/{name}")
}

fn put_share(apiserver: &FakeApiserver, share: &str, namespace: &str, name: &str) {
    let object = json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
        "metadata": {"name": share}, "spec": {"secretRef": {"namespace": namespace, "name": name}}});
    apiserver.put(&format!("{SHARES}/sharedsecrets/{share}"), object);
}

fn put_secret(apiserver: &FakeApiserver, password: &str) {
    let object = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-creds", "namespace": "team-a"},
        "data": {"password": k8s_openapi::ByteString(password.as_bytes().to_vec())}});
    apiserver.put(SECRET, object);
}

/// A Deployment of namespace `app` running as `account`, mounting share `db`, labelled to be
/// restarted on its change when `labelled`.
fn put_deployment(apiserver: &FakeApiserver, name: &str, account: &str, labelled: bool) {
    let labels = if labelled { json!({RESTART_LABEL: "true"}) } else { json!({}) };
    let object = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "app", "labels": labels},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"serviceAccountName": account, "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "db", "csi": {"driver": DRIVER_NAME, "readOnly": true,
                    "volumeAttributes": {"sharedSecret": "db"}}}]}}}});
    apiserver.put(&deployment_path(name), object);
}

fn observed(apiserver: &FakeApiserver, name: &str) -> Option<String> {
    let object = apiserver.get(&deployment_path(name))?;
    object["metadata"]["annotations"][OBSERVED_ANNOTATION].as_str().map(str::to_owned)
}

fn restarted_at(apiserver: &FakeApiserver, name: &str) -> Option<String> {
    let object = apiserver.get(&deployment_path(name))?;
    object["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT_ANNOTATION].as_str().map(str::to_owned)
}

fn patches(apiserver: &FakeApiserver, name: &str) -> Vec<Value> {
    let path = deployment_path(name);
    apiserver.writes().into_iter().filter(|seen| seen.path == path).map(|seen| seen.body).collect()
}

/// An apiserver whose access reviews allow only [`ALLOWED`].
fn apiserver() -> Arc<FakeApiserver> {
    let apiserver = FakeApiserver::new();
    apiserver.answer_creates("subjectaccessreviews", |review| {
        let allowed = review["spec"]["user"] == json!(ALLOWED);
        let mut answered = review.clone();
        answered["status"] = json!({"allowed": allowed});
        answered
    });
    apiserver
}

fn start(apiserver: &Arc<FakeApiserver>, per_namespace: usize) -> tokio::task::JoinHandle<()> {
    let settings = RolloutSettings {
        workloads_per_namespace: per_namespace,
        timeout: Duration::from_secs(10),
        key_secret: NamespacedObject::parse("csi-driver/rollout-records-key").unwrap(),
    };
    tokio::spawn(run(apiserver.client(), settings))
}

#[tokio::test(start_paused = true)]
async fn a_workload_is_recorded_at_first_sight_then_restarted_once_per_change_of_a_share_its_pods_may_use() {
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    put_deployment(&apiserver, "web", "app-sa", true);
    // Mounts the share but may not use it: never restarted for it, nor told of its versions.
    put_deployment(&apiserver, "other", "other-sa", true);
    // Not labelled: never followed.
    put_deployment(&apiserver, "quiet", "app-sa", false);
    let controller = start(&apiserver, 10);

    until("web recorded", || observed(&apiserver, "web").is_some_and(|record| record.contains("SharedSecret/db=")))
        .await;
    let first = observed(&apiserver, "web").unwrap();
    assert_eq!(restarted_at(&apiserver, "web"), None, "the first sight is recorded, not restarted");
    assert!(apiserver.get("/api/v1/namespaces/csi-driver/secrets/rollout-records-key").is_some(), "the key was made");

    // The record's own echo (the workload's watch bringing the patch back) wakes a pass too:
    // past it, only the Secret's change can wake one.
    tokio::time::sleep(Duration::from_secs(10)).await;
    put_secret(&apiserver, "two");
    let changed = tokio::time::Instant::now();
    until("web restarted", || restarted_at(&apiserver, "web").is_some()).await;
    // The change itself wakes a pass (not the resync minutes later).
    assert!(changed.elapsed() < Duration::from_secs(5), "restarted {:?} after the change", changed.elapsed());
    let second = observed(&apiserver, "web").unwrap();
    assert_ne!(first, second, "the record holds the new version");
    // Quiet for a while: passes come (the controller's own writes wake some), no second restart.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let web = patches(&apiserver, "web");
    assert_eq!(web.len(), 2, "a record, then one restart: {web:#?}");
    for body in &web {
        assert!(body["metadata"]["resourceVersion"].is_string(), "each patch is conditional: {body}");
    }
    assert_eq!(patches(&apiserver, "other"), Vec::<Value>::new(), "a workload told nothing of a share it may not use");
    assert!(observed(&apiserver, "other").is_none());
    assert!(
        apiserver.seen().iter().all(|seen| seen.path != deployment_path("quiet")),
        "an unlabelled one is never asked of"
    );
    let reviews = apiserver.writes().into_iter().filter(|seen| seen.path.ends_with("/subjectaccessreviews")).count();
    assert!(reviews >= 2, "web's and other's access were reviewed: {reviews}");
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn only_the_object_a_share_names_is_watched_and_only_while_a_share_names_it() {
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    // A share naming what cannot be an object's name: nothing of it reaches a selector.
    put_share(&apiserver, "odd", "team-b", "x,metadata.namespace=team-c");
    put_secret(&apiserver, "one");
    put_deployment(&apiserver, "web", "app-sa", true);
    let controller = start(&apiserver, 10);

    until("web recorded", || observed(&apiserver, "web").is_some()).await;
    assert_eq!(apiserver.watching("/api/v1/namespaces/team-a/secrets?"), 1, "one watch of the named Secret");
    assert_eq!(apiserver.watching("fieldSelector=metadata.name%3Ddb-creds"), 1);
    let secret_reads: Vec<String> = apiserver
        .seen()
        .into_iter()
        .filter(|seen| seen.path.contains("/secrets") && !seen.path.contains("/csi-driver/"))
        .map(|seen| format!("{}?{}", seen.path, seen.query))
        .collect();
    assert!(!secret_reads.is_empty());
    for read in &secret_reads {
        assert!(read.starts_with("/api/v1/namespaces/team-a/secrets?"), "{read}");
        assert!(read.contains("fieldSelector=metadata.name%3Ddb-creds"), "selected by its name: {read}");
    }

    // The share goes: so does its watch, and a later change of the Secret restarts nothing.
    apiserver.remove(&format!("{SHARES}/sharedsecrets/db"));
    until("the Secret's watch stopped", || apiserver.watching("/api/v1/namespaces/team-a/secrets?") == 0).await;
    let before = patches(&apiserver, "web").len();
    put_secret(&apiserver, "two");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(restarted_at(&apiserver, "web"), None);
    assert_eq!(patches(&apiserver, "web").len(), before, "its record kept as it was: the share cannot be seen now");
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_share_deleted_and_made_again_with_other_content_restarts_its_workload_once() {
    // The object the share names is deleted: its version is forgotten; made again with other
    // content, the workload is restarted for it.
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    put_deployment(&apiserver, "web", "app-sa", true);
    let controller = start(&apiserver, 10);
    until("web recorded", || observed(&apiserver, "web").is_some_and(|record| record.contains("SharedSecret/db=")))
        .await;
    apiserver.remove(SECRET);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(restarted_at(&apiserver, "web"), None, "a Secret gone restarts nothing");
    put_secret(&apiserver, "two");
    until("web restarted", || restarted_at(&apiserver, "web").is_some()).await;
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failed_patch_is_retried_with_backoff() {
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    put_deployment(&apiserver, "web", "app-sa", true);
    apiserver.fail(Method::PATCH, &deployment_path("web"), 500, 1);
    let started = tokio::time::Instant::now();
    let controller = start(&apiserver, 10);
    until("web recorded", || observed(&apiserver, "web").is_some()).await;
    assert!(started.elapsed() < Duration::from_secs(10), "retried with backoff: {:?}", started.elapsed());
    assert_eq!(patches(&apiserver, "web").len(), 2);
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_patch_the_apiserver_fails_is_tried_again_after_a_second_not_at_the_resync() {
    // Past the first passes (the watches' lists wake a few), a failed patch is the only thing
    // that can bring the next pass soon: its backoff (1 s), not the resync minutes later.
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    let controller = start(&apiserver, 10);
    tokio::time::sleep(Duration::from_secs(10)).await;
    apiserver.fail(Method::PATCH, &deployment_path("web"), 500, 1);
    put_deployment(&apiserver, "web", "app-sa", true);
    let put = tokio::time::Instant::now();
    until("web recorded", || observed(&apiserver, "web").is_some()).await;
    assert!(put.elapsed() < Duration::from_secs(10), "tried again {:?} after the workload came", put.elapsed());
    assert_eq!(patches(&apiserver, "web").len(), 2, "the failed patch, then the one that took");
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_conflict_is_no_failure_the_watch_brings_the_change_that_caused_it() {
    // A 409 says the workload changed since the decision: the controller waits for the watch to
    // bring the change rather than retrying the stale patch. Here nothing changed, so nothing
    // comes before the resync minutes later; then the change comes, and with it the record.
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    let controller = start(&apiserver, 10);
    // The first passes over (the watches' lists wake a few), the workload comes.
    tokio::time::sleep(Duration::from_secs(10)).await;
    apiserver.fail(Method::PATCH, &deployment_path("api"), 409, 1);
    put_deployment(&apiserver, "api", "app-sa", true);
    until("api's patch tried", || patches(&apiserver, "api").len() == 1).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(observed(&apiserver, "api").is_none(), "a conflict is not retried as a failure");
    assert_eq!(patches(&apiserver, "api").len(), 1);
    put_deployment(&apiserver, "api", "app-sa", true);
    until("api recorded once its change came", || observed(&apiserver, "api").is_some()).await;
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn an_object_gone_while_the_watch_was_away_is_forgotten_at_the_relist() {
    // The Secret goes while its watch is away (the apiserver's watch cache moved on: 410, and
    // the controller lists again). A workload that appears meanwhile has never seen the Secret:
    // when it comes back with other content, that workload is recorded, not restarted.
    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    let controller = start(&apiserver, 10);
    until("the Secret watched", || apiserver.watching("/api/v1/namespaces/team-a/secrets?") == 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    apiserver.expire_watches();
    apiserver.remove(SECRET);
    until("the Secret watched again", || apiserver.watching("/api/v1/namespaces/team-a/secrets?") == 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    put_deployment(&apiserver, "late", "app-sa", true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    put_secret(&apiserver, "two");
    until("late recorded", || observed(&apiserver, "late").is_some_and(|record| record.contains("SharedSecret/db=")))
        .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(restarted_at(&apiserver, "late"), None, "it never saw the old content");
    controller.abort();
}

/// The log lines written while `body` runs on this thread.
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_namespace_is_said_once_however_its_workloads_churn() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let lines = lines.clone();
        move || Captured(lines.clone())
    };
    let subscriber = tracing_subscriber::fmt().with_writer(writer).with_ansi(false).finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let apiserver = apiserver();
    put_share(&apiserver, "db", "team-a", "db-creds");
    put_secret(&apiserver, "one");
    for name in ["a", "b", "c"] {
        put_deployment(&apiserver, name, "app-sa", true);
    }
    let controller = start(&apiserver, 1);
    until("one workload recorded", || ["a", "b", "c"].iter().any(|name| observed(&apiserver, name).is_some())).await;
    // The two not followed change again and again.
    for round in 0..5 {
        for name in ["b", "c"] {
            put_deployment(&apiserver, name, if round % 2 == 0 { "app-sa" } else { "app-sa2" }, true);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    controller.abort();
    let _ = std::io::stdout().flush();
    let text = String::from_utf8_lossy(&lines.lock().unwrap()).into_owned();
    let full = text.lines().filter(|line| line.contains("not restarted on a share's change")).count();
    assert_eq!(full, 1, "said once for the namespace:\n{text}");
    let recorded = ["a", "b", "c"].iter().filter(|name| observed(&apiserver, name).is_some()).count();
    assert_eq!(recorded, 1, "one workload followed in a namespace of room 1");
}
