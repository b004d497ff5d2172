//! The shared-resource driver's rules at admission, decided on the pod spec alone: each inline
//! volume of the driver is checked by the driver's own vocabulary (`sharedresource-api`), so a
//! pod the driver would refuse at mount is refused at creation, in the driver's words.

use sharedresource_api::{DRIVER_NAME, Invalid, VolumeAttributes};

use crate::pod_spec::PodSpecView;

/// One inline volume of the shared-resource driver, its attributes checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedVolume<'s> {
    /// The volume's name in the pod spec.
    pub name: &'s str,
    /// What it mounts, or why the driver would refuse it.
    pub attributes: Result<VolumeAttributes, Invalid>,
}

/// The spec's volumes of the shared-resource driver, in order; empty (and allocation-free) for a
/// spec without one, the common case.
pub fn shared_volumes<'s>(spec: &'s PodSpecView<'_>) -> Vec<SharedVolume<'s>> {
    spec.volumes
        .iter()
        .filter_map(|volume| {
            let csi = volume.csi.as_ref().filter(|csi| csi.driver == DRIVER_NAME)?;
            Some(SharedVolume { name: &volume.name, attributes: VolumeAttributes::parse(&csi.volume_attributes) })
        })
        .collect()
}

/// `<object> has volumes the shared-resource driver would refuse at mount: volume "v": <why>;
/// ...`, for each `(volume, why)` in `refused`; `None` when there is none.
pub fn refusal_message(object: &str, refused: &[(&str, String)]) -> Option<String> {
    if refused.is_empty() {
        return None;
    }
    let each: Vec<String> = refused.iter().map(|(volume, why)| format!("volume {volume:?}: {why}")).collect();
    Some(format!("{object} has volumes the shared-resource driver would refuse at mount: {}", each.join("; ")))
}

#[cfg(test)]
pub(crate) mod tests {
    use sharedresource_api::{ObjectName, Selection, ShareKind};

    use super::*;
    use crate::pod_spec::{CsiVolumeView, VolumeView};

    /// An inline CSI volume of `driver`, read-only, with `attributes`.
    pub(crate) fn volume(name: &str, driver: &str, attributes: &[(&str, &str)]) -> VolumeView<'static> {
        let volume_attributes = attributes.iter().map(|(k, v)| (k.to_string().into(), v.to_string().into())).collect();
        VolumeView {
            name: name.to_string().into(),
            csi: Some(CsiVolumeView { driver: driver.to_string().into(), read_only: Some(true), volume_attributes }),
        }
    }

    #[test]
    fn only_the_drivers_volumes_are_checked_and_each_refusal_is_named() {
        let spec = PodSpecView {
            volumes: vec![
                volume("db", DRIVER_NAME, &[("sharedSecret", "db")]),
                volume("other", "csi.example.com", &[("anything", "goes")]),
                volume("typo", DRIVER_NAME, &[("sharedSecret", "db"), ("refreshResouce", "false")]),
                VolumeView { name: "empty".into(), csi: None },
                volume("none", DRIVER_NAME, &[]),
            ],
            ..Default::default()
        };
        let volumes = shared_volumes(&spec);
        assert_eq!(volumes.iter().map(|v| v.name).collect::<Vec<_>>(), ["db", "typo", "none"]);
        let db = ObjectName::parse("db").unwrap();
        assert_eq!(volumes[0].attributes.as_ref().map(|a| &a.selection), Ok(&Selection::Share(ShareKind::Secret, db)));
        let refused: Vec<(&str, String)> =
            volumes.iter().filter_map(|v| Some((v.name, v.attributes.as_ref().err()?.0.clone()))).collect();
        assert_eq!(
            refusal_message("web", &refused).as_deref(),
            Some(
                "web has volumes the shared-resource driver would refuse at mount: \
                 volume \"typo\": volumeAttributes[\"refreshResouce\"] is not an attribute of this driver: a sharedSecret volume takes \"sharedSecret\", \"refreshResource\" and \"optional\" only; \
                 volume \"none\": volumeAttributes lacks \"sharedSecret\", \"sharedConfigMap\" or \"projection\": name what to mount"
            )
        );
    }

    #[test]
    fn a_spec_without_the_driver_has_nothing_to_refuse() {
        let spec = PodSpecView { volumes: vec![volume("v", "csi.example.com", &[])], ..Default::default() };
        let volumes = shared_volumes(&spec);
        assert!(volumes.is_empty());
        assert_eq!(refusal_message("web", &[]), None);
    }
}
