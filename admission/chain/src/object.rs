//! The objects a request may carry, decoded into Kubernetes types by resource, and the pod spec
//! inside each (a Pod's own, or a workload's template).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplate, PodTemplateSpec, ReplicationController};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::attributes::GroupVersionResource;

/// A request's object. Pods and the pod-template workloads are typed; anything else is kept as
/// JSON and never evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum AdmissionObject {
    /// `pods`.
    Pod(Box<Pod>),
    /// `podtemplates`.
    PodTemplate(Box<PodTemplate>),
    /// `replicationcontrollers`.
    ReplicationController(Box<ReplicationController>),
    /// `apps/replicasets`.
    ReplicaSet(Box<ReplicaSet>),
    /// `apps/deployments`.
    Deployment(Box<Deployment>),
    /// `apps/statefulsets`.
    StatefulSet(Box<StatefulSet>),
    /// `apps/daemonsets`.
    DaemonSet(Box<DaemonSet>),
    /// `batch/jobs`.
    Job(Box<Job>),
    /// `batch/cronjobs`.
    CronJob(Box<CronJob>),
    /// Any other resource.
    Other(serde_json::Value),
}

/// The object did not decode as the resource's kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object does not decode as {}: {field}: {message}", kind.map_or("JSON".to_string(), |k| k.to_string()))]
pub struct ObjectDecodeError {
    /// The kind expected from the resource; `None` when the text is not even JSON.
    pub kind: Option<PodSpecKind>,
    /// The dotted path of the offending field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The resources whose objects carry a pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSpecKind {
    /// `pods`.
    Pod,
    /// `podtemplates`.
    PodTemplate,
    /// `replicationcontrollers`.
    ReplicationController,
    /// `apps/replicasets`.
    ReplicaSet,
    /// `apps/deployments`.
    Deployment,
    /// `apps/statefulsets`.
    StatefulSet,
    /// `apps/daemonsets`.
    DaemonSet,
    /// `batch/jobs`.
    Job,
    /// `batch/cronjobs`.
    CronJob,
}

impl PodSpecKind {
    /// The kind behind a resource, when it carries a pod spec.
    pub fn of(resource: &GroupVersionResource) -> Option<PodSpecKind> {
        Some(match (resource.group.as_str(), resource.resource.as_str()) {
            ("", "pods") => PodSpecKind::Pod,
            ("", "podtemplates") => PodSpecKind::PodTemplate,
            ("", "replicationcontrollers") => PodSpecKind::ReplicationController,
            ("apps", "replicasets") => PodSpecKind::ReplicaSet,
            ("apps", "deployments") => PodSpecKind::Deployment,
            ("apps", "statefulsets") => PodSpecKind::StatefulSet,
            ("apps", "daemonsets") => PodSpecKind::DaemonSet,
            ("batch", "jobs") => PodSpecKind::Job,
            ("batch", "cronjobs") => PodSpecKind::CronJob,
            _ => return None,
        })
    }

    /// True for the pod-template workloads, false for Pod.
    pub fn is_workload(self) -> bool {
        self != PodSpecKind::Pod
    }

    /// Decodes an object of this kind from JSON text or an already-parsed value.
    fn decode(self, source: impl ObjectSource) -> Result<AdmissionObject, ObjectDecodeError> {
        Ok(match self {
            PodSpecKind::Pod => AdmissionObject::Pod(source.typed(self)?),
            PodSpecKind::PodTemplate => AdmissionObject::PodTemplate(source.typed(self)?),
            PodSpecKind::ReplicationController => AdmissionObject::ReplicationController(source.typed(self)?),
            PodSpecKind::ReplicaSet => AdmissionObject::ReplicaSet(source.typed(self)?),
            PodSpecKind::Deployment => AdmissionObject::Deployment(source.typed(self)?),
            PodSpecKind::StatefulSet => AdmissionObject::StatefulSet(source.typed(self)?),
            PodSpecKind::DaemonSet => AdmissionObject::DaemonSet(source.typed(self)?),
            PodSpecKind::Job => AdmissionObject::Job(source.typed(self)?),
            PodSpecKind::CronJob => AdmissionObject::CronJob(source.typed(self)?),
        })
    }
}

