//! The `secrets-store` client against a provider served by tonic on a real unix socket: what
//! `Mount` is sent, how answers are checked, and how a provider that fails, hangs or is not
//! there is reported. (The end-to-end suites ask a provider built from upstream's own module.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use inline_guard_proto::secretsstore::csi_driver_provider_server::{CsiDriverProvider, CsiDriverProviderServer};
use inline_guard_proto::secretsstore::{self, File, VersionRequest, VersionResponse};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::*;
use sharedresource_api::object_name::ObjectName;

/// A provider answering every `Mount` with `answer` after `delay`, keeping the requests.
#[derive(Clone)]
pub(crate) struct FakeProvider {
    answer: Arc<Mutex<std::result::Result<MountResponse, Status>>>,
    delay: Duration,
    requests: Arc<Mutex<Vec<MountRequest>>>,
}

#[tonic::async_trait]
impl CsiDriverProvider for FakeProvider {
    async fn version(&self, _: Request<VersionRequest>) -> std::result::Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse { version: "v1alpha1".into(), ..Default::default() }))
    }

    async fn mount(&self, request: Request<MountRequest>) -> std::result::Result<Response<MountResponse>, Status> {
        self.requests.lock().unwrap().push(request.into_inner());
        tokio::time::sleep(self.delay).await;
        self.answer.lock().unwrap().clone().map(Response::new)
    }
}

pub(crate) struct Served {
    provider: FakeProvider,
    client: SecretsStoreClient,
    pub(crate) socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// A timeout no answer of the fake provider comes near, however busy the machine: only the
/// hang test waits for one, with its own short timeout.
const PATIENT: Duration = Duration::from_secs(60);

/// A fake provider answering `answer` after `delay`, served on the current runtime.
pub(crate) async fn serve(answer: std::result::Result<MountResponse, Status>, delay: Duration) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vault.sock");
    let provider = FakeProvider { answer: Arc::new(Mutex::new(answer)), delay, requests: Arc::default() };
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tonic::transport::Server::builder().add_service(CsiDriverProviderServer::new(provider.clone()));
    tokio::spawn(server.serve_with_incoming(UnixListenerStream::new(listener)));
    Served { provider, client: client_of(socket.clone(), PATIENT), socket, _dir: dir }
}

fn client_of(socket: std::path::PathBuf, timeout: Duration) -> SecretsStoreClient {
    SecretsStoreClient::new(SecretsStoreProvider {
        name: ObjectName::parse("vault").unwrap(),
        socket,
        timeout,
        max_message_bytes: 64 << 10,
    })
}

fn ask() -> VolumeAsk {
    VolumeAsk::example(&[("provider", "vault"), ("roleName", "db")])
}

/// An answer to `Mount` of `files` (path, mode, contents) at object `versions`.
pub(crate) fn answer(files: &[(&str, i32, &str)], versions: &[(&str, &str)]) -> MountResponse {
    MountResponse {
        object_version: versions
            .iter()
            .map(|(id, v)| ObjectVersion { id: id.to_string(), version: v.to_string() })
            .collect(),
        error: None,
        files: files
            .iter()
            .map(|(path, mode, contents)| File {
                path: path.to_string(),
                mode: *mode,
                contents: contents.as_bytes().to_vec(),
            })
            .collect(),
    }
}

#[tokio::test]
async fn mount_is_sent_what_upstreams_driver_sends_and_its_files_are_served_with_their_modes() {
    let served =
        serve(Ok(answer(&[("db/password", 0o440, "s3cret"), ("ca.crt", 0, "pem")], &[("db", "7")])), Duration::ZERO)
            .await;
    let (payload, versions) = served.client.files(&ask()).await.unwrap();
    assert_eq!(versions, [("db".to_string(), "7".to_string())].into());
    assert_eq!(payload["db/password"].data, b"s3cret");
    assert_eq!(payload["db/password"].mode, 0o440);
    assert_eq!(payload["ca.crt"].mode, 0o644, "an unset mode is the permission asked for");

    let requests = served.provider.requests.lock().unwrap().clone();
    let [request] = requests.as_slice() else { panic!("{requests:?}") };
    let attributes: serde_json::Value = serde_json::from_str(&request.attributes).unwrap();
    let expected = serde_json::json!({
        "roleName": "db",
        "csi.storage.k8s.io/pod.name": "web", "csi.storage.k8s.io/pod.namespace": "team-a",
        "csi.storage.k8s.io/pod.uid": "u1", "csi.storage.k8s.io/serviceAccount.name": "reader",
        "csi.storage.k8s.io/ephemeral": "true",
    });
    assert_eq!(attributes, expected);
    assert_eq!((request.secrets.as_str(), request.permission.as_str()), ("{}", "420"));
    assert_eq!(request.target_path, "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/secrets/mount");
    assert!(request.current_object_version.is_empty(), "nothing was answered before");
}

