//! CSIVolumeAdmission, the validating plugin: looks up the facts a pod spec needs and hands them
//! to the pure decision in `inline-guard-policy`.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::verdict::distinct_csi_drivers;
use inline_guard_policy::{PolicySettings, Subject, SubjectKind, evaluate};

use crate::attributes::{Attributes, Operation};
use crate::error::{AdmissionError, Result};
use crate::facts::{ClusterFacts, FactsError};
use crate::object::PodSpecKind;
use crate::plugin::{Handler, ValidationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/CSIVolumeAdmission";

/// Applies the enforce / warn / audit matrix to the inline CSI volumes of pods and workloads.
pub struct CsiVolumeAdmission {
    settings: Arc<PolicySettings>,
    facts: Arc<dyn ClusterFacts>,
}

impl CsiVolumeAdmission {
    /// A plugin deciding with `settings` on facts from `facts`.
    pub fn new(settings: Arc<PolicySettings>, facts: Arc<dyn ClusterFacts>) -> CsiVolumeAdmission {
        CsiVolumeAdmission { settings, facts }
    }
}

impl Handler for CsiVolumeAdmission {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }
}

fn unavailable(error: FactsError) -> AdmissionError {
    AdmissionError::Internal(error.to_string())
}

#[async_trait]
impl ValidationInterface for CsiVolumeAdmission {
    async fn validate(&self, attributes: &Attributes<'_>, recorder: &mut Recorder) -> Result<()> {
        let Some(kind) = PodSpecKind::of(&attributes.resource) else {
            return Ok(());
        };
        // Pod volumes are immutable after creation, and subresources (status, binding,
        // ephemeralcontainers) cannot add volumes.
        if !attributes.subresource.is_empty() {
            return Ok(());
        }
        let is_workload_update = kind.is_workload() && attributes.operation == Operation::Update;
        if attributes.operation != Operation::Create && !is_workload_update {
            return Ok(());
        }
        let Some(object) = &attributes.object else {
            return Err(AdmissionError::BadRequest(format!(
                "{} request carries no object",
                attributes.resource.resource
            )));
        };
        let Some(spec) = object.pod_spec() else {
            return Ok(());
        };
        if is_workload_update {
            let old_volumes = attributes.old_object.as_ref().and_then(|old| old.pod_spec()).map(|old| &old.volumes);
            if old_volumes == Some(&spec.volumes) {
                return Ok(());
            }
        }
        let drivers = distinct_csi_drivers(spec);
        if drivers.is_empty() {
            return Ok(());
        }

        let namespace_labels = self.facts.namespace_labels(&attributes.namespace).await.map_err(unavailable)?;
        let mut driver_labels = Vec::with_capacity(drivers.len());
        for driver in drivers {
            driver_labels.push((driver, self.facts.csi_driver_labels(driver).await.map_err(unavailable)?));
        }

        let subject = Subject {
            kind: if kind.is_workload() { SubjectKind::Workload } else { SubjectKind::Pod },
            name: attributes.display_name(),
            namespace: &attributes.namespace,
            username: &attributes.user_info.username,
            spec,
        };
        let verdict = evaluate(&self.settings, &subject, namespace_labels.as_deref(), &driver_labels);
        recorder.warn_all(verdict.warnings);
        for (key, value) in verdict.audit_annotations {
            recorder.annotate(key, value);
        }
        match verdict.denial {
            Some(denial) => Err(AdmissionError::Forbidden(denial)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_executor::block_on;
    use inline_guard_policy::Labels;
    use serde_json::json;

    use super::*;
    use crate::attributes::{GroupVersionResource, UserInfo};
    use crate::object::AdmissionObject;
    use crate::static_facts::StaticClusterFacts;

    fn facts() -> StaticClusterFacts {
        let mut facts = StaticClusterFacts::new();
        facts.insert_namespace(
            "locked",
            [("pod-security.kubernetes.io/enforce".to_string(), "restricted".to_string())].into(),
        );
        facts.insert_csi_driver(
            "csi.example.com",
            [("security.openshift.io/csi-ephemeral-volume-profile".to_string(), "privileged".to_string())].into(),
        );
        facts
    }

    fn plugin_with(facts: Arc<dyn ClusterFacts>) -> CsiVolumeAdmission {
        CsiVolumeAdmission::new(Arc::new(PolicySettings::default()), facts)
    }

    fn deployment(driver: &str, replicas: i32) -> serde_json::Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
               "spec": {"replicas": replicas, "selector": {}, "template": {"spec": {"containers": [],
                        "volumes": [{"name": "v", "csi": {"driver": driver}}]}}}})
    }

    fn attributes(
        resource: GroupVersionResource<'static>,
        operation: Operation,
        object: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> Attributes<'static> {
        let decode = |value: serde_json::Value| AdmissionObject::from_value(&resource, &value).unwrap();
        Attributes {
            operation,
            kind: Default::default(),
            resource: resource.clone(),
            subresource: "".into(),
            namespace: "locked".into(),
            name: "".into(),
            object: Some(decode(object)),
            old_object: old.map(decode),
            user_info: UserInfo::anonymous(),
            dry_run: false,
        }
    }

