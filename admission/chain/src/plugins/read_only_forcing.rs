//! Read-only forcing, the mutating plugin: makes the volumes of listed drivers, and their mounts,
//! read-only on pod creation and on new ephemeral containers.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::{MountScope, PatchOperation, PolicySettings, force_read_only};

use crate::attributes::{Attributes, Operation};
use crate::error::Result;
use crate::object::{AdmissionObject, PodSpecKind};
use crate::plugin::{Handler, MutationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/ReadOnlyForcing";

/// The subresource through which ephemeral containers are added to a running pod.
const EPHEMERAL_CONTAINERS: &str = "ephemeralcontainers";

/// Forces `readOnly: true` for the drivers in the settings' read-only list. Exemptions do not
/// apply: the driver refuses writable publishes anyway, so skipping the patch would only make
/// the pod fail later, on the node.
pub struct ReadOnlyForcing {
    settings: Arc<PolicySettings>,
}

impl ReadOnlyForcing {
    /// A plugin forcing the drivers listed in `settings`.
    pub fn new(settings: Arc<PolicySettings>) -> ReadOnlyForcing {
        ReadOnlyForcing { settings }
    }
}

impl Handler for ReadOnlyForcing {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }
}

#[async_trait]
impl MutationInterface for ReadOnlyForcing {
    async fn admit(&self, attributes: &mut Attributes<'_>, _recorder: &mut Recorder) -> Result<Vec<PatchOperation>> {
        if PodSpecKind::of(&attributes.resource) != Some(PodSpecKind::Pod) {
            return Ok(Vec::new());
        }
        let existing: Vec<&str> = match (attributes.operation, &*attributes.subresource) {
            (Operation::Create, "") => Vec::new(),
            (Operation::Update, EPHEMERAL_CONTAINERS) => attributes
                .old_object
                .as_ref()
                .and_then(AdmissionObject::pod_spec)
                .map(|spec| spec.ephemeral_containers.iter().map(|c| &*c.name).collect())
                .unwrap_or_default(),
            _ => return Ok(Vec::new()),
        };
        let scope = if attributes.subresource.is_empty() {
            MountScope::WholePod
        } else {
            MountScope::NewEphemeralContainers { existing: &existing }
        };
        let Some(spec) = attributes.object.as_mut().and_then(AdmissionObject::pod_spec_mut) else {
            return Ok(Vec::new());
        };
        Ok(force_read_only(spec, &self.settings.read_only_drivers, scope))
    }
}

#[cfg(test)]
mod tests {
    use futures_executor::block_on;
    use inline_guard_policy::settings::SHARED_RESOURCE_DRIVER;
    use serde_json::{Value, json};

    use super::*;
    use crate::attributes::{GroupVersionResource, UserInfo};

    fn attributes(
        resource: &str,
        subresource: &str,
        operation: Operation,
        object: Value,
        old: Option<Value>,
    ) -> Attributes<'static> {
        let resource = match resource {
            "deployments" => GroupVersionResource::v1("apps", "deployments"),
            _ => GroupVersionResource::v1("", "pods"),
        };
        let decode = |value: Value| AdmissionObject::from_value(&resource, &value).unwrap();
        Attributes {
            operation,
            kind: Default::default(),
            resource: resource.clone(),
            subresource: subresource.to_string().into(),
            namespace: "apps".into(),
            name: "web".into(),
            object: Some(decode(object)),
            old_object: old.map(decode),
            user_info: UserInfo::anonymous(),
            dry_run: false,
        }
    }

    fn ephemeral(name: &str) -> Value {
        json!({"name": name, "volumeMounts": [{"name": "v", "mountPath": "/v"}]})
    }

    /// A pod whose volume of the read-only driver is read-only already, with these ephemeral
    /// containers, each mounting it writable.
    fn pod(ephemeral_containers: &[&str]) -> Value {
        json!({"metadata": {"name": "web"}, "spec": {
            "containers": [],
            "ephemeralContainers": ephemeral_containers.iter().map(|name| ephemeral(name)).collect::<Vec<_>>(),
            "volumes": [{"name": "v", "csi": {"driver": SHARED_RESOURCE_DRIVER, "readOnly": true}}],
        }})
    }

    fn admit(attributes: &mut Attributes<'_>) -> Vec<PatchOperation> {
        let plugin = ReadOnlyForcing::new(Arc::new(PolicySettings::default()));
        block_on(plugin.admit(attributes, &mut Recorder::default())).unwrap()
    }

    fn forced(path: &str) -> PatchOperation {
        PatchOperation::set_true(path.into(), false)
    }

    #[test]
    fn a_new_ephemeral_container_has_its_mount_forced_and_the_old_ones_are_left_alone() {
        let mut added =
            attributes("pods", EPHEMERAL_CONTAINERS, Operation::Update, pod(&["old", "new"]), Some(pod(&["old"])));
        assert_eq!(admit(&mut added), [forced("/spec/ephemeralContainers/1/volumeMounts/0/readOnly")]);
    }

    #[test]
    fn a_pod_create_is_forced_whole() {
        let mut create = attributes("pods", "", Operation::Create, pod(&["debug"]), None);
        assert_eq!(admit(&mut create), [forced("/spec/ephemeralContainers/0/volumeMounts/0/readOnly")]);
    }

    #[test]
    fn other_updates_and_workloads_are_never_patched() {
        let mut update = attributes("pods", "", Operation::Update, pod(&["new"]), Some(pod(&[])));
        assert_eq!(admit(&mut update), []);
        let mut status = attributes("pods", "status", Operation::Update, pod(&["new"]), Some(pod(&[])));
        assert_eq!(admit(&mut status), []);
        let template = json!({"metadata": {"name": "web"}, "spec": {"selector": {}, "template": pod(&["debug"])}});
        let mut deployment = attributes("deployments", "", Operation::Create, template, None);
        assert_eq!(admit(&mut deployment), []);
    }
}
