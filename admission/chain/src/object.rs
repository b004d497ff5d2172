//! What admission reads of a request's object: its names and the pod spec it carries (a Pod's own,
//! or a workload's template), decoded in one pass that skips everything else. The whole object has
//! already been validated by kube-apiserver; decoding only these parts keeps an answer within a
//! few microseconds while still checking the type of every field that is read.

use std::borrow::Cow;
use std::fmt;

use inline_guard_policy::INJECT_ANNOTATION;
use inline_guard_policy::PodSpecView;
use inline_guard_policy::pod_spec::{ContainerView, VolumeView, nullable, owned};
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use sharedresource_api::projection::ProjectionSpec;

use crate::attributes::GroupVersionResource;

pub(crate) mod fast_decode;

/// The resources whose objects carry a pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSpecKind {
    /// `pods`: `spec`.
    Pod,
    /// `podtemplates`: `template.spec`.
    PodTemplate,
    /// `replicationcontrollers`: `spec.template.spec`.
    ReplicationController,
    /// `apps/replicasets`: `spec.template.spec`.
    ReplicaSet,
    /// `apps/deployments`: `spec.template.spec`.
    Deployment,
    /// `apps/statefulsets`: `spec.template.spec`.
    StatefulSet,
    /// `apps/daemonsets`: `spec.template.spec`.
    DaemonSet,
    /// `batch/jobs`: `spec.template.spec`.
    Job,
    /// `batch/cronjobs`: `spec.jobTemplate.spec.template.spec`.
    CronJob,
}

impl PodSpecKind {
    /// The kind behind a resource, when it carries a pod spec.
    pub fn of(resource: &GroupVersionResource<'_>) -> Option<PodSpecKind> {
        Some(match (&*resource.group, &*resource.resource) {
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
}

impl fmt::Display for PodSpecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The names in an object's `metadata`, and the one annotation admission reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectNames<'a> {
    /// `metadata.name`.
    pub name: Option<Cow<'a, str>>,
    /// `metadata.generateName`.
    pub generate_name: Option<Cow<'a, str>>,
    /// `metadata.namespace`.
    pub namespace: Option<Cow<'a, str>>,
    /// `metadata.annotations["sharedresource.inlineguard.dev/inject"]`: the shares the pod asks
    /// to have injected. The other annotations are skipped unread.
    #[serde(rename = "annotations", deserialize_with = "inject_annotation")]
    pub inject: Option<Cow<'a, str>>,
}

/// Reads `metadata.annotations` (a map of strings, or `null`) keeping only the value of
/// [`INJECT_ANNOTATION`]; a repeated key keeps its last value, as a map would.
fn inject_annotation<'de, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    struct Annotations;
    impl<'de> Visitor<'de> for Annotations {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_none<E>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<String>, D::Error> {
            deserializer.deserialize_map(self)
        }
        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Option<String>, M::Error> {
            #[derive(Deserialize)]
            struct Key<'k>(#[serde(borrow)] Cow<'k, str>);
            let mut found = None;
            while let Some(Key(key)) = map.next_key()? {
                if key == INJECT_ANNOTATION {
                    found = Some(map.next_value::<String>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    Ok(deserializer.deserialize_option(Annotations)?.map(Cow::Owned))
}

/// A request's object as admission sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionObject<'a> {
    /// The kind, when the resource carries a pod spec; `None` for every other resource.
    pub kind: Option<PodSpecKind>,
    /// Its names.
    pub names: ObjectNames<'a>,
    /// Its pod spec; `None` when the object has none (an empty template, another resource).
    pub spec: Option<PodSpecView<'a>>,
    /// A `SharedProjection`'s spec; `None` for every other resource.
    pub projection: Option<Box<ProjectionSpec>>,
    /// A workload's pod template's injection annotation (a Pod's own is in `names`): see
    /// [`AdmissionObject::injection`].
    pub template_inject: Option<Cow<'a, str>>,
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

/// Every place a pod spec is carried, read in one pass without knowing the kind first: a Pod's
/// `spec`, a workload's `spec.template.spec`, a CronJob's `spec.jobTemplate.spec.template.spec`, a
/// PodTemplate's `template.spec`. Their field names do not collide, so one shape holds them all and
/// the kind picks the right one afterwards.
#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectShape<'a> {
    #[serde(deserialize_with = "nullable")]
    metadata: ObjectNames<'a>,
    spec: Option<SpecShape<'a>>,
    template: Option<Box<TemplateShape<'a>>>,
}

#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct SpecShape<'a> {
    #[serde(deserialize_with = "nullable")]
    volumes: Vec<VolumeView<'a>>,
    #[serde(deserialize_with = "nullable")]
    containers: Vec<ContainerView<'a>>,
    #[serde(deserialize_with = "nullable")]
    init_containers: Vec<ContainerView<'a>>,
    #[serde(deserialize_with = "nullable")]
    ephemeral_containers: Vec<ContainerView<'a>>,
    runtime_class_name: Option<Cow<'a, str>>,
    service_account_name: Option<Cow<'a, str>>,
    template: Option<Box<TemplateShape<'a>>>,
    job_template: Option<Box<JobTemplateShape<'a>>>,
}

#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
struct TemplateShape<'a> {
    #[serde(deserialize_with = "nullable")]
    metadata: ObjectNames<'a>,
    spec: Option<PodSpecView<'a>>,
}

#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
struct JobTemplateShape<'a> {
    spec: Option<JobSpecShape<'a>>,
}

#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
struct JobSpecShape<'a> {
    template: Option<Box<TemplateShape<'a>>>,
}

/// A `SharedProjection`: its names and its spec, whole (the spec is small and rare).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProjectionObject<'a> {
    #[serde(deserialize_with = "nullable")]
    metadata: ObjectNames<'a>,
    spec: Option<ProjectionSpec>,
}

