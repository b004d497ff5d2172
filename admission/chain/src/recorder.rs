//! Where plugins leave warnings and audit annotations for the host to return or log.

use std::collections::BTreeMap;

/// Collects a request's admission warnings and audit annotations across plugins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorder {
    warnings: Vec<String>,
    audit_annotations: BTreeMap<String, String>,
}

impl Recorder {
    /// Adds a warning for the client (kubectl prints these as `Warning: ...`).
    pub fn warn(&mut self, message: String) {
        self.warnings.push(message);
    }

    /// Records an audit annotation. Keys are bare names: a webhook's keys are prefixed by
    /// kube-apiserver with the webhook's name. The first value for a key wins, so a later plugin
    /// cannot overwrite an earlier one's record.
    pub fn annotate(&mut self, key: &str, value: String) {
        self.audit_annotations.entry(key.to_string()).or_insert(value);
    }

    /// The warnings, in the order recorded.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The audit annotations.
    pub fn audit_annotations(&self) -> &BTreeMap<String, String> {
        &self.audit_annotations
    }

    /// Takes both collections.
    pub fn into_parts(self) -> (Vec<String>, BTreeMap<String, String>) {
        (self.warnings, self.audit_annotations)
    }
}
