//! SharedResourceAdmission, a validating plugin: what the shared-resource driver would refuse at
//! mount is refused at creation, in the driver's words. For each volume of the driver in a pod:
//! attributes the driver refuses (422), a share or projection that does not exist (422), a
//! service account RBAC does not let `use` a share the volume shows (403, the driver's
//! PERMISSION_DENIED message). A workload is warned instead: its pods are judged when they are
//! made, so a Deployment created before its RoleBinding is not lost. A lookup that fails (the
//! apiserver down or slow) admits with a warning and an audit annotation: the driver checks
//! again at every mount, so availability wins here. A `SharedProjection` that the driver's
//! `check_spec` refuses is denied on create and update.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::{refusal_message, shared_volumes};
use sharedresource_api::access::{AccessQuestion, Guarded};
use sharedresource_api::missing::{projection_not_found, share_not_found};
use sharedresource_api::projection::check_spec;
use sharedresource_api::projection::spec::SourceKind;
use sharedresource_api::quote::quote;
use sharedresource_api::{ObjectName, Selection, ShareKind};

use crate::attributes::{Attributes, Operation};
use crate::error::{AdmissionError, Result};
use crate::object::{PodSpecKind, is_shared_projection};
use crate::plugin::{Handler, ValidationInterface};
use crate::recorder::Recorder;
use crate::share_facts::{Known, ShareFacts};

/// The plugin's registered name.
pub const PLUGIN_NAME: &str = "inlineguard.dev/SharedResourceAdmission";
/// The audit annotation listing what could not be checked because a lookup failed.
pub const UNCHECKED_ANNOTATION: &str = "shared-resource-unchecked";
/// The service account a pod without `serviceAccountName` runs as.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Checks pods, workloads and SharedProjections against the driver's own rules, looking shares,
/// projections and access up in `facts`.
pub struct SharedResourceAdmission {
    facts: Arc<dyn ShareFacts>,
}

impl SharedResourceAdmission {
    /// The plugin, deciding on facts from `facts`.
    pub fn new(facts: Arc<dyn ShareFacts>) -> SharedResourceAdmission {
        SharedResourceAdmission { facts }
    }
}

impl Handler for SharedResourceAdmission {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn handles(&self, operation: Operation) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
    }
}

#[async_trait]
impl ValidationInterface for SharedResourceAdmission {
    async fn validate(&self, attributes: &Attributes<'_>, recorder: &mut Recorder) -> Result<()> {
        // Subresources (status, binding, ephemeralcontainers) add no volume and change no spec.
        if !attributes.subresource.is_empty() {
            return Ok(());
        }
        if is_shared_projection(&attributes.resource) {
            return check_projection(attributes);
        }
        let Some(kind) = PodSpecKind::of(&attributes.resource) else {
            return Ok(());
        };
        // Pod volumes are immutable after creation; a workload's template may change.
        let is_workload_update = kind.is_workload() && attributes.operation == Operation::Update;
        if attributes.operation != Operation::Create && !is_workload_update {
            return Ok(());
        }
        let Some(spec) = attributes.object.as_ref().and_then(|object| object.pod_spec()) else {
            return Ok(());
        };
        let volumes = shared_volumes(spec);
        if volumes.is_empty() {
            return Ok(());
        }
        if is_workload_update {
            // A scale or a label change leaves the volumes and the account as they were judged.
            let old = attributes.old_object.as_ref().and_then(|old| old.pod_spec());
            if old
                .is_some_and(|old| old.volumes == spec.volumes && old.service_account_name == spec.service_account_name)
            {
                return Ok(());
            }
        }
        let service_account =
            spec.service_account_name.as_deref().filter(|name| !name.is_empty()).unwrap_or(DEFAULT_SERVICE_ACCOUNT);
        let mut judged = Judged::default();
        for volume in &volumes {
            let mut judge = Judge {
                facts: &*self.facts,
                namespace: &attributes.namespace,
                service_account,
                judged: &mut judged,
                volume: volume.name,
            };
            match &volume.attributes {
                Err(invalid) => judge.refuse(invalid.0.clone(), false),
                Ok(checked) => judge.selection(&checked.selection).await,
            }
        }
        judged.into_answer(attributes.display_name(), kind.is_workload(), recorder)
    }
}

/// What the volumes of one object came to.
#[derive(Default)]
struct Judged<'s> {
    /// `(volume, why)`, in the driver's words.
    refused: Vec<(&'s str, String)>,
    /// Whether one refusal is RBAC's.
    denied: bool,
    /// Lookups that failed: allowed, since the driver checks again at mount.
    unchecked: Vec<String>,
    /// Access this host does not check (`check`, offline).
    not_checked: Vec<String>,
}

