//! The opted-in workloads as the rollout controller keeps them: per workload only what the rule
//! reads (the shares its pods mount, its record, its pods' ServiceAccount, the resourceVersion a
//! patch is conditioned on), never the object, and at most a configured number per namespace, so
//! what one tenant labels costs the controller a bounded amount whatever it makes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::Resource;

use super::plan::{MAX_SHARES_PER_WORKLOAD, OBSERVED_ANNOTATION, Observed, ShareRef, mounted_shares, parse_observed};

/// The workload kinds followed: those whose pod template a restart rolls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    /// `apps/v1` Deployment.
    Deployment,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// `apps/v1` DaemonSet.
    DaemonSet,
}

/// A kind of workload the controller follows.
pub trait Workload: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope> {
    /// Which kind.
    const KIND: WorkloadKind;
    /// Its pod template.
    fn template(&self) -> Option<&PodTemplateSpec>;
}

impl Workload for Deployment {
    const KIND: WorkloadKind = WorkloadKind::Deployment;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|spec| &spec.template)
    }
}

impl Workload for StatefulSet {
    const KIND: WorkloadKind = WorkloadKind::StatefulSet;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|spec| &spec.template)
    }
}

impl Workload for DaemonSet {
    const KIND: WorkloadKind = WorkloadKind::DaemonSet;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|spec| &spec.template)
    }
}

/// A workload's identity: namespace first, so one namespace's workloads are one range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadKey {
    /// Its namespace.
    pub namespace: String,
    /// Its kind.
    pub kind: WorkloadKind,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// What the rule reads of one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The shares its pods mount.
    pub shares: BTreeSet<ShareRef>,
    /// What it last saw of them.
    pub observed: Observed,
    /// Its pods' ServiceAccount: whose `use` of a share a restart is checked against.
    pub service_account: String,
    /// The resourceVersion the summary was read at.
    pub resource_version: String,
}

/// Why a workload is not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// Its pods mount more than [`MAX_SHARES_PER_WORKLOAD`] shares.
    TooManyShares,
    /// Its namespace already has the most followed workloads (said once per namespace until it
    /// has room again: a tenant's churn cannot fill the log).
    NamespaceFull,
    /// As [`Skipped::NamespaceFull`], already said.
    NamespaceStillFull,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::TooManyShares => write!(f, "its pods mount more than {MAX_SHARES_PER_WORKLOAD} shares"),
            Skipped::NamespaceFull | Skipped::NamespaceStillFull => {
                write!(f, "its namespace has the most workloads followed (--rollout-workloads-per-namespace)")
            }
        }
    }
}

/// The key and summary of `workload` (`None` for the summary: its pods mount too many shares),
/// or `None` for one without a name or namespace. A workload without a template mounts nothing.
/// Its record is read as made under the key of id `key_id`.
pub fn summarize<K: Workload>(workload: &K, key_id: &str) -> Option<(WorkloadKey, Option<Summary>)> {
    let meta = workload.meta();
    let key = WorkloadKey { namespace: meta.namespace.clone()?, kind: K::KIND, name: meta.name.clone()? };
    let spec = workload.template().and_then(|template| template.spec.as_ref());
    let Some(shares) = spec.map_or(Some(BTreeSet::new()), mounted_shares) else { return Some((key, None)) };
    let service_account = spec
        .and_then(|spec| spec.service_account_name.clone().or_else(|| spec.service_account.clone()))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let annotation = meta.annotations.as_ref().and_then(|a| a.get(OBSERVED_ANNOTATION)).map(String::as_str);
    let observed = parse_observed(annotation, key_id);
    let resource_version = meta.resource_version.clone().unwrap_or_default();
    Some((key, Some(Summary { shares, observed, service_account, resource_version })))
}

/// The followed workloads, at most `per_namespace` in each namespace.
#[derive(Debug, Clone)]
pub struct Workloads {
    per_namespace: usize,
    followed: BTreeMap<WorkloadKey, Summary>,
    /// The namespaces told full since they last had room.
    told_full: BTreeSet<String>,
}

impl Workloads {
    /// None yet, at most `per_namespace` in each namespace.
    pub fn new(per_namespace: usize) -> Workloads {
        Workloads { per_namespace, followed: BTreeMap::new(), told_full: BTreeSet::new() }
    }

    /// Follows `key` as `summary` (`None`: too many shares, and no longer followed), unless its
    /// namespace is full; says why when it is not followed.
    pub fn put(&mut self, key: WorkloadKey, summary: Option<Summary>) -> Result<(), Skipped> {
        let Some(summary) = summary else {
            self.followed.remove(&key);
            return Err(Skipped::TooManyShares);
        };
        if !self.followed.contains_key(&key) && self.in_namespace(&key.namespace) >= self.per_namespace {
            return Err(if self.told_full.insert(key.namespace) {
                Skipped::NamespaceFull
            } else {
                Skipped::NamespaceStillFull
            });
        }
        self.followed.insert(key, summary);
        Ok(())
    }

    /// Stops following `key`.
    pub fn remove(&mut self, key: &WorkloadKey) {
        if self.followed.remove(key).is_some() {
            self.told_full.remove(&key.namespace);
        }
    }

