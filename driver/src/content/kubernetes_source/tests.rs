//! The Kubernetes source against an injected apiserver: a tower service answering by path, and
//! counting what was asked.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::*;
use crate::content::PassId;
use crate::content::ask::PodInfo;
use crate::content::error::Error;
use sharedresource_api::ShareKind;
use sharedresource_api::object_name::ObjectName;

/// What the fake apiserver holds.
#[derive(Clone)]
struct Cluster {
    share: bool,
    secret: bool,
    allowed: Option<bool>,
    reviews: Arc<AtomicUsize>,
    /// Reads of the share `db` by name.
    share_reads: Arc<AtomicUsize>,
    /// The namespace the share names for its Secret.
    backing_namespace: &'static str,
}

fn answer(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
}

fn not_found() -> Response<Full<Bytes>> {
    answer(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
    )
}

impl Cluster {
    fn respond(&self, request: &Request<kube::client::Body>) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        match (request.method(), path) {
            (&Method::GET, "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets/db") if self.share => {
                self.share_reads.fetch_add(1, Ordering::SeqCst);
                answer(
                    StatusCode::OK,
                    json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret", "metadata": {"name": "db"},
                           "spec": {"secretRef": {"namespace": self.backing_namespace, "name": "db-creds"}}}),
                )
            }
            (&Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews") => {
                self.reviews.fetch_add(1, Ordering::SeqCst);
                match self.allowed {
                    Some(allowed) => answer(
                        StatusCode::CREATED,
                        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {}, "status": {"allowed": allowed}}),
                    ),
                    None => answer(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500}),
                    ),
                }
            }
            (&Method::GET, "/api/v1/namespaces/infra/secrets/db-creds") if self.secret => answer(
                StatusCode::OK,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-creds", "namespace": "infra", "resourceVersion": "7"},
                       "data": {"password": "czNjcmV0"}}),
            ),
            // Everything else, the watches' lists included, finds nothing.
            _ => not_found(),
        }
    }
}

fn source(cluster: Cluster, runtime: &tokio::runtime::Runtime) -> KubernetesSource {
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let response = cluster.respond(&request);
        async move { Ok::<_, Infallible>(response) }
    });
    // The client's buffer task starts on the runtime.
    let _entered = runtime.enter();
    let client = kube::Client::new(service, "default");
    KubernetesSource::new(client, runtime.handle().clone(), Arc::new(Metrics::new()))
}

/// A source whose apiserver answers with `answer_first` when it has an answer, and as `cluster`
/// otherwise.
fn source_answering(
    cluster: Cluster,
    runtime: &tokio::runtime::Runtime,
    answer_first: impl Fn(&Request<kube::client::Body>) -> Option<Response<Full<Bytes>>> + Clone + Send + 'static,
) -> KubernetesSource {
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let response = answer_first(&request).unwrap_or_else(|| cluster.respond(&request));
        async move { Ok::<_, Infallible>(response) }
    });
    let _entered = runtime.enter();
    KubernetesSource::new(kube::Client::new(service, "default"), runtime.handle().clone(), Arc::new(Metrics::new()))
}

/// The share list: `db`, naming Secret infra/db-creds.
fn share_list() -> Response<Full<Bytes>> {
    answer(
        StatusCode::OK,
        json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecretList",
               "metadata": {"resourceVersion": "1"},
               "items": [{"metadata": {"name": "db", "resourceVersion": "1"},
                          "spec": {"secretRef": {"namespace": "infra", "name": "db-creds"}}}]}),
    )
}

