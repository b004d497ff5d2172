//! The read-only check, a validating plugin: a pod whose volumes of a listed driver are still
//! writable after every mutation is denied, because read-only forcing did not run for it.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::{PolicySettings, not_forced_message, writable_read_only_volumes};

use crate::attributes::{Attributes, Operation};
use crate::error::{AdmissionError, Result};
use crate::object::PodSpecKind;
use crate::plugin::{Handler, ValidationInterface};
use crate::recorder::Recorder;

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/ReadOnlyCheck";

/// Denies pod creations that read-only forcing should have changed but did not. Like forcing,
/// it honours no exemption: the driver refuses writable publishes for everyone.
pub struct ReadOnlyCheck {
    settings: Arc<PolicySettings>,
}

impl ReadOnlyCheck {
    /// A plugin checking the drivers listed in `settings`.
    pub fn new(settings: Arc<PolicySettings>) -> ReadOnlyCheck {
        ReadOnlyCheck { settings }
    }
}

impl Handler for ReadOnlyCheck {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        operation == Operation::Create
    }
}

#[async_trait]
impl ValidationInterface for ReadOnlyCheck {
    async fn validate(&self, attributes: &Attributes<'_>, _recorder: &mut Recorder) -> Result<()> {
        // Forcing changes pods only; workloads' templates are checked through the pods they make.
        if PodSpecKind::of(&attributes.resource) != Some(PodSpecKind::Pod) || !attributes.subresource.is_empty() {
            return Ok(());
        }
        let Some(spec) = attributes.object.as_ref().and_then(|object| object.pod_spec()) else {
            return Ok(());
        };
        let writable = writable_read_only_volumes(spec, &self.settings.read_only_drivers);
        if writable.is_empty() {
            return Ok(());
        }
        Err(AdmissionError::Forbidden(not_forced_message(attributes.display_name(), &writable)))
    }
}

#[cfg(test)]
mod tests {
    use futures_executor::block_on;
    use inline_guard_policy::settings::SHARED_RESOURCE_DRIVER;
    use serde_json::json;

    use super::*;
    use crate::attributes::{GroupVersionResource, UserInfo};
    use crate::chain::{Chain, Phase};
    use crate::object::AdmissionObject;
    use crate::plugins::ReadOnlyForcing;

    fn pod_create(read_only: Option<bool>) -> Attributes<'static> {
        let resource = GroupVersionResource::v1("", "pods");
        let mut csi = json!({"driver": SHARED_RESOURCE_DRIVER});
        if let Some(read_only) = read_only {
            csi["readOnly"] = json!(read_only);
        }
        let pod =
            json!({"metadata": {"name": "web"}, "spec": {"containers": [], "volumes": [{"name": "v", "csi": csi}]}});
        Attributes {
            operation: Operation::Create,
            kind: Default::default(),
            resource: resource.clone(),
            subresource: "".into(),
            namespace: "apps".into(),
            name: "".into(),
            object: Some(AdmissionObject::from_value(&resource, &pod).unwrap()),
            old_object: None,
            user_info: UserInfo::anonymous(),
            dry_run: false,
        }
    }

    fn chain(settings: Arc<PolicySettings>) -> Chain {
        Chain::new()
            .with_mutating(Arc::new(ReadOnlyForcing::new(settings.clone())))
            .with_validating(Arc::new(ReadOnlyCheck::new(settings)))
    }

    #[test]
    fn a_pod_that_skipped_forcing_is_denied_and_says_why() {
        let chain = chain(Arc::new(PolicySettings::default()));
        let outcome = block_on(chain.run(Phase::Validating, &mut pod_create(Some(false))));
        let Err(AdmissionError::Forbidden(message)) = outcome.result else { panic!("{outcome:?}") };
        assert!(message.starts_with(
            "web has inline volumes that must be read-only but are not: volume \"v\" (CSIDriver sharedresource.csi.inlineguard.dev)."
        ));
        assert_eq!(block_on(chain.run(Phase::Validating, &mut pod_create(Some(true)))).result, Ok(()));
    }

    #[test]
    fn forcing_before_the_check_admits_the_same_pod() {
        let chain = chain(Arc::new(PolicySettings::default()));
        let outcome = block_on(chain.run(Phase::Both, &mut pod_create(None)));
        assert_eq!(outcome.result, Ok(()));
        assert_eq!(outcome.patch.len(), 1);
    }

    #[test]
    fn workloads_and_pod_subresources_are_not_checked() {
        // Workloads are checked through the pods they make; forcing changes pods only.
        let chain = chain(Arc::new(PolicySettings::default()));
        let resource = GroupVersionResource::v1("apps", "deployments");
        let writable = json!({"driver": SHARED_RESOURCE_DRIVER, "readOnly": false});
        let deployment = json!({"metadata": {"name": "api"}, "spec": {"selector": {}, "template": {"spec": {
            "containers": [], "volumes": [{"name": "v", "csi": writable}]}}}});
        let mut create = pod_create(Some(false));
        create.resource = resource.clone();
        create.object = Some(AdmissionObject::from_value(&resource, &deployment).unwrap());
        assert_eq!(block_on(chain.run(Phase::Validating, &mut create)).result, Ok(()));

        let mut subresource = pod_create(Some(false));
        subresource.subresource = "binding".into();
        assert_eq!(block_on(chain.run(Phase::Validating, &mut subresource)).result, Ok(()));
    }

    #[test]
    fn updates_and_unlisted_drivers_pass() {
        let mut settings = PolicySettings::default();
        settings.read_only_drivers.0.clear();
        let outcome = block_on(chain(Arc::new(settings)).run(Phase::Validating, &mut pod_create(None)));
        assert_eq!(outcome.result, Ok(()));
        let mut update = pod_create(None);
        update.operation = Operation::Update;
        let outcome = block_on(chain(Arc::new(PolicySettings::default())).run(Phase::Validating, &mut update));
        assert_eq!(outcome.result, Ok(()));
    }
}