impl<'a> From<ProjectionObject<'a>> for AdmissionObject<'a> {
    fn from(object: ProjectionObject<'a>) -> AdmissionObject<'a> {
        AdmissionObject {
            kind: None,
            names: object.metadata,
            spec: None,
            projection: object.spec.map(Box::new),
            template_inject: None,
        }
    }
}

/// True for the resource of `SharedProjection` objects, whose spec the review decodes whole.
pub fn is_shared_projection(resource: &GroupVersionResource<'_>) -> bool {
    resource.group == sharedresource_api::API_GROUP && resource.resource == "sharedprojections"
}

/// Only the names, for resources admission does not evaluate: their spec may hold anything.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NamesOnly<'a> {
    #[serde(deserialize_with = "nullable")]
    metadata: ObjectNames<'a>,
}

impl<'a> AdmissionObject<'a> {
    /// The object `shape` as a `kind` (`None`: a resource without pod spec).
    pub fn from_shape(kind: Option<PodSpecKind>, shape: ObjectShape<'a>) -> AdmissionObject<'a> {
        let names = shape.metadata;
        let template = match kind {
            None => return AdmissionObject { kind, names, ..AdmissionObject::default() },
            Some(PodSpecKind::Pod) => {
                let spec = shape.spec.map(|s| PodSpecView {
                    volumes: s.volumes,
                    containers: s.containers,
                    init_containers: s.init_containers,
                    ephemeral_containers: s.ephemeral_containers,
                    runtime_class_name: s.runtime_class_name,
                    service_account_name: s.service_account_name,
                });
                return AdmissionObject { kind, names, spec, ..AdmissionObject::default() };
            }
            Some(PodSpecKind::PodTemplate) => shape.template,
            Some(PodSpecKind::CronJob) => {
                shape.spec.and_then(|s| s.job_template).and_then(|j| j.spec).and_then(|j| j.template)
            }
            Some(_) => shape.spec.and_then(|s| s.template),
        };
        let (template_inject, spec) = template.map(|t| (t.metadata.inject, t.spec)).unwrap_or_default();
        AdmissionObject { kind, names, spec, projection: None, template_inject }
    }

    /// Decodes JSON text as the object of `resource`.
    pub fn from_json(
        resource: &GroupVersionResource<'_>,
        json: &str,
    ) -> Result<AdmissionObject<'a>, ObjectDecodeError> {
        let kind = PodSpecKind::of(resource);
        match kind {
            Some(_) => {
                let shape = decode(kind, || serde_json::from_str(json), &mut serde_json::Deserializer::from_str(json))?;
                Ok(AdmissionObject::from_shape(kind, shape))
            }
            None if is_shared_projection(resource) => {
                let object: ProjectionObject<'a> =
                    decode(None, || serde_json::from_str(json), &mut serde_json::Deserializer::from_str(json))?;
                Ok(object.into())
            }
            None => {
                let names: NamesOnly<'a> =
                    decode(None, || serde_json::from_str(json), &mut serde_json::Deserializer::from_str(json))?;
                Ok(AdmissionObject { kind: None, names: names.metadata, ..AdmissionObject::default() })
            }
        }
    }

