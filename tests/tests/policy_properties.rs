//! Properties of the decision that no table can cover: tightening a namespace never admits what a
//! looser one denies, and no input (labels, specs, review bodies) makes anything panic.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_executor::block_on;
use inline_guard_admission::plugins::standard_chain;
use inline_guard_admission::review::answer;
use inline_guard_admission::{Phase, StaticClusterFacts};
use inline_guard_policy::labels::{AUDIT_LEVEL, DRIVER_PROFILE, ENFORCE_LEVEL, WARN_LEVEL};
use inline_guard_policy::{
    ContainerView, CsiVolumeView, Defaults, Labels, Level, MountScope, PodSpecView, PolicySettings, ReadOnlyDrivers,
    Subject, SubjectKind, VolumeMountView, VolumeView, evaluate, force_read_only,
};
use proptest::prelude::*;

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![Just(Level::Restricted), Just(Level::Baseline), Just(Level::Privileged)]
}

/// A profile label value: usually valid, sometimes garbage, sometimes absent.
fn profile_value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => level().prop_map(|l| Some(l.as_str().to_string())),
        1 => ".{0,12}".prop_map(Some),
        1 => Just(None),
    ]
}

/// Up to six drivers from a pool of four, so that volumes share drivers.
fn pod_drivers() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 0..6)
}

fn spec(drivers: &[usize]) -> PodSpecView<'static> {
    PodSpecView {
        volumes: drivers
            .iter()
            .enumerate()
            .map(|(i, d)| VolumeView {
                name: format!("v{i}").into(),
                csi: Some(CsiVolumeView {
                    driver: format!("d{d}.example.com").into(),
                    read_only: None,
                    ..Default::default()
                }),
            })
            .collect(),
        ..Default::default()
    }
}

fn driver_table(profiles: &[Option<String>]) -> BTreeMap<String, Labels> {
    profiles
        .iter()
        .enumerate()
        .map(|(i, profile)| {
            let labels = profile.iter().map(|p| (DRIVER_PROFILE.to_string(), p.clone())).collect();
            (format!("d{i}.example.com"), labels)
        })
        .collect()
}

fn namespace(enforce: Level, warn: Level, audit: Level) -> Labels {
    [(ENFORCE_LEVEL, enforce), (WARN_LEVEL, warn), (AUDIT_LEVEL, audit)]
        .into_iter()
        .map(|(k, l)| (k.to_string(), l.as_str().to_string()))
        .collect()
}