/// Where an object is decoded from. Decoding runs untracked first; only a failure pays for a
/// second, path-tracking read to say which field is wrong (tracking doubles the cost of a pod).
trait ObjectSource {
    fn typed<T: DeserializeOwned>(&self, kind: PodSpecKind) -> Result<Box<T>, ObjectDecodeError>;
}

impl ObjectSource for &str {
    fn typed<T: DeserializeOwned>(&self, kind: PodSpecKind) -> Result<Box<T>, ObjectDecodeError> {
        serde_json::from_str(self)
            .map(Box::new)
            .map_err(|plain| locate::<T, _>(kind, &mut serde_json::Deserializer::from_str(self), plain))
    }
}

impl ObjectSource for &serde_json::Value {
    fn typed<T: DeserializeOwned>(&self, kind: PodSpecKind) -> Result<Box<T>, ObjectDecodeError> {
        T::deserialize(*self).map(Box::new).map_err(|plain| locate::<T, _>(kind, *self, plain))
    }
}

fn locate<'de, T: Deserialize<'de>, D: Deserializer<'de, Error = serde_json::Error>>(
    kind: PodSpecKind,
    deserializer: D,
    plain: serde_json::Error,
) -> ObjectDecodeError {
    match serde_path_to_error::deserialize::<_, T>(deserializer) {
        Err(error) => ObjectDecodeError {
            kind: Some(kind),
            field: error.path().to_string(),
            message: error.into_inner().to_string(),
        },
        Ok(_) => ObjectDecodeError { kind: Some(kind), field: ".".into(), message: plain.to_string() },
    }
}

impl fmt::Display for PodSpecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl AdmissionObject {
    /// Decodes JSON text as the kind `resource` holds. Other resources are kept as JSON.
    pub fn from_json(resource: &GroupVersionResource, json: &str) -> Result<AdmissionObject, ObjectDecodeError> {
        match PodSpecKind::of(resource) {
            Some(kind) => kind.decode(json),
            None => serde_json::from_str(json).map(AdmissionObject::Other).map_err(|error| ObjectDecodeError {
                kind: None,
                field: ".".into(),
                message: error.to_string(),
            }),
        }
    }

    /// Decodes an already-parsed value as the kind `resource` holds. Other resources are kept as-is.
    pub fn from_value(
        resource: &GroupVersionResource,
        value: serde_json::Value,
    ) -> Result<AdmissionObject, ObjectDecodeError> {
        match PodSpecKind::of(resource) {
            Some(kind) => kind.decode(&value),
            None => Ok(AdmissionObject::Other(value)),
        }
    }

    /// Object metadata, for typed objects.
    pub fn metadata(&self) -> Option<&ObjectMeta> {
        Some(match self {
            AdmissionObject::Pod(o) => &o.metadata,
            AdmissionObject::PodTemplate(o) => &o.metadata,
            AdmissionObject::ReplicationController(o) => &o.metadata,
            AdmissionObject::ReplicaSet(o) => &o.metadata,
            AdmissionObject::Deployment(o) => &o.metadata,
            AdmissionObject::StatefulSet(o) => &o.metadata,
            AdmissionObject::DaemonSet(o) => &o.metadata,
            AdmissionObject::Job(o) => &o.metadata,
            AdmissionObject::CronJob(o) => &o.metadata,
            AdmissionObject::Other(_) => return None,
        })
    }