fn request(service_account: &str) -> VolumeAsk {
    VolumeAsk {
        volume_id: "csi-1".into(),
        volume_name: "shared".into(),
        mount_point: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/shared/mount".into(),
        pod: PodInfo {
            name: "web".into(),
            namespace: "team-a".into(),
            uid: "u".into(),
            service_account: service_account.into(),
        },
        attributes: [("sharedSecret".to_string(), "db".to_string())].into(),
        tokens: Default::default(),
        secrets: Default::default(),
        object_versions: Default::default(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

fn everything() -> Cluster {
    Cluster {
        share: true,
        secret: true,
        allowed: Some(true),
        reviews: Arc::default(),
        share_reads: Arc::default(),
        backing_namespace: "infra",
    }
}

#[test]
fn an_allowed_service_account_gets_the_secrets_data() {
    let runtime = runtime();
    let payload = source(everything(), &runtime).content(&request("web")).unwrap();
    assert_eq!(payload.keys().collect::<Vec<_>>(), ["password"]);
    assert_eq!(payload["password"].data, b"s3cret");
}

#[test]
fn each_refusal_names_what_is_missing() {
    let runtime = runtime();
    let denied = source(Cluster { allowed: Some(false), ..everything() }, &runtime).content(&request("web"));
    assert_eq!(
        denied,
        Err(Error::Denied(
            "service account team-a/web may not use SharedSecret \"db\": grant it the verb \"use\" on sharedsecrets.sharedresource.inlineguard.dev \"db\" (a Role and RoleBinding in namespace team-a)".into()
        ))
    );
    let no_share = source(Cluster { share: false, ..everything() }, &runtime).content(&request("web"));
    assert_eq!(no_share, Err(Error::Missing("SharedSecret \"db\" not found".into())));
    let no_secret = source(Cluster { secret: false, ..everything() }, &runtime).content(&request("web"));
    assert_eq!(
        no_secret,
        Err(Error::Missing("Secret infra/db-creds, shared by SharedSecret \"db\", not found".into()))
    );
    let unreachable = source(Cluster { allowed: None, ..everything() }, &runtime).content(&request("web"));
    assert!(matches!(unreachable, Err(Error::Unavailable(_))), "{unreachable:?}");
}

/// `request("web")` marking its share optional.
fn optional_request() -> VolumeAsk {
    let mut ask = request("web");
    ask.attributes.insert("optional".into(), "true".into());
    ask
}

#[test]
fn an_optional_share_that_is_missing_serves_nothing_and_says_what_it_lacks() {
    let runtime = runtime();
    let lacking = |source: &KubernetesSource| {
        let opened = source.open(&optional_request(), Opening::Refresh(None)).unwrap();
        let absent = opened.absent.clone();
        (absent, opened.into_files().unwrap())
    };
    let source = source(Cluster { share: false, ..everything() }, &runtime);
    assert_eq!(lacking(&source), (vec!["SharedSecret \"db\" not found".to_string()], Payload::new()));
    // Said at every answer: when it begins is the volume layer's to tell (it keeps what each
    // volume lacked), so the source keeps nothing of the volume and tells no pod itself.
    assert_eq!(lacking(&source).0.len(), 1);

    let source = self::source(Cluster { secret: false, ..everything() }, &runtime);
    let (absent, files) = lacking(&source);
    assert_eq!(absent, ["Secret infra/db-creds, shared by SharedSecret \"db\", not found"]);
    assert!(files.is_empty(), "the Secret does not exist");

    let whole = self::source(everything(), &runtime);
    let (absent, files) = lacking(&whole);
    assert!(absent.is_empty(), "nothing lacking");
    assert_eq!(files.keys().collect::<Vec<_>>(), ["password"]);
}

#[test]
fn optional_never_turns_a_denial_or_an_outage_into_an_empty_volume() {
    let runtime = runtime();
    for (name, cluster) in [
        ("share missing, use denied", Cluster { share: false, allowed: Some(false), ..everything() }),
        ("secret missing, use denied", Cluster { secret: false, allowed: Some(false), ..everything() }),
        ("share missing, access unanswered", Cluster { share: false, allowed: None, ..everything() }),
        ("secret missing, access unanswered", Cluster { secret: false, allowed: None, ..everything() }),
    ] {
        let source = source(cluster, &runtime);
        let answer = source.content(&optional_request());
        match name.ends_with("denied") {
            true => assert!(matches!(answer, Err(Error::Denied(_))), "{name}: {answer:?}"),
            false => assert!(matches!(answer, Err(Error::Unavailable(_))), "{name}: {answer:?}"),
        }
    }
    // `"false"` is the default's spelling: a missing share fails the volume.
    let mut not_optional = request("web");
    not_optional.attributes.insert("optional".into(), "false".into());
    let answer = source(Cluster { share: false, ..everything() }, &runtime).content(&not_optional);
    assert_eq!(answer, Err(Error::Missing("SharedSecret \"db\" not found".into())));
}

/// One access check per (service account, share): shared within a pass, then held across
/// passes and publishes until a look at grants concerns the account (or grant changes may have been missed).
#[test]
fn an_access_answer_is_held_until_a_grant_change_concerns_its_account() {
    let runtime = runtime();
    let cluster = everything();
    let reviews = cluster.reviews.clone();
    let source = source(cluster, &runtime);
    let pass = PassId(1);
    source.start_pass(pass);
    for _ in 0..5 {
        source.content_in_pass(&request("web"), pass).unwrap();
    }
    source.content_in_pass(&request("other"), pass).unwrap();
    assert_eq!(reviews.load(Ordering::SeqCst), 2, "one per (service account, share)");
    source.end_pass(pass, None);
    source.start_pass(PassId(2));
    source.content_in_pass(&request("web"), PassId(2)).unwrap();
    source.end_pass(PassId(2), None);
    source.content(&request("web")).unwrap();
    source.content(&request("other")).unwrap();
    assert_eq!(reviews.load(Ordering::SeqCst), 2, "held across passes and publishes");

    // A binding of `web` changed: its answer is forgotten at the look, `other`'s kept.
    source.change_log().grant_changed([crate::content::changes::Accounts::One("team-a".into(), "web".into())]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while reviews.load(Ordering::SeqCst) == 2 {
        assert!(std::time::Instant::now() < deadline, "the look at the grant never forgot web's answer");
        source.content(&request("web")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let after_look = reviews.load(Ordering::SeqCst);
    source.content(&request("other")).unwrap();
    assert_eq!(reviews.load(Ordering::SeqCst), after_look, "another account's answer is kept");
    source.change_log().grants_relisted();
    source.content(&request("other")).unwrap();
    assert_eq!(reviews.load(Ordering::SeqCst), after_look + 1, "a relist of grants forgets every answer");
}

/// The collections the source's watches list and watch: everything else is a request for
/// a volume.
const WATCHED: [&str; 7] = [
    "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets",
    "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedconfigmaps",
    "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedprojections",
    "/apis/rbac.authorization.k8s.io/v1/rolebindings",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/rbac.authorization.k8s.io/v1/roles",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
];

/// A fake apiserver that counts every request made for a volume (not the watches' lists) and
/// answers none: each call waits forever.
fn stalled(requests: Arc<AtomicUsize>, runtime: &tokio::runtime::Runtime) -> KubernetesSource {
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        if !WATCHED.contains(&request.uri().path()) {
            requests.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            std::future::pending::<()>().await;
            Ok::<Response<Full<Bytes>>, Infallible>(not_found())
        }
    });
    let _entered = runtime.enter();
    let client = kube::Client::new(service, "default");
    KubernetesSource::new(client, runtime.handle().clone(), Arc::new(Metrics::new()))
        .with_request_timeout(std::time::Duration::from_millis(300))
}

#[test]
fn a_request_the_apiserver_never_answers_is_given_up_at_the_timeout() {
    let runtime = runtime();
    let requests = Arc::new(AtomicUsize::new(0));
    let source = stalled(requests.clone(), &runtime);
    let answer = source.content(&request("web"));
    let Err(Error::Unavailable(message)) = answer else { panic!("expected UNAVAILABLE, got {answer:?}") };
    assert!(message.ends_with("the apiserver did not answer within 0.3 s"), "{message}");
    assert!(requests.load(Ordering::SeqCst) >= 1, "the positive control: the same count sees the share's request");
}

#[test]
fn hostile_names_are_refused_before_any_request() {
    let runtime = runtime();
    let requests = Arc::new(AtomicUsize::new(0));
    let source = stalled(requests.clone(), &runtime);
    let long = "a".repeat(30_003);
    for hostile in
        ["?watch=true", "s1/status", "../../api/v1/namespaces/x/secrets/vault", ".", "..", "a%2fb", "a#b", &long]
    {
        for attribute in ["sharedSecret", "sharedConfigMap", "projection"] {
            let mut asked = request("web");
            asked.attributes = [(attribute.to_string(), hostile.to_string())].into();
            let answer = source.content(&asked);
            let Err(Error::Invalid(message)) = &answer else { panic!("{hostile:?}: {answer:?}") };
            assert!(message.contains("is not a valid object name"), "{message}");
            assert!(message.len() < 700, "{} bytes", message.len());
            assert!(!message.contains('%'), "{message}");
        }
    }
    assert_eq!(requests.load(Ordering::SeqCst), 0, "no request was made for a refused name");
}

#[test]
fn a_share_naming_an_object_that_cannot_exist_is_refused_without_reading_it() {
    let runtime = runtime();
    let broken = Cluster { backing_namespace: "../kube-system", ..everything() };
    let answer = source(broken, &runtime).content(&request("web"));
    let Err(error @ Error::Unservable(message)) = &answer else { panic!("{answer:?}") };
    assert!(
        message.starts_with(
            "SharedSecret db names a Secret that cannot exist: \"../kube-system\" is not a valid namespace name"
        ),
        "{message}"
    );
    assert!(error.withdraws_content(), "a published volume of it is emptied");
}

/// A backing object is watched only once this node has served a volume from it, and on its own:
/// a watch of that one Secret (the driver needs read access to nothing else); no kind is listed
/// or watched cluster-wide (shares, projections and grants reach the node through its own object).
#[test]
fn a_backing_object_is_watched_alone_once_a_volume_was_served_from_it() {
    let runtime = runtime();
    let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let source = source_answering(everything(), &runtime, {
        let asked = asked.clone();
        move |request| {
            asked.lock().unwrap().push(request.uri().to_string());
            None
        }
    });
    let infra_secrets = |asked: &[String]| asked.iter().any(|uri| uri.starts_with("/api/v1/namespaces/infra/secrets?"));
    let only_db_creds = |uri: &String| uri.contains("fieldSelector=metadata.name%3Ddb-creds");
    let wait_for = |what: &str, seen: &dyn Fn(&[String]) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !seen(&asked.lock().unwrap()) {
            assert!(std::time::Instant::now() < deadline, "never {what}: {:?}", asked.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!infra_secrets(&asked.lock().unwrap()), "watched infra's Secrets before serving from there");
    // A volume served from infra starts the watch there.
    source.content(&request("web")).unwrap();
    wait_for("watched infra's Secrets", &|asked| infra_secrets(asked));
    let asked = asked.lock().unwrap();
    let watches: Vec<&String> =
        asked.iter().filter(|uri| uri.starts_with("/api/v1/namespaces/infra/secrets?")).collect();
    assert!(watches.iter().all(|uri| only_db_creds(uri)), "a watch of more than infra/db-creds: {watches:?}");
    let cluster_wide: Vec<&String> =
        asked.iter().filter(|uri| WATCHED.contains(&uri.split('?').next().unwrap_or_default())).collect();
    assert!(cluster_wide.is_empty(), "a kind listed or watched cluster-wide: {cluster_wide:?}");
    assert!(
        asked.iter().any(|uri| uri.starts_with("/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets/db")),
        "the share was read by name"
    );
}

/// A projection showing the pod's labels is refused, naming the item, without reading the pod,
/// unless reading pods was opted into; then the pod is read and its labels shown.
#[test]
fn pod_labels_are_read_only_when_opted_into() {
    let runtime = runtime();
    let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let service = tower::service_fn({
        let asked = asked.clone();
        move |request: Request<kube::client::Body>| {
            let path = request.uri().path().to_string();
            asked.lock().unwrap().push(path.clone());
            let response = match path.as_str() {
                "/apis/sharedresource.inlineguard.dev/v1alpha1/namespaces/team-a/sharedprojections/app" => answer(
                    StatusCode::OK,
                    json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedProjection",
                           "metadata": {"name": "app", "namespace": "team-a"},
                           "spec": {"sources": [{"podInfo": {"items": [
                               {"path": "name", "fieldPath": "metadata.name"},
                               {"path": "labels", "fieldPath": "metadata.labels"}]}}]}}),
                ),
                "/api/v1/namespaces/team-a/pods/web" => answer(
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "web", "namespace": "team-a", "uid": "u", "labels": {"app": "web"}}}),
                ),
                _ => not_found(),
            };
            async move { Ok::<_, Infallible>(response) }
        }
    });
    let _entered = runtime.enter();
    let client = kube::Client::new(service, "default");
    let mut projected = request("reader");
    projected.attributes = [("projection".to_string(), "app".to_string())].into();
    let pod_read = |asked: &[String]| asked.iter().any(|path| path.contains("/pods/"));

    let refusing = KubernetesSource::new(client.clone(), runtime.handle().clone(), Arc::new(Metrics::new()));
    assert_eq!(
        refusing.content(&projected),
        Err(Error::Unservable(
            "SharedProjection team-a/\"app\": sources[0] (podInfo) shows \"metadata.labels\" of the pod, and this \
             node's driver does not read pods (podMetadata is off in its configuration; \
             config/deploy/driver/pod-metadata.yaml opts in)"
                .into()
        ))
    );
    assert!(asked.lock().unwrap().iter().any(|p| p.ends_with("/sharedprojections/app")), "the projection was read");
    assert!(!pod_read(&asked.lock().unwrap()), "the pod was read without the opt-in");

    let reading =
        KubernetesSource::new(client, runtime.handle().clone(), Arc::new(Metrics::new())).with_pod_metadata(true);
    let payload = reading.content(&projected).unwrap();
    assert_eq!(payload["labels"].data, b"app=\"web\"");
    assert!(pod_read(&asked.lock().unwrap()));
}