impl Judged<'_> {
    fn into_answer(self, object: &str, is_workload: bool, recorder: &mut Recorder) -> Result<()> {
        for item in &self.not_checked {
            recorder.warn(item.clone());
        }
        if !self.unchecked.is_empty() {
            for item in &self.unchecked {
                recorder.warn(format!("{item}: not checked at creation; the driver checks it at mount"));
            }
            recorder.annotate(UNCHECKED_ANNOTATION, self.unchecked.join("; "));
        }
        let Some(message) = refusal_message(object, &self.refused) else {
            return Ok(());
        };
        // A workload is judged again through each pod it makes: a template written before its
        // RoleBinding, or before its share, is not lost.
        if is_workload {
            recorder.warn(message);
            return Ok(());
        }
        Err(if self.denied { AdmissionError::Forbidden(message) } else { AdmissionError::Invalid(message) })
    }
}

/// One volume being judged, with what it is judged by.
struct Judge<'j, 's> {
    facts: &'j dyn ShareFacts,
    namespace: &'j str,
    service_account: &'j str,
    judged: &'j mut Judged<'s>,
    volume: &'s str,
}

impl Judge<'_, '_> {
    fn refuse(&mut self, why: String, denied: bool) {
        self.judged.refused.push((self.volume, why));
        self.judged.denied |= denied;
    }

    fn unchecked(&mut self, what: String, error: impl std::fmt::Display) {
        self.judged.unchecked.push(format!("volume {:?}: {what}: {error}", self.volume));
    }

    async fn selection(&mut self, selection: &Selection) {
        match selection {
            Selection::Share(kind, name) => self.share(*kind, name).await,
            Selection::Projection(name) => self.projection(name).await,
            // A provider is the node's configuration, which admission does not see.
            Selection::Provider(_) => {}
        }
    }

    /// The share exists and the pod's service account may use it.
    async fn share(&mut self, kind: ShareKind, name: &ObjectName) {
        match self.facts.share_exists(kind, name).await {
            Ok(Known::Answer(false)) => return self.refuse(share_not_found(kind, name), false),
            Ok(Known::Answer(true) | Known::NotChecked) => {}
            Err(error) => self.unchecked(format!("{} {}", kind.kind(), quote(name.as_str())), error),
        }
        let question = AccessQuestion {
            namespace: self.namespace.to_string(),
            service_account: self.service_account.to_string(),
            kind: Guarded::Share(kind),
            name: name.as_str().to_string(),
        };
        match self.facts.may_use(&question).await {
            Ok(Known::Answer(true)) => {}
            Ok(Known::Answer(false)) => self.refuse(question.denial(), true),
            Ok(Known::NotChecked) => self.judged.not_checked.push(format!(
                "volume {:?}: access of service account {}/{} to {} {} is not checked offline",
                self.volume,
                self.namespace,
                self.service_account,
                kind.kind(),
                quote(name.as_str())
            )),
            Err(error) => self.unchecked(format!("access to {} {}", kind.kind(), quote(name.as_str())), error),
        }
    }

    /// The projection exists, its spec is one the driver serves, and each share it shows passes
    /// [`Judge::share`].
    async fn projection(&mut self, name: &ObjectName) {
        let spec = match self.facts.projection(self.namespace, name).await {
            Ok(Known::Answer(Some(spec))) => spec,
            Ok(Known::Answer(None)) => return self.refuse(projection_not_found(self.namespace, name), false),
            Ok(Known::NotChecked) => return,
            Err(error) => {
                return self.unchecked(format!("SharedProjection {}/{}", self.namespace, quote(name.as_str())), error);
            }
        };
        if let Err(invalid) = check_spec(&spec) {
            let why = format!("SharedProjection {}/{}: {invalid}", self.namespace, quote(name.as_str()));
            return self.refuse(why, false);
        }
        for source in &spec.sources {
            let (kind, share) = match source.kind() {
                Some(SourceKind::SharedSecret(share)) => (ShareKind::Secret, share),
                Some(SourceKind::SharedConfigMap(share)) => (ShareKind::ConfigMap, share),
                _ => continue,
            };
            // check_spec has checked every share name.
            if let Ok(share) = ObjectName::parse(&share.name) {
                self.share(kind, &share).await;
            }
        }
    }
}

/// A SharedProjection's spec by the driver's `check_spec`, its message as the driver gives it.
fn check_projection(attributes: &Attributes<'_>) -> Result<()> {
    let Some(object) = &attributes.object else {
        return Err(AdmissionError::BadRequest("sharedprojections request carries no object".into()));
    };
    let Some(spec) = &object.projection else {
        return Err(AdmissionError::Invalid("the SharedProjection has no spec".into()));
    };
    check_spec(spec).map_err(|invalid| AdmissionError::Invalid(invalid.0))
}

#[cfg(test)]
mod tests;