proptest! {
    #[test]
    fn a_stricter_namespace_never_admits_what_a_looser_one_denies(
        loose in (level(), level(), level()),
        tighten in (0usize..3, 0usize..3, 0usize..3),
        drivers in pod_drivers(),
        profiles in prop::collection::vec(profile_value(), 4),
        driver_default in level(),
        workloads_enforced in any::<bool>(),
        kind in prop_oneof![Just(SubjectKind::Pod), Just(SubjectKind::Workload)],
    ) {
        let stricter = |level: Level, steps: usize| {
            Level::ALL.into_iter().rev().find(|l| *l <= level && (level as usize - *l as usize) <= steps).unwrap_or(level)
        };
        let strict = (stricter(loose.0, tighten.0), stricter(loose.1, tighten.1), stricter(loose.2, tighten.2));
        prop_assert!(strict.0 <= loose.0 && strict.1 <= loose.1 && strict.2 <= loose.2);

        let settings = PolicySettings {
            defaults: Defaults { driver_profile: driver_default, ..Defaults::default() },
            enforce_on_workloads: workloads_enforced,
            ..Default::default()
        };
        let spec = spec(&drivers);
        let table = driver_table(&profiles);
        let subject = Subject { kind, name: "p", namespace: "ns", username: "u", spec: &spec };
        let loose_verdict = evaluate(&settings, &subject, Some(&namespace(loose.0, loose.1, loose.2)), &table);
        let strict_verdict = evaluate(&settings, &subject, Some(&namespace(strict.0, strict.1, strict.2)), &table);

        if !loose_verdict.is_allowed() {
            prop_assert!(!strict_verdict.is_allowed(), "loose denied but strict admitted");
        }
        // Nothing recorded at a looser level disappears at a stricter one.
        for key in loose_verdict.audit_annotations.keys() {
            prop_assert!(strict_verdict.audit_annotations.contains_key(key), "{key} lost");
        }
    }

    #[test]
    fn arbitrary_labels_and_driver_names_never_panic(
        namespace_labels in prop::collection::btree_map(
            prop_oneof![Just(ENFORCE_LEVEL.to_string()), Just(WARN_LEVEL.to_string()), Just(AUDIT_LEVEL.to_string()),
                        Just(format!("{ENFORCE_LEVEL}-version")), ".{0,20}"],
            ".{0,20}", 0..6),
        driver_names in prop::collection::vec(".{0,30}", 0..5),
        driver_profile in ".{0,12}",
        runtime_class in prop::option::of(".{0,10}"),
    ) {
        let spec = PodSpecView {
            runtime_class_name: runtime_class.map(Into::into),
            volumes: driver_names
                .iter()
                .map(|d| VolumeView { name: d.into(), csi: Some(CsiVolumeView { driver: d.into(), read_only: None, ..Default::default() }) })
                .collect(),
            ..Default::default()
        };
        let table: BTreeMap<String, Labels> = driver_names.iter()
            .map(|d| (d.clone(), [(DRIVER_PROFILE.to_string(), driver_profile.clone())].into()))
            .collect();
        let subject = Subject { kind: SubjectKind::Pod, name: "", namespace: "", username: "", spec: &spec };
        let verdict = evaluate(&PolicySettings::default(), &subject, Some(&namespace_labels), &table);
        // Whatever came in, a denial always names a driver of the pod.
        if let Some(denial) = verdict.denial {
            let names_a_driver = driver_names.iter().any(|d| denial.contains(&format!("CSIDriver {d} ")));
            prop_assert!(names_a_driver, "denial names none of the pod's drivers: {}", denial);
        }
    }

    #[test]
    fn read_only_forcing_is_idempotent_and_touches_only_listed_drivers(
        drivers in pod_drivers(),
        mounts in prop::collection::vec((0usize..6, prop::option::of(any::<bool>())), 0..8),
        listed in prop::collection::btree_set(0usize..4, 0..4),
    ) {
        let mut pod = spec(&drivers);
        pod.containers = vec![ContainerView {
            name: "c".into(),
            volume_mounts: mounts
                .iter()
                .map(|(v, ro)| VolumeMountView { name: format!("v{v}").into(), read_only: *ro, ..Default::default() })
                .collect(),
        }];
        let listed = ReadOnlyDrivers(listed.iter().map(|d| format!("d{d}.example.com")).collect());
        let before = pod.clone();
        let patch = force_read_only(&mut pod, &listed, MountScope::WholePod);
        prop_assert!(force_read_only(&mut pod, &listed, MountScope::WholePod).is_empty());
        let changed = patch.len();
        let differing_fields = before.volumes.iter().zip(&pod.volumes).filter(|(a, b)| a != b).count()
            + before.containers[0].volume_mounts.iter().zip(&pod.containers[0].volume_mounts).filter(|(a, b)| a != b).count();
        prop_assert_eq!(changed, differing_fields, "one patch operation per changed field");
        for (volume, original) in pod.volumes.iter().zip(&before.volumes) {
            let csi = volume.csi.as_ref().unwrap();
            if !listed.contains(&csi.driver) {
                prop_assert_eq!(volume, original);
            }
        }
    }

    #[test]
    fn arbitrary_review_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let chain = standard_chain(Arc::new(PolicySettings::default()), Arc::new(StaticClusterFacts::new()), Arc::new(inline_guard_admission::NothingChecked));
        let _ = block_on(answer(&chain, Phase::Both, &body));
    }

    #[test]
    fn reviews_with_arbitrary_objects_are_answered_not_panicked_on(
        object in prop_oneof![
            Just(serde_json::Value::Null),
            any::<i64>().prop_map(serde_json::Value::from),
            ".{0,16}".prop_map(serde_json::Value::from),
            prop::collection::btree_map(prop_oneof![Just("spec".to_string()), Just("metadata".to_string()), ".{0,6}"],
                prop_oneof![Just(serde_json::json!({"volumes": [{"name": "v", "csi": {"driver": 1}}]})),
                            Just(serde_json::json!({"containers": "x"})), Just(serde_json::json!([]))], 0..3)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ],
        resource in prop_oneof![Just("pods"), Just("deployments"), Just("cronjobs"), Just("configmaps")],
    ) {
        let group = match resource { "deployments" => "apps", "cronjobs" => "batch", _ => "" };
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": group, "version": "v1", "kind": "X"},
                        "resource": {"group": group, "version": "v1", "resource": resource},
                        "operation": "CREATE", "namespace": "ns", "object": object}
        })).unwrap();
        let chain = standard_chain(Arc::new(PolicySettings::default()), Arc::new(StaticClusterFacts::new()), Arc::new(inline_guard_admission::NothingChecked));
        let response = block_on(answer(&chain, Phase::Both, &body)).unwrap();
        prop_assert_eq!(response.response.uid, "u");
    }
}
