//! The parts of a pod spec that inline-volume admission reads (volumes, their CSI sources and
//! attributes, the runtime class, mount paths) and the mutating plugins write (`readOnly` on volumes
//! and mounts, injected volumes and mounts). Decoding only
//! these parts, skipping the rest without allocating, is what keeps a webhook answer within a few
//! microseconds; kube-apiserver has already validated the whole object before it calls a webhook.
//! Field names and JSON spellings are those of `core/v1` PodSpec.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// A pod spec, as admission sees it. Its text may borrow from the JSON it was read from (`'a`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpecView<'a> {
    /// `spec.volumes`.
    #[serde(deserialize_with = "nullable")]
    pub volumes: Vec<VolumeView<'a>>,
    /// `spec.containers`.
    #[serde(deserialize_with = "nullable")]
    pub containers: Vec<ContainerView<'a>>,
    /// `spec.initContainers`.
    #[serde(deserialize_with = "nullable")]
    pub init_containers: Vec<ContainerView<'a>>,
    /// `spec.ephemeralContainers`.
    #[serde(deserialize_with = "nullable")]
    pub ephemeral_containers: Vec<ContainerView<'a>>,
    /// `spec.runtimeClassName`.
    pub runtime_class_name: Option<Cow<'a, str>>,
    /// `spec.serviceAccountName`: whose access to a share is checked (`default` when absent, as
    /// the ServiceAccount admission plugin sets it).
    pub service_account_name: Option<Cow<'a, str>>,
}

/// One entry of `spec.volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeView<'a> {
    /// `name`.
    pub name: Cow<'a, str>,
    /// `csi`: present for inline CSI volumes only.
    pub csi: Option<CsiVolumeView<'a>>,
}

/// A volume's `csi` source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CsiVolumeView<'a> {
    /// `driver`.
    pub driver: Cow<'a, str>,
    /// `readOnly`.
    pub read_only: Option<bool>,
    /// `volumeAttributes`: what the driver is asked for. Only the shared-resource plugin reads
    /// them; another driver's are decoded (borrowed from the body, without copying) but never
    /// looked at.
    #[serde(deserialize_with = "nullable")]
    pub volume_attributes: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
}

/// A container, init container or ephemeral container, reduced to its mounts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerView<'a> {
    /// `name`.
    pub name: Cow<'a, str>,
    /// `volumeMounts`.
    #[serde(deserialize_with = "nullable")]
    pub volume_mounts: Vec<VolumeMountView<'a>>,
}

/// One entry of a container's `volumeMounts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeMountView<'a> {
    /// `name`: the volume mounted.
    pub name: Cow<'a, str>,
    /// `mountPath`: where share injection looks for a path already taken.
    pub mount_path: Cow<'a, str>,
    /// `readOnly`.
    pub read_only: Option<bool>,
    /// `subPath`: a path inside the volume mounted instead of its root; kubelet binds what it
    /// resolves to when the container starts, so later changes of the volume never reach it.
    #[serde(deserialize_with = "nullable")]
    pub sub_path: Cow<'a, str>,
    /// `subPathExpr`: the same, with the container's environment expanded into the path.
    #[serde(deserialize_with = "nullable")]
    pub sub_path_expr: Cow<'a, str>,
}

/// Text that no longer borrows from the body it was read from.
pub fn owned(text: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(text.into_owned())
}

fn owned_containers(containers: Vec<ContainerView<'_>>) -> Vec<ContainerView<'static>> {
    containers.into_iter().map(ContainerView::into_owned).collect()
}

impl PodSpecView<'_> {
    /// The same spec, owning its text: for a caller that keeps it past the body it was read from.
    pub fn into_owned(self) -> PodSpecView<'static> {
        PodSpecView {
            volumes: self.volumes.into_iter().map(VolumeView::into_owned).collect(),
            containers: owned_containers(self.containers),
            init_containers: owned_containers(self.init_containers),
            ephemeral_containers: owned_containers(self.ephemeral_containers),
            runtime_class_name: self.runtime_class_name.map(owned),
            service_account_name: self.service_account_name.map(owned),
        }
    }
}

impl VolumeView<'_> {
    /// The same volume, owning its text.
    pub fn into_owned(self) -> VolumeView<'static> {
        VolumeView {
            name: owned(self.name),
            csi: self.csi.map(|csi| CsiVolumeView {
                driver: owned(csi.driver),
                read_only: csi.read_only,
                volume_attributes: csi.volume_attributes.into_iter().map(|(k, v)| (owned(k), owned(v))).collect(),
            }),
        }
    }
}

