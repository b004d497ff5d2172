//! The annotation's grammar and the plan, with their exact messages.

use sharedresource_api::{ObjectName, ShareKind};

use super::annotation::MAX_ENTRIES;
use super::plan::volume_name;
use super::*;
use crate::patch::{PatchOp, PatchValue};
use crate::pod_spec::{ContainerView, CsiVolumeView, PodSpecView, VolumeMountView, VolumeView};

fn name(text: &str) -> ObjectName {
    ObjectName::parse(text).unwrap()
}

fn entry(source: InjectSource, mount_path: &str) -> InjectEntry {
    InjectEntry { source, mount_path: mount_path.into() }
}

fn refusal(value: &str) -> String {
    parse_injection(value).unwrap_err().0
}

#[test]
fn entries_name_a_kind_an_object_and_a_path_and_blank_space_around_them_is_ignored() {
    let entries =
        parse_injection(" sharedsecret/db:/etc/db , sharedconfigmap/ca.bundle:/etc/ca,projection/app:/run/app ")
            .unwrap();
    assert_eq!(
        entries,
        [
            entry(InjectSource::Share(ShareKind::Secret, name("db")), "/etc/db"),
            entry(InjectSource::Share(ShareKind::ConfigMap, name("ca.bundle")), "/etc/ca"),
            entry(InjectSource::Projection(name("app")), "/run/app"),
        ]
    );
    assert_eq!(parse_injection("").unwrap(), [], "an empty value injects nothing");
    assert_eq!(parse_injection("  ").unwrap(), []);
    let twice = parse_injection("sharedsecret/db:/a,sharedsecret/db:/b").unwrap();
    assert_eq!(twice.len(), 2, "one share may be mounted at two paths");
}

#[test]
fn a_malformed_entry_is_named_with_what_is_wrong() {
    let prefix = "annotation \"sharedresource.inlineguard.dev/inject\": ";
    let cases = [
        ("sharedsecret/db", "entry \"sharedsecret/db\": is not <kind>/<name>:<mountPath>"),
        ("db:/etc/db", "entry \"db:/etc/db\": is not <kind>/<name>:<mountPath>"),
        (
            "secret/db:/etc/db",
            "entry \"secret/db:/etc/db\": kind \"secret\" is not one of \"sharedsecret\", \"sharedconfigmap\", \"projection\"",
        ),
        (
            "sharedsecret/DB:/etc/db",
            "entry \"sharedsecret/DB:/etc/db\": \"DB\" is not a valid object name: an object name is at most 253 characters of lowercase letters, digits, '-' and '.', each '.'-separated part starting and ending with a letter or digit",
        ),
        ("sharedsecret/db:etc/db", "entry \"sharedsecret/db:etc/db\": the mount path is not absolute"),
        ("sharedsecret/db:", "entry \"sharedsecret/db:\": the mount path is empty"),
        ("sharedsecret/db://", "entry \"sharedsecret/db://\": the mount path is the container's root"),
        ("sharedsecret/db:/etc/../root", "entry \"sharedsecret/db:/etc/../root\": the mount path has a '..' element"),
        ("sharedsecret/db:/etc/d\tb", "entry \"sharedsecret/db:/etc/d\\tb\": the mount path has a control character"),
        ("sharedsecret/db:/a,,sharedsecret/db:/b", "entry 2 is empty"),
        ("sharedsecret/db:/a,", "entry 2 is empty"),
        (
            "sharedsecret/db:/etc/db,sharedconfigmap/ca:/etc//db/",
            "entries \"sharedsecret/db:/etc/db\" and \"sharedconfigmap/ca:/etc//db/\" mount at the same path",
        ),
    ];
    for (value, why) in cases {
        assert_eq!(refusal(value), format!("{prefix}{why}"), "{value:?}");
    }
}

#[test]
fn a_hostile_annotation_gets_a_bounded_message() {
    let many = vec!["sharedsecret/db:/a"; MAX_ENTRIES + 1].join(",");
    assert_eq!(
        refusal(&many),
        "annotation \"sharedresource.inlineguard.dev/inject\": names 33 entries; at most 32 may be injected"
    );
    let long = format!("sharedsecret/db:/{}", "x".repeat(100_000));
    let message = refusal(&long);
    assert!(message.len() < 400, "{} bytes", message.len());
    assert!(message.ends_with("... (100017 bytes): the mount path is longer than 1024 bytes"), "{message}");
}

