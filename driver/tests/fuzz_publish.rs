//! A fuzz run in the test command: the publish request check, target paths and the atomic
//! writer's key handling, fed the corpus in `tests/corpus/` and then generated inputs built from
//! its fragments and arbitrary text. Whatever comes in: no panic, a bounded message, and nothing
//! accepted that could act outside kubelet's layout or the volume.

use std::collections::HashMap;
use std::path::{Component, Path};

use inline_guard_proto::csi::v1::NodePublishVolumeRequest;
use inline_guard_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use proptest::prelude::*;
use sharedresource_csi_driver::csi::error::Error;
use sharedresource_csi_driver::csi::request::check;
use sharedresource_csi_driver::volume::atomic_writer::{AtomicWriter, FileContent, Payload, check_key};
use sharedresource_csi_driver::volume::target_path::TargetPath;

const ROOT: &str = "/var/lib/kubelet";
/// What any refusal may cost in message bytes (three quoted inputs and the prose around them).
const MAX_MESSAGE_BYTES: usize = 1024;

/// The lines of a corpus file, `#` comments skipped, `\n` and `\0` unescaped.
fn corpus(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(name)).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.replace("\\n", "\n").replace("\\0", "\0"))
        .collect()
}

fn message(error: &impl std::fmt::Display) -> String {
    error.to_string()
}

/// The gRPC code `error` reaches kubelet with.
fn code(error: impl Into<Error>) -> tonic::Code {
    tonic::Status::from(error.into()).code()
}

/// A target `TargetPath` accepted must be kubelet's layout, spelled one way, under the root.
fn assert_target_property(target: &str) {
    match TargetPath::parse(target, Path::new(ROOT)) {
        Ok(parsed) => {
            let path = parsed.as_path();
            assert!(path.starts_with(ROOT), "{target:?}");
            assert!(path.components().skip(1).all(|c| matches!(c, Component::Normal(_))), "{target:?}");
            assert_eq!(path.to_str(), Some(target), "accepted only in its one spelling");
            let below = parsed.below_root();
            assert_eq!((below.len(), below[0].as_str(), below[5].as_str()), (6, "pods", "mount"), "{target:?}");
            assert_eq!(&below[2..4], ["volumes", "kubernetes.io~csi"]);
            assert!(!target.contains('\0'));
        }
        Err(error) => {
            assert!(message(&error).len() <= MAX_MESSAGE_BYTES, "{} bytes", message(&error).len());
            assert_eq!(code(error), tonic::Code::InvalidArgument);
        }
    }
}

/// A key `check_key` accepted must name a place inside the volume that the writer's own entries
/// cannot collide with.
fn assert_key_property(key: &str) {
    match check_key(key) {
        Ok(()) => {
            assert!(!key.is_empty() && !key.starts_with('/') && !key.starts_with("..") && !key.contains('\0'));
            assert!(Path::new(key).components().all(|c| matches!(c, Component::Normal(_))), "{key:?}");
            assert!(key.split('/').all(|c| !c.is_empty()), "{key:?}");
        }
        Err(error) => assert!(message(&error).len() <= MAX_MESSAGE_BYTES, "{} bytes", message(&error).len()),
    }
}

fn request(
    volume_id: String,
    target: String,
    context: HashMap<String, String>,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id,
        target_path: target,
        volume_capability: Some(inline_guard_proto::csi::v1::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        readonly,
        volume_context: context,
        ..Default::default()
    }
}

