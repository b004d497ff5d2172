//! A lazy volume's layout from the helper's answer, and its reads against a real helper
//! process that logs each call: one `get` per file within the cache's TTL, however many opens
//! at once; a failing file fails alone; withdrawn access fails every read and keeps nothing.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::content::external::helper_protocol::mount_options;
use sharedresource_api::object_name::ObjectName;

fn reply(text: &str) -> MountReply {
    MountReply::parse(text.as_bytes()).unwrap()
}

#[test]
fn the_layout_has_the_enabled_directories_the_listed_files_and_the_way_to_them() {
    let layout =
        LazyLayout::of(&reply(r#"{"enable-dirs": ["a/b", "open"], "files": {"a/b": ["x", "sub/y"]}}"#)).unwrap();
    for (path, kind) in [
        ("", Some(EntryKind::Directory)),
        ("a", Some(EntryKind::Directory)),
        ("a/b", Some(EntryKind::Directory)),
        ("a/b/x", Some(EntryKind::File)),
        ("a/b/sub", Some(EntryKind::Directory)),
        ("a/b/sub/y", Some(EntryKind::File)),
        ("a/b/unlisted", None),
        ("a/c", None),
        ("open", Some(EntryKind::Directory)),
        ("open/any-name", Some(EntryKind::File)),
        ("open/..hidden", Some(EntryKind::File)),
        ("open/nested/name", None),
        ("elsewhere", None),
    ] {
        assert_eq!(layout.kind(path), kind, "{path:?}");
    }
    let listed = |path: &str| layout.listing(path).map(|l| l.map(|(n, k)| (n.to_string(), k)).collect::<Vec<_>>());
    assert_eq!(
        listed(""),
        Some(vec![("a".to_string(), EntryKind::Directory), ("open".to_string(), EntryKind::Directory)])
    );
    assert_eq!(
        listed("a/b"),
        Some(vec![("sub".to_string(), EntryKind::Directory), ("x".to_string(), EntryKind::File)])
    );
    assert_eq!(listed("open"), Some(vec![]), "an open directory lists nothing of its own");
    assert_eq!(listed("a/b/x"), None, "a file is no directory");
}

#[test]
fn a_path_that_is_both_a_file_and_a_directory_is_refused() {
    let error =
        LazyLayout::of(&reply(r#"{"enable-dirs": ["a", "a/x"], "files": {"a": ["x"], "a/x": ["y"]}}"#)).unwrap_err();
    assert_eq!(error, "\"a/x\" is both a file and a directory");
}

/// A helper serving the files of a directory, logging each call; a file named `broken` fails.
pub(crate) struct Helper {
    dir: tempfile::TempDir,
}

impl Helper {
    pub(crate) fn new(files: &[(&str, &str)]) -> Helper {
        let helper = Helper { dir: tempfile::tempdir().unwrap() };
        std::fs::create_dir_all(helper.path("files")).unwrap();
        for (name, content) in files {
            std::fs::write(helper.path("files").join(name), content).unwrap();
        }
        let script = format!(
            "#!/bin/sh\n\
             echo \"$*\" >> {calls}\n\
             case \"$1\" in\n\
             mount) printf '{{\"enable-dirs\": [\"secrets\"], \"mount-param\": [\"kubernetes.io/pod.name\"],}}' ;;\n\
             get) name=${{2#secrets/}}; [ \"$name\" = broken ] && {{ echo \"the vault refused $name\" >&2; exit 3; }}\n\
{probe}\
                  cat {files}/\"$name\" ;;\n\
             esac\n",
            calls = helper.path("calls").display(),
            probe = crate::content::external::concurrency_probe::around_get(helper.dir.path()),
            files = helper.path("files").display(),
        );
        std::fs::write(helper.path("helper"), script).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(helper.path("helper"), std::fs::Permissions::from_mode(0o755)).unwrap();
        helper
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn gets(&self) -> Vec<String> {
        let calls = std::fs::read_to_string(self.path("calls")).unwrap_or_default();
        calls.lines().filter(|line| line.starts_with("get ")).map(String::from).collect()
    }

    /// The lazy provider `vault-cli` running this helper.
    pub(crate) fn provider(&self, cache_ttl: Duration) -> ExecProvider {
        ExecProvider {
            name: ObjectName::parse("vault-cli").unwrap(),
            helper: self.path("helper"),
            mode: super::super::provider::FetchMode::Lazy,
            timeout: Duration::from_secs(60),
            cache_ttl,
            max_file_bytes: 1 << 20,
            run_as: crate::content::external::provider::HelperUser::this_process(),
        }
    }

    /// The volume's files, fetched through this helper on the current runtime.
    pub(crate) fn files(&self, cache_ttl: Duration) -> HelperFiles {
        let provider = self.provider(cache_ttl);
        let options = mount_options(&crate::content::ask::VolumeAsk::example(&[("provider", "vault-cli")])).unwrap();
        let reply = reply(r#"{"enable-dirs": ["secrets"], "mount-param": ["kubernetes.io/pod.name"],}"#);
        HelperFiles::new(
            provider,
            (FairSlots::new(4, 4), "apps".to_string()),
            reply,
            options,
            tokio::runtime::Handle::current(),
        )
        .unwrap()
    }
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_file_is_fetched_once_when_first_read_and_served_from_memory_within_the_ttl() {
    let helper = Helper::new(&[("db-password", "s3cret")]);
    let files = helper.files(HOUR);
    assert!(helper.gets().is_empty(), "nothing is fetched before a read");
    assert_eq!(files.cached("secrets/db-password"), None);
    for _ in 0..3 {
        assert_eq!(&*files.read("secrets/db-password").await.unwrap(), b"s3cret");
    }
    assert_eq!(helper.gets(), ["get secrets/db-password web"], "the mount-param value follows the path");
    assert_eq!(files.cached("secrets/db-password").map(|(size, _)| size), Some(6));
    assert_eq!(files.gets(), 1);
}

#[tokio::test]
async fn a_volume_holds_no_more_content_in_memory_than_its_size_cached_or_open() {
    let helper = Helper::new(&[("a", "12345"), ("b", "1234"), ("c", "123")]);
    let files = helper.files(HOUR).with_memory_limit(9);
    let a = files.read("secrets/a").await.unwrap();
    let b = files.read("secrets/b").await.unwrap();
    assert_eq!((a.len(), b.len(), files.live_bytes()), (5, 4, 9), "a and b are held: 9 bytes");
    let error = files.read("secrets/c").await.unwrap_err();
    assert_eq!(
        error,
        Error::TooLarge(
            "provider \"vault-cli\": the volume's files in memory (cached or open) would hold more than 9 bytes, \
             its size (tmpfsSize); close files it holds open"
                .into()
        )
    );
    // Read again, a and b are the same contents: nothing more is held.
    assert_eq!(files.read("secrets/a").await.unwrap().id, a.id);
    assert_eq!(files.live_bytes(), 9);
    // Withdrawn, the cache lets go; what open files hold is given back when they close.
    assert!(files.set_withdrawn(true));
    assert_eq!(files.live_bytes(), 9, "a and b are still open");
    drop((a, b));
    assert_eq!(files.live_bytes(), 0, "closed, nothing is held");
    assert!(files.set_withdrawn(false), "access back");
    assert_eq!(files.read("secrets/c").await.unwrap().len(), 3, "room again");
}

/// A charge that counts up to `limit` bytes.
struct Counted {
    held: AtomicU64,
    limit: u64,
}

impl MemoryCharge for Counted {
    fn grow(&self, bytes: u64) -> std::result::Result<(), String> {
        let held = self.held.load(Ordering::SeqCst);
        if held + bytes > self.limit {
            return Err(format!("{held} held of {} (namespaceContentBudget)", self.limit));
        }
        self.held.fetch_add(bytes, Ordering::SeqCst);
        Ok(())
    }

    fn shrink(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn content_in_memory_counts_in_the_volume_s_charge_and_is_refused_beyond_it() {
    let helper = Helper::new(&[("a", "12345"), ("b", "1234")]);
    let files = helper.files(HOUR);
    let charge = Arc::new(Counted { held: AtomicU64::new(0), limit: 8 });
    files.charge_to(charge.clone());
    let a = files.read("secrets/a").await.unwrap();
    assert_eq!(charge.held.load(Ordering::SeqCst), 5);
    let error = files.read("secrets/b").await.unwrap_err();
    assert_eq!(error, Error::TooLarge("provider \"vault-cli\": 5 held of 8 (namespaceContentBudget)".into()));
    assert_eq!(files.live_bytes(), 5, "the refused content is not held");
    assert!(files.set_withdrawn(true));
    drop(a);
    assert_eq!(charge.held.load(Ordering::SeqCst), 0, "given back when nothing holds it");
}

#[tokio::test]
async fn after_the_ttl_the_helper_is_asked_again() {
    let helper = Helper::new(&[("db-password", "first")]);
    let files = helper.files(Duration::from_secs(1));
    assert_eq!(&*files.read("secrets/db-password").await.unwrap(), b"first");
    std::fs::write(helper.path("files/db-password"), "second").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(files.cached("secrets/db-password"), None, "expired");
    assert_eq!(&*files.read("secrets/db-password").await.unwrap(), b"second");
    assert_eq!(helper.gets().len(), 2);
}

#[tokio::test]
async fn content_fetched_again_unchanged_keeps_its_id_and_changed_content_gets_a_new_one() {
    let helper = Helper::new(&[("db-password", "first"), ("api-key", "first")]);
    let files = helper.files(Duration::from_secs(1));
    let first = files.read("secrets/db-password").await.unwrap();
    let other = files.read("secrets/api-key").await.unwrap();
    assert_ne!(first.id, other.id, "ids are per content had, not per bytes across files");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = files.read("secrets/db-password").await.unwrap();
    assert_eq!(helper.gets().len(), 3, "fetched again after the TTL");
    assert_eq!(again.id, first.id, "the same bytes: the same content");
    std::fs::write(helper.path("files/db-password"), "second").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let changed = files.read("secrets/db-password").await.unwrap();
    assert_eq!(&*changed, b"second");
    assert_ne!(changed.id, first.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_of_one_file_at_once_run_the_helper_once() {
    let helper = Helper::new(&[("db-password", "s3cret")]);
    let files = Arc::new(helper.files(HOUR));
    let reads = (0..8).map(|_| {
        let files = files.clone();
        tokio::spawn(async move { files.read("secrets/db-password").await })
    });
    for read in futures_util::future::join_all(reads).await {
        assert_eq!(&*read.unwrap().unwrap(), b"s3cret");
    }
    assert_eq!(helper.gets().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_volume_runs_at_most_its_own_share_of_the_nodes_helpers() {
    let names: Vec<String> = (0..6).map(|i| format!("file-{i}")).collect();
    let kept: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "x")).collect();
    let helper = Helper::new(&kept);
    // Each get waits until the volume's part runs side by side (the positive control), and no
    // more than that part ever runs.
    crate::content::external::concurrency_probe::expect(helper.dir.path(), GETS_PER_VOLUME, 6);
    let files = Arc::new(helper.files(HOUR));
    let reads = names.iter().map(|name| {
        let (files, path) = (files.clone(), format!("secrets/{name}"));
        tokio::spawn(async move { files.read(&path).await })
    });
    for read in futures_util::future::join_all(reads).await {
        assert_eq!(&*read.unwrap().unwrap(), b"x");
    }
    assert_eq!(helper.gets().len(), 6);
    let most = crate::content::external::concurrency_probe::most(helper.dir.path());
    assert_eq!(most, GETS_PER_VOLUME, "{most} gets at once; the node allows 4, the volume {GETS_PER_VOLUME}");
}

#[tokio::test]
async fn a_failing_file_fails_alone_naming_the_helpers_words() {
    let helper = Helper::new(&[("db-password", "s3cret")]);
    let files = helper.files(HOUR);
    let error = files.read("secrets/broken").await.unwrap_err();
    assert_eq!(
        error,
        Error::Unavailable(
            "provider \"vault-cli\": the helper's get \"secrets/broken\" exit status: 3; it said: the vault refused broken"
                .into()
        )
    );
    assert_eq!(&*files.read("secrets/db-password").await.unwrap(), b"s3cret");
    // A failure is not cached: the next open asks again.
    assert!(files.read("secrets/broken").await.is_err());
    assert_eq!(helper.gets().len(), 3);
}

#[tokio::test]
async fn a_path_outside_the_layout_is_missing_without_asking_the_helper() {
    let helper = Helper::new(&[]);
    let files = helper.files(HOUR);
    for path in ["elsewhere/x", "secrets", "secrets/a/b", ""] {
        assert!(matches!(files.read(path).await, Err(Error::Missing(_))), "{path:?}");
    }
    assert!(helper.gets().is_empty());
}

#[tokio::test]
async fn withdrawn_access_fails_every_read_and_keeps_nothing() {
    let helper = Helper::new(&[("db-password", "s3cret")]);
    let files = helper.files(HOUR);
    files.read("secrets/db-password").await.unwrap();
    assert!(files.set_withdrawn(true), "a change");
    assert!(!files.set_withdrawn(true), "no change the second time");
    assert_eq!(
        files.read("secrets/db-password").await.unwrap_err(),
        Error::Denied("provider \"vault-cli\": access to the volume's files was withdrawn".into())
    );
    assert_eq!(files.cached("secrets/db-password"), None, "the cache was dropped");
    assert!(files.set_withdrawn(false));
    assert_eq!(&*files.read("secrets/db-password").await.unwrap(), b"s3cret");
    assert_eq!(helper.gets().len(), 2, "given back, the file is fetched anew");
}

#[tokio::test]
async fn a_mount_param_the_options_lack_is_refused_at_publish() {
    let helper = Helper::new(&[]);
    let provider = helper.files(HOUR).provider.clone();
    let error = HelperFiles::new(
        provider,
        (FairSlots::new(1, 1), "apps".to_string()),
        reply(r#"{"enable-dirs": ["secrets"], "mount-param": ["vault-role"]}"#),
        Map::new(),
        tokio::runtime::Handle::current(),
    )
    .unwrap_err();
    assert_eq!(
        error,
        Error::Unservable(
            "provider \"vault-cli\": the helper's mount: mount-param names \"vault-role\", which the mount options do not hold"
                .into()
        )
    );
}

/// The handover's JSON as the version before the content face wrote it (every field at the top
/// level): what a successor of this version must read, and the form it must write for a
/// successor of that version.
const HANDED_BY_EARLIER_VERSIONS: &str = r#"{"provider": "vault-cli", "namespace": "apps",
    "enable_dirs": ["secrets"], "mount_param": ["kubernetes.io/pod.name"], "files": {}, "rooted": false,
    "options": {"kubernetes.io/pod.name": "web"}, "withdrawn": true}"#;

#[tokio::test]
async fn files_handed_over_keep_the_wire_form_of_earlier_versions_both_ways() {
    let helper = Helper::new(&[("db-password", "s3cret")]);
    let earlier: HandedFiles = serde_json::from_str(HANDED_BY_EARLIER_VERSIONS).unwrap();
    let files = HelperFiles::from_handed(
        earlier.clone(),
        helper.provider(HOUR),
        FairSlots::new(4, 4),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    assert_eq!(
        files.read("secrets/db-password").await.unwrap_err(),
        Error::Denied("provider \"vault-cli\": access to the volume's files was withdrawn".into()),
        "a revocation is handed over with the files"
    );
    assert_eq!(files.kind("secrets"), Some(EntryKind::Directory), "laid out as the predecessor had them");
    let written = serde_json::to_value(files.handed()).unwrap();
    assert_eq!(written, serde_json::from_str::<Value>(HANDED_BY_EARLIER_VERSIONS).unwrap());
    assert_eq!(files.handed(), earlier);
}

#[tokio::test]
async fn handed_state_of_another_form_is_refused_naming_the_field_never_its_value() {
    let helper = Helper::new(&[]);
    let mut handed: HandedFiles = serde_json::from_str(HANDED_BY_EARLIER_VERSIONS).unwrap();
    handed.state.insert("options".into(), Value::from("t0ken-that-must-not-show"));
    let error = HelperFiles::from_handed(
        handed,
        helper.provider(HOUR),
        FairSlots::new(1, 1),
        tokio::runtime::Handle::current(),
    )
    .unwrap_err();
    let Error::Unservable(message) = &error else { panic!("{error:?}") };
    assert!(
        message.starts_with("provider \"vault-cli\": the files handed over: options is not in this version's form")
    );
    assert!(!message.contains("t0ken"), "{message}");
}
