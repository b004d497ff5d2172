//! SharedResourceAdmission, a validating plugin: what the shared-resource driver would refuse at
//! mount is refused at creation, in the driver's words. For each volume of the driver in a pod:
//! attributes the driver refuses (422), a share or projection that does not exist (422), a
//! service account RBAC does not let `use` a share the volume shows (403, the driver's
//! PERMISSION_DENIED message). A workload is warned instead: its pods are judged when they are
//! made, so a Deployment created before its RoleBinding is not lost. A lookup that fails (the
//! apiserver down or slow) admits with a warning and an audit annotation: the driver checks
//! again at every mount, so availability wins here. A `SharedProjection` that the driver's
//! `check_spec` refuses is denied on create and update. A container mounting one of the driver's
//! volumes with `subPath` or `subPathExpr` is warned: it never sees the volume change. Shares asked for by annotation are judged
//! as the injected volumes they become (see [`with_injection`]).

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::{join, join_all};
use inline_guard_policy::{
    PodSpecView, not_injected_message, parse_injection, plan_injection, refusal_message, shared_volumes,
    sub_path_warnings,
};
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
        let Some(object) = &attributes.object else {
            return Ok(());
        };
        let Some(written) = object.pod_spec() else {
            return Ok(());
        };
        if is_workload_update {
            // A scale or a label change leaves the volumes, the account and the injection as
            // they were judged.
            let old = attributes.old_object.as_ref();
            let unchanged =
                old.and_then(|old| Some((old.pod_spec()?, old.injection()))).is_some_and(|(old, inject)| {
                    old.volumes == written.volumes
                        && old.service_account_name == written.service_account_name
                        && inject == object.injection()
                });
            if unchanged {
                // Its mounts may have changed all the same.
                recorder.warn_all(sub_path_warnings(written));
                return Ok(());
            }
        }
        let injected = match object.injection() {
            Some(value) => with_injection(attributes.display_name(), kind, written, value, recorder)?,
            None => None,
        };
        let spec = injected.as_ref().unwrap_or(written);
        recorder.warn_all(sub_path_warnings(spec));
        let volumes = shared_volumes(spec);
        if volumes.is_empty() {
            return Ok(());
        }
        let service_account =
            spec.service_account_name.as_deref().filter(|name| !name.is_empty()).unwrap_or(DEFAULT_SERVICE_ACCOUNT);
        let judge = Judge { facts: &*self.facts, namespace: &attributes.namespace, service_account };
        // Every volume, and both lookups of each share, at once: the worst case is one projection
        // lookup then its shares' (2 × the facts' timeout), within the webhook's 5 s.
        let judgements = join_all(volumes.iter().map(|volume| async move {
            match &volume.attributes {
                Err(invalid) => Judged::refusal(volume.name, invalid.0.clone(), false),
                Ok(checked) => judge.selection(volume.name, &checked.selection, checked.optional).await,
            }
        }))
        .await;
        let mut judged = Judged::default();
        for judgement in judgements {
            judged.merge(judgement);
        }
        judged.into_answer(attributes.display_name(), kind.is_workload(), recorder)
    }
}

/// The spec as the annotation's injection makes it, for the validation that follows: a pod has
/// been injected already (by the mutating webhook, or the chain's own mutating phase), so what
/// it still lacks means the injection webhook did not run, and it is refused rather than started
/// without its shares; a workload's template is injected here, on a copy, so its pods' volumes are
/// judged now. A malformed annotation refuses a pod and warns on a workload. `None`: judge the
/// spec as written.
fn with_injection<'s>(
    object: &str,
    kind: PodSpecKind,
    written: &PodSpecView<'s>,
    value: &str,
    recorder: &mut Recorder,
) -> Result<Option<PodSpecView<'s>>> {
    let plan = parse_injection(value).and_then(|entries| plan_injection(written, &entries));
    let plan = match plan {
        Ok(plan) if plan.is_empty() => return Ok(None),
        Ok(plan) => plan,
        Err(invalid) if kind.is_workload() => {
            recorder.warn(format!("{object}: {}", invalid.0));
            return Ok(None);
        }
        Err(invalid) => return Err(AdmissionError::Invalid(format!("{object}: {}", invalid.0))),
    };
    if !kind.is_workload() {
        return Err(AdmissionError::Invalid(not_injected_message(object, &plan, written)));
    }
    let mut template = written.clone();
    plan.apply(&mut template);
    Ok(Some(template))
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

