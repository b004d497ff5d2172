//! Memory of the lister cache: 10 000 namespaces as the watch delivers them (labels, annotations,
//! managed fields), applied to the server's label store (which keeps the name and the Pod Security
//! labels, sharing identical label sets), measured as the growth of the process's resident set;
//! then 1 000 CSIDrivers beside them, as a large cluster's webhook replica holds both. Beside it,
//! for comparison, the same namespaces kept whole in kube's reflector store. Target: a few
//! megabytes. (The webhook's watches are per replica, not per node: this is its whole cache.)
//!
//! `cargo bench -p inline-guard-benches --bench cache_memory [-- --json FILE]`

use std::collections::BTreeMap;

use inline_guard_server::cache::{CsiDriverMeta, NamespaceMeta};
use inline_guard_server::label_store::LabelStore;
use inline_guard_server::metrics::CacheKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;

const NAMESPACES: usize = 10_000;
const DRIVERS: usize = 1_000;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("statm resident");
    pages * 4096
}

fn namespace(index: usize) -> NamespaceMeta {
    let name = format!("team-{index:05}");
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/metadata.name", name.as_str()),
        ("pod-security.kubernetes.io/enforce", "baseline"),
        ("pod-security.kubernetes.io/warn", "restricted"),
        ("pod-security.kubernetes.io/audit", "restricted"),
        ("team", "payments"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let annotations: BTreeMap<String, String> = [(
        "kubectl.kubernetes.io/last-applied-configuration".to_string(),
        format!("{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"labels\":{{\"team\":\"payments\"}},\"name\":\"{name}\"}}}}\n"),
    )]
    .into();
    let managed = ManagedFieldsEntry {
        api_version: Some("v1".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(
            serde_json::json!({"f:metadata": {"f:labels": {"f:team": {}, "f:pod-security.kubernetes.io/enforce": {}}}}),
        )),
        manager: Some("kubectl-client-side-apply".into()),
        operation: Some("Update".into()),
        ..Default::default()
    };
    NamespaceMeta {
        types: None,
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(annotations),
            managed_fields: Some(vec![managed.clone(), managed]),
            resource_version: Some(format!("{}", 100_000 + index)),
            uid: Some(format!("5f0c8a9e-0000-4000-8000-{index:012}")),
            ..Default::default()
        },
        _phantom: Default::default(),
    }
}

/// CSIDriver `index` with its profile label and the metadata a real one carries.
fn csi_driver(index: usize) -> CsiDriverMeta {
    let labels: BTreeMap<String, String> = [
        ("security.openshift.io/csi-ephemeral-volume-profile".to_string(), "restricted".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), "helm".to_string()),
    ]
    .into();
    CsiDriverMeta {
        types: None,
        metadata: ObjectMeta {
            name: Some(format!("csi-{index:04}.storage.example.com")),
            labels: Some(labels),
            resource_version: Some(format!("{}", 200_000 + index)),
            uid: Some(format!("6a0c8a9e-0000-4000-8000-{index:012}")),
            ..Default::default()
        },
        _phantom: Default::default(),
    }
}

fn main() {
    let json_out = std::env::args().skip_while(|a| a != "--json").nth(1);
    let before = resident_bytes();
    let store = LabelStore::new(CacheKind::Namespace);
    store.apply(Event::<NamespaceMeta>::Init);
    for index in 0..NAMESPACES {
        store.apply(Event::InitApply(namespace(index)));
    }
    store.apply(Event::<NamespaceMeta>::InitDone);
    let served = report("label store (as served)", store.len(), resident_bytes().saturating_sub(before));
    let drivers = LabelStore::new(CacheKind::CsiDriver);
    drivers.apply(Event::<CsiDriverMeta>::Init);
    for index in 0..DRIVERS {
        drivers.apply(Event::InitApply(csi_driver(index)));
    }
    drivers.apply(Event::<CsiDriverMeta>::InitDone);
    let both = resident_bytes().saturating_sub(before) as f64 / 1e6;
    println!(
        "{} namespaces and {} CSIDrivers, label stores (as served): resident set grew {both:.1} MB",
        store.len(),
        drivers.len()
    );
    drop((store, drivers));

    let before = resident_bytes();
    let mut writer = Writer::<NamespaceMeta>::default();
    let reader = writer.as_reader();
    writer.apply_watcher_event(&Event::Init);
    for index in 0..NAMESPACES {
        writer.apply_watcher_event(&Event::InitApply(namespace(index)));
    }
    writer.apply_watcher_event(&Event::InitDone);
    let whole = report(
        "whole objects in kube's reflector store (comparison)",
        reader.len(),
        resident_bytes().saturating_sub(before),
    );
    if let Some(path) = json_out {
        let results = serde_json::json!({"namespaces": NAMESPACES, "label_store_mb": served, "reflector_store_mb": whole,
                               "csi_drivers": DRIVERS, "with_drivers_mb": both});
        std::fs::write(&path, serde_json::to_vec_pretty(&results).unwrap()).expect("writing the results");
    }
}

/// Prints one measurement and returns the growth in MB.
fn report(what: &str, objects: usize, grown: u64) -> f64 {
    let megabytes = grown as f64 / 1e6;
    println!("{objects} namespaces, {what}: resident set grew {megabytes:.1} MB");
    megabytes
}
