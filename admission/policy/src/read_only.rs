//! Read-only forcing, the mutating half: every volume of a listed driver, and every mount of such a
//! volume, is made read-only. The object is changed in place and the same change is returned as a
//! minimal JSON Patch (one operation per field that was not already `true`).

use crate::patch::PatchOperation;
use crate::pod_spec::{ContainerView, PodSpecView};
use crate::settings::ReadOnlyDrivers;

/// Which parts of a pod may be changed by this request.
#[derive(Debug, Clone, Copy)]
pub enum MountScope<'a> {
    /// Pod CREATE: the volumes and the mounts of containers, init containers and ephemeral
    /// containers.
    WholePod,
    /// The `pods/ephemeralcontainers` subresource: everything else in the pod is immutable, so only
    /// the mounts of ephemeral containers not already present (by name) are touched.
    NewEphemeralContainers {
        /// Names of the ephemeral containers the pod already had.
        existing: &'a [&'a str],
    },
}

/// Forces `readOnly: true` on the pod spec at `/spec` and returns the JSON Patch that does the same
/// to the object as sent. An empty patch means nothing changed.
pub fn force_read_only(
    spec: &mut PodSpecView,
    drivers: &ReadOnlyDrivers,
    scope: MountScope<'_>,
) -> Vec<PatchOperation> {
    let mut patch = Vec::new();
    let mut forced_volumes: Vec<String> = Vec::new();
    for (index, volume) in spec.volumes.iter_mut().enumerate() {
        let Some(csi) = volume.csi.as_mut() else { continue };
        if !drivers.contains(&csi.driver) {
            continue;
        }
        forced_volumes.push(volume.name.clone());
        if matches!(scope, MountScope::WholePod) && csi.read_only != Some(true) {
            patch
                .push(PatchOperation::set_true(format!("/spec/volumes/{index}/csi/readOnly"), csi.read_only.is_some()));
            csi.read_only = Some(true);
        }
    }
    if forced_volumes.is_empty() {
        return patch;
    }

    let lists: [(&str, &mut Vec<ContainerView>); 3] = [
        ("containers", &mut spec.containers),
        ("initContainers", &mut spec.init_containers),
        ("ephemeralContainers", &mut spec.ephemeral_containers),
    ];
    for (list, containers) in lists {
        for (index, container) in containers.iter_mut().enumerate() {
            let may_change = match scope {
                MountScope::WholePod => true,
                MountScope::NewEphemeralContainers { existing } => {
                    list == "ephemeralContainers" && !existing.contains(&container.name.as_str())
                }
            };
            if may_change {
                force_mounts(container, &forced_volumes, &format!("/spec/{list}/{index}"), &mut patch);
            }
        }
    }
    patch
}

fn force_mounts(
    container: &mut ContainerView,
    forced_volumes: &[String],
    container_path: &str,
    patch: &mut Vec<PatchOperation>,
) {
    for (index, mount) in container.volume_mounts.iter_mut().enumerate() {
        if mount.read_only != Some(true) && forced_volumes.contains(&mount.name) {
            patch.push(PatchOperation::set_true(
                format!("{container_path}/volumeMounts/{index}/readOnly"),
                mount.read_only.is_some(),
            ));
            mount.read_only = Some(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::PatchOp;
    use crate::pod_spec::{CsiVolumeView, VolumeMountView, VolumeView};
    use crate::settings::SHARED_RESOURCE_DRIVER;

    fn csi(name: &str, driver: &str, read_only: Option<bool>) -> VolumeView {
        VolumeView { name: name.into(), csi: Some(CsiVolumeView { driver: driver.into(), read_only }) }
    }

    fn mount(name: &str, read_only: Option<bool>) -> VolumeMountView {
        VolumeMountView { name: name.into(), read_only }
    }

    fn container(name: &str, mounts: Vec<VolumeMountView>) -> ContainerView {
        ContainerView { name: name.into(), volume_mounts: mounts }
    }

    fn op(op: PatchOp, path: &str) -> PatchOperation {
        PatchOperation { op, path: path.into(), value: true }
    }

    fn sample() -> PodSpecView {
        PodSpecView {
            volumes: vec![
                csi("other", "other.example.com", None),
                csi("shared", SHARED_RESOURCE_DRIVER, None),
                csi("shared-rw", SHARED_RESOURCE_DRIVER, Some(false)),
            ],
            containers: vec![
                container("app", vec![mount("other", None), mount("shared", None), mount("shared-rw", Some(false))]),
                container("sidecar", vec![mount("shared", Some(true))]),
            ],
            init_containers: vec![container("init", vec![mount("shared", None)])],
            ephemeral_containers: vec![container("debug", vec![mount("shared-rw", None)])],
            ..Default::default()
        }
    }

    #[test]
    fn pod_create_forces_volumes_and_every_kind_of_container_mount() {
        let mut spec = sample();
        let patch = force_read_only(&mut spec, &ReadOnlyDrivers::default(), MountScope::WholePod);
        assert_eq!(
            patch,
            [
                op(PatchOp::Add, "/spec/volumes/1/csi/readOnly"),
                op(PatchOp::Replace, "/spec/volumes/2/csi/readOnly"),
                op(PatchOp::Add, "/spec/containers/0/volumeMounts/1/readOnly"),
                op(PatchOp::Replace, "/spec/containers/0/volumeMounts/2/readOnly"),
                op(PatchOp::Add, "/spec/initContainers/0/volumeMounts/0/readOnly"),
                op(PatchOp::Add, "/spec/ephemeralContainers/0/volumeMounts/0/readOnly"),
            ]
        );
        assert_eq!(spec.volumes[0].csi.as_ref().unwrap().read_only, None, "other drivers are untouched");
        assert_eq!(spec.volumes[2].csi.as_ref().unwrap().read_only, Some(true));
        assert_eq!(spec.containers[0].volume_mounts[0].read_only, None);
    }

    #[test]
    fn forcing_twice_yields_no_patch() {
        let mut spec = sample();
        force_read_only(&mut spec, &ReadOnlyDrivers::default(), MountScope::WholePod);
        let before = spec.clone();
        assert!(force_read_only(&mut spec, &ReadOnlyDrivers::default(), MountScope::WholePod).is_empty());
        assert_eq!(spec, before);
    }

    #[test]
    fn drivers_not_in_the_list_are_never_touched() {
        let mut spec = sample();
        let drivers = ReadOnlyDrivers(["unused.example.com".to_string()].into());
        assert!(force_read_only(&mut spec, &drivers, MountScope::WholePod).is_empty());
        assert_eq!(spec, sample());
    }

    #[test]
    fn ephemeral_container_update_touches_only_new_ephemeral_containers() {
        let mut spec = sample();
        spec.ephemeral_containers.push(container("debug-2", vec![mount("shared", Some(false))]));
        let patch = force_read_only(
            &mut spec,
            &ReadOnlyDrivers::default(),
            MountScope::NewEphemeralContainers { existing: &["debug"] },
        );
        assert_eq!(patch, [op(PatchOp::Replace, "/spec/ephemeralContainers/1/volumeMounts/0/readOnly")]);
    }
}
