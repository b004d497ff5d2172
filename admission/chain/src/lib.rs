//! The admission chain: a Rust shape of kube-apiserver's in-process admission plugins, the three
//! plugins this project ships (CSIVolumeAdmission, read-only forcing and its check), the cluster
//! facts they read, and the `admission.k8s.io/v1` AdmissionReview wire form.
//!
//! Hosts (the webhook server, `check`, an embedding apiserver) build [`Attributes`], run a
//! [`Chain`], and turn its [`Outcome`] into their own answer; [`review`] is the one place an outcome
//! becomes an AdmissionReview response.

pub mod attributes;
pub mod chain;
pub mod error;
pub mod facts;
mod json_cursor;
pub mod object;
pub mod plugin;
pub mod plugins;
pub mod recorder;
pub mod review;
pub mod share_facts;
pub mod static_facts;

pub use attributes::{Attributes, GroupVersionKind, GroupVersionResource, Operation, UserInfo};
pub use chain::{Chain, Outcome, Phase};
pub use error::{AdmissionError, Result};
pub use facts::{ClusterFacts, FactsError};
pub use object::{AdmissionObject, ObjectDecodeError};
pub use plugin::{Handler, MutationInterface, ValidationInterface};
pub use recorder::Recorder;
pub use share_facts::{Known, NothingChecked, ShareFacts};
pub use static_facts::{ClusterStateError, StaticClusterFacts};
