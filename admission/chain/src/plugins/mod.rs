//! The plugins this project ships, and the chain every host runs them in.

pub mod csi_volume_admission;
pub mod read_only_check;
pub mod read_only_forcing;

use std::sync::Arc;

use inline_guard_policy::PolicySettings;

pub use csi_volume_admission::CsiVolumeAdmission;
pub use read_only_check::ReadOnlyCheck;
pub use read_only_forcing::ReadOnlyForcing;

use crate::chain::Chain;
use crate::facts::ClusterFacts;

/// The chain the webhook server and `check` both run: read-only forcing (mutating), then
/// CSIVolumeAdmission and the read-only check (validating), so a pod forcing missed is refused
/// after the policy's own verdict.
pub fn standard_chain(settings: Arc<PolicySettings>, facts: Arc<dyn ClusterFacts>) -> Chain {
    Chain::new()
        .with_mutating(Arc::new(ReadOnlyForcing::new(settings.clone())))
        .with_validating(Arc::new(CsiVolumeAdmission::new(settings.clone(), facts)))
        .with_validating(Arc::new(ReadOnlyCheck::new(settings)))
}
