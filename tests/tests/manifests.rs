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
