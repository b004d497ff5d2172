//! Share injection, the mutating plugin: a pod annotated `sharedresource.inlineguard.dev/inject`
//! gets, at creation, the read-only volumes and mounts its annotation names
//! (`inline_guard_policy::share_injection`). It runs before read-only forcing, whose patch then
//! has nothing to add for the injected volumes.
//!
//! Pods only. A workload's template is left as written: its pods carry the annotation and are
//! injected as they are made, the way sidecar injectors work, so a GitOps tool never sees its
//! Deployment drift and a change of this plugin never rolls one out. SharedResourceAdmission
//! judges a workload's template as its pods will be, injection included.

use async_trait::async_trait;
use inline_guard_policy::{PatchOperation, parse_injection, plan_injection};

use crate::attributes::{Attributes, Operation};
use crate::error::{AdmissionError, Result};
use crate::object::{AdmissionObject, PodSpecKind};
use crate::plugin::{Handler, MutationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/ShareInjection";

/// Injects the shares a pod's annotation names.
#[derive(Debug, Default)]
pub struct ShareInjection;

impl Handler for ShareInjection {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        // A pod's volumes and containers cannot change after creation.
        operation == Operation::Create
    }
}

#[async_trait]
impl MutationInterface for ShareInjection {
    async fn admit(&self, attributes: &mut Attributes<'_>, _recorder: &mut Recorder) -> Result<Vec<PatchOperation>> {
        if PodSpecKind::of(&attributes.resource) != Some(PodSpecKind::Pod) || !attributes.subresource.is_empty() {
            return Ok(Vec::new());
        }
        let Some(parsed) = attributes.object.as_ref().and_then(AdmissionObject::injection).map(parse_injection) else {
            return Ok(Vec::new());
        };
        let refused = |why: String| AdmissionError::Invalid(format!("{}: {why}", attributes.display_name()));
        let entries = parsed.map_err(|invalid| refused(invalid.0))?;
        let Some(spec) = attributes.object.as_ref().and_then(AdmissionObject::pod_spec) else {
            return Ok(Vec::new());
        };
        let plan = plan_injection(spec, &entries).map_err(|invalid| refused(invalid.0))?;
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        // Checked above: a pod with a spec.
        let Some(spec) = attributes.object.as_mut().and_then(AdmissionObject::pod_spec_mut) else {
            return Ok(Vec::new());
        };
        Ok(plan.apply(spec))
    }
}

#[cfg(test)]
mod tests {
    use futures_executor::block_on;
    use serde_json::{Value, json};

    use super::*;
    use crate::attributes::GroupVersionResource;

    fn attributes(resource: &str, subresource: &str, object: Value) -> Attributes<'static> {
        let resource = match resource {
            "deployments" => GroupVersionResource::v1("apps", "deployments"),
            _ => GroupVersionResource::v1("", "pods"),
        };
        let object = AdmissionObject::from_value(&resource, &object).unwrap();
        let mut attributes = Attributes::anonymous_create(resource, "apps", object);
        attributes.subresource = subresource.to_string().into();
        attributes
    }

    fn pod(annotation: &str) -> Value {
        json!({"metadata": {"name": "web", "annotations": {"sharedresource.inlineguard.dev/inject": annotation}},
               "spec": {"containers": [{"name": "app", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}})
    }

    fn admit(attributes: &mut Attributes<'_>) -> Result<Vec<PatchOperation>> {
        block_on(ShareInjection.admit(attributes, &mut Recorder::default()))
    }

    #[test]
    fn an_annotated_pod_is_patched_and_its_spec_then_holds_the_injection() {
        let mut create = attributes("pods", "", pod("sharedsecret/db:/etc/db"));
        let patch = admit(&mut create).unwrap();
        let paths: Vec<&str> = patch.iter().map(|op| op.path.as_str()).collect();
        assert_eq!(paths, ["/spec/volumes", "/spec/containers/0/volumeMounts/-"]);
        let spec = create.object.as_ref().and_then(AdmissionObject::pod_spec).unwrap();
        assert_eq!(spec.volumes[0].name, "inject-secret-db", "the validating plugins see the injected volume");
        assert_eq!(admit(&mut create).unwrap(), [], "injecting twice changes nothing");
    }

    #[test]
    fn a_malformed_annotation_or_a_taken_path_is_refused_naming_the_pod_and_the_entry() {
        let mut malformed = attributes("pods", "", pod("sharedsecret/db"));
        assert_eq!(
            admit(&mut malformed),
            Err(AdmissionError::Invalid(
                "web: annotation \"sharedresource.inlineguard.dev/inject\": entry \"sharedsecret/db\": is not <kind>/<name>:<mountPath>"
                    .into()
            ))
        );
        let mut taken = attributes("pods", "", pod("sharedconfigmap/ca:/data"));
        assert_eq!(
            admit(&mut taken),
            Err(AdmissionError::Invalid(
                "web: annotation \"sharedresource.inlineguard.dev/inject\": entry \"sharedconfigmap/ca:/data\": container \"app\" already mounts volume \"data\" at \"/data\""
                    .into()
            ))
        );
    }

    #[test]
    fn workloads_subresources_and_unannotated_pods_are_never_patched() {
        let template = json!({"spec": {"selector": {}, "template": pod("sharedsecret/db:/etc/db")}});
        assert_eq!(admit(&mut attributes("deployments", "", template)).unwrap(), []);
        assert_eq!(admit(&mut attributes("pods", "ephemeralcontainers", pod("sharedsecret/db:/etc/db"))).unwrap(), []);
        let plain = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app"}]}});
        assert_eq!(admit(&mut attributes("pods", "", plain)).unwrap(), []);
        assert_eq!(admit(&mut attributes("pods", "", pod(""))).unwrap(), [], "an empty annotation injects nothing");
    }
}
