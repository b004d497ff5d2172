//! Test support for the files the repository ships generated (`config/deploy/webhooks.yaml`,
//! `config/native/policies.yaml`): the configuration they are generated from, and the drift
//! check each generator's test makes.

use std::path::{Path, PathBuf};

use crate::{AdmissionConfig, read_documents};

/// `path` below the repository's root.
pub fn repository_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The admission configuration the shipped `config/deploy/config.yaml` ConfigMap embeds: what
/// the shipped generated files are generated from.
pub fn shipped_config() -> AdmissionConfig {
    let config_path = repository_file("config/deploy/config.yaml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    let config_map = &read_documents(&config_path, &text).unwrap()[0].value;
    let embedded = config_map["data"]["admission.yaml"].as_str().unwrap();
    AdmissionConfig::parse(Path::new("config/deploy/config.yaml#admission.yaml"), embedded).unwrap()
}

/// Fails unless the shipped file `path` holds `generated` exactly; with `switch=1` in the
/// environment, writes it first. Returns the shipped file's documents.
pub fn assert_shipped(path: &str, generated: &str, switch: &str) -> Vec<serde_json::Value> {
    let path = repository_file(path);
    if std::env::var_os(switch).is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, generated).unwrap();
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(shipped == generated, "{} drifted from the configuration ({switch}=1 regenerates it)", path.display());
    read_documents(&path, &shipped).unwrap().into_iter().map(|d| d.value).collect()
}
