//! The pod fields a projection's `podInfo` may show, by their downward API field paths: which
//! are supported is part of the API (the admission plugin refuses the others at creation); how
//! each is rendered is the driver's.

use crate::invalid::{Invalid, Result};
use crate::quote::quote;

/// A pod field a projection may show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodField {
    /// `metadata.name`.
    Name,
    /// `metadata.namespace`.
    Namespace,
    /// `metadata.uid`.
    Uid,
    /// `spec.serviceAccountName`.
    ServiceAccountName,
    /// `metadata.labels`: every label.
    Labels,
    /// `metadata.annotations`: every annotation.
    Annotations,
    /// `metadata.labels['key']`: one label's value, empty when absent.
    Label(String),
    /// `metadata.annotations['key']`: one annotation's value, empty when absent.
    Annotation(String),
}

impl PodField {
    /// Parses a downward API field path; names what is supported when it is not.
    pub fn parse(field_path: &str) -> Result<PodField> {
        let field = match field_path {
            "metadata.name" => PodField::Name,
            "metadata.namespace" => PodField::Namespace,
            "metadata.uid" => PodField::Uid,
            "spec.serviceAccountName" => PodField::ServiceAccountName,
            "metadata.labels" => PodField::Labels,
            "metadata.annotations" => PodField::Annotations,
            other => {
                if let Some(key) = subscript(other, "metadata.labels") {
                    PodField::Label(key.to_string())
                } else if let Some(key) = subscript(other, "metadata.annotations") {
                    PodField::Annotation(key.to_string())
                } else {
                    return Err(Invalid(format!(
                        "fieldPath {} is not supported: use metadata.name, metadata.namespace, metadata.uid, \
                         spec.serviceAccountName, metadata.labels, metadata.annotations, \
                         metadata.labels['<key>'] or metadata.annotations['<key>']",
                        quote(other)
                    )));
                }
            }
        };
        Ok(field)
    }

    /// Whether showing this field needs the pod object (labels and annotations are not in
    /// kubelet's publish request).
    pub fn needs_pod_object(&self) -> bool {
        matches!(self, PodField::Labels | PodField::Annotations | PodField::Label(_) | PodField::Annotation(_))
    }
}

/// `metadata.labels['key']` → `key`; the key must be non-empty and free of quotes.
fn subscript<'a>(field_path: &'a str, map: &str) -> Option<&'a str> {
    let key = field_path.strip_prefix(map)?.strip_prefix("['")?.strip_suffix("']")?;
    (!key.is_empty() && !key.contains('\'')).then_some(key)
}
