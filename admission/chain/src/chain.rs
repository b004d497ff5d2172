//! The chain: mutating plugins in order, then validating plugins in order, one outcome.

use std::collections::BTreeMap;
use std::sync::Arc;

use inline_guard_policy::PatchOperation;

use crate::attributes::Attributes;
use crate::error::AdmissionError;
use crate::plugin::{MutationInterface, ValidationInterface};
use crate::recorder::Recorder;

/// Which plugins to run. A webhook server splits the chain across its two endpoints; an
/// in-process host runs both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Mutating plugins only (the mutating webhook).
    Mutating,
    /// Validating plugins only (the validating webhook).
    Validating,
    /// Mutating, then validating on the mutated object.
    Both,
}

/// The result of running the chain on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `Ok` when admitted; the first plugin error otherwise.
    pub result: Result<(), AdmissionError>,
    /// Warnings from every plugin that ran.
    pub warnings: Vec<String>,
    /// Audit annotations from every plugin that ran.
    pub audit_annotations: BTreeMap<String, String>,
    /// The JSON Patch against the object as received; always empty when rejected.
    pub patch: Vec<PatchOperation>,
}

impl Outcome {
    /// A rejection decided before any plugin ran (an object that does not decode, say).
    pub fn rejected(error: AdmissionError) -> Outcome {
        Outcome { result: Err(error), warnings: Vec::new(), audit_annotations: BTreeMap::new(), patch: Vec::new() }
    }

    /// True when the request is admitted.
    pub fn is_allowed(&self) -> bool {
        self.result.is_ok()
    }
}

/// An ordered set of plugins.
#[derive(Clone, Default)]
pub struct Chain {
    mutating: Vec<Arc<dyn MutationInterface>>,
    validating: Vec<Arc<dyn ValidationInterface>>,
}

impl Chain {
    /// An empty chain.
    pub fn new() -> Chain {
        Chain::default()
    }

    /// Appends a mutating plugin.
    pub fn with_mutating(mut self, plugin: Arc<dyn MutationInterface>) -> Chain {
        self.mutating.push(plugin);
        self
    }

    /// Appends a validating plugin.
    pub fn with_validating(mut self, plugin: Arc<dyn ValidationInterface>) -> Chain {
        self.validating.push(plugin);
        self
    }

    /// Runs the plugins of `phase` on `attributes`, stopping at the first rejection as
    /// kube-apiserver does. Mutations are applied to `attributes.object`.
    pub async fn run(&self, phase: Phase, attributes: &mut Attributes) -> Outcome {
        let mut recorder = Recorder::default();
        let mut patch = Vec::new();
        let result = self.run_plugins(phase, attributes, &mut recorder, &mut patch).await;
        if result.is_err() {
            patch.clear();
        }
        let (warnings, audit_annotations) = recorder.into_parts();
        Outcome { result, warnings, audit_annotations, patch }
    }

    async fn run_plugins(
        &self,
        phase: Phase,
        attributes: &mut Attributes,
        recorder: &mut Recorder,
        patch: &mut Vec<PatchOperation>,
    ) -> Result<(), AdmissionError> {
        if phase != Phase::Validating {
            for plugin in &self.mutating {
                if plugin.handles(attributes.operation) {
                    // Each plugin's operations are relative to the object as it received it, so the
                    // concatenation applies in order to the original.
                    patch.extend(plugin.admit(attributes, recorder).await?);
                }
            }
        }
        if phase != Phase::Mutating {
            for plugin in &self.validating {
                if plugin.handles(attributes.operation) {
                    plugin.validate(attributes, recorder).await?;
                }
            }
        }
        Ok(())
    }
}
