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
    pub async fn run(&self, phase: Phase, attributes: &mut Attributes<'_>) -> Outcome {
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
        attributes: &mut Attributes<'_>,
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

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use futures_executor::block_on;

    use super::*;
    use crate::attributes::{GroupVersionResource, Operation, UserInfo};
    use crate::plugin::Handler;

    /// Records the order plugins ran in, and optionally rejects.
    struct Probe {
        name: &'static str,
        reject: bool,
        log: Arc<std::sync::Mutex<Vec<&'static str>>>,
    }

    impl Handler for Probe {
        fn name(&self) -> &'static str {
            self.name
        }
        fn handles(&self, operation: Operation) -> bool {
            operation == Operation::Create
        }
    }

    #[async_trait]
    impl MutationInterface for Probe {
        async fn admit(
            &self,
            _: &mut Attributes<'_>,
            recorder: &mut Recorder,
        ) -> Result<Vec<PatchOperation>, AdmissionError> {
            self.log.lock().unwrap().push(self.name);
            recorder.warn(format!("{} ran", self.name));
            Ok(vec![PatchOperation::set_true(format!("/{}", self.name), false)])
        }
    }

    #[async_trait]
    impl ValidationInterface for Probe {
        async fn validate(&self, _: &Attributes<'_>, recorder: &mut Recorder) -> Result<(), AdmissionError> {
            self.log.lock().unwrap().push(self.name);
            recorder.annotate(self.name, "ran".into());
            if self.reject { Err(AdmissionError::Forbidden(format!("{} says no", self.name))) } else { Ok(()) }
        }
    }

    fn attributes(operation: Operation) -> Attributes<'static> {
        Attributes {
            operation,
            kind: Default::default(),
            resource: GroupVersionResource::v1("", "pods"),
            subresource: "".into(),
            namespace: "ns".into(),
            name: "p".into(),
            object: None,
            old_object: None,
            user_info: UserInfo::anonymous(),
            dry_run: false,
        }
    }

    fn probe(name: &'static str, reject: bool, log: &Arc<std::sync::Mutex<Vec<&'static str>>>) -> Arc<Probe> {
        Arc::new(Probe { name, reject, log: log.clone() })
    }

    #[test]
    fn mutating_plugins_run_in_order_before_validating_ones_and_the_first_rejection_stops_the_chain() {
        let log = Arc::default();
        let chain = Chain::new()
            .with_validating(probe("v1", true, &log))
            .with_validating(probe("v2", false, &log))
            .with_mutating(probe("m1", false, &log))
            .with_mutating(probe("m2", false, &log));
        let outcome = block_on(chain.run(Phase::Both, &mut attributes(Operation::Create)));
        assert_eq!(*log.lock().unwrap(), ["m1", "m2", "v1"]);
        assert_eq!(outcome.result, Err(AdmissionError::Forbidden("v1 says no".into())));
        assert!(outcome.patch.is_empty(), "a rejected request carries no patch");
        assert_eq!(outcome.warnings, ["m1 ran", "m2 ran"]);
        assert_eq!(outcome.audit_annotations.get("v1").map(String::as_str), Some("ran"));
    }

    #[test]
    fn phases_select_plugins_and_handles_filters_operations() {
        let log = Arc::default();
        let chain = Chain::new().with_mutating(probe("m", false, &log)).with_validating(probe("v", false, &log));
        let outcome = block_on(chain.run(Phase::Mutating, &mut attributes(Operation::Create)));
        assert_eq!(outcome.patch.len(), 1);
        block_on(chain.run(Phase::Validating, &mut attributes(Operation::Create)));
        block_on(chain.run(Phase::Both, &mut attributes(Operation::Delete)));
        assert_eq!(*log.lock().unwrap(), ["m", "v"]);
    }
}
