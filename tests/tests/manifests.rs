//! The shipped deployment manifests parse, and the configuration they mount is valid. (That the
//! apiserver accepts them is the end-to-end suite's job: server-side dry-run.)

use std::path::Path;

use inline_guard_config::{AdmissionConfig, read_documents};
use inline_guard_tests::repo_root;

#[test]
fn every_deployment_manifest_is_a_stream_of_kubernetes_objects() {
    let mut kinds = Vec::new();
    for dir in ["config/deploy", "config/deploy/driver"] {
        for entry in std::fs::read_dir(repo_root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for document in read_documents(&path, &text).unwrap_or_else(|e| panic!("{e}")) {
                kinds.push(document.value["kind"].as_str().unwrap().to_string());
            }
        }
    }
    for kind in [
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ClusterRole",
        "DaemonSet",
        "CustomResourceDefinition",
        "CSIDriver",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in config/deploy");
    }
}

#[test]
fn the_mounted_configuration_is_valid_and_the_documented_default() {
    let path = repo_root().join("config/deploy/config.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let config_map = &read_documents(&path, &text).unwrap()[0].value;
    let embedded = config_map["data"]["admission.yaml"].as_str().unwrap();
    let config = AdmissionConfig::parse(Path::new("config/deploy/config.yaml#admission.yaml"), embedded).unwrap();
    assert_eq!(config, AdmissionConfig::embedded_default());
}

/// The objects of a manifest file.
fn objects_of(file: &str) -> Vec<serde_json::Value> {
    let path = repo_root().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    read_documents(&path, &text).unwrap().into_iter().map(|document| document.value).collect()
}

/// Each shipped PodMonitor scrapes the pods it is for: its namespace, a selector their template's
/// labels match, and the name of one of their container ports (the apiserver's dry-run checks
/// its schema only; a misspelt port would scrape nothing, silently).
#[test]
fn each_pod_monitor_selects_its_workloads_pods_and_names_their_metrics_port() {
    for (monitor_file, workload_file, kind) in [
        ("config/deploy/driver/pod-monitor.yaml", "config/deploy/driver/daemonset.yaml", "DaemonSet"),
        ("config/deploy/pod-monitor.yaml", "config/deploy/deployment.yaml", "Deployment"),
    ] {
        let monitor = &objects_of(monitor_file)[0];
        assert_eq!(monitor["kind"], "PodMonitor", "{monitor_file}");
        let workload = objects_of(workload_file).into_iter().find(|o| o["kind"] == kind).unwrap();
        assert_eq!(monitor["metadata"]["namespace"], workload["metadata"]["namespace"], "{monitor_file}");
        let labels = workload["spec"]["template"]["metadata"]["labels"].as_object().unwrap();
        let selector = monitor["spec"]["selector"]["matchLabels"].as_object().unwrap();
        assert!(!selector.is_empty(), "{monitor_file} selects every pod of its namespace");
        for (key, value) in selector {
            assert_eq!(labels.get(key), Some(value), "{monitor_file}: the {kind}'s pods lack {key}={value}");
        }
        let ports: Vec<&serde_json::Value> = workload["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .map(|p| &p["name"])
            .collect();
        for endpoint in monitor["spec"]["podMetricsEndpoints"].as_array().unwrap() {
            assert!(ports.contains(&&endpoint["port"]), "{monitor_file}: no container port {}", endpoint["port"]);
            assert_eq!(endpoint["path"], "/metrics", "{monitor_file}");
        }
    }
}

/// The driver's memory limit holds what its configuration lets it hold: the content budget and
/// its update overshoot, the content in flight, and the process (`DriverConfig::memory_needed`).
/// A budget raised without the limit would let the kernel kill the driver before the budget
/// refuses anything.
#[test]
fn the_driver_s_memory_limit_holds_its_content_budget_and_the_process() {
    let objects = objects_of("config/deploy/driver/daemonset.yaml");
    let config_map = objects.iter().find(|o| o["kind"] == "ConfigMap").expect("the driver's ConfigMap");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("driver.yaml");
    std::fs::write(&path, config_map["data"]["driver.yaml"].as_str().unwrap()).unwrap();
    let config = sharedresource_csi_driver::config::DriverConfig::load(&path).unwrap();
    let daemon_set = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("the driver's DaemonSet");
    let containers = daemon_set["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    let driver = containers.iter().find(|c| c["name"] == "driver").expect("the driver's container");
    let limit = driver["resources"]["limits"]["memory"].as_str().expect("a memory limit");
    let limit = sharedresource_csi_driver::units::size_of(limit).unwrap();
    let needed = config.memory_needed();
    assert!(needed > config.content_budget, "the positive control: the process needs room beside the budget");
    assert!(limit >= needed, "the driver's limit is {limit} bytes; its configuration needs {needed}");
}