impl<'s> Judged<'s> {
    fn refusal(volume: &'s str, why: String, denied: bool) -> Judged<'s> {
        Judged { refused: vec![(volume, why)], denied, ..Judged::default() }
    }

    fn unchecked(volume: &str, what: String, error: impl std::fmt::Display) -> Judged<'s> {
        Judged { unchecked: vec![format!("volume {volume:?}: {what}: {error}")], ..Judged::default() }
    }

    fn merge(&mut self, other: Judged<'s>) {
        self.refused.extend(other.refused);
        self.denied |= other.denied;
        self.unchecked.extend(other.unchecked);
        self.not_checked.extend(other.not_checked);
    }

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

/// What a pod's volumes are judged by.
#[derive(Clone, Copy)]
struct Judge<'j> {
    facts: &'j dyn ShareFacts,
    namespace: &'j str,
    service_account: &'j str,
}

impl Judge<'_> {
    async fn selection<'s>(self, volume: &'s str, selection: &Selection, optional: bool) -> Judged<'s> {
        match selection {
            Selection::Share(kind, name) => self.share(volume, *kind, name, optional).await,
            Selection::Projection(name) => self.projection(volume, name).await,
            // A provider is the node's configuration, which admission does not see.
            Selection::Provider(_) => Judged::default(),
        }
    }

    /// The share exists (unless `optional`: the driver then serves the volume empty until it
    /// does) and the pod's service account may use it; both asked at once, a missing share of a
    /// volume that needs it named first, as the driver does.
    async fn share<'s>(self, volume: &'s str, kind: ShareKind, name: &ObjectName, optional: bool) -> Judged<'s> {
        let question = AccessQuestion {
            namespace: self.namespace.to_string(),
            service_account: self.service_account.to_string(),
            kind: Guarded::Share(kind),
            name: name.as_str().to_string(),
        };
        let (exists, allowed) = join(self.facts.share_exists(kind, name), self.facts.may_use(&question)).await;
        let share = || format!("{} {}", kind.kind(), quote(name.as_str()));
        let mut judged = match exists {
            Ok(Known::Answer(false)) if !optional => {
                return Judged::refusal(volume, share_not_found(kind, name), false);
            }
            Ok(Known::Answer(_) | Known::NotChecked) => Judged::default(),
            Err(error) => Judged::unchecked(volume, share(), error),
        };
        judged.merge(match allowed {
            Ok(Known::Answer(true)) => Judged::default(),
            Ok(Known::Answer(false)) => Judged::refusal(volume, question.denial(), true),
            Ok(Known::NotChecked) => Judged {
                not_checked: vec![format!(
                    "volume {volume:?}: access of service account {}/{} to {} is not checked offline",
                    self.namespace,
                    self.service_account,
                    share()
                )],
                ..Judged::default()
            },
            Err(error) => Judged::unchecked(volume, format!("access to {}", share()), error),
        });
        judged
    }

    /// The projection exists, its spec is one the driver serves, and each share it shows passes
    /// [`Judge::share`] (all at once).
    async fn projection<'s>(self, volume: &'s str, name: &ObjectName) -> Judged<'s> {
        let projection = || format!("SharedProjection {}/{}", self.namespace, quote(name.as_str()));
        let spec = match self.facts.projection(self.namespace, name).await {
            Ok(Known::Answer(Some(spec))) => spec,
            Ok(Known::Answer(None)) => {
                return Judged::refusal(volume, projection_not_found(self.namespace, name), false);
            }
            Ok(Known::NotChecked) => return Judged::default(),
            Err(error) => return Judged::unchecked(volume, projection(), error),
        };
        if let Err(invalid) = check_spec(&spec) {
            return Judged::refusal(volume, format!("{}: {invalid}", projection()), false);
        }
        // check_spec has checked every share name.
        let shares: Vec<(ShareKind, ObjectName, bool)> = spec
            .sources
            .iter()
            .filter_map(|source| {
                let (kind, share) = match source.kind()? {
                    SourceKind::SharedSecret(share) => (ShareKind::Secret, share),
                    SourceKind::SharedConfigMap(share) => (ShareKind::ConfigMap, share),
                    _ => return None,
                };
                Some((kind, ObjectName::parse(&share.name).ok()?, share.optional))
            })
            .collect();
        let mut judged = Judged::default();
        let judging = shares.iter().map(|(kind, share, optional)| self.share(volume, *kind, share, *optional));
        for judgement in join_all(judging).await {
            judged.merge(judgement);
        }
        judged
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
