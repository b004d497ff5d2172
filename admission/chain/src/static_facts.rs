//! A fixed snapshot of Namespaces and CSIDrivers: what `check` decides against, and what the
//! server serves from in standalone mode. Read from a cluster-state file, or filled by tests.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_config::documents::Position;
use inline_guard_config::format::read_text;
use inline_guard_config::read_documents;
use inline_guard_policy::Labels;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use sharedresource_api::access::AccessQuestion;
use sharedresource_api::projection::ProjectionSpec;
use sharedresource_api::{ObjectName, ShareKind};

use crate::facts::{ClusterFacts, FactsError};
use crate::share_facts::{Known, ShareFacts};

/// The apiVersion of shares and projections.
const SHARED_RESOURCE_VERSION: &str = "sharedresource.inlineguard.dev/v1alpha1";

/// A cluster-state file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStateError {
    /// The file could not be read or parsed.
    #[error(transparent)]
    File(#[from] inline_guard_config::Error),
    /// The file holds no Namespace at all: what an emptied or truncated file looks like. The
    /// webhook refuses it, since deciding on it would treat every namespace as unlabelled.
    #[error(
        "{}: holds no Namespace; refusing it as broken (an empty or truncated file would admit every pod as if no namespace were labelled)",
        path.display()
    )]
    NoNamespace {
        /// The file.
        path: PathBuf,
    },
    /// One document is not a usable Namespace or CSIDriver.
    #[error("{}: {position}: {source}", path.display())]
    Document {
        /// The file.
        path: PathBuf,
        /// Which document.
        position: Position,
        /// What is wrong with it.
        source: FactsError,
    },
}

/// A fixed snapshot of Namespaces and CSIDrivers, and of shares and projections when the file
/// holds any, from a file or a test.
#[derive(Debug, Clone, Default)]
pub struct StaticClusterFacts {
    namespaces: HashMap<String, Arc<Labels>>,
    csi_drivers: HashMap<String, Arc<Labels>>,
    // `None` until the file holds one share: a file without shares says nothing about them, so
    // their existence is not checked rather than refused.
    shares: Option<HashSet<(ShareKind, String)>>,
    projections: Option<HashMap<(String, String), Arc<ProjectionSpec>>>,
}

impl StaticClusterFacts {
    /// An empty snapshot: every lookup finds nothing.
    pub fn new() -> StaticClusterFacts {
        StaticClusterFacts::default()
    }

    /// Reads every Namespace and CSIDriver in a cluster-state file (YAML, JSON or a `List`); any
    /// other object is an error naming its document.
    pub fn load(path: &Path) -> Result<StaticClusterFacts, ClusterStateError> {
        StaticClusterFacts::parse(path, &read_text(path)?)
    }

    /// [`StaticClusterFacts::load`] on text already read from `path` (named in messages).
    pub fn parse(path: &Path, text: &str) -> Result<StaticClusterFacts, ClusterStateError> {
        let mut facts = StaticClusterFacts::new();
        for document in read_documents(path, text)? {
            facts.insert_object(&document.value).map_err(|source| ClusterStateError::Document {
                path: path.to_path_buf(),
                position: document.position,
                source,
            })?;
        }
        Ok(facts)
    }

    /// Adds or replaces a namespace.
    pub fn insert_namespace(&mut self, name: &str, labels: Labels) {
        self.namespaces.insert(name.to_string(), Arc::new(labels));
    }

    /// Adds or replaces a CSIDriver.
    pub fn insert_csi_driver(&mut self, name: &str, labels: Labels) {
        self.csi_drivers.insert(name.to_string(), Arc::new(labels));
    }

    /// Adds a share of `kind`.
    pub fn insert_share(&mut self, kind: ShareKind, name: &str) {
        self.shares.get_or_insert_default().insert((kind, name.to_string()));
    }

    /// Adds a SharedProjection.
    pub fn insert_projection(&mut self, namespace: &str, name: &str, spec: ProjectionSpec) {
        self.projections.get_or_insert_default().insert((namespace.to_string(), name.to_string()), Arc::new(spec));
    }

