//! The rollout rule, pure: which shares a workload's pod template mounts, what the workload last
//! saw of them (an annotation on the workload itself, so a restarted controller neither misses a
//! change nor restarts twice for one), and whether a new view of the shares' content restarts it.
//!
//! A workload opts in with [`RESTART_LABEL`]` = "true"` (a label, so the controller's watch selects
//! it on the apiserver and never sees anything else). Its metadata carries [`OBSERVED_ANNOTATION`]:
//! the id of the key its versions were made under (`@ID`, `content_version`), then one
//! `Kind/name=version` per share its pods mount and may `use` (a share they may not use is never
//! recorded: the record tells a tenant nothing of it). A share whose version differs from the one
//! recorded restarts it: [`RESTARTED_AT_ANNOTATION`] in the pod template (what `kubectl rollout
//! restart` sets), written in the same patch as the new record, so one change is one restart. A
//! share seen for the first time is recorded without a restart; a share whose content cannot be
//! seen (the share deleted, its backing object deleted: a revocation) keeps its old record, so
//! neither the revocation nor the return of the same content restarts anything.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodSpec;
use sharedresource_api::{DRIVER_NAME, Selection, ShareKind, VolumeAttributes};

/// The label a workload opts in with (value `"true"`).
pub const RESTART_LABEL: &str = "sharedresource.inlineguard.dev/restart-on-change";
/// The workload annotation recording the content versions its last rollout saw.
pub const OBSERVED_ANNOTATION: &str = "sharedresource.inlineguard.dev/observed-content";
/// The pod-template annotation a restart sets, as `kubectl rollout restart` does.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";
/// The most shares one workload's pods may mount and still be followed: what bounds the record
/// (and the work one tenant's workload costs); a workload mounting more is skipped, logged.
pub const MAX_SHARES_PER_WORKLOAD: usize = 32;
/// The longest record read back (32 entries of two names and a version fit several times over);
/// a longer one is read as no record at all: the next change is recorded, not restarted for.
const MAX_OBSERVED_LEN: usize = 32 * 1024;

/// One share, as pods name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShareRef {
    /// Its kind.
    pub kind: ShareKind,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for ShareRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind.kind(), self.name)
    }
}

/// The shares a pod template's volumes of this driver mount, or `None` when there are more than
/// [`MAX_SHARES_PER_WORKLOAD`]. Volumes whose attributes the driver would refuse mount nothing
/// and are left out; projections and providers are not followed (see docs/driver.md).
pub fn mounted_shares(spec: &PodSpec) -> Option<BTreeSet<ShareRef>> {
    let mut shares = BTreeSet::new();
    for volume in spec.volumes.iter().flatten() {
        let Some(csi) = volume.csi.as_ref().filter(|csi| csi.driver == DRIVER_NAME) else { continue };
        let attributes = csi.volume_attributes.clone().unwrap_or_default();
        if let Ok(VolumeAttributes { selection: Selection::Share(kind, name), .. }) =
            VolumeAttributes::parse(&attributes)
        {
            shares.insert(ShareRef { kind, name: name.as_str().to_owned() });
            if shares.len() > MAX_SHARES_PER_WORKLOAD {
                return None;
            }
        }
    }
    Some(shares)
}

/// What a workload last saw: a version per share.
pub type Observed = BTreeMap<ShareRef, String>;

/// The record as the annotation holds it: `@` and the id of the key its versions were made
/// under, then `Kind/name=version` entries, joined by commas, sorted.
pub fn format_observed(key_id: &str, observed: &Observed) -> String {
    std::iter::once(format!("@{key_id}"))
        .chain(observed.iter().map(|(share, version)| format!("{share}={version}")))
        .collect::<Vec<_>>()
        .join(",")
}

/// The record an annotation holds, made under the key of id `key_id`. Anything else (a record
/// of another key or of none, as older versions wrote them; too long; an unknown kind; an entry
/// without `=`) reads as no record: the controller then records what it sees without a restart,
/// which is what a workload's first sight is too.
pub fn parse_observed(annotation: Option<&str>, key_id: &str) -> Observed {
    let Some(text) = annotation.filter(|text| !text.is_empty() && text.len() <= MAX_OBSERVED_LEN) else {
        return Observed::new();
    };
    let mut entries = text.split(',');
    if entries.next().and_then(|first| first.strip_prefix('@')) != Some(key_id) {
        return Observed::new();
    }
    let mut observed = Observed::new();
    for entry in entries {
        let parsed = entry.split_once('=').and_then(|(share, version)| {
            let (kind, name) = share.split_once('/')?;
            let kind = [ShareKind::Secret, ShareKind::ConfigMap].into_iter().find(|k| k.kind() == kind)?;
            (!name.is_empty() && !version.is_empty())
                .then(|| (ShareRef { kind, name: name.to_owned() }, version.to_owned()))
        });
        match parsed {
            Some((share, version)) => {
                observed.insert(share, version);
            }
            None => return Observed::new(),
        }
    }
    observed
}

/// What to do with one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Its record is what it should be.
    Nothing,
    /// Write this record, without a restart (a share seen for the first time, one no longer
    /// mounted forgotten).
    Record(Observed),
    /// Restart it for these shares' changes, writing this record with the restart.
    Restart {
        /// The record to write.
        observed: Observed,
        /// The shares whose content changed, sorted.
        changed: Vec<ShareRef>,
    },
}

/// The shares of `mounted` whose version in `current` the record does not hold yet (new or
/// changed): each is recorded, or restarted for, only once the workload's pods may `use` it.
pub fn unrecorded(
    mounted: &BTreeSet<ShareRef>,
    observed: &Observed,
    current: &BTreeMap<ShareRef, String>,
) -> Vec<ShareRef> {
    mounted
        .iter()
        .filter(|share| current.get(*share).is_some_and(|now| observed.get(*share) != Some(now)))
        .cloned()
        .collect()
}

/// The decision for a workload mounting `mounted`, which last saw `observed`, when the shares'
/// content is now at `current` (a share missing from it cannot be seen now: its record is kept).
pub fn decide(mounted: &BTreeSet<ShareRef>, observed: &Observed, current: &BTreeMap<ShareRef, String>) -> Decision {
    let mut next = Observed::new();
    let mut changed = Vec::new();
    for share in mounted {
        match (current.get(share), observed.get(share)) {
            (Some(now), Some(before)) => {
                if now != before {
                    changed.push(share.clone());
                }
                next.insert(share.clone(), now.clone());
            }
            (Some(now), None) => {
                next.insert(share.clone(), now.clone());
            }
            (None, Some(before)) => {
                next.insert(share.clone(), before.clone());
            }
            (None, None) => {}
        }
    }
    if !changed.is_empty() {
        Decision::Restart { observed: next, changed }
    } else if &next != observed {
        Decision::Record(next)
    } else {
        Decision::Nothing
    }
}

#[cfg(test)]
mod tests;