#[test]
fn volume_names_are_deterministic_distinct_and_valid() {
    let secret = |n: &str| InjectSource::Share(ShareKind::Secret, name(n));
    assert_eq!(volume_name(&secret("db")), "inject-secret-db");
    assert_eq!(volume_name(&InjectSource::Share(ShareKind::ConfigMap, name("db"))), "inject-configmap-db");
    assert_eq!(volume_name(&InjectSource::Projection(name("app"))), "inject-projection-app");
    let dotted = volume_name(&secret("a.b"));
    let dashed = volume_name(&secret("a-b"));
    assert_ne!(dotted, dashed);
    assert!(dotted.starts_with("inject-secret-a-b-") && dotted.len() == "inject-secret-a-b-".len() + 8, "{dotted}");
    assert_eq!(volume_name(&secret("a.b")), dotted, "the same source always gets the same name");
    let long = volume_name(&secret(&format!("{}.{}", "a".repeat(60), "b".repeat(60))));
    for volume in [&dotted, &dashed, &long] {
        let valid = volume.len() <= 63
            && volume.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !volume.ends_with('-');
        assert!(valid, "{volume:?} is not a DNS-1123 label");
    }
}

fn container(name: &str, mounts: &[(&str, &str)]) -> ContainerView<'static> {
    ContainerView {
        name: name.to_string().into(),
        volume_mounts: mounts
            .iter()
            .map(|(volume, path)| VolumeMountView {
                name: volume.to_string().into(),
                mount_path: path.to_string().into(),
                read_only: None,
                ..Default::default()
            })
            .collect(),
    }
}

fn spec() -> PodSpecView<'static> {
    PodSpecView {
        volumes: vec![VolumeView { name: "data".into(), csi: None }],
        containers: vec![container("app", &[("data", "/data")]), container("sidecar", &[])],
        init_containers: vec![container("init", &[])],
        ephemeral_containers: vec![container("debug", &[])],
        ..Default::default()
    }
}

fn serialized(patch: &[crate::PatchOperation]) -> Vec<String> {
    patch.iter().map(|op| format!("{:?} {} {}", op.op, op.path, serde_json::to_string(&op.value).unwrap())).collect()
}

