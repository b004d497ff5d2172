//! Where the 3 KB review's time goes: envelope parse, object decode (and its alternatives), the
//! chain, encoding. A diagnostic companion to `review`, with no target of its own.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use futures_executor::block_on;
use inline_guard_admission::Phase;
use inline_guard_admission::review::{ReviewResponse, parse_request};
use inline_guard_benches::{REVIEW_3K, chain};
use k8s_openapi::api::core::v1::Pod;

fn stages(c: &mut Criterion) {
    let chain = chain();
    let body = REVIEW_3K.as_bytes();
    let mut group = c.benchmark_group("stages-3KB");
    group.bench_function("parse envelope", |b| b.iter(|| parse_request(black_box(body)).unwrap().uid.len()));
    let request = parse_request(body).unwrap();
    let raw = request.object.unwrap().get();
    group.bench_function("decode pod (k8s-openapi)", |b| {
        b.iter(|| serde_json::from_str::<Pod>(black_box(raw)).unwrap())
    });
    group.bench_function("decode value", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(black_box(raw)).unwrap())
    });
    group.bench_function("ignore", |b| {
        b.iter(|| serde_json::from_str::<serde::de::IgnoredAny>(black_box(raw)).unwrap())
    });
    group.bench_function("attributes", |b| b.iter(|| request.attributes().unwrap()));
    let attributes = request.attributes().unwrap();
    group.bench_function("clone + chain validate", |b| {
        b.iter(|| block_on(chain.run(Phase::Validating, &mut attributes.clone())))
    });
    group.bench_function("clone attributes", |b| b.iter(|| attributes.clone()));
    let outcome = block_on(chain.run(Phase::Validating, &mut attributes.clone()));
    group.bench_function("encode", |b| b.iter(|| ReviewResponse::from_outcome("uid", outcome.clone()).to_json()));
    group.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