/// A backing object RBAC does not grant the driver (the read-grants controller has not caught up
/// with a new share) is UNAVAILABLE, kubelet retries, and the message says why in the driver's
/// words, never the apiserver's.
#[test]
fn a_backing_object_not_yet_granted_is_unavailable_naming_the_controller() {
    let runtime = runtime();
    let source = source_answering(everything(), &runtime, |request| {
        (request.uri().path() == "/api/v1/namespaces/infra/secrets/db-creds").then(|| {
            answer(
                StatusCode::FORBIDDEN,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                       "message": "secrets \"db-creds\" is forbidden: User \"system:serviceaccount:x:y\" cannot get"}),
            )
        })
    });
    assert_eq!(
        source.content(&request("web")),
        Err(Error::Unavailable(
            "the driver may not read Secret infra/db-creds yet: the read-grants controller \
             (sharedresource-read-grants) grants it to the driver once a share names it"
                .into()
        ))
    );
}

/// A backing object's version as its watch listed it lets the volumes use the content read at
/// that version: once the list is in, a refresh reads nothing (before, only an update's event
/// did, so every refresh of an object never updated read it again).
#[test]
fn an_object_listed_at_the_version_read_is_not_read_again() {
    let runtime = runtime();
    let reads = Arc::new(AtomicUsize::new(0));
    let source = source_answering(everything(), &runtime, {
        let reads = reads.clone();
        move |request| {
            let path = request.uri().path();
            if path == "/api/v1/namespaces/infra/secrets/db-creds" {
                reads.fetch_add(1, Ordering::SeqCst);
            }
            let listing = !request.uri().query().unwrap_or_default().contains("watch=true");
            if listing && path == WATCHED[0] {
                return Some(share_list());
            }
            (listing && path == "/api/v1/namespaces/infra/secrets").then(|| {
                answer(
                    StatusCode::OK,
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                           "metadata": {"resourceVersion": "7"},
                           "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                      "metadata": {"name": "db-creds", "namespace": "infra", "resourceVersion": "7"}}]}),
                )
            })
        }
    });
    source.content(&request("web")).unwrap();
    assert_eq!(reads.load(Ordering::SeqCst), 1, "the first publish reads the Secret");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let before = reads.load(Ordering::SeqCst);
        source.content(&request("web")).unwrap();
        if reads.load(Ordering::SeqCst) == before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "every refresh read the Secret again ({before} reads)");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A helper program answering the design's protocol (the shipped example's shape): `mount`
