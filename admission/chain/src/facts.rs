//! The cluster facts the plugins read: a namespace's labels and a CSIDriver's labels. The
//! interface is the only way the chain reaches the cluster; a lister cache, a file or a test table
//! stand behind it.

use std::sync::Arc;

use async_trait::async_trait;
use inline_guard_policy::Labels;

/// A fact could not be looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactsError {
    /// The source is not ready (a cache not yet synced) or a live lookup failed.
    #[error("cluster facts unavailable: {0}")]
    Unavailable(String),
    /// An object handed to a static source is not a Namespace or a CSIDriver, or is malformed.
    #[error("{0}")]
    UnsupportedObject(String),
}

/// Looks up labels by object name; `Ok(None)` when the object does not exist.
#[async_trait]
pub trait ClusterFacts: Send + Sync {
    /// The labels of the namespace `name`.
    async fn namespace_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError>;
    /// The labels of the CSIDriver `name`.
    async fn csi_driver_labels(&self, name: &str) -> Result<Option<Arc<Labels>>, FactsError>;
}