    /// The pod spec to evaluate: a Pod's spec or a workload's template spec. `None` when the
    /// object has none (a template left empty, or another resource).
    pub fn pod_spec(&self) -> Option<&PodSpec> {
        match self {
            AdmissionObject::Pod(o) => o.spec.as_ref(),
            AdmissionObject::PodTemplate(o) => template_spec(o.template.as_ref()),
            AdmissionObject::ReplicationController(o) => template_spec(o.spec.as_ref()?.template.as_ref()),
            AdmissionObject::ReplicaSet(o) => template_spec(o.spec.as_ref()?.template.as_ref()),
            AdmissionObject::Deployment(o) => template_spec(o.spec.as_ref().map(|s| &s.template)),
            AdmissionObject::StatefulSet(o) => template_spec(o.spec.as_ref().map(|s| &s.template)),
            AdmissionObject::DaemonSet(o) => template_spec(o.spec.as_ref().map(|s| &s.template)),
            AdmissionObject::Job(o) => template_spec(o.spec.as_ref().map(|s| &s.template)),
            AdmissionObject::CronJob(o) => {
                template_spec(o.spec.as_ref()?.job_template.spec.as_ref().map(|s| &s.template))
            }
            AdmissionObject::Other(_) => None,
        }
    }

    /// A Pod's spec, mutable: read-only forcing only ever changes pods.
    pub fn pod_spec_mut(&mut self) -> Option<&mut PodSpec> {
        match self {
            AdmissionObject::Pod(o) => o.spec.as_mut(),
            _ => None,
        }
    }
}

fn template_spec(template: Option<&PodTemplateSpec>) -> Option<&PodSpec> {
    template?.spec.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_workload_resource_yields_its_template_spec() {
        let template = r#"{"spec":{"containers":[],"volumes":[{"name":"v","csi":{"driver":"d"}}]}}"#;
        let cases = [
            ("", "podtemplates", format!(r#"{{"template":{template}}}"#)),
            ("", "replicationcontrollers", format!(r#"{{"spec":{{"template":{template}}}}}"#)),
            ("apps", "replicasets", format!(r#"{{"spec":{{"selector":{{}},"template":{template}}}}}"#)),
            ("apps", "deployments", format!(r#"{{"spec":{{"selector":{{}},"template":{template}}}}}"#)),
            ("apps", "statefulsets", format!(r#"{{"spec":{{"selector":{{}},"template":{template}}}}}"#)),
            ("apps", "daemonsets", format!(r#"{{"spec":{{"selector":{{}},"template":{template}}}}}"#)),
            ("batch", "jobs", format!(r#"{{"spec":{{"template":{template}}}}}"#)),
            (
                "batch",
                "cronjobs",
                format!(r#"{{"spec":{{"schedule":"* * * * *","jobTemplate":{{"spec":{{"template":{template}}}}}}}}}"#),
            ),
        ];
        for (group, resource, json) in cases {
            let object = AdmissionObject::from_json(&GroupVersionResource::v1(group, resource), &json).unwrap();
            let spec = object.pod_spec().unwrap_or_else(|| panic!("{resource}: no spec"));
            assert_eq!(spec.volumes.as_ref().unwrap()[0].csi.as_ref().unwrap().driver, "d", "{resource}");
            let value: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(AdmissionObject::from_value(&GroupVersionResource::v1(group, resource), value).unwrap(), object);
        }
    }

    #[test]
    fn a_pod_that_does_not_decode_says_which_field_failed() {
        let error = AdmissionObject::from_json(
            &GroupVersionResource::v1("", "pods"),
            r#"{"spec":{"containers":[],"volumes":[{"name":"v","csi":{"driver":7}}]}}"#,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "object does not decode as Pod: spec.volumes[0].csi.driver: invalid type: integer `7`, expected a string at line 1 column 65"
        );
    }

    #[test]
    fn other_resources_are_kept_as_json() {
        let object =
            AdmissionObject::from_json(&GroupVersionResource::v1("", "configmaps"), r#"{"data":{"a":"b"}}"#).unwrap();
        assert!(matches!(object, AdmissionObject::Other(_)));
        assert_eq!(object.pod_spec(), None);
    }
}
