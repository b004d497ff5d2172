//! The plugin interfaces, shaped after kube-apiserver's `admission.Interface`,
//! `MutationInterface` and `ValidationInterface`.
//!
//! They are async because a host may need to fetch a fact it has not cached (a CSIDriver created a
//! moment ago); the decision itself stays synchronous and pure.

use async_trait::async_trait;
use inline_guard_policy::PatchOperation;

use crate::attributes::{Attributes, Operation};
use crate::error::Result;
use crate::recorder::Recorder;

/// What every plugin answers: its name and which operations it acts on.
pub trait Handler: Send + Sync {
    /// The plugin name, as registered.
    fn name(&self) -> &'static str;
    /// True when the plugin wants to see requests with this operation.
    fn handles(&self, operation: Operation) -> bool;
}

/// A plugin that may change the object.
#[async_trait]
pub trait MutationInterface: Handler {
    /// Changes `attributes.object` in place and returns the same change as JSON Patch operations
    /// against the object as the plugin received it (empty: nothing changed). An error rejects the
    /// request.
    async fn admit(&self, attributes: &mut Attributes<'_>, recorder: &mut Recorder) -> Result<Vec<PatchOperation>>;
}

/// A plugin that only accepts or rejects.
#[async_trait]
pub trait ValidationInterface: Handler {
    /// Accepts (`Ok`) or rejects the request; warnings and audit annotations go to `recorder`.
    async fn validate(&self, attributes: &Attributes<'_>, recorder: &mut Recorder) -> Result<()>;
}