    /// Adds a `v1` Namespace, a `storage.k8s.io/v1` CSIDriver, or a SharedSecret, SharedConfigMap
    /// or SharedProjection of `sharedresource.inlineguard.dev/v1alpha1`, given as JSON; anything
    /// else is refused with a message saying what was found.
    pub fn insert_object(&mut self, object: &Value) -> Result<(), FactsError> {
        let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind) = (text("apiVersion"), text("kind"));
        let is_namespace = api_version == "v1" && kind == "Namespace";
        let is_csi_driver = api_version == "storage.k8s.io/v1" && kind == "CSIDriver";
        let ours = api_version == SHARED_RESOURCE_VERSION;
        let share_kind = [ShareKind::Secret, ShareKind::ConfigMap].into_iter().find(|k| ours && k.kind() == kind);
        let is_projection = ours && kind == "SharedProjection";
        if !is_namespace && !is_csi_driver && share_kind.is_none() && !is_projection {
            return Err(FactsError::UnsupportedObject(format!(
                "expected a v1 Namespace, a storage.k8s.io/v1 CSIDriver, or a {SHARED_RESOURCE_VERSION} SharedSecret, SharedConfigMap or SharedProjection, found {api_version} {kind}"
            )));
        }
        let metadata: ObjectMeta = match object.get("metadata") {
            Some(metadata) => serde_path_to_error::deserialize(metadata).map_err(|error| {
                FactsError::UnsupportedObject(format!("{kind} metadata.{}: {}", error.path(), error.inner()))
            })?,
            None => ObjectMeta::default(),
        };
        let Some(name) = metadata.name.filter(|name| !name.is_empty()) else {
            return Err(FactsError::UnsupportedObject(format!("{kind} has no metadata.name")));
        };
        if let Some(share_kind) = share_kind {
            self.insert_share(share_kind, &name);
            return Ok(());
        }
        if is_projection {
            let spec = object.get("spec").cloned().unwrap_or_default();
            let spec: ProjectionSpec = serde_path_to_error::deserialize(spec).map_err(|error| {
                FactsError::UnsupportedObject(format!(
                    "SharedProjection {name} spec.{}: {}",
                    error.path(),
                    error.inner()
                ))
            })?;
            let namespace = metadata.namespace.filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
            self.insert_projection(&namespace, &name, spec);
            return Ok(());
        }
        let labels = metadata.labels.unwrap_or_default();
        if is_namespace {
            self.insert_namespace(&name, labels);
        } else {
            self.insert_csi_driver(&name, labels);
        }
        Ok(())
    }

    /// How many namespaces and CSIDrivers the snapshot holds.
    pub fn len(&self) -> (usize, usize) {
        (self.namespaces.len(), self.csi_drivers.len())
    }

    /// True when the snapshot holds nothing.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.csi_drivers.is_empty()
    }
}

#[async_trait]
impl ClusterFacts for StaticClusterFacts {
    async fn namespace_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        Ok(self.namespaces.get(name).cloned())
    }

    async fn csi_driver_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        Ok(self.csi_drivers.get(name).cloned())
    }
}

/// The shares and projections the file holds, when it holds any; access is never checked
/// offline.
#[async_trait]
impl ShareFacts for StaticClusterFacts {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<Known<bool>, FactsError> {
        Ok(match &self.shares {
            Some(shares) => Known::Answer(shares.contains(&(kind, name.as_str().to_string()))),
            None => Known::NotChecked,
        })
    }

    async fn projection(
        &self,
        namespace: &str,
        name: &ObjectName,
    ) -> Result<Known<Option<Arc<ProjectionSpec>>>, FactsError> {
        Ok(match &self.projections {
            Some(projections) => {
                Known::Answer(projections.get(&(namespace.to_string(), name.as_str().to_string())).cloned())
            }
            None => Known::NotChecked,
        })
    }

    async fn may_use(&self, _question: &AccessQuestion) -> Result<Known<bool>, FactsError> {
        Ok(Known::NotChecked)
    }
}

