//! The plugins this project ships, and the chain every host runs them in.

pub mod csi_volume_admission;
pub mod read_only_check;
pub mod read_only_forcing;
pub mod share_injection;
pub mod shared_resource_admission;

use std::sync::Arc;

use inline_guard_policy::PolicySettings;

pub use csi_volume_admission::CsiVolumeAdmission;
pub use read_only_check::ReadOnlyCheck;
pub use read_only_forcing::ReadOnlyForcing;
pub use share_injection::ShareInjection;
pub use shared_resource_admission::SharedResourceAdmission;

use crate::chain::Chain;
use crate::facts::ClusterFacts;
use crate::share_facts::ShareFacts;

/// The chain the webhook server and `check` both run: share injection and read-only forcing
/// (mutating), then CSIVolumeAdmission, the read-only check and SharedResourceAdmission
/// (validating), so injected volumes are judged like written ones, a pod forcing missed is
/// refused after the policy's own verdict, and the driver's own rules come last.
pub fn standard_chain(
    settings: Arc<PolicySettings>,
    facts: Arc<dyn ClusterFacts>,
    share_facts: Arc<dyn ShareFacts>,
) -> Chain {
    Chain::new()
        .with_mutating(Arc::new(ShareInjection))
        .with_mutating(Arc::new(ReadOnlyForcing::new(settings.clone())))
        .with_validating(Arc::new(CsiVolumeAdmission::new(settings.clone(), facts)))
        .with_validating(Arc::new(ReadOnlyCheck::new(settings)))
        .with_validating(Arc::new(SharedResourceAdmission::new(share_facts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attributes::Operation;
    use crate::plugin::Handler;
    use crate::static_facts::StaticClusterFacts;

    /// The registered names and the operations each plugin is shown: kube-apiserver's `Handles`
    /// contract, which decides what a plugin never sees (a DELETE or CONNECT reaches none).
    #[test]
    fn each_plugin_has_its_registered_name_and_sees_only_its_operations() {
        let settings = Arc::new(PolicySettings::default());
        let plugins: [(&dyn Handler, &str, [bool; 4]); 5] = [
            (&ShareInjection, "inlineguard.dev/ShareInjection", [true, false, false, false]),
            (&ReadOnlyForcing::new(settings.clone()), "inlineguard.dev/ReadOnlyForcing", [true, true, false, false]),
            (
                &CsiVolumeAdmission::new(settings.clone(), Arc::new(StaticClusterFacts::new())),
                "inlineguard.dev/CSIVolumeAdmission",
                [true, true, false, false],
            ),
            (&ReadOnlyCheck::new(settings), "inlineguard.dev/ReadOnlyCheck", [true, false, false, false]),
            (
                &SharedResourceAdmission::new(Arc::new(crate::NothingChecked)),
                "inlineguard.dev/SharedResourceAdmission",
                [true, true, false, false],
            ),
        ];
        let operations = [Operation::Create, Operation::Update, Operation::Delete, Operation::Connect];
        for (plugin, name, handled) in plugins {
            assert_eq!(plugin.name(), name);
            let seen: Vec<bool> = operations.iter().map(|operation| plugin.handles(*operation)).collect();
            assert_eq!(seen, handled, "{name}: Create, Update, Delete, Connect");
        }
    }
}
