//! Fixtures shared by the benchmarks: a labelled cluster, pod specs with N inline CSI volumes, and
//! realistic AdmissionReview bodies.

pub mod apiserver_metrics;
pub mod dir_changes;
pub mod floor;
pub mod lazy_bench;
pub mod process_cpu;
pub mod profile;
pub mod report;
pub mod scale_report;
pub mod shares_cluster;
pub mod volume_requests;

use std::collections::BTreeMap;
use std::sync::Arc;

use inline_guard_admission::plugins::standard_chain;
use inline_guard_admission::{Chain, StaticClusterFacts};
use inline_guard_policy::labels::{AUDIT_LEVEL, DRIVER_PROFILE, ENFORCE_LEVEL, WARN_LEVEL};
use inline_guard_policy::{ContainerView, CsiVolumeView, Labels, PodSpecView, PolicySettings, VolumeView};

/// A realistic pod CREATE review of about 3 KB (one container, one CSI volume, a projected token).
pub const REVIEW_3K: &str = include_str!("../fixtures/review-3k.json");
/// A pod CREATE review of about 30 KB (six containers with many environment variables).
pub const REVIEW_30K: &str = include_str!("../fixtures/review-30k.json");

/// The value after `--name` on this process's command line, parsed; `None` when the option is
/// absent, and an error naming the option and the value when it does not parse.
pub fn option<T>(name: &str) -> Result<Option<T>, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let mut args = std::env::args().skip_while(|arg| arg != name);
    if args.next().is_none() {
        return Ok(None);
    }
    let value = args.next().ok_or_else(|| format!("{name} needs a value"))?;
    value
        .parse()
        .map(Some)
        .map_err(|error| format!("{name} {:?}: {error}", value.chars().take(100).collect::<String>()))
}

/// The namespace the fixtures live in: enforce baseline, warn and audit restricted.
pub const NAMESPACE: &str = "apps";

/// Namespace labels with enforce `baseline`, warn and audit `restricted`.
pub fn namespace_labels() -> Labels {
    [(ENFORCE_LEVEL, "baseline"), (WARN_LEVEL, "restricted"), (AUDIT_LEVEL, "restricted")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Driver names `csi-0.example.com`, `csi-1.example.com`, ... each labelled `baseline`.
pub fn driver_name(index: usize) -> String {
    format!("csi-{index}.example.com")
}

/// The labels of every fixture driver (and of `csi.example.com`, used by the review fixtures).
pub fn drivers(count: usize) -> BTreeMap<String, Labels> {
    let labels: Labels = [(DRIVER_PROFILE.to_string(), "baseline".to_string())].into();
    (0..count)
        .map(driver_name)
        .chain(std::iter::once("csi.example.com".to_string()))
        .map(|name| (name, labels.clone()))
        .collect()
}

/// A pod spec with one container and `csi_volumes` inline CSI volumes of distinct drivers.
pub fn pod_spec(csi_volumes: usize) -> PodSpecView<'static> {
    PodSpecView {
        containers: vec![ContainerView { name: "app".into(), volume_mounts: Vec::new() }],
        volumes: (0..csi_volumes)
            .map(|index| VolumeView {
                name: format!("v{index}").into(),
                csi: Some(CsiVolumeView { driver: driver_name(index).into(), read_only: None, ..Default::default() }),
            })
            .collect(),
        ..Default::default()
    }
}

/// The fixture cluster: the namespace and every fixture driver.
pub fn facts() -> StaticClusterFacts {
    let mut facts = StaticClusterFacts::new();
    facts.insert_namespace(NAMESPACE, namespace_labels());
    for (name, labels) in drivers(8) {
        facts.insert_csi_driver(&name, labels);
    }
    facts
}

/// The standard chain over the fixture cluster, with default settings.
pub fn chain() -> Chain {
    standard_chain(
        Arc::new(PolicySettings::default()),
        Arc::new(facts()),
        Arc::new(inline_guard_admission::NothingChecked),
    )
}

/// This process's resident set, in MB (from /proc).
pub fn resident_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kb| kb.parse().ok())
        .unwrap_or_default();
    kb / 1024.0
}

/// The `p` quantile of `sorted` latencies.
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1).min(sorted.len() - 1)]
}
