//! SharedResourceAdmission's and share injection's cost in process. Targets: a pod with no volume
//! of the driver costs under 100 ns more in the chain (the plugin alone, and the chain with and
//! without both plugins, same run); a pod with one share costs one held lookup when warm, under
//! 2 µs; a pod asking for one share by annotation is measured through the whole chain. The warm facts are the
//! webhook's own `HeldShareFacts` (held answers and lookup counter) with every answer held: what
//! `LiveShareFacts` does once a burst has asked.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_executor::block_on;
use inline_guard_admission::attributes::{Attributes, GroupVersionResource};
use inline_guard_admission::object::AdmissionObject;
use inline_guard_admission::plugins::{
    CsiVolumeAdmission, ReadOnlyCheck, ReadOnlyForcing, ShareInjection, SharedResourceAdmission,
};
use inline_guard_admission::{Chain, Phase, Recorder, ValidationInterface};
use inline_guard_benches::facts;
use inline_guard_policy::{INJECT_ANNOTATION, PolicySettings};
use inline_guard_server::metrics::Metrics;
use inline_guard_server::share_lookup::{HeldShareFacts, LookupSettings, Projection, ShareQuestions};
use serde_json::{Value, json};
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::{DRIVER_NAME, ObjectName, ShareKind};

/// Every question answered yes at once: the benchmark holds the answers before it measures, so
/// these are asked only while warming.
struct AlwaysYes;

#[async_trait]
impl ShareQuestions for AlwaysYes {
    async fn share_exists(&self, _: ShareKind, _: &ObjectName) -> Result<bool, String> {
        Ok(true)
    }

    async fn projection(&self, _: &str, _: &ObjectName) -> Result<Projection, String> {
        Ok(None)
    }

    async fn may_use(&self, _: &AccessQuestion) -> Result<bool, String> {
        Ok(true)
    }
}

fn pod_create(volumes: Value) -> Attributes<'static> {
    let resource = GroupVersionResource::v1("", "pods");
    let pod = json!({"metadata": {"name": "web"}, "spec": {"serviceAccountName": "web", "containers": [{"name": "app",
        "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": true}]}], "volumes": volumes}});
    let object = AdmissionObject::from_value(&resource, &pod).expect("a pod");
    Attributes::anonymous_create(resource, "team-a", object)
}

fn shared_admission(c: &mut Criterion) {
    // The webhook's own holding, answers held for the whole run.
    let settings = LookupSettings { ttl: Duration::from_secs(24 * 3600), ..LookupSettings::default() };
    let warm = Arc::new(HeldShareFacts::holding(AlwaysYes, settings, Arc::new(Metrics::new())));
    let plugin = SharedResourceAdmission::new(warm.clone());
    let other_driver = pod_create(json!([{"name": "v", "csi": {"driver": "d0.example.com", "readOnly": true}}]));
    let one_share = pod_create(json!([{"name": "v", "csi": {"driver": DRIVER_NAME, "readOnly": true,
        "volumeAttributes": {"sharedSecret": "db"}}}]));
    let mut recorder = Recorder::default();
    block_on(plugin.validate(&one_share, &mut recorder)).expect("warming admits");
    assert!(recorder.warnings().is_empty(), "warm facts answer: {:?}", recorder.warnings());

    let mut group = c.benchmark_group("shared_admission");
    group.bench_function("plugin/pod_without_the_driver", |b| {
        b.iter(|| {
            let mut recorder = Recorder::default();
            block_on(plugin.validate(black_box(&other_driver), &mut recorder)).expect("admitted");
            black_box(recorder)
        })
    });
    group.bench_function("plugin/pod_with_one_share_warm", |b| {
        b.iter(|| {
            let mut recorder = Recorder::default();
            block_on(plugin.validate(black_box(&one_share), &mut recorder)).expect("admitted");
            black_box(recorder)
        })
    });
    let settings = Arc::new(PolicySettings::default());
    let facts = Arc::new(facts());
    let without = Chain::new()
        .with_mutating(Arc::new(ReadOnlyForcing::new(settings.clone())))
        .with_validating(Arc::new(CsiVolumeAdmission::new(settings.clone(), facts.clone())))
        .with_validating(Arc::new(ReadOnlyCheck::new(settings.clone())));
    // The shipped order: share injection before forcing, SharedResourceAdmission last.
    let with = Chain::new()
        .with_mutating(Arc::new(ShareInjection))
        .with_mutating(Arc::new(ReadOnlyForcing::new(settings.clone())))
        .with_validating(Arc::new(CsiVolumeAdmission::new(settings.clone(), facts.clone())))
        .with_validating(Arc::new(ReadOnlyCheck::new(settings)))
        .with_validating(Arc::new(SharedResourceAdmission::new(warm)));
    for (name, chain) in [("chain_without_the_plugins", &without), ("chain_with_the_plugins", &with)] {
        group.bench_function(format!("{name}/pod_without_the_driver"), |b| {
            b.iter(|| {
                let mut attributes = other_driver.clone();
                black_box(block_on(chain.run(Phase::Both, black_box(&mut attributes))))
            })
        });
    }
    // A pod asking for one share by annotation: injected, forced (nothing to do), judged warm.
    let resource = GroupVersionResource::v1("", "pods");
    let annotated = json!({"metadata": {"name": "web", "annotations": {INJECT_ANNOTATION: "sharedsecret/db:/etc/db"}},
        "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}]}});
    let annotated = Attributes::anonymous_create(
        resource.clone(),
        "team-a",
        AdmissionObject::from_value(&resource, &annotated).expect("a pod"),
    );
    assert_eq!(block_on(with.run(Phase::Both, &mut annotated.clone())).patch.len(), 2, "injected");
    group.bench_function("chain_with_the_plugins/pod_asking_one_share_by_annotation_warm", |b| {
        b.iter(|| {
            let mut attributes = annotated.clone();
            black_box(block_on(with.run(Phase::Both, black_box(&mut attributes))))
        })
    });
    group.finish();
}

criterion_group!(benches, shared_admission);
criterion_main!(benches);