/// lists one file, `get` prints its content.
fn helper(dir: &std::path::Path) -> std::path::PathBuf {
    let helper = dir.join("helper");
    std::fs::write(
        &helper,
        "#!/bin/sh\ncase \"$1\" in\nmount) printf '{\"enable-dirs\": [\"secrets\"], \"files\": {\"secrets\": [\"db-password\"]}}' ;;\nget) printf 'from-the-helper' ;;\nesac\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    helper
}

/// A source with the helper as provider `example`, fetching `mode`.
fn with_provider(
    cluster: Cluster,
    runtime: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    mode: crate::content::external::provider::FetchMode,
) -> KubernetesSource {
    use crate::content::external::provider::{ExecProvider, Provider};
    let provider = ExecProvider {
        name: ObjectName::parse("example").unwrap(),
        helper: helper(dir),
        mode,
        timeout: Duration::from_secs(30),
        cache_ttl: Duration::from_secs(60),
        max_file_bytes: 1 << 20,
        run_as: crate::content::external::provider::HelperUser::this_process(),
    };
    let providers = Providers::new([("example".to_string(), Provider::Exec(provider))].into(), 4);
    source(cluster, runtime).with_providers(providers)
}

fn provider_request(service_account: &str) -> VolumeAsk {
    VolumeAsk { attributes: [("provider".to_string(), "example".to_string())].into(), ..request(service_account) }
}

#[test]
fn a_provider_serves_its_files_only_to_a_service_account_granted_use_of_it() {
    use crate::content::external::provider::FetchMode;
    let runtime = runtime();
    let dir = tempfile::tempdir().unwrap();
    let allowed = with_provider(everything(), &runtime, dir.path(), FetchMode::Eager);
    let payload = allowed.content(&provider_request("web")).unwrap();
    assert_eq!(payload.keys().collect::<Vec<_>>(), ["secrets/db-password"]);
    assert_eq!(payload["secrets/db-password"].data, b"from-the-helper");
    // Eager: nothing is left for the volume layer to serve lazily.
    assert!(allowed.lazy(&provider_request("web")).unwrap().is_none());

    let denied =
        with_provider(Cluster { allowed: Some(false), ..everything() }, &runtime, dir.path(), FetchMode::Eager);
    let refusal = denied.content(&provider_request("web")).unwrap_err();
    assert!(
        matches!(&refusal, Error::Denied(why) if why.starts_with("service account team-a/web may not use provider \"example\"")),
        "{refusal:?}"
    );
    // A provider the node does not run: missing, naming where providers are configured.
    let unknown = VolumeAsk { attributes: [("provider".to_string(), "vault".to_string())].into(), ..request("web") };
    assert_eq!(
        allowed.content(&unknown),
        Err(Error::Missing(
            "provider \"vault\" is not configured on this node (providers in the driver's configuration)".into()
        ))
    );
}

#[test]
fn a_lazy_provider_leaves_its_files_to_be_fetched_when_opened() {
    use crate::content::external::provider::FetchMode;
    let runtime = runtime();
    let dir = tempfile::tempdir().unwrap();
    let lazy = with_provider(everything(), &runtime, dir.path(), FetchMode::Lazy);
    assert!(lazy.lazy(&provider_request("web")).unwrap().is_some(), "a lazy provider's volume is served lazily");
    assert!(lazy.lazy(&request("web")).unwrap().is_none(), "a share's volume is not");
    let denied = with_provider(Cluster { allowed: Some(false), ..everything() }, &runtime, dir.path(), FetchMode::Lazy);
    assert!(matches!(denied.lazy(&provider_request("web")), Err(Error::Denied(_))));
}

#[test]
fn a_provider_class_named_for_a_helper_is_refused() {
    use crate::content::external::provider::FetchMode;
    let runtime = runtime();
    let dir = tempfile::tempdir().unwrap();
    let source = with_provider(everything(), &runtime, dir.path(), FetchMode::Eager);
    let mut ask = provider_request("web");
    ask.attributes.insert(crate::content::external::provider_class::CLASS_ATTRIBUTE.to_string(), "vault-db".into());
    let refusal = source.content(&ask).unwrap_err();
    assert!(
        matches!(&refusal, Error::Invalid(why) if why.ends_with("is for providers of kind secrets-store; provider \"example\" is not one")),
        "{refusal:?}"
    );
}

/// A share is read once and held until the node is told it changed (or stops hearing notices):
/// then one refresh pass reads it once for all its volumes.
#[test]
fn a_share_is_held_until_told_and_read_once_per_pass_after() {
    let runtime = runtime();
    let cluster = everything();
    let reads = cluster.share_reads.clone();
    let source = source(cluster, &runtime);
    let other_volume = VolumeAsk { volume_id: "csi-2".into(), ..request("web") };
    source.content(&request("web")).unwrap();
    assert_eq!(reads.load(Ordering::SeqCst), 1, "the first publish reads it: the count's positive control");
    source.content(&other_volume).unwrap();
    assert_eq!(reads.load(Ordering::SeqCst), 1, "held: the second publish reads nothing");
    // Told of a change: forgotten, so the next publish reads it again...
    source.cluster.cache().forget_share(ShareKind::Secret, "db");
    source.content(&request("web")).unwrap();
    assert_eq!(reads.load(Ordering::SeqCst), 2);
    // ...and within one pass (a refresh of every volume), the first read serves the rest.
    source.cluster.cache().forget_shares();
    let pass = PassId(1);
    source.start_pass(pass);
    source.content_in_pass(&request("web"), pass).unwrap();
    source.content_in_pass(&other_volume, pass).unwrap();
    source.end_pass(pass, None);
    assert_eq!(reads.load(Ordering::SeqCst), 3);
}

#[test]
fn dropping_the_source_ends_its_watches() {
    let runtime = runtime();
    let before = runtime.metrics().num_alive_tasks();
    let source = source(everything(), &runtime);
    assert!(runtime.metrics().num_alive_tasks() > before, "the source's watches and client run on the runtime");
    drop(source);
    // The watches end, and with them the last handles on the client, whose task ends too.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while runtime.metrics().num_alive_tasks() > before {
        assert!(std::time::Instant::now() < deadline, "the source's tasks outlived it");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Only a refusal (403) reads as "not granted yet": any other failure to read a backing object is
/// unavailable, naming the apiserver's answer, so a broken apiserver is never blamed on RBAC.
#[test]
fn a_backing_object_the_apiserver_fails_to_read_is_unavailable_not_ungranted() {
    let runtime = runtime();
    let source = source_answering(everything(), &runtime, |request| {
        (request.uri().path() == "/api/v1/namespaces/infra/secrets/db-creds").then(|| {
            answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500,
                       "message": "etcd is down"}),
            )
        })
    });
    assert_eq!(
        source.content(&request("web")),
        Err(Error::Unavailable(
            "reading Secret infra/db-creds: the apiserver answered HTTP 500 InternalError; the driver's log has the details"
                .into()
        ))
    );
}