#[test]
fn injection_adds_one_read_only_volume_per_source_and_a_mount_in_every_container_and_init_container() {
    let mut spec = spec();
    let entries = parse_injection("sharedsecret/db:/etc/db,sharedsecret/db:/etc/db2,projection/app:/run/app").unwrap();
    let plan = plan_injection(&spec, &entries).unwrap();
    assert_eq!(plan.volume_names().collect::<Vec<_>>(), ["inject-secret-db", "inject-projection-app"]);
    let patch = plan.apply(&mut spec);
    let volume = |name: &str, attribute: &str, value: &str| {
        format!(
            r#"{{"name":"{name}","csi":{{"driver":"sharedresource.csi.inlineguard.dev","readOnly":true,"volumeAttributes":{{"{attribute}":"{value}"}}}}}}"#
        )
    };
    let mount = |name: &str, path: &str| format!(r#"{{"name":"{name}","mountPath":"{path}","readOnly":true}}"#);
    let all_three = format!(
        "[{},{},{}]",
        mount("inject-secret-db", "/etc/db"),
        mount("inject-secret-db", "/etc/db2"),
        mount("inject-projection-app", "/run/app")
    );
    assert_eq!(
        serialized(&patch),
        [
            format!("Add /spec/volumes/- {}", volume("inject-secret-db", "sharedSecret", "db")),
            format!("Add /spec/volumes/- {}", volume("inject-projection-app", "projection", "app")),
            format!("Add /spec/containers/0/volumeMounts/- {}", mount("inject-secret-db", "/etc/db")),
            format!("Add /spec/containers/0/volumeMounts/- {}", mount("inject-secret-db", "/etc/db2")),
            format!("Add /spec/containers/0/volumeMounts/- {}", mount("inject-projection-app", "/run/app")),
            format!("Add /spec/containers/1/volumeMounts {all_three}"),
            format!("Add /spec/initContainers/0/volumeMounts {all_three}"),
        ]
    );
    assert!(patch.iter().all(|op| op.op == PatchOp::Add));
    assert!(spec.ephemeral_containers[0].volume_mounts.is_empty(), "ephemeral containers are left alone");
    assert_eq!(spec.volumes.len(), 3);
    assert_eq!(spec.volumes[1].csi.as_ref().map(|csi| csi.read_only), Some(Some(true)));
    assert_eq!(spec.containers[1].volume_mounts.len(), 3);
    // The spec the validating plugins then judge has the injected mounts as the patch writes
    // them: read-only, whole (no sub path).
    let injected_mount = &spec.containers[1].volume_mounts[0];
    assert_eq!((injected_mount.read_only, &*injected_mount.sub_path), (Some(true), ""));
    // Injecting again into the injected spec: nothing to do.
    let again = plan_injection(&spec, &entries).unwrap();
    assert!(again.is_empty());
    assert_eq!(again.apply(&mut spec.clone()), []);
}

#[test]
fn a_pod_without_volumes_gets_its_volume_list_written_whole() {
    let mut spec = PodSpecView { containers: vec![container("app", &[])], ..Default::default() };
    let entries = parse_injection("sharedconfigmap/ca:/etc/ca").unwrap();
    let patch = plan_injection(&spec, &entries).unwrap().apply(&mut spec);
    assert_eq!(patch[0].path, "/spec/volumes");
    assert!(matches!(&patch[0].value, PatchValue::Volumes(volumes) if volumes.len() == 1));
    assert_eq!(patch[1].path, "/spec/containers/0/volumeMounts");
}

#[test]
fn a_path_taken_by_another_volume_or_a_name_taken_by_another_volume_is_refused_naming_both() {
    let prefix = "annotation \"sharedresource.inlineguard.dev/inject\": entry ";
    let entries = parse_injection("sharedsecret/db:/data/").unwrap();
    assert_eq!(
        plan_injection(&spec(), &entries).unwrap_err().0,
        format!("{prefix}\"sharedsecret/db:/data/\": container \"app\" already mounts volume \"data\" at \"/data\"")
    );
    let mut taken = spec();
    taken.volumes.push(VolumeView {
        name: "inject-secret-db".into(),
        csi: Some(CsiVolumeView { driver: "sharedresource.csi.inlineguard.dev".into(), ..Default::default() }),
    });
    let entries = parse_injection("sharedsecret/db:/etc/db").unwrap();
    assert_eq!(
        plan_injection(&taken, &entries).unwrap_err().0,
        format!(
            "{prefix}\"sharedsecret/db:/etc/db\": the pod has another volume named \"inject-secret-db\", the name injection gives SharedSecret \"db\""
        )
    );
}

#[test]
fn a_volume_already_injected_is_kept_whatever_its_read_only_says() {
    let mut spec = spec();
    let entries = parse_injection("sharedsecret/db:/etc/db").unwrap();
    plan_injection(&spec, &entries).unwrap().apply(&mut spec);
    spec.volumes[1].csi.as_mut().unwrap().read_only = None;
    assert!(plan_injection(&spec, &entries).unwrap().is_empty(), "read-only forcing sees to readOnly");
}

#[test]
fn the_bounds_themselves_are_allowed() {
    // Exactly as many entries as may be injected, each at its own path.
    let most: Vec<String> = (0..MAX_ENTRIES).map(|i| format!("sharedsecret/db:/etc/db{i}")).collect();
    assert_eq!(parse_injection(&most.join(",")).unwrap().len(), MAX_ENTRIES);
    // A mount path of exactly 1024 bytes.
    let path = format!("/{}", "x".repeat(1023));
    assert_eq!(parse_injection(&format!("sharedsecret/db:{path}")).unwrap()[0].mount_path, path);
}

#[test]
fn a_hashed_volume_name_is_fnv_1a_of_the_kind_and_the_name() {
    // FNV-1a 32 of "secret/a.b" is 6e0f2d6d (the published algorithm: offset basis 0x811c9dc5,
    // prime 0x01000193, xor then multiply): the name is stable across versions and platforms.
    assert_eq!(volume_name(&InjectSource::Share(ShareKind::Secret, name("a.b"))), "inject-secret-a-b-6e0f2d6d");
}

#[test]
fn two_sources_whose_volume_names_meet_are_refused_naming_both() {
    // `a.b` hashes to the name a Secret literally called `a-b-6e0f2d6d` reads as.
    let entries = parse_injection("sharedsecret/a.b:/etc/one,sharedsecret/a-b-6e0f2d6d:/etc/two").unwrap();
    assert_eq!(
        plan_injection(&spec(), &entries).unwrap_err().0,
        "annotation \"sharedresource.inlineguard.dev/inject\": entry \"sharedsecret/a-b-6e0f2d6d:/etc/two\": its volume name \"inject-secret-a-b-6e0f2d6d\" is also SharedSecret \"a.b\"'s; rename one of them"
    );
}

#[test]
fn a_volume_of_the_injected_name_from_another_driver_is_not_taken_for_the_injected_one() {
    let mut taken = spec();
    taken.volumes.push(VolumeView {
        name: "inject-secret-db".into(),
        csi: Some(CsiVolumeView {
            driver: "other.csi.example.com".into(),
            volume_attributes: [("sharedSecret".into(), "db".into())].into(),
            ..Default::default()
        }),
    });
    let entries = parse_injection("sharedsecret/db:/etc/db").unwrap();
    assert!(plan_injection(&taken, &entries).unwrap_err().0.ends_with(
        "the pod has another volume named \"inject-secret-db\", the name injection gives SharedSecret \"db\""
    ));
}

#[test]
fn a_plan_is_empty_only_when_neither_a_volume_nor_a_mount_is_missing() {
    let entries = parse_injection("sharedsecret/db:/etc/db").unwrap();
    let mut spec = spec();
    assert!(!plan_injection(&spec, &entries).unwrap().is_empty(), "both missing");
    plan_injection(&spec, &entries).unwrap().apply(&mut spec);
    assert!(plan_injection(&spec, &entries).unwrap().is_empty(), "both there");
    // The volume there, one container's mount gone: a mount is missing.
    spec.containers[1].volume_mounts.clear();
    assert!(!plan_injection(&spec, &entries).unwrap().is_empty(), "a mount missing");
}

#[test]
fn the_denial_of_an_uninjected_pod_names_at_most_five_missing_things_then_how_many_more() {
    let spec = spec();
    let tail = "The share injection webhook did not inject them; its MutatingWebhookConfiguration is missing or older than this server (regenerate it with `csi-volume-admission webhooks`)";
    // One volume and its mount in three containers: four things, all named.
    let four = plan_injection(&spec, &parse_injection("sharedsecret/db:/etc/db").unwrap()).unwrap();
    assert_eq!(
        not_injected_message("pod web", &four, &spec),
        format!(
            "pod web asks for shares by annotation \"sharedresource.inlineguard.dev/inject\" but lacks volume \"inject-secret-db\", mount of \"inject-secret-db\" at \"/etc/db\" in container \"app\", mount of \"inject-secret-db\" at \"/etc/db\" in container \"sidecar\", mount of \"inject-secret-db\" at \"/etc/db\" in container \"init\". {tail}"
        )
    );
    // Two volumes and six mounts: five named, three more counted.
    let eight =
        plan_injection(&spec, &parse_injection("sharedsecret/db:/etc/db,projection/app:/run/app").unwrap()).unwrap();
    let message = not_injected_message("pod web", &eight, &spec);
    assert!(message.contains("in container \"sidecar\" and 3 more. The share"), "{message}");
    // Exactly five (one volume, four mounts): none "more".
    let mut spec_with_four_containers = spec.clone();
    spec_with_four_containers.containers.push(container("third", &[]));
    let five_missing =
        plan_injection(&spec_with_four_containers, &parse_injection("sharedsecret/db:/etc/db").unwrap()).unwrap();
    let message = not_injected_message("pod web", &five_missing, &spec_with_four_containers);
    assert!(message.contains("in container \"init\". The share"), "{message}");
    assert!(!message.contains("more"), "{message}");
}
