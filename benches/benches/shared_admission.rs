//! SharedResourceAdmission's cost in process. Targets: a pod with no volume of the driver costs
//! under 100 ns more in the chain (the plugin alone, and the chain with and without it, same
//! run); a pod with one share costs one held lookup when warm, under 2 µs. The warm facts are the
//! webhook's own held answers (`HeldAnswers`) and lookup counter, with every answer held: what
//! `LiveShareFacts` does when a burst has already asked.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_executor::block_on;
use inline_guard_admission::attributes::{Attributes, GroupVersionResource, Operation, UserInfo};
use inline_guard_admission::object::AdmissionObject;
use inline_guard_admission::plugins::{CsiVolumeAdmission, ReadOnlyCheck, ReadOnlyForcing, SharedResourceAdmission};
use inline_guard_admission::{Chain, FactsError, Known, Phase, Recorder, ShareFacts, ValidationInterface};
use inline_guard_benches::facts;
use inline_guard_policy::PolicySettings;
use inline_guard_server::held_answers::{HeldAnswers, Served};
use inline_guard_server::metrics::{Metrics, ShareQuestion};
use serde_json::{Value, json};
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::projection::ProjectionSpec;
use sharedresource_api::{DRIVER_NAME, ObjectName, ShareKind};

/// Every answer held (asked once, before measuring), counted as the live facts count.
struct WarmFacts {
    shares: HeldAnswers<(ShareKind, ObjectName), bool>,
    access: HeldAnswers<AccessQuestion, bool>,
    metrics: Metrics,
}

impl WarmFacts {
    fn counted<T>(
        &self,
        question: ShareQuestion,
        (answer, served): (Result<T, String>, Served),
    ) -> Result<Known<T>, FactsError> {
        self.metrics.share_lookup(question, served, answer.is_ok());
        answer.map(Known::Answer).map_err(FactsError::Unavailable)
    }
}

#[async_trait]
impl ShareFacts for WarmFacts {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<Known<bool>, FactsError> {
        let answer = self.shares.answer(&(kind, name.clone()), || async { Ok(true) }).await;
        self.counted(ShareQuestion::Share, answer)
    }

    async fn projection(&self, _: &str, _: &ObjectName) -> Result<Known<Option<Arc<ProjectionSpec>>>, FactsError> {
        Ok(Known::NotChecked)
    }

    async fn may_use(&self, question: &AccessQuestion) -> Result<Known<bool>, FactsError> {
        let answer = self.access.answer(question, || async { Ok(true) }).await;
        self.counted(ShareQuestion::Access, answer)
    }
}

fn pod_create(volumes: Value) -> Attributes<'static> {
    let resource = GroupVersionResource::v1("", "pods");
    let pod = json!({"metadata": {"name": "web"}, "spec": {"serviceAccountName": "web", "containers": [{"name": "app",
        "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": true}]}], "volumes": volumes}});
    Attributes {
        operation: Operation::Create,
        kind: Default::default(),
        object: Some(AdmissionObject::from_value(&resource, &pod).expect("a pod")),
        resource,
        subresource: "".into(),
        namespace: "team-a".into(),
        name: "".into(),
        old_object: None,
        user_info: UserInfo::anonymous(),
        dry_run: false,
    }
}

fn shared_admission(c: &mut Criterion) {
    let hold = Duration::from_secs(24 * 3600);
    let capacity = NonZeroUsize::new(1024).expect("not zero");
    let warm = Arc::new(WarmFacts {
        shares: HeldAnswers::new(capacity, hold),
        access: HeldAnswers::new(capacity, hold),
        metrics: Metrics::new(),
    });
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
    let with = without.clone().with_validating(Arc::new(SharedResourceAdmission::new(warm)));
    for (name, chain) in [("chain_without_the_plugin", &without), ("chain_with_the_plugin", &with)] {
        group.bench_function(format!("{name}/pod_without_the_driver"), |b| {
            b.iter(|| {
                let mut attributes = other_driver.clone();
                black_box(block_on(chain.run(Phase::Both, black_box(&mut attributes))))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, shared_admission);
criterion_main!(benches);
