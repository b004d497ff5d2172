//! Where the 3 KB review's time goes: the one-pass parse of review and object (beside bare scans
//! of the same bytes, serde's derive that decoded them before, and a full k8s-openapi Pod
//! decode), the chain, encoding. A diagnostic companion to `review`, with no target of its own.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use futures_executor::block_on;
use inline_guard_admission::Phase;
use inline_guard_admission::review::{ReviewResponse, decoders, parse_request};
use inline_guard_benches::{REVIEW_3K, chain};
use k8s_openapi::api::core::v1::Pod;

fn stages(c: &mut Criterion) {
    let chain = chain();
    let body = REVIEW_3K.as_bytes();
    let mut group = c.benchmark_group("stages-3KB");
    let text = REVIEW_3K;
    group.bench_function("scan only, serde", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(body)).unwrap())
    });
    group.bench_function("scan only, hand-written reader (lower bound)", |b| {
        b.iter(|| assert!(decoders::scan_only(black_box(text))))
    });
    group.bench_function("decode, hand-written", |b| b.iter(|| assert!(decoders::hand_written(black_box(text)))));
    group.bench_function("decode, serde derive (for comparison)", |b| {
        b.iter(|| assert!(decoders::serde_derive(black_box(text))))
    });
    group.bench_function("parse review and object (one pass)", |b| {
        b.iter(|| parse_request(black_box(body)).unwrap().uid.len())
    });
    let review: serde_json::Value = serde_json::from_slice(body).unwrap();
    let pod = review["request"]["object"].to_string();
    group.bench_function("full k8s-openapi Pod decode (for comparison)", |b| {
        b.iter(|| serde_json::from_str::<Pod>(black_box(&pod)).unwrap())
    });
    let attributes = parse_request(body).unwrap().attributes.unwrap();
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
