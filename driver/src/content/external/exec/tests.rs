//! The eager `exec` provider with the shipped example helper (config/examples/exec-helper.sh),
//! run as a real process over a directory standing in for a vault.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::content::ask::PodInfo;
use crate::content::external::concurrency_probe;
use crate::content::tokens::Tokens;
use sharedresource_api::object_name::ObjectName;

/// A vault directory and the example helper reading it, wrapped to log each call (and how many
/// `get`s run at that moment) before running it.
struct Vault {
    dir: tempfile::TempDir,
}

impl Vault {
    fn new() -> Vault {
        let vault = Vault { dir: tempfile::tempdir().unwrap() };
        let example = include_str!("../../../../../config/examples/exec-helper.sh");
        let root = vault.path("root");
        let helper = example.replace("ROOT=/var/lib/inline-guard/example-vault", &format!("ROOT={}", root.display()));
        assert_ne!(helper, example, "the example names its ROOT");
        std::fs::write(vault.path("example"), helper).unwrap();
        let wrapper = format!(
            "#!/bin/sh\n\
             echo \"$1 $2\" >> {log}\n\
             if [ \"$1\" = get ]; then\n{probe}fi\n\
             exec /bin/sh {example} \"$@\"\n",
            log = vault.path("calls").display(),
            probe = concurrency_probe::around_get(vault.dir.path()),
            example = vault.path("example").display(),
        );
        std::fs::write(vault.path("helper"), wrapper).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(vault.path("helper"), std::fs::Permissions::from_mode(0o755)).unwrap();
        vault
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn keep(&self, namespace: &str, pod: &str, file: &str, content: &str) {
        let dir = self.path("root").join(namespace).join(pod);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), content).unwrap();
    }

    fn provider(&self) -> ExecProvider {
        ExecProvider {
            name: ObjectName::parse("example").unwrap(),
            helper: self.path("helper"),
            mode: crate::content::external::provider::FetchMode::Eager,
            timeout: Duration::from_secs(30),
            cache_ttl: Duration::from_secs(60),
            max_file_bytes: 1 << 20,
            run_as: crate::content::external::provider::HelperUser::this_process(),
        }
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("calls")).unwrap_or_default().lines().map(String::from).collect()
    }

    fn most_concurrent(&self) -> usize {
        concurrency_probe::most(self.dir.path())
    }
}

fn ask(namespace: &str, pod: &str) -> VolumeAsk {
    VolumeAsk {
        volume_id: format!("csi-{pod}"),
        volume_name: "secrets".into(),
        mount_point: format!("/var/lib/kubelet/pods/{pod}/volumes/kubernetes.io~csi/secrets/mount").into(),
        pod: PodInfo {
            name: pod.into(),
            namespace: namespace.into(),
            uid: pod.into(),
            service_account: "reader".into(),
        },
        attributes: [("provider".to_string(), "example".to_string())].into(),
        tokens: Tokens::default(),
        secrets: Default::default(),
        object_versions: Default::default(),
    }
}

fn text(payload: &Payload) -> Vec<(String, String)> {
    payload.iter().map(|(path, file)| (path.clone(), String::from_utf8(file.data.clone()).unwrap())).collect()
}

fn providers(vault: &Vault, concurrency: usize) -> ExecProviders {
    ExecProviders::new([("example".to_string(), vault.provider())].into(), concurrency)
}

#[tokio::test]
async fn each_pod_is_served_its_own_files_with_one_mount_and_one_get_per_file() {
    let vault = Vault::new();
    vault.keep("team-a", "web", "db-password", "s3cret");
    vault.keep("team-a", "web", "api-key", "k3y");
    vault.keep("team-b", "web", "db-password", "other");
    let providers = providers(&vault, 4);
    let files = providers.files(&vault.provider(), &ask("team-a", "web")).await.unwrap();
    assert_eq!(
        text(&files),
        [("secrets/api-key".into(), "k3y".into()), ("secrets/db-password".into(), "s3cret".into())]
    );
    let mut calls = vault.calls();
    calls.sort();
    let mount_point = "/var/lib/kubelet/pods/web/volumes/kubernetes.io~csi/secrets/mount";
    assert_eq!(calls, ["get secrets/api-key", "get secrets/db-password", &format!("mount {mount_point}")]);
    let other = providers.files(&vault.provider(), &ask("team-b", "web")).await.unwrap();
    assert_eq!(text(&other), [("secrets/db-password".into(), "other".into())], "the identity picks the files");
}

#[test]
fn the_example_helper_takes_the_pod_s_identity_only_where_a_key_of_the_options_stands() {
    let vault = Vault::new();
    vault.keep("team-a", "web", "api-key", "k3y");
    vault.keep("team-b", "web", "db-password", "other");
    // A pod of team-b whose parameter's key carries the identity's key and another namespace:
    // serialized, its quotes are escaped, and it sorts after the real key. The driver refuses
    // such a key (`check_parameter`); the helper must not need it to.
    let options = serde_json::json!({
        "kubernetes.io/pod.name": "web",
        "kubernetes.io/pod.namespace": "team-b",
        "zz\",\"kubernetes.io/pod.namespace": "team-a",
    });
    let output = std::process::Command::new("/bin/sh")
        .arg(vault.path("example"))
        .args(["mount", "/mnt", &options.to_string()])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(answer.contains("\"db-password\""), "team-b/web's files listed: {answer}");
    assert!(!answer.contains("api-key"), "team-a/web's files listed for a pod of team-b: {answer}");
}

