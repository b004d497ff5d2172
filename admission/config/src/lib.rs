//! Reading files: the CSIVolumeAdmission configuration (with an optional Pod Security
//! configuration it defers to) and multi-document Kubernetes manifests, YAML or JSON; and the
//! webhook configurations, and the native admission policies, generated from that configuration.
//!
//! Everything is parsed and validated once, at start-up, into typed values; an error names the
//! file, the field and the line.

pub mod admission_config;
pub mod documents;
pub mod error;
pub mod format;
pub mod native_policies;
pub mod pod_security;
#[cfg(test)]
mod shipped_files;
pub mod webhook_configurations;

pub use admission_config::{AdmissionConfig, CONFIG_API_VERSION, CONFIG_KIND};
pub use documents::{Document, read_documents};
pub use error::{Error, Result};