/// A pass that found a share writes the share's status once it ends: its conditions say what the
/// pass saw of the backing object.
#[test]
fn the_end_of_a_pass_writes_what_it_saw_into_the_shares_status() {
    let runtime = runtime();
    let written = Arc::new(AtomicUsize::new(0));
    let source = source_answering(Cluster { secret: false, ..everything() }, &runtime, {
        let written = written.clone();
        move |request| {
            let status = "/apis/sharedresource.inlineguard.dev/v1alpha1/sharedsecrets/db/status";
            (request.method() == Method::PATCH && request.uri().path() == status).then(|| {
                written.fetch_add(1, Ordering::SeqCst);
                answer(StatusCode::OK, json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedSecret",
                                              "metadata": {"name": "db"}, "spec": {"secretRef": {"namespace": "infra", "name": "db-creds"}}}))
            })
        }
    });
    let pass = PassId(7);
    source.start_pass(pass);
    assert!(source.content_in_pass(&request("web"), pass).is_err(), "the Secret is missing");
    assert_eq!(written.load(Ordering::SeqCst), 0, "nothing is written before the pass ends");
    source.end_pass(pass, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while written.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the pass's end wrote no status");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_source_is_ready_at_once_and_checks_a_volumes_attributes_whole() {
    let runtime = runtime();
    let source = source(everything(), &runtime);
    // Its answers come from the apiserver at each publish: nothing to wait for before serving.
    assert!(source.ready());
    assert_eq!(source.check_attributes(&request("web")), Ok(()));
    let both = VolumeAsk {
        attributes: [("sharedSecret".to_string(), "db".to_string()), ("sharedConfigMap".to_string(), "db".to_string())]
            .into(),
        ..request("web")
    };
    assert!(matches!(source.check_attributes(&both), Err(Error::Invalid(_))), "{:?}", source.check_attributes(&both));
}

