//! Standalone mode: the cluster facts come from a cluster-state file instead of an apiserver, and
//! are reloaded when the file changes. A broken edit is reported and the last good state kept; a
//! file with no Namespace at all counts as broken (an emptied or half-written file must not turn
//! every denial into an admission). Each reload reads the file once: the bytes compared are the
//! bytes parsed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use inline_guard_admission::{ClusterFacts, ClusterStateError, FactsError, Known, ShareFacts, StaticClusterFacts};
use inline_guard_policy::Labels;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::projection::ProjectionSpec;
use sharedresource_api::{ObjectName, ShareKind};

use crate::health::Readiness;
use crate::metrics::{CacheKind, Metrics};
use crate::reload::Reload;

/// Cluster facts read from a file and kept fresh.
pub struct FileFacts {
    path: PathBuf,
    current: RwLock<Arc<StaticClusterFacts>>,
    last_seen: Mutex<Vec<u8>>,
    metrics: Arc<Metrics>,
}

impl FileFacts {
    /// Loads the file; an unusable file at start-up is an error.
    pub fn load(path: &Path, metrics: Arc<Metrics>) -> Result<FileFacts, ClusterStateError> {
        let bytes = inline_guard_config::format::read_bounded(path)?;
        let facts = parse(path, &bytes)?;
        let file_facts = FileFacts {
            path: path.to_path_buf(),
            current: RwLock::new(Arc::new(facts)),
            last_seen: Mutex::new(bytes),
            metrics,
        };
        file_facts.publish_metrics();
        Ok(file_facts)
    }

    /// Re-reads the file and swaps in its content if it changed and is valid.
    pub fn reload_if_changed(&self) -> Reload {
        let bytes = match inline_guard_config::format::read_bounded(&self.path) {
            Ok(bytes) => bytes,
            Err(error) => {
                let mut last_seen = self.last_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                // Reported once per change, not every poll: forget the bytes last seen.
                if last_seen.is_empty() {
                    return Reload::Unchanged;
                }
                last_seen.clear();
                return Reload::Rejected(error.to_string());
            }
        };
        {
            let mut last_seen = self.last_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if *last_seen == bytes {
                return Reload::Unchanged;
            }
            *last_seen = bytes.clone();
        }
        match parse(&self.path, &bytes) {
            Ok(facts) => {
                *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(facts);
                self.publish_metrics();
                Reload::Reloaded
            }
            Err(error) => Reload::Rejected(error.to_string()),
        }
    }

    fn snapshot(&self) -> Arc<StaticClusterFacts> {
        // Clone the Arc so the lock is not held while a request is decided.
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn publish_metrics(&self) {
        let (namespaces, drivers) = self.snapshot().len();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default();
        self.metrics.set_cache(CacheKind::Namespace, namespaces, true, now);
        self.metrics.set_cache(CacheKind::CsiDriver, drivers, true, now);
    }
}

/// The facts in `bytes` read from `path`, refused when not UTF-8, not a cluster state, or without
/// a single Namespace.
fn parse(path: &Path, bytes: &[u8]) -> Result<StaticClusterFacts, ClusterStateError> {
    let text = std::str::from_utf8(bytes).map_err(|error| inline_guard_config::Error::Read {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, error),
    })?;
    let facts = StaticClusterFacts::parse(path, text)?;
    if facts.len().0 == 0 {
        return Err(ClusterStateError::NoNamespace { path: path.to_path_buf() });
    }
    Ok(facts)
}

#[async_trait]
impl ClusterFacts for FileFacts {
    async fn namespace_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        self.snapshot().namespace_labels(name).await
    }

    async fn csi_driver_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError> {
        self.snapshot().csi_driver_labels(name).await
    }
}

/// The shares and projections the file holds, when it holds any; access is not checked without
/// an apiserver.
#[async_trait]
impl ShareFacts for FileFacts {
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<Known<bool>, FactsError> {
        self.snapshot().share_exists(kind, name).await
    }

    async fn projection(
        &self,
        namespace: &str,
        name: &ObjectName,
    ) -> Result<Known<Option<Arc<ProjectionSpec>>>, FactsError> {
        self.snapshot().projection(namespace, name).await
    }

    async fn may_use(&self, question: &AccessQuestion) -> Result<Known<bool>, FactsError> {
        self.snapshot().may_use(question).await
    }
}

impl Readiness for FileFacts {
    /// A file is complete once read: ready from the start.
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {team: x}}\n";

    #[tokio::test]
    async fn edits_are_picked_up_and_broken_edits_keep_the_last_good_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        std::fs::write(&path, STATE).unwrap();
        let metrics = Arc::new(Metrics::new());
        let facts = FileFacts::load(&path, metrics.clone()).unwrap();
        assert!(facts.namespace_labels("a").await.unwrap().is_some());
        assert_eq!(facts.reload_if_changed(), Reload::Unchanged);

        std::fs::write(&path, STATE.replace("name: a", "name: b")).unwrap();
        assert_eq!(facts.reload_if_changed(), Reload::Reloaded);
        assert!(facts.namespace_labels("a").await.unwrap().is_none());
        assert!(facts.namespace_labels("b").await.unwrap().is_some());

        std::fs::write(&path, "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n").unwrap();
        let Reload::Rejected(message) = facts.reload_if_changed() else { panic!("a Secret was accepted") };
        assert!(
            message.ends_with("document 1: expected a v1 Namespace, a storage.k8s.io/v1 CSIDriver, or a sharedresource.inlineguard.dev/v1alpha1 SharedSecret, SharedConfigMap or SharedProjection, found v1 Secret"),
            "{message}"
        );
        assert!(facts.namespace_labels("b").await.unwrap().is_some(), "the last good state is kept");
        assert!(metrics.encode().contains("csi_volume_admission_cache_objects{kind=\"namespace\"} 1"));
    }

    #[tokio::test]
    async fn a_state_without_any_namespace_is_broken_at_start_and_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.yaml");
        let metrics = Arc::new(Metrics::new());
        let driver_only = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d}\n";
        for empty in ["", "---\n", "# regenerating\n", driver_only] {
            std::fs::write(&path, empty).unwrap();
            let Err(error) = FileFacts::load(&path, metrics.clone()) else { panic!("{empty:?} was accepted") };
            assert!(error.to_string().ends_with("holds no Namespace; refusing it as broken (an empty or truncated file would admit every pod as if no namespace were labelled)"), "{error}");
        }
        std::fs::write(&path, STATE).unwrap();
        let facts = FileFacts::load(&path, metrics).unwrap();
        for empty in ["", "---\n", "# regenerating\n", driver_only] {
            std::fs::write(&path, empty).unwrap();
            assert!(matches!(facts.reload_if_changed(), Reload::Rejected(_)), "{empty:?}");
            assert!(facts.namespace_labels("a").await.unwrap().is_some(), "the last good state is kept");
        }
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(facts.reload_if_changed(), Reload::Rejected(_)), "a vanished file is reported once");
        assert_eq!(facts.reload_if_changed(), Reload::Unchanged);
        std::fs::write(&path, STATE).unwrap();
        assert_eq!(facts.reload_if_changed(), Reload::Reloaded);
    }
}