#[tokio::test]
async fn the_node_publish_secrets_are_sent_and_never_printed() {
    let served = serve(Ok(answer(&[("a", 0, "x")], &[])), Duration::ZERO).await;
    let ask = VolumeAsk {
        secrets: crate::content::ask::PublishSecrets::new([("clientSecret".to_string(), "hunter2".to_string())]),
        ..ask()
    };
    served.client.files(&ask).await.unwrap();
    let sent = served.provider.requests.lock().unwrap()[0].secrets.clone();
    assert_eq!(serde_json::from_str::<Value>(&sent).unwrap(), serde_json::json!({"clientSecret": "hunter2"}));
    let printed = format!("{ask:?}");
    assert!(printed.contains("clientSecret") && !printed.contains("hunter2"), "{printed}");
}

#[tokio::test]
async fn the_versions_answered_come_back_with_the_files_and_the_recorded_ones_are_sent_back() {
    let served = serve(Ok(answer(&[("a", 0, "x")], &[("secret/a", "v1")])), Duration::ZERO).await;
    let (_, answered) = served.client.files(&ask()).await.unwrap();
    let v1: BTreeMap<String, String> = [("secret/a".to_string(), "v1".to_string())].into();
    assert_eq!(answered, v1);
    // A refresh of the volume whose record holds them.
    served.client.files(&VolumeAsk { object_versions: v1, ..ask() }).await.unwrap();

    let sent: Vec<Vec<(String, String)>> = served
        .provider
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.current_object_version.iter().map(|v| (v.id.clone(), v.version.clone())).collect())
        .collect();
    assert_eq!(sent, [vec![], vec![("secret/a".to_string(), "v1".to_string())]]);
}

