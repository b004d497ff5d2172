//! The pure decision for a pod with 0, 1 and 8 inline CSI volumes. Target: under 1 µs for one volume.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use inline_guard_benches::{NAMESPACE, drivers, namespace_labels, pod_spec};
use inline_guard_policy::{PolicySettings, Subject, SubjectKind, evaluate};

fn decision(c: &mut Criterion) {
    let settings = PolicySettings::default();
    let namespace = namespace_labels();
    let drivers = drivers(8);
    let mut group = c.benchmark_group("decision");
    for volumes in [0, 1, 8] {
        let spec = pod_spec(volumes);
        let subject =
            Subject { kind: SubjectKind::Pod, name: "web", namespace: NAMESPACE, username: "alice", spec: &spec };
        group.bench_function(format!("{volumes} csi volumes"), |b| {
            b.iter(|| evaluate(black_box(&settings), black_box(&subject), Some(&namespace), &drivers))
        });
    }
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
