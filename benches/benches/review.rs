//! Decode + decide + encode of an AdmissionReview, as the webhook's endpoints do it.
//! Target: under 15 µs for the 3 KB review on the validating path.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_executor::block_on;
use inline_guard_admission::Phase;
use inline_guard_admission::review::answer;
use inline_guard_benches::{REVIEW_3K, REVIEW_30K, chain};

fn review(c: &mut Criterion) {
    let chain = chain();
    let mut group = c.benchmark_group("review");
    for (size, body) in [("3KB", REVIEW_3K), ("30KB", REVIEW_30K)] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        for (phase_name, phase) in [("validate", Phase::Validating), ("mutate", Phase::Mutating)] {
            group.bench_with_input(BenchmarkId::new(phase_name, size), body.as_bytes(), |b, body| {
                b.iter(|| {
                    let response = block_on(answer(&chain, phase, black_box(body))).expect("fixture is a valid review");
                    black_box(response.to_json())
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, review);
criterion_main!(benches);