impl ContainerView<'_> {
    /// The same container, owning its text.
    pub fn into_owned(self) -> ContainerView<'static> {
        ContainerView {
            name: owned(self.name),
            volume_mounts: self
                .volume_mounts
                .into_iter()
                .map(|mount| VolumeMountView {
                    name: owned(mount.name),
                    mount_path: owned(mount.mount_path),
                    read_only: mount.read_only,
                    sub_path: owned(mount.sub_path),
                    sub_path_expr: owned(mount.sub_path_expr),
                })
                .collect(),
        }
    }
}

/// `null` (what an empty YAML key decodes to) reads as the empty value, as in Kubernetes.
pub fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_what_admission_needs_and_skips_the_rest() {
        let spec: PodSpecView = serde_json::from_str(
            r#"{"containers":[{"name":"app","image":"x","env":[{"name":"A","value":"1"}],"volumeMounts":[{"name":"v","mountPath":"/v","readOnly":false,"subPath":"tls.crt"}]}],
                "volumes":[{"name":"v","csi":{"driver":"d","volumeAttributes":{"a":"b"}}},{"name":"p","projected":{"sources":[]}}],
                "initContainers":null,"runtimeClassName":"kata","nodeSelector":{"a":"b"}}"#,
        )
        .unwrap();
        assert_eq!(
            spec,
            PodSpecView {
                volumes: vec![
                    VolumeView {
                        name: "v".into(),
                        csi: Some(CsiVolumeView {
                            driver: "d".into(),
                            read_only: None,
                            volume_attributes: [("a".into(), "b".into())].into(),
                        }),
                    },
                    VolumeView { name: "p".into(), csi: None },
                ],
                containers: vec![ContainerView {
                    name: "app".into(),
                    volume_mounts: vec![VolumeMountView {
                        name: "v".into(),
                        mount_path: "/v".into(),
                        read_only: Some(false),
                        sub_path: "tls.crt".into(),
                        sub_path_expr: "".into(),
                    }],
                }],
                init_containers: vec![],
                ephemeral_containers: vec![],
                runtime_class_name: Some("kata".into()),
                service_account_name: None,
            }
        );
    }

    #[test]
    fn a_field_it_reads_must_have_the_right_type() {
        let error =
            serde_json::from_str::<PodSpecView>(r#"{"volumes":[{"name":"v","csi":{"driver":7}}]}"#).unwrap_err();
        assert!(error.to_string().starts_with("invalid type: integer `7`, expected a string"), "{error}");
    }

    #[test]
    fn an_owned_spec_keeps_everything_it_was_read_with() {
        let body = r#"{"volumes":[{"name":"v","csi":{"driver":"d","readOnly":true}}],
            "containers":[{"name":"app","volumeMounts":[{"name":"v","readOnly":false}]}],
            "initContainers":[{"name":"init","volumeMounts":[{"name":"v","subPathExpr":"$(POD)"}]}],
            "ephemeralContainers":[{"name":"debug","volumeMounts":[{"name":"v","readOnly":true}]}],
            "runtimeClassName":"kata"}"#
            .to_string();
        let borrowed: PodSpecView = serde_json::from_str(&body).unwrap();
        let owned: PodSpecView<'static> = borrowed.clone().into_owned();
        drop(body);
        assert_eq!(owned, borrowed_again());
        assert!(matches!(owned.volumes[0].name, Cow::Owned(_)));
        assert!(matches!(owned.containers[0].volume_mounts[0].name, Cow::Owned(_)));
        assert!(matches!(owned.init_containers[0].volume_mounts[0].sub_path_expr, Cow::Owned(_)));

        fn borrowed_again() -> PodSpecView<'static> {
            let mount =
                |name: &'static str, read_only| VolumeMountView { name: name.into(), read_only, ..Default::default() };
            PodSpecView {
                volumes: vec![VolumeView {
                    name: "v".into(),
                    csi: Some(CsiVolumeView { driver: "d".into(), read_only: Some(true), ..Default::default() }),
                }],
                containers: vec![ContainerView { name: "app".into(), volume_mounts: vec![mount("v", Some(false))] }],
                init_containers: vec![ContainerView {
                    name: "init".into(),
                    volume_mounts: vec![VolumeMountView { sub_path_expr: "$(POD)".into(), ..mount("v", None) }],
                }],
                ephemeral_containers: vec![ContainerView {
                    name: "debug".into(),
                    volume_mounts: vec![mount("v", Some(true))],
                }],
                runtime_class_name: Some("kata".into()),
                service_account_name: None,
            }
        }
    }
}