#[test]
fn the_changes_it_hands_out_are_the_feed_its_watches_write() {
    let runtime = runtime();
    let source = source(everything(), &runtime);
    let (first, second) = (source.changes().expect("a feed of changes"), source.changes().expect("a feed of changes"));
    // One feed: a volume layer listening to a copy would never hear of a grant or object change.
    assert!(Arc::ptr_eq(&first, &second));
}

#[test]
fn a_providers_object_versions_come_back_with_its_files_and_nothing_is_kept_of_them() {
    use crate::content::external::provider::{Provider, SecretsStoreProvider};
    use crate::content::external::secrets_store::tests::{answer, serve};
    let runtime = runtime();
    let served = runtime.block_on(serve(Ok(answer(&[("db/password", 0, "s3cret")], &[("db", "7")])), Duration::ZERO));
    let provider = SecretsStoreProvider {
        name: ObjectName::parse("vault").unwrap(),
        socket: served.socket.clone(),
        timeout: Duration::from_secs(60),
        max_message_bytes: 64 << 10,
    };
    let providers = Providers::new([("vault".to_string(), Provider::SecretsStore(provider))].into(), 4);
    let source = source(everything(), &runtime).with_providers(providers);
    let ask = VolumeAsk { attributes: [("provider".to_string(), "vault".to_string())].into(), ..request("web") };
    let opened = source.open(&ask, Opening::Refresh(None)).unwrap();
    assert_eq!(opened.versions, [("db".to_string(), "7".to_string())].into(), "the versions the provider answered");
    let Shown::Files(files) = opened.shown else { panic!("an eager provider's files are laid out") };
    assert_eq!(files["db/password"].data, b"s3cret");
    // What the volume's record sends back is the provider's to compare: the source keeps none.
    let again = VolumeAsk { object_versions: [("db".to_string(), "7".to_string())].into(), ..ask };
    assert_eq!(source.open(&again, Opening::Refresh(None)).unwrap().versions.len(), 1);
}