#[tokio::test]
async fn a_failing_helper_is_unavailable_with_its_own_words_and_never_file_content() {
    let vault = Vault::new();
    let error = providers(&vault, 4).files(&vault.provider(), &ask("team-a", "nobody")).await.unwrap_err();
    assert_eq!(
        error,
        Error::Unavailable(
            "provider \"example\": the helper's mount exit status: 1; it said: nothing is kept for pod team-a/nobody"
                .into()
        )
    );
    vault.keep("team-a", "web", "db-password", "s3cret");
    let mut provider = vault.provider();
    provider.max_file_bytes = 3;
    let error = providers(&vault, 4).files(&provider, &ask("team-a", "web")).await.unwrap_err();
    let Error::Unavailable(message) = error else { panic!("{error:?}") };
    assert!(message.starts_with("provider \"example\": the helper's "), "{message}");
    assert!(message.contains("printed more than 3 bytes"), "{message}");
    assert!(!message.contains("s3cret"));
}

#[tokio::test]
async fn helpers_run_at_most_the_nodes_bound_at_once() {
    let vault = Vault::new();
    for index in 0..6 {
        vault.keep("team-a", "web", &format!("file-{index}"), "x");
    }
    let files = providers(&vault, 1).files(&vault.provider(), &ask("team-a", "web")).await.unwrap();
    assert_eq!(files.len(), 6);
    assert_eq!(vault.most_concurrent(), 1, "one helper at a time");
    // A node bound of three gives one volume two (its namespace's half, and the volume's own
    // part): each helper waits for a second, so two are seen side by side (the positive control
    // that the probe sees concurrency at all), and no third.
    concurrency_probe::reset(vault.dir.path());
    concurrency_probe::expect(vault.dir.path(), 2, 6);
    providers(&vault, 3).files(&vault.provider(), &ask("team-a", "web")).await.unwrap();
    assert_eq!(vault.most_concurrent(), 2, "two at once, never more");
}

#[tokio::test]
async fn one_volume_runs_at_most_its_own_part_of_the_nodes_helpers() {
    let vault = Vault::new();
    for index in 0..8 {
        vault.keep("team-a", "web", &format!("file-{index}"), "x");
    }
    // Each helper waits until the volume's part runs side by side (the positive control), and
    // no more than that part ever runs.
    concurrency_probe::expect(vault.dir.path(), GETS_PER_VOLUME, 8);
    let files = providers(&vault, 8).files(&vault.provider(), &ask("team-a", "web")).await.unwrap();
    assert_eq!(files.len(), 8);
    let most = vault.most_concurrent();
    assert_eq!(most, GETS_PER_VOLUME, "{most} gets at once; the node allows 8, one volume {GETS_PER_VOLUME}");
}

#[tokio::test]
async fn an_eager_volume_larger_than_its_size_is_refused_while_it_is_fetched() {
    let vault = Vault::new();
    for index in 0..4 {
        vault.keep("team-a", "web", &format!("file-{index}"), &"x".repeat(100));
    }
    let fits = providers(&vault, 4).with_volume_limit(400);
    assert_eq!(fits.files(&vault.provider(), &ask("team-a", "web")).await.unwrap().len(), 4, "400 bytes fit 400");
    let error = providers(&vault, 4).with_volume_limit(399).files(&vault.provider(), &ask("team-a", "web")).await;
    let Err(Error::TooLarge(message)) = error else { panic!("{error:?}") };
    assert_eq!(
        message,
        "provider \"example\": the helper's files hold more than 399 bytes together, the volume's size (tmpfsSize)"
    );
}

#[tokio::test]
async fn a_helper_that_lists_nothing_withdraws_the_volume() {
    let vault = Vault::new();
    std::fs::create_dir_all(vault.path("root/team-a/web")).unwrap();
    let error = providers(&vault, 4).files(&vault.provider(), &ask("team-a", "web")).await.unwrap_err();
    assert!(matches!(&error, Error::Unservable(m) if m.contains("lists no files")), "{error:?}");
    assert!(error.withdraws_content());
}

#[tokio::test]
async fn a_helper_written_from_the_design_alone_is_served_eagerly_once_it_lists_its_files() {
    use crate::content::external::design_helper;
    let dir = tempfile::tempdir().unwrap();
    let mut provider = ExecProvider { helper: design_helper::write(dir.path(), true), ..Vault::new().provider() };
    let providers = ExecProviders::new([("example".to_string(), provider.clone())].into(), 4);
    let files = providers.files(&provider, &ask("team-a", "web")).await.unwrap();
    assert_eq!(
        text(&files),
        [("db/password".into(), "read -field=password secret/pod-secrets/team-a/web//db".into())],
        "`/db` is db under the mount point; get is passed /db/password, as the design's driver does"
    );
    assert_eq!(design_helper::calls(dir.path())[1..], ["get /db/password team-a web"]);
    // The design's answer word for word lists no files: eager mode says what it needs.
    provider.helper = design_helper::write(dir.path(), false);
    let error = providers.files(&provider, &ask("team-a", "web")).await.unwrap_err();
    assert!(matches!(&error, Error::Unservable(m) if m.contains("lists no files")), "{error:?}");
}

#[test]
fn the_example_helper_is_the_one_shipped() {
    // The test above runs the shipped file, changed only in its ROOT line.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/examples/exec-helper.sh");
    let text = std::fs::read_to_string(example).unwrap();
    assert!(text.contains("ROOT=/var/lib/inline-guard/example-vault\n"));
}