#[cfg(test)]
mod tests {
    use futures_executor::block_on;
    use serde_json::json;

    use super::*;

    #[test]
    fn namespaces_and_csi_drivers_are_indexed_by_name() {
        let mut facts = StaticClusterFacts::new();
        facts
            .insert_object(&json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"apps","labels":{"pod-security.kubernetes.io/enforce":"baseline"}}}))
            .unwrap();
        facts
            .insert_object(
                &json!({"apiVersion":"storage.k8s.io/v1","kind":"CSIDriver","metadata":{"name":"csi.example.com"}}),
            )
            .unwrap();
        let labels = block_on(facts.namespace_labels("apps")).unwrap().unwrap();
        assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("baseline"));
        assert_eq!(block_on(facts.csi_driver_labels("csi.example.com")).unwrap().unwrap().len(), 0);
        assert_eq!(block_on(facts.csi_driver_labels("apps")).unwrap(), None);
    }

    #[test]
    fn other_objects_are_refused_by_kind() {
        let mut facts = StaticClusterFacts::new();
        let error = facts.insert_object(&json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "expected a v1 Namespace, a storage.k8s.io/v1 CSIDriver, or a sharedresource.inlineguard.dev/v1alpha1 SharedSecret, SharedConfigMap or SharedProjection, found v1 Pod"
        );
    }

    #[test]
    fn malformed_labels_and_missing_names_are_refused() {
        let mut facts = StaticClusterFacts::new();
        let error = facts
            .insert_object(&json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a","labels":{"x":1}}}))
            .unwrap_err();
        assert_eq!(error.to_string(), "Namespace metadata.labels.x: invalid type: integer `1`, expected a string");
        let error = facts.insert_object(&json!({"apiVersion":"v1","kind":"Namespace"})).unwrap_err();
        assert_eq!(error.to_string(), "Namespace has no metadata.name");
    }

    #[test]
    fn shares_and_projections_are_checked_only_when_the_file_holds_some() {
        let db = ObjectName::parse("db").unwrap();
        let mut facts = StaticClusterFacts::new();
        assert_eq!(block_on(facts.share_exists(ShareKind::Secret, &db)), Ok(Known::NotChecked));
        assert_eq!(block_on(facts.projection("team-a", &db)), Ok(Known::NotChecked));
        let version = "sharedresource.inlineguard.dev/v1alpha1";
        facts
            .insert_object(&json!({"apiVersion": version, "kind": "SharedSecret", "metadata": {"name": "db"},
                                   "spec": {"secretRef": {"namespace": "owner", "name": "db"}}}))
            .unwrap();
        facts
            .insert_object(&json!({"apiVersion": version, "kind": "SharedProjection",
                                   "metadata": {"name": "app", "namespace": "team-a"},
                                   "spec": {"sources": [{"sharedSecret": {"name": "db"}}]}}))
            .unwrap();
        assert_eq!(block_on(facts.share_exists(ShareKind::Secret, &db)), Ok(Known::Answer(true)));
        assert_eq!(block_on(facts.share_exists(ShareKind::ConfigMap, &db)), Ok(Known::Answer(false)));
        let app = ObjectName::parse("app").unwrap();
        let Ok(Known::Answer(Some(spec))) = block_on(facts.projection("team-a", &app)) else { panic!("not found") };
        assert_eq!(spec.sources.len(), 1);
        assert_eq!(block_on(facts.projection("team-b", &app)), Ok(Known::Answer(None)));
        let question = AccessQuestion {
            namespace: "team-a".into(),
            service_account: "web".into(),
            kind: sharedresource_api::access::Guarded::Share(ShareKind::Secret),
            name: "db".into(),
        };
        assert_eq!(block_on(facts.may_use(&question)), Ok(Known::NotChecked), "never offline");
        let bad = json!({"apiVersion": version, "kind": "SharedProjection", "metadata": {"name": "x"}, "spec": {"sources": 3}});
        assert!(
            facts
                .insert_object(&bad)
                .unwrap_err()
                .to_string()
                .starts_with("SharedProjection x spec.sources: invalid type")
        );
    }
}