fn kubelet_context() -> HashMap<String, String> {
    [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "web"),
        ("csi.storage.k8s.io/pod.namespace", "apps"),
        ("csi.storage.k8s.io/pod.uid", "u"),
        ("csi.storage.k8s.io/serviceAccount.name", "web"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[test]
fn the_corpus_is_refused_or_accepted_by_the_rules() {
    let targets = corpus("targets.txt");
    let keys = corpus("keys.txt");
    assert!(targets.len() >= 15 && keys.len() >= 15, "the corpus is read");
    let accepted: Vec<&String> = targets.iter().filter(|t| TargetPath::parse(t, Path::new(ROOT)).is_ok()).collect();
    assert_eq!(
        accepted,
        ["/var/lib/kubelet/pods/0c5e/volumes/kubernetes.io~csi/shared/mount"],
        "only kubelet's layout"
    );
    for target in &targets {
        assert_target_property(target);
    }
    let accepted: Vec<&String> = keys.iter().filter(|k| check_key(k).is_ok()).collect();
    assert_eq!(accepted, ["ca.crt", "nested/dir/key", ".hidden", "a/..b", " spaced key", "tab\tkey"]);
    for key in &keys {
        assert_key_property(key);
    }
}

/// Text built from corpus fragments, path separators and arbitrary characters.
fn hostile_text(fragments: Vec<String>) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => proptest::sample::select(fragments),
        3 => proptest::sample::select(vec!["/", "..", ".", "//", "\0", "pods", "mount", "kubernetes.io~csi", "volumes"])
            .prop_map(String::from),
        2 => "\\PC{0,12}",
        1 => proptest::string::string_regex("[a-z0-9~./-]{0,300}").unwrap(),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn generated_targets_and_keys_keep_their_properties(
        target in hostile_text(corpus("targets.txt")),
        key in hostile_text(corpus("keys.txt")),
    ) {
        assert_target_property(&target);
        assert_key_property(&key);
    }

    #[test]
    fn generated_publish_requests_never_panic_and_say_what_is_wrong_in_bounded_words(
        volume_id in prop_oneof![Just(String::new()), "\\PC{0,40}", Just("v".repeat(5000))],
        target in hostile_text(corpus("targets.txt")),
        extra in proptest::collection::hash_map("\\PC{0,20}", "\\PC{0,600}", 0..4),
        drop_key in proptest::option::of(0usize..5),
        readonly in any::<bool>(),
    ) {
        let mut context = kubelet_context();
        if let Some(index) = drop_key {
            let key = context.keys().nth(index).cloned().unwrap();
            context.remove(&key);
        }
        context.extend(extra);
        match check(&request(volume_id.clone(), target.clone(), context, readonly), Path::new(ROOT)) {
            Ok(checked) => {
                prop_assert!(readonly, "a writable publish is never accepted");
                prop_assert_eq!(checked.target.as_path().to_str(), Some(target.as_str()));
                assert_target_property(&target);
                prop_assert!(!volume_id.is_empty() && volume_id.len() <= 4096);
                prop_assert!(checked.ask.attributes.keys().all(|k| !k.starts_with("csi.storage.k8s.io/")));
            }
            Err(error) => {
                prop_assert!(message(&error).len() <= MAX_MESSAGE_BYTES, "{} bytes", message(&error).len());
                prop_assert_eq!(code(error), tonic::Code::InvalidArgument);
            }
        }
    }

}

proptest! {
    // Each case writes a real directory: fewer of them.
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn the_writer_never_writes_outside_its_volume(
        keys in proptest::collection::vec(hostile_text(corpus("keys.txt")), 1..6),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("volume");
        std::fs::create_dir(&volume).unwrap();
        let payload: Payload = keys.iter().map(|k| (k.clone(), FileContent::new(k.as_bytes()))).collect();
        let result = AtomicWriter::new(&volume).write(&payload);
        let beside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        prop_assert_eq!(beside, vec![std::ffi::OsString::from("volume")], "nothing written beside the volume");
        match result {
            Ok(_) => {
                for key in payload.keys() {
                    prop_assert_eq!(std::fs::read(volume.join(key)).unwrap(), key.as_bytes());
                }
            }
            // Refused before anything is written, or a key that is a file in one entry and a
            // directory in another: either way, no version is left half-made.
            Err(error) => prop_assert!(message(&error).len() <= MAX_MESSAGE_BYTES),
        }
    }
}