    /// Decodes an already-parsed value as the object of `resource`.
    pub fn from_value(
        resource: &GroupVersionResource<'_>,
        value: &serde_json::Value,
    ) -> Result<AdmissionObject<'a>, ObjectDecodeError> {
        let kind = PodSpecKind::of(resource);
        match kind {
            Some(_) => Ok(AdmissionObject::from_shape(kind, decode(kind, || ObjectShape::deserialize(value), value)?)),
            None if is_shared_projection(resource) => {
                let object: ProjectionObject<'a> = decode(None, || ProjectionObject::deserialize(value), value)?;
                Ok(object.into())
            }
            None => {
                let names: NamesOnly<'a> = decode(None, || NamesOnly::deserialize(value), value)?;
                Ok(AdmissionObject { kind: None, names: names.metadata, ..AdmissionObject::default() })
            }
        }
    }

    /// The same object, owning its text: for a caller that keeps it past the body it was read
    /// from.
    pub fn into_owned(self) -> AdmissionObject<'static> {
        let names = self.names;
        AdmissionObject {
            kind: self.kind,
            names: ObjectNames {
                name: names.name.map(owned),
                generate_name: names.generate_name.map(owned),
                namespace: names.namespace.map(owned),
                inject: names.inject.map(owned),
            },
            spec: self.spec.map(PodSpecView::into_owned),
            projection: self.projection,
            template_inject: self.template_inject.map(owned),
        }
    }

    /// The share injection annotation of the pod this object is, or makes: a Pod's own, a
    /// workload's pod template's. `None` for every other resource.
    pub fn injection(&self) -> Option<&str> {
        match self.kind? {
            PodSpecKind::Pod => self.names.inject.as_deref(),
            _ => self.template_inject.as_deref(),
        }
    }

    /// The pod spec to evaluate: a Pod's spec or a workload's template spec.
    pub fn pod_spec(&self) -> Option<&PodSpecView<'a>> {
        self.spec.as_ref()
    }

    /// A Pod's spec, mutable: read-only forcing only ever changes pods.
    pub fn pod_spec_mut(&mut self) -> Option<&mut PodSpecView<'a>> {
        if self.kind == Some(PodSpecKind::Pod) { self.spec.as_mut() } else { None }
    }
}

