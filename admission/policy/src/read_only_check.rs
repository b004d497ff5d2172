//! The check behind read-only forcing: after every mutation, no volume of a listed driver, and no
//! mount of one, may still be writable.
//!
//! Forcing runs in the mutating webhook, which the apiserver calls only when its generated
//! `matchConditions` say so. A MutatingWebhookConfiguration generated before a driver joined
//! `readOnlyDrivers`, or one that was never applied, would let such a pod through unforced, and
//! the pod would then fail on the node (the driver refuses writable publishes). The validating
//! webhook sees the object after every mutating webhook has run, so it refuses the pod instead,
//! saying why; this turns a stale configuration into a loud denial rather than a silent gap.

use crate::pod_spec::PodSpecView;
use crate::read_only::{MountScope, WritablePlace, writable_places};
use crate::settings::ReadOnlyDrivers;

/// How many writable places a message names before it says how many more there are.
const NAMED_AT_MOST: usize = 5;

/// The volumes of listed drivers, and their mounts, that are not `readOnly: true` (exactly what
/// forcing a pod creation would set), described in that order: `volume "v" (CSIDriver d)`, then
/// `mount of "v" in container "c"`.
pub fn writable_read_only_volumes(spec: &PodSpecView, drivers: &ReadOnlyDrivers) -> Vec<String> {
    writable_places(spec, drivers, MountScope::WholePod)
        .into_iter()
        .filter_map(|place| match place {
            WritablePlace::Volume { volume } => {
                let volume = spec.volumes.get(volume)?;
                let driver = &volume.csi.as_ref()?.driver;
                Some(format!("volume {:?} (CSIDriver {driver})", volume.name))
            }
            WritablePlace::Mount { list, container, mount } => {
                let container = list.of(spec).get(container)?;
                let mount = container.volume_mounts.get(mount)?;
                Some(format!("mount of {:?} in container {:?}", mount.name, container.name))
            }
        })
        .collect()
}

/// The denial for an object whose listed volumes are still writable: names at most a few places,
/// then says how to repair the configuration that let it through.
pub fn not_forced_message(object: &str, writable: &[String]) -> String {
    let mut places = writable.iter().take(NAMED_AT_MOST).cloned().collect::<Vec<_>>().join(", ");
    if writable.len() > NAMED_AT_MOST {
        places.push_str(&format!(" and {} more", writable.len() - NAMED_AT_MOST));
    }
    format!(
        "{object} has inline volumes that must be read-only but are not: {places}. The read-only webhook did not force them; \
         its MutatingWebhookConfiguration is missing or older than the readOnlyDrivers list (regenerate it with `csi-volume-admission webhooks`)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_spec::{ContainerView, CsiVolumeView, VolumeMountView, VolumeView};
    use crate::settings::SHARED_RESOURCE_DRIVER;

    fn csi<'a>(name: &'a str, driver: &'a str, read_only: Option<bool>) -> VolumeView<'a> {
        VolumeView {
            name: name.into(),
            csi: Some(CsiVolumeView { driver: driver.into(), read_only, ..Default::default() }),
        }
    }

    fn container<'a>(name: &'a str, mounts: &[(&'a str, Option<bool>)]) -> ContainerView<'a> {
        ContainerView {
            name: name.into(),
            volume_mounts: mounts
                .iter()
                .map(|(volume, read_only)| VolumeMountView {
                    name: (*volume).into(),
                    read_only: *read_only,
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_forced_pod_has_nothing_writable() {
        let mut spec = PodSpecView {
            volumes: vec![csi("shared", SHARED_RESOURCE_DRIVER, None), csi("other", "other.example.com", None)],
            containers: vec![container("app", &[("shared", Some(false)), ("other", None)])],
            init_containers: vec![container("init", &[("shared", None)])],
            ..Default::default()
        };
        assert_eq!(
            writable_read_only_volumes(&spec, &ReadOnlyDrivers::default()),
            [
                "volume \"shared\" (CSIDriver sharedresource.csi.inlineguard.dev)",
                "mount of \"shared\" in container \"app\"",
                "mount of \"shared\" in container \"init\"",
            ]
        );
        crate::read_only::force_read_only(&mut spec, &ReadOnlyDrivers::default(), crate::MountScope::WholePod);
        assert!(writable_read_only_volumes(&spec, &ReadOnlyDrivers::default()).is_empty());
    }

    #[test]
    fn volumes_of_other_drivers_and_other_mounts_are_not_named() {
        let spec = PodSpecView {
            volumes: vec![csi("other", "other.example.com", Some(false))],
            containers: vec![container("app", &[("other", None), ("shared", None)])],
            ..Default::default()
        };
        assert!(writable_read_only_volumes(&spec, &ReadOnlyDrivers::default()).is_empty());
    }

    #[test]
    fn the_message_names_a_few_places_and_counts_the_rest() {
        let writable: Vec<String> = (0..8).map(|i| format!("volume \"v{i}\" (CSIDriver d)")).collect();
        let message = not_forced_message("web", &writable);
        assert!(
            message.starts_with(
                "web has inline volumes that must be read-only but are not: volume \"v0\" (CSIDriver d), "
            )
        );
        assert!(message.contains("volume \"v4\" (CSIDriver d) and 3 more."), "{message}");
        assert!(!message.contains("\"v5\""));
        assert!(message.ends_with("(regenerate it with `csi-volume-admission webhooks`)"));
    }

    #[test]
    fn the_message_counts_nothing_more_when_it_names_every_place() {
        let writable: Vec<String> = (0..5).map(|i| format!("volume \"v{i}\" (CSIDriver d)")).collect();
        let message = not_forced_message("web", &writable);
        assert!(message.contains("volume \"v4\" (CSIDriver d). The read-only webhook"), "{message}");
        assert!(!message.contains("more"), "{message}");
    }
}