/// The ways these tests open a volume, each through the one [`ContentSource::open`].
trait Opens {
    /// A volume's files outside a pass, as a refresh of it asks them.
    fn content(&self, ask: &VolumeAsk) -> Result<Payload>;
    /// A volume's files within refresh pass `pass`.
    fn content_in_pass(&self, ask: &VolumeAsk, pass: PassId) -> Result<Payload>;
    /// A new publish's lazy files; `None` when the volume's files are laid out in full.
    fn lazy(&self, ask: &VolumeAsk) -> Result<Option<Arc<dyn crate::content::lazy::LazyFiles>>>;
    /// Whether a new publish of the volume is taken (its attributes first).
    fn check_attributes(&self, ask: &VolumeAsk) -> Result<()>;
}

impl Opens for KubernetesSource {
    fn content(&self, ask: &VolumeAsk) -> Result<Payload> {
        self.open(ask, Opening::Refresh(None))?.into_files()
    }

    fn content_in_pass(&self, ask: &VolumeAsk, pass: PassId) -> Result<Payload> {
        self.open(ask, Opening::Refresh(Some(pass)))?.into_files()
    }

    fn lazy(&self, ask: &VolumeAsk) -> Result<Option<Arc<dyn crate::content::lazy::LazyFiles>>> {
        Ok(match self.open(ask, Opening::Publish)?.shown {
            Shown::Lazy(files) => Some(files),
            Shown::Files(_) => None,
        })
    }

    fn check_attributes(&self, ask: &VolumeAsk) -> Result<()> {
        self.open(ask, Opening::Publish).map(drop)
    }
}
