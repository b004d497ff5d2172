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

    /// Adds `messages` to the warnings, in order; the first plugin to warn hands its list over
    /// instead of having it copied.
    pub fn warn_all(&mut self, messages: Vec<String>) {
        if self.warnings.is_empty() {
            self.warnings = messages;
        } else {
            self.warnings.extend(messages);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_keep_the_order_they_were_given_in_however_they_arrive() {
        let mut recorder = Recorder::default();
        recorder.warn_all(vec!["first".into(), "second".into()]);
        recorder.warn("third".into());
        recorder.warn_all(vec!["fourth".into()]);
        recorder.warn_all(Vec::new());
        assert_eq!(recorder.warnings(), ["first", "second", "third", "fourth"]);
    }

    #[test]
    fn the_first_value_recorded_for_an_annotation_wins() {
        let mut recorder = Recorder::default();
        recorder.annotate("key", "first".into());
        recorder.annotate("key", "second".into());
        assert_eq!(recorder.audit_annotations().get("key").map(String::as_str), Some("first"));
    }
}