#[tokio::test]
async fn a_provider_that_fails_hangs_or_is_not_there_keeps_the_volume_as_it_is() {
    let failed = serve(Err(Status::not_found("no secret db in vault")), Duration::ZERO).await;
    let error = failed.client.files(&ask()).await.unwrap_err();
    assert_eq!(
        error,
        Error::Unavailable("provider \"vault\" failed Mount: NotFound: \"no secret db in vault\"".into())
    );

    let coded = MountResponse {
        error: Some(secretsstore::Error { code: "VaultSealed".into() }),
        ..answer(&[("a", 0, "x")], &[])
    };
    let error = serve(Ok(coded), Duration::ZERO).await.client.files(&ask()).await.unwrap_err();
    assert_eq!(error, Error::Unavailable("provider \"vault\" answered Mount with error code \"VaultSealed\"".into()));

    let hung = serve(Ok(answer(&[("a", 0, "x")], &[])), Duration::from_secs(3600)).await;
    let error = client_of(hung.socket.clone(), Duration::from_secs(1)).files(&ask()).await.unwrap_err();
    assert!(
        matches!(&error, Error::Unavailable(m) if m.starts_with("provider \"vault\" did not answer Mount within 1s")),
        "{error:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let error = client_of(dir.path().join("absent.sock"), PATIENT).files(&ask()).await.unwrap_err();
    assert!(
        matches!(&error, Error::Unavailable(m) if m.starts_with("provider \"vault\" failed Mount: Unavailable")),
        "{error:?}"
    );
    assert!(!error.withdraws_content());
}

#[tokio::test]
async fn an_answer_that_cannot_be_laid_out_is_refused_naming_why() {
    struct Case {
        name: &'static str,
        answer: MountResponse,
        message: &'static str,
    }
    let cases = [
        Case {
            name: "no files",
            answer: answer(&[], &[]),
            message: "provider \"vault\": its answer to Mount holds no files",
        },
        Case {
            name: "a path out of the volume",
            answer: answer(&[("../etc/passwd", 0, "x")], &[]),
            message: "provider \"vault\": its answer to Mount: key \"../etc/passwd\" is refused",
        },
        Case {
            name: "an absolute path",
            answer: answer(&[("/etc/passwd", 0, "x")], &[]),
            message: "provider \"vault\": its answer to Mount: key \"/etc/passwd\" is refused: it is an absolute path",
        },
        Case {
            name: "setuid",
            answer: answer(&[("a", 0o4755, "x")], &[]),
            message: "provider \"vault\": its answer to Mount gives file \"a\" mode 0o4755, which is more than permission bits",
        },
        Case {
            name: "negative",
            answer: answer(&[("a", -1, "x")], &[]),
            message: "provider \"vault\": its answer to Mount gives file \"a\" mode",
        },
        Case {
            name: "twice",
            answer: answer(&[("a", 0, "x"), ("a", 0, "y")], &[]),
            message: "provider \"vault\": its answer to Mount names file \"a\" twice",
        },
    ];
    for case in cases {
        let error = serve(Ok(case.answer), Duration::ZERO).await.client.files(&ask()).await.unwrap_err();
        assert!(matches!(&error, Error::Unservable(m) if m.starts_with(case.message)), "{}: {error:?}", case.name);
        assert!(error.withdraws_content(), "{}", case.name);
    }
    let many: Vec<(String, i32, &str)> = (0..=MAX_LISTED_FILES).map(|i| (format!("f{i}"), 0, "")).collect();
    let many: Vec<(&str, i32, &str)> = many.iter().map(|(p, m, c)| (p.as_str(), *m, *c)).collect();
    let error = serve(Ok(answer(&many, &[])), Duration::ZERO).await.client.files(&ask()).await.unwrap_err();
    assert_eq!(
        error,
        Error::Unservable(
            "provider \"vault\": its answer to Mount holds 1025 files, more than the 1024 a volume may hold".into()
        )
    );
    let ids: Vec<(String, &str)> = (0..=MAX_LISTED_FILES).map(|i| (format!("o{i}"), "1")).collect();
    let ids: Vec<(&str, &str)> = ids.iter().map(|(id, v)| (id.as_str(), *v)).collect();
    let error = serve(Ok(answer(&[("a", 0, "x")], &ids)), Duration::ZERO).await.client.files(&ask()).await.unwrap_err();
    assert_eq!(
        error,
        Error::Unservable("provider \"vault\": its answer to Mount holds 1025 object versions, more than 1024".into())
    );
}

#[tokio::test]
async fn an_answer_over_the_message_bound_is_refused_and_the_client_stays_usable() {
    let big = "x".repeat(128 << 10);
    let served = serve(Ok(answer(&[("big", 0, &big)], &[])), Duration::ZERO).await;
    let error = served.client.files(&ask()).await.unwrap_err();
    assert!(
        matches!(&error, Error::Unavailable(m) if m.contains("OutOfRange") || m.contains("message length too large")),
        "{error:?}"
    );
    *served.provider.answer.lock().unwrap() = Ok(answer(&[("small", 0, "x")], &[]));
    assert_eq!(served.client.files(&ask()).await.unwrap().0["small"].data, b"x");
}

#[tokio::test]
async fn an_answer_larger_than_the_volume_can_show_is_refused_before_it_is_held() {
    let wide = |socket: std::path::PathBuf| {
        SecretsStoreClient::new(SecretsStoreProvider {
            name: ObjectName::parse("vault").unwrap(),
            socket,
            timeout: PATIENT,
            max_message_bytes: 16 << 20,
        })
    };
    let big = "x".repeat(2 << 20);
    let served = serve(Ok(answer(&[("big", 0, &big)], &[])), Duration::ZERO).await;
    // The control: within the provider's own bound of 16 MiB, 2 MiB are decoded.
    assert!(wide(served.socket.clone()).files(&ask()).await.is_ok());
    // A volume that can show nothing takes answers of its envelope only (1 MiB).
    let mut tiny = wide(served.socket.clone());
    tiny.limit_answers_to(0);
    let error = tiny.files(&ask()).await.unwrap_err();
    assert!(
        matches!(&error, Error::Unavailable(m) if m.contains("OutOfRange") || m.contains("message length too large")),
        "{error:?}"
    );
    *served.provider.answer.lock().unwrap() = Ok(answer(&[("small", 0, &"x".repeat(512 << 10))], &[]));
    assert!(tiny.files(&ask()).await.is_ok(), "an answer within it is served");
    // The shipped tmpfsSize of 8 MiB: at most 9 MiB decoded, not the provider's 16; and never
    // more than a provider's own bound.
    let mut shipped = wide(served.socket.clone());
    shipped.limit_answers_to(8 << 20);
    assert_eq!(shipped.answer_limit, (8 << 20) + ANSWER_ENVELOPE_BYTES as usize);
    let mut narrow = client_of(served.socket.clone(), PATIENT);
    narrow.limit_answers_to(8 << 20);
    assert_eq!(narrow.answer_limit, 64 << 10);
}

#[tokio::test]
async fn an_attribute_cannot_speak_for_another_pod() {
    let served = serve(Ok(answer(&[("a", 0, "x")], &[])), Duration::ZERO).await;
    let mut forged = ask();
    forged.attributes.insert("csi.storage.k8s.io/pod.namespace".into(), "kube-system".into());
    let error = served.client.files(&forged).await.unwrap_err();
    assert!(matches!(&error, Error::Invalid(m) if m.contains("are the driver's to set")), "{error:?}");
    assert!(served.provider.requests.lock().unwrap().is_empty(), "nothing was asked");
}