    fn validate(plugin: &CsiVolumeAdmission, attributes: &Attributes<'_>) -> (Result<()>, Recorder) {
        let mut recorder = Recorder::default();
        let result = block_on(plugin.validate(attributes, &mut recorder));
        (result, recorder)
    }

    #[test]
    fn a_workload_update_that_keeps_the_volumes_is_not_evaluated_again() {
        let plugin = plugin_with(Arc::new(facts()));
        let deployments = GroupVersionResource::v1("apps", "deployments");
        let scaled = attributes(
            deployments.clone(),
            Operation::Update,
            deployment("csi.example.com", 3),
            Some(deployment("csi.example.com", 1)),
        );
        let (result, recorder) = validate(&plugin, &scaled);
        assert_eq!(result, Ok(()));
        assert_eq!(recorder, Recorder::default());

        let changed = attributes(
            deployments,
            Operation::Update,
            deployment("csi.example.com", 1),
            Some(deployment("other.example.com", 1)),
        );
        let (result, recorder) = validate(&plugin, &changed);
        assert_eq!(result, Ok(()), "workloads are warned, not denied");
        assert_eq!(recorder.warnings().len(), 1);
        assert!(recorder.warnings()[0].starts_with("api uses an inline volume provided by CSIDriver csi.example.com"));
    }

    #[test]
    fn pod_updates_are_not_evaluated() {
        let plugin = plugin_with(Arc::new(facts()));
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "volumes": [{"name": "v", "csi": {"driver": "csi.example.com"}}]}});
        let update =
            attributes(GroupVersionResource::v1("", "pods"), Operation::Update, pod.clone(), Some(pod.clone()));
        assert_eq!(validate(&plugin, &update).0, Ok(()));
        let create = attributes(GroupVersionResource::v1("", "pods"), Operation::Create, pod, None);
        assert!(matches!(validate(&plugin, &create).0, Err(AdmissionError::Forbidden(_))));
    }

    #[test]
    fn a_pod_update_is_not_evaluated_even_when_its_volumes_differ() {
        // The apiserver refuses such an update anyway (pod volumes are immutable); the plugin
        // must not treat a pod as a workload whose template changed.
        let plugin = plugin_with(Arc::new(facts()));
        let pod = |driver: &str| json!({"metadata": {"name": "p"}, "spec": {"containers": [], "volumes": [{"name": "v", "csi": {"driver": driver}}]}});
        let update = attributes(
            GroupVersionResource::v1("", "pods"),
            Operation::Update,
            pod("csi.example.com"),
            Some(pod("other.example.com")),
        );
        assert_eq!(validate(&plugin, &update), (Ok(()), Recorder::default()));
    }

    #[test]
    fn a_pod_without_a_name_is_named_by_its_generate_name() {
        let plugin = plugin_with(Arc::new(facts()));
        let pod = json!({"metadata": {"generateName": "web-5d8f-"}, "spec": {"containers": [], "volumes": [{"name": "v", "csi": {"driver": "csi.example.com"}}]}});
        let create = attributes(GroupVersionResource::v1("", "pods"), Operation::Create, pod, None);
        let Err(AdmissionError::Forbidden(message)) = validate(&plugin, &create).0 else { panic!("not denied") };
        assert!(message.starts_with("web-5d8f- uses an inline volume"), "{message}");
    }

    #[test]
    fn unavailable_facts_are_an_internal_error_not_a_guess() {
        struct Unsynced;
        #[async_trait]
        impl ClusterFacts for Unsynced {
            async fn namespace_labels(&self, _: &str) -> std::result::Result<Option<Arc<Labels>>, FactsError> {
                Err(FactsError::Unavailable("namespace cache not synced".into()))
            }
            async fn csi_driver_labels(&self, _: &str) -> std::result::Result<Option<Arc<Labels>>, FactsError> {
                Ok(None)
            }
        }
        let plugin = plugin_with(Arc::new(Unsynced));
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "volumes": [{"name": "v", "csi": {"driver": "d"}}]}});
        let create = attributes(GroupVersionResource::v1("", "pods"), Operation::Create, pod, None);
        assert_eq!(
            validate(&plugin, &create).0,
            Err(AdmissionError::Internal("cluster facts unavailable: namespace cache not synced".into()))
        );
    }

    #[test]
    fn other_resources_pass_untouched() {
        let plugin = plugin_with(Arc::new(facts()));
        let config_map =
            attributes(GroupVersionResource::v1("", "configmaps"), Operation::Create, json!({"data": {}}), None);
        assert_eq!(validate(&plugin, &config_map), (Ok(()), Recorder::default()));
    }
}