    /// Replaces every workload of `kind` with those of `listed` (a watch listed them again).
    pub fn replace_kind(&mut self, kind: WorkloadKind, listed: Workloads) {
        self.followed.retain(|key, _| key.kind != kind);
        // A namespace said full while listing is not said full again at its next change.
        self.told_full.extend(listed.told_full);
        for (key, summary) in listed.followed {
            // Cannot fail for a reason but a full namespace, which is logged where it was listed.
            let _ = self.put(key, Some(summary));
        }
    }

    /// How many are followed in `namespace`.
    fn in_namespace(&self, namespace: &str) -> usize {
        let first =
            WorkloadKey { namespace: namespace.to_owned(), kind: WorkloadKind::Deployment, name: String::new() };
        self.followed.range(first..).take_while(|(key, _)| key.namespace == namespace).count()
    }

    /// Every followed workload.
    pub fn all(&self) -> impl Iterator<Item = (&WorkloadKey, &Summary)> {
        self.followed.iter()
    }

    /// After a patch the controller made: `key` now records `observed` at `resource_version`,
    /// so the next pass does not act on the view before it (the watch brings the same).
    pub fn patched(&mut self, key: &WorkloadKey, observed: Observed, resource_version: String) {
        if let Some(summary) = self.followed.get_mut(key) {
            summary.observed = observed;
            summary.resource_version = resource_version;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> WorkloadKey {
        WorkloadKey { namespace: namespace.into(), kind: WorkloadKind::Deployment, name: name.into() }
    }

    fn summary() -> Summary {
        Summary {
            shares: BTreeSet::new(),
            observed: Observed::new(),
            service_account: "default".into(),
            resource_version: "1".into(),
        }
    }

    #[test]
    fn a_namespace_gets_at_most_its_share_of_workloads_and_others_are_unaffected() {
        let mut workloads = Workloads::new(2);
        assert_eq!(workloads.put(key("a", "1"), Some(summary())), Ok(()));
        assert_eq!(workloads.put(key("a", "2"), Some(summary())), Ok(()));
        assert_eq!(workloads.put(key("a", "3"), Some(summary())), Err(Skipped::NamespaceFull));
        assert_eq!(workloads.put(key("a", "4"), Some(summary())), Err(Skipped::NamespaceStillFull));
        // One already followed is updated in place.
        assert_eq!(workloads.put(key("a", "2"), Some(summary())), Ok(()));
        assert_eq!(workloads.put(key("b", "1"), Some(summary())), Ok(()));
        workloads.remove(&key("a", "1"));
        assert_eq!(workloads.put(key("a", "3"), Some(summary())), Ok(()));
        // Full again after having had room: said again.
        assert_eq!(workloads.put(key("a", "4"), Some(summary())), Err(Skipped::NamespaceFull));
        let names: Vec<String> = workloads.all().map(|(k, _)| k.to_string()).collect();
        assert_eq!(names, ["Deployment a/2", "Deployment a/3", "Deployment b/1"]);
    }

    #[test]
    fn a_workload_that_grows_too_many_shares_is_no_longer_followed() {
        let mut workloads = Workloads::new(2);
        workloads.put(key("a", "1"), Some(summary())).unwrap();
        assert_eq!(workloads.put(key("a", "1"), None), Err(Skipped::TooManyShares));
        assert_eq!(workloads.all().count(), 0);
    }

    #[test]
    fn a_relist_replaces_only_its_own_kind() {
        let mut workloads = Workloads::new(5);
        workloads.put(key("a", "gone"), Some(summary())).unwrap();
        let stateful = WorkloadKey { kind: WorkloadKind::StatefulSet, ..key("a", "kept") };
        workloads.put(stateful.clone(), Some(summary())).unwrap();
        let mut listed = Workloads::new(5);
        listed.put(key("a", "new"), Some(summary())).unwrap();
        workloads.replace_kind(WorkloadKind::Deployment, listed);
        let keys: Vec<WorkloadKey> = workloads.all().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, [key("a", "new"), stateful]);
    }

    #[test]
    fn the_summary_reads_the_pods_account_and_the_record() {
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "team", "resourceVersion": "7",
                         "annotations": {OBSERVED_ANNOTATION: "@0123abcd,SharedSecret/db=abc"}},
            "spec": {"selector": {}, "template": {"spec": {"serviceAccountName": "web-sa", "containers": [],
                "volumes": [{"name": "db", "csi": {"driver": sharedresource_api::DRIVER_NAME, "volumeAttributes": {"sharedSecret": "db"}}}]}}}
        }))
        .unwrap();
        let (key, summary) = summarize(&deployment, "0123abcd").unwrap();
        assert_eq!(key, WorkloadKey { namespace: "team".into(), kind: WorkloadKind::Deployment, name: "web".into() });
        let summary = summary.unwrap();
        let db = ShareRef { kind: sharedresource_api::ShareKind::Secret, name: "db".into() };
        assert_eq!(summary.shares, BTreeSet::from([db.clone()]));
        assert_eq!(summary.observed, Observed::from([(db, "abc".to_owned())]));
        assert_eq!((summary.service_account.as_str(), summary.resource_version.as_str()), ("web-sa", "7"));
    }
}
