//! The facts SharedResourceAdmission reads: whether a share exists, a projection's spec, and
//! whether RBAC lets a service account `use` a share. A host that cannot know one (`check`, which
//! has no apiserver) says so with [`Known::NotChecked`] instead of guessing.

use std::sync::Arc;

use async_trait::async_trait;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::projection::ProjectionSpec;
use sharedresource_api::{ObjectName, ShareKind};

use crate::facts::FactsError;

/// An answer, or the host's word that it does not look this up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known<T> {
    /// The answer.
    Answer(T),
    /// This host does not check it (`check` asks no apiserver about access; a cluster-state file
    /// without shares says nothing about them).
    NotChecked,
}

/// Looks up shares, projections and access.
#[async_trait]
pub trait ShareFacts: Send + Sync {
    /// Whether the share `name` of `kind` exists.
    async fn share_exists(&self, kind: ShareKind, name: &ObjectName) -> Result<Known<bool>, FactsError>;
    /// The spec of the SharedProjection `namespace/name`; `None` when it does not exist.
    async fn projection(
        &self,
        namespace: &str,
        name: &ObjectName,
    ) -> Result<Known<Option<Arc<ProjectionSpec>>>, FactsError>;
    /// Whether RBAC answers `question` with "allowed".
    async fn may_use(&self, question: &AccessQuestion) -> Result<Known<bool>, FactsError>;
}

/// A host that looks nothing up: every answer is [`Known::NotChecked`].
#[derive(Debug, Default, Clone, Copy)]
pub struct NothingChecked;

#[async_trait]
impl ShareFacts for NothingChecked {
    async fn share_exists(&self, _: ShareKind, _: &ObjectName) -> Result<Known<bool>, FactsError> {
        Ok(Known::NotChecked)
    }

    async fn projection(&self, _: &str, _: &ObjectName) -> Result<Known<Option<Arc<ProjectionSpec>>>, FactsError> {
        Ok(Known::NotChecked)
    }

    async fn may_use(&self, _: &AccessQuestion) -> Result<Known<bool>, FactsError> {
        Ok(Known::NotChecked)
    }
}