/// Decodes untracked; only a failure pays for a second, path-tracking read to say which field is
/// wrong (tracking doubles the cost of a decode).
fn decode<'de, T, D>(
    kind: Option<PodSpecKind>,
    fast: impl FnOnce() -> Result<T, serde_json::Error>,
    tracked: D,
) -> Result<T, ObjectDecodeError>
where
    T: DeserializeOwned,
    D: Deserializer<'de, Error = serde_json::Error>,
{
    fast().map_err(|plain| match serde_path_to_error::deserialize::<_, T>(tracked) {
        Err(error) => {
            ObjectDecodeError { kind, field: error.path().to_string(), message: error.into_inner().to_string() }
        }
        Ok(_) => ObjectDecodeError { kind, field: ".".into(), message: plain.to_string() },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_workload_resource_yields_its_template_spec() {
        let template = r#"{"spec":{"containers":[],"volumes":[{"name":"v","csi":{"driver":"d"}}]}}"#;
        let cases = [
            ("", "pods", template.to_string()),
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
            let resource = GroupVersionResource::v1(group, resource);
            let object = AdmissionObject::from_json(&resource, &json).unwrap();
            let spec = object.pod_spec().unwrap_or_else(|| panic!("{}: no spec", resource.resource));
            assert_eq!(spec.volumes[0].csi.as_ref().unwrap().driver, "d", "{}", resource.resource);
            let value: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(AdmissionObject::from_value(&resource, &value).unwrap(), object);
        }
    }

    #[test]
    fn the_injection_annotation_is_the_pods_own_or_its_templates() {
        let annotated = |value: &str| json!({"sharedresource.inlineguard.dev/inject": value, "other": "x"});
        let pod = json!({"metadata": {"annotations": annotated("sharedsecret/a:/a")}, "spec": {}});
        let deployment = json!({"metadata": {"annotations": annotated("sharedsecret/own:/own")}, "spec": {
            "template": {"metadata": {"annotations": annotated("sharedsecret/b:/b")}, "spec": {}}}});
        let cronjob = json!({"spec": {"jobTemplate": {"spec": {"template": {
            "metadata": {"annotations": annotated("sharedsecret/c:/c")}, "spec": {}}}}}});
        let plain = json!({"metadata": {"annotations": null}, "spec": {"template": {"metadata": null}}});
        let cases = [
            ("", "pods", pod, Some("sharedsecret/a:/a")),
            ("apps", "deployments", deployment, Some("sharedsecret/b:/b")),
            ("batch", "cronjobs", cronjob, Some("sharedsecret/c:/c")),
            ("apps", "deployments", plain, None),
        ];
        for (group, resource, value, wanted) in cases {
            let resource = GroupVersionResource::v1(group, resource);
            let from_value = AdmissionObject::from_value(&resource, &value).unwrap();
            let from_json = AdmissionObject::from_json(&resource, &value.to_string()).unwrap();
            assert_eq!(from_value.injection(), wanted, "{value}");
            assert_eq!(from_json, from_value);
            assert_eq!(from_json.clone().into_owned(), from_json);
        }
        let error = AdmissionObject::from_value(
            &GroupVersionResource::v1("", "pods"),
            &json!({"metadata": {"annotations": {"sharedresource.inlineguard.dev/inject": 7}}}),
        )
        .unwrap_err();
        assert!(error.field.starts_with("metadata.annotations"), "{error}");
    }

    #[test]
    fn an_object_freed_from_its_text_is_the_same_object() {
        let json = r#"{"metadata":{"name":"web","generateName":"web-","namespace":"apps"},"spec":{
            "runtimeClassName":"kata","containers":[{"name":"app","volumeMounts":[{"name":"v","readOnly":true}]}],
            "initContainers":[{"name":"init"}],"ephemeralContainers":[{"name":"debug"}],
            "volumes":[{"name":"v","csi":{"driver":"d","readOnly":false}}]}}"#;
        let object = AdmissionObject::from_json(&GroupVersionResource::v1("", "pods"), json).unwrap();
        assert_eq!(object.clone().into_owned(), object);
    }

    #[test]
    fn only_a_pod_spec_may_be_changed() {
        let pod = AdmissionObject::from_value(&GroupVersionResource::v1("", "pods"), &json!({"spec": {}})).unwrap();
        let mut pod = pod;
        assert!(pod.pod_spec_mut().is_some());
        let mut deployment = AdmissionObject::from_value(
            &GroupVersionResource::v1("apps", "deployments"),
            &json!({"spec": {"template": {"spec": {}}}}),
        )
        .unwrap();
        assert!(deployment.pod_spec().is_some());
        assert!(deployment.pod_spec_mut().is_none());
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
    fn other_resources_keep_only_their_names_whatever_their_spec_holds() {
        let object = AdmissionObject::from_json(
            &GroupVersionResource::v1("example.com", "widgets"),
            r#"{"metadata":{"name":"w"},"spec":{"volumes":"not a list","template":7}}"#,
        )
        .unwrap();
        assert_eq!(object.kind, None);
        assert_eq!(object.names.name.as_deref(), Some("w"));
        assert_eq!(object.pod_spec(), None);
    }
}
