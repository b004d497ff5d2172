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

/// The containers of a pod spec, in the order forcing patches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerList {
    /// `spec.containers`.
    Containers,
    /// `spec.initContainers`.
    InitContainers,
    /// `spec.ephemeralContainers`.
    EphemeralContainers,
}

impl ContainerList {
    const ALL: [ContainerList; 3] =
        [ContainerList::Containers, ContainerList::InitContainers, ContainerList::EphemeralContainers];

    /// The field's JSON name.
    pub fn field(self) -> &'static str {
        match self {
            ContainerList::Containers => "containers",
            ContainerList::InitContainers => "initContainers",
            ContainerList::EphemeralContainers => "ephemeralContainers",
        }
    }

    pub(crate) fn of<'s, 'a>(self, spec: &'s PodSpecView<'a>) -> &'s [ContainerView<'a>] {
        match self {
            ContainerList::Containers => &spec.containers,
            ContainerList::InitContainers => &spec.init_containers,
            ContainerList::EphemeralContainers => &spec.ephemeral_containers,
        }
    }

    pub(crate) fn of_mut<'s, 'a>(self, spec: &'s mut PodSpecView<'a>) -> &'s mut [ContainerView<'a>] {
        match self {
            ContainerList::Containers => &mut spec.containers,
            ContainerList::InitContainers => &mut spec.init_containers,
            ContainerList::EphemeralContainers => &mut spec.ephemeral_containers,
        }
    }
}

/// A `readOnly` field that forcing sets to `true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritablePlace {
    /// `spec.volumes[volume].csi.readOnly`.
    Volume {
        /// Index in `spec.volumes`.
        volume: usize,
    },
    /// `spec.<list>[container].volumeMounts[mount].readOnly`.
    Mount {
        /// Which list of containers.
        list: ContainerList,
        /// Index in that list.
        container: usize,
        /// Index in the container's `volumeMounts`.
        mount: usize,
    },
}

/// Every `readOnly` field of `spec` that `scope` lets forcing change and that is not `true` yet:
/// the volumes of listed drivers, then their mounts in containers, init containers and
/// ephemeral containers. Forcing sets exactly these; the read-only check refuses a pod that
/// still has any.
pub fn writable_places(spec: &PodSpecView, drivers: &ReadOnlyDrivers, scope: MountScope<'_>) -> Vec<WritablePlace> {
    let mut places = Vec::new();
    let mut listed_volumes: Vec<&str> = Vec::new();
    for (index, volume) in spec.volumes.iter().enumerate() {
        let Some(csi) = &volume.csi else { continue };
        if !drivers.contains(&csi.driver) {
            continue;
        }
        listed_volumes.push(&volume.name);
        if matches!(scope, MountScope::WholePod) && csi.read_only != Some(true) {
            places.push(WritablePlace::Volume { volume: index });
        }
    }
    if listed_volumes.is_empty() {
        return places;
    }
    for list in ContainerList::ALL {
        for (container_index, container) in list.of(spec).iter().enumerate() {
            let may_change = match scope {
                MountScope::WholePod => true,
                MountScope::NewEphemeralContainers { existing } => {
                    list == ContainerList::EphemeralContainers && !existing.contains(&&*container.name)
                }
            };
            if !may_change {
                continue;
            }
            for (mount_index, mount) in container.volume_mounts.iter().enumerate() {
                if mount.read_only != Some(true) && listed_volumes.contains(&&*mount.name) {
                    places.push(WritablePlace::Mount { list, container: container_index, mount: mount_index });
                }
            }
        }
    }
    places
}

/// Forces `readOnly: true` on the pod spec at `/spec` and returns the JSON Patch that does the same
/// to the object as sent. An empty patch means nothing changed.
pub fn force_read_only(
    spec: &mut PodSpecView,
    drivers: &ReadOnlyDrivers,
    scope: MountScope<'_>,
) -> Vec<PatchOperation> {
    let places = writable_places(spec, drivers, scope);
    let mut patch = Vec::with_capacity(places.len());
    for place in places {
        let (path, read_only) = match place {
            // The places index this same spec, so every lookup finds its field.
            WritablePlace::Volume { volume } => {
                let Some(csi) = spec.volumes.get_mut(volume).and_then(|v| v.csi.as_mut()) else { continue };
                (format!("/spec/volumes/{volume}/csi/readOnly"), &mut csi.read_only)
            }
            WritablePlace::Mount { list, container, mount } => {
                let field = list.field();
                let containers = list.of_mut(spec);
                let Some(entry) = containers.get_mut(container).and_then(|c| c.volume_mounts.get_mut(mount)) else {
                    continue;
                };
                (format!("/spec/{field}/{container}/volumeMounts/{mount}/readOnly"), &mut entry.read_only)
            }
        };
        patch.push(PatchOperation::set_true(path, read_only.is_some()));
        *read_only = Some(true);
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::PatchOp;
    use crate::pod_spec::{CsiVolumeView, VolumeMountView, VolumeView};
    use crate::settings::SHARED_RESOURCE_DRIVER;

    fn csi<'a>(name: &'a str, driver: &'a str, read_only: Option<bool>) -> VolumeView<'a> {
        VolumeView {
            name: name.into(),
            csi: Some(CsiVolumeView { driver: driver.into(), read_only, ..Default::default() }),
        }
    }

    fn mount(name: &str, read_only: Option<bool>) -> VolumeMountView<'_> {
        VolumeMountView { name: name.into(), read_only, ..Default::default() }
    }

    fn container<'a>(name: &'a str, mounts: Vec<VolumeMountView<'a>>) -> ContainerView<'a> {
        ContainerView { name: name.into(), volume_mounts: mounts }
    }

    fn op(op: PatchOp, path: &str) -> PatchOperation {
        PatchOperation { op, path: path.into(), value: crate::patch::PatchValue::Bool(true) }
    }

    fn sample() -> PodSpecView<'static> {
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
