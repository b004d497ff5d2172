//! NodePublishVolume and NodeUnpublishVolume requests checked in a fixed order, each failure
//! with the specification's code and a message that says what to change. The readonly refusal is the driver's half of the
//! two-sided guarantee: even where the mutating webhook is not deployed, no container gets a
//! writable view of shared content.

use std::path::Path;

use inline_guard_proto::csi::v1::volume_capability::AccessType;
use inline_guard_proto::csi::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};

use crate::content::ask::PublishSecrets;
use crate::content::ask::{PodInfo, VolumeAsk};
use crate::content::tokens::Tokens;
use crate::csi::error::{Error, Result};
use crate::quote::quote;
use crate::volume::checked::{Publish, Unpublish};
use crate::volume::target_path::TargetPath;

/// `"true"` for inline ephemeral volumes (kubelet sets it).
pub const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The pod's name (kubelet sets it when the CSIDriver has `podInfoOnMount: true`).
pub const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// The pod's namespace.
pub const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// The pod's UID.
pub const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
/// The pod's service account.
pub const SERVICE_ACCOUNT_NAME: &str = "csi.storage.k8s.io/serviceAccount.name";
/// Every key kubelet reserves in the volume context; never treated as a volume attribute (the
/// service-account tokens key among them must never be logged or stored).
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// Checks `request` in the order: volume_id, target_path (present, then kubelet's layout under
/// `kubelet_dir`), volume_capability, access type, ephemeral, pod information, readonly, tokens.
pub fn check(request: &NodePublishVolumeRequest, kubelet_dir: &Path) -> Result<Publish> {
    let invalid = |message: String| Err(Error::Request(message));
    check_volume_id(&request.volume_id)?;
    if request.target_path.is_empty() {
        return invalid("target_path is required".into());
    }
    let target = TargetPath::parse(&request.target_path, kubelet_dir)?;
    let Some(capability) = &request.volume_capability else {
        return invalid("volume_capability is required".into());
    };
    let (mount_flags, mount_group) = match &capability.access_type {
        Some(AccessType::Mount(mount)) => (mount.mount_flags.clone(), mount_group(&mount.volume_mount_group)?),
        Some(AccessType::Block(_)) => {
            return invalid("block access is not supported: this driver serves files, use a filesystem volume".into());
        }
        None => return invalid("volume_capability.access_type is required (mount)".into()),
    };
    let context = &request.volume_context;
    if context.get(EPHEMERAL).map(String::as_str) != Some("true") {
        return invalid(format!(
            "only inline ephemeral volumes are supported: volume_context[{EPHEMERAL:?}] must be \"true\" (declare the volume in the pod's spec.volumes[].csi)"
        ));
    }
    check_pod_information(context)?;
    if !request.readonly {
        return invalid(
            "this driver only publishes read-only volumes: set readOnly: true on the pod's csi volume".into(),
        );
    }
    let tokens = Tokens::from_volume_context(context)?;
    let value = |key: &str| context.get(key).cloned().unwrap_or_default();
    let ask = VolumeAsk {
        volume_id: request.volume_id.clone(),
        volume_name: target.volume_name().to_string(),
        mount_point: target.as_path().to_path_buf(),
        pod: PodInfo {
            name: value(POD_NAME),
            namespace: value(POD_NAMESPACE),
            uid: value(POD_UID),
            service_account: value(SERVICE_ACCOUNT_NAME),
        },
        attributes: context
            .iter()
            .filter(|(key, _)| !key.starts_with(KUBELET_PREFIX))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
        tokens,
        secrets: PublishSecrets::new(request.secrets.clone()),
        object_versions: Default::default(),
    };
    Ok(Publish { target, mount_flags, mount_group, ask })
}

/// Checks `request` in the order: volume_id, target_path (present, then kubelet's layout under
/// `kubelet_dir`).
pub fn check_unpublish(request: &NodeUnpublishVolumeRequest, kubelet_dir: &Path) -> Result<Unpublish> {
    check_volume_id(&request.volume_id)?;
    if request.target_path.is_empty() {
        return Err(Error::Request("target_path is required".into()));
    }
    let target = TargetPath::parse(&request.target_path, kubelet_dir)?;
    Ok(Unpublish { volume_id: request.volume_id.clone(), target })
}

/// The longest volume id accepted: far above kubelet's (`csi-` and 64 hex digits) and CSI's
/// advised 128 bytes, low enough that a record stays small.
const MAX_VOLUME_ID_BYTES: usize = 4096;

/// A volume id is required, and bounded.
fn check_volume_id(volume_id: &str) -> Result<()> {
    if volume_id.is_empty() {
        return Err(Error::Request("volume_id is required".into()));
    }
    if volume_id.len() > MAX_VOLUME_ID_BYTES {
        return Err(Error::Request(format!(
            "volume_id {} is longer than {MAX_VOLUME_ID_BYTES} bytes",
            quote(volume_id)
        )));
    }
    Ok(())
}

/// The volume capability's `volume_mount_group` (kubelet passes the pod's `fsGroup` there,
/// since the driver has the VOLUME_MOUNT_GROUP capability): empty for none, else a group id.
fn mount_group(text: &str) -> Result<Option<u32>> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u32>().map(Some).map_err(|_| {
        Error::Request(format!(
            "volume_capability.mount.volume_mount_group {} is not a group id (a number, the pod's fsGroup)",
            quote(text)
        ))
    })
}

/// kubelet's pod information is in `context` (the CSIDriver's `podInfoOnMount: true`), the
/// service account's name included.
fn check_pod_information(context: &std::collections::HashMap<String, String>) -> Result<()> {
    let invalid = |message: String| Err(Error::Request(message));
    let missing: Vec<&str> = [POD_NAME, POD_NAMESPACE, POD_UID, SERVICE_ACCOUNT_NAME]
        .into_iter()
        .filter(|key| context.get(*key).is_none_or(|value| value.is_empty()))
        .collect();
    if missing == [SERVICE_ACCOUNT_NAME] {
        // podInfoOnMount is on (the other keys came): the pod itself has no service account, as
        // when the ServiceAccount admission plugin is off and the pod names none.
        return invalid(format!(
            "volume_context[{SERVICE_ACCOUNT_NAME:?}] is empty: the pod runs without a service account, and access to a share is granted to one (set spec.serviceAccountName, or enable the ServiceAccount admission plugin)"
        ));
    }
    if !missing.is_empty() {
        return invalid(format!(
            "volume_context lacks the pod information {}: set podInfoOnMount: true on the CSIDriver",
            missing.join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use inline_guard_proto::csi::v1::VolumeCapability;
    use inline_guard_proto::csi::v1::volume_capability::{AccessMode, BlockVolume, MountVolume};

    use super::*;

    fn valid() -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: "csi-8d2c".into(),
            target_path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/shared/mount".into(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode { mode: 2 }),
            }),
            readonly: true,
            volume_context: [
                (EPHEMERAL, "true"),
                (POD_NAME, "web"),
                (POD_NAMESPACE, "apps"),
                (POD_UID, "0c5e"),
                (SERVICE_ACCOUNT_NAME, "web-sa"),
                ("csi.storage.k8s.io/serviceAccount.tokens", "{\"vault\":{\"token\":\"s3cret-token\"}}"),
                ("sharedConfigMap", "cluster-ca"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }
    }

    fn with_mount_group(group: &str) -> NodePublishVolumeRequest {
        let mut request = valid();
        let mount = MountVolume { volume_mount_group: group.into(), ..MountVolume::default() };
        request.volume_capability.as_mut().unwrap().access_type = Some(AccessType::Mount(mount));
        request
    }

    #[test]
    fn the_pods_fs_group_is_the_volume_mount_group_kubelet_passes() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(check(&with_mount_group("2000"), root).unwrap().mount_group, Some(2000));
        assert_eq!(check(&with_mount_group(""), root).unwrap().mount_group, None, "no fsGroup");
        assert_eq!(
            message(&with_mount_group("wheel")),
            "volume_capability.mount.volume_mount_group \"wheel\" is not a group id (a number, the pod's fsGroup)"
        );
        assert!(message(&with_mount_group("-1")).contains("is not a group id"));
    }

    fn message(request: &NodePublishVolumeRequest) -> String {
        let status = match check(request, Path::new("/var/lib/kubelet")) {
            Err(error) => tonic::Status::from(error),
            Ok(checked) => panic!("expected INVALID_ARGUMENT, the request passed: {checked:?}"),
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{}", status.message());
        status.message().to_string()
    }

    #[test]
    fn a_valid_request_yields_the_pod_and_only_the_user_attributes() {
        let checked = check(&valid(), Path::new("/var/lib/kubelet")).unwrap();
        assert_eq!(
            checked.ask.pod,
            PodInfo {
                name: "web".into(),
                namespace: "apps".into(),
                uid: "0c5e".into(),
                service_account: "web-sa".into()
            }
        );
        assert_eq!(checked.ask.attributes, [("sharedConfigMap".to_string(), "cluster-ca".to_string())].into());
        assert_eq!(checked.ask.tokens.get("vault"), Some("s3cret-token"));
        let debug = format!("{checked:?}");
        assert!(!debug.contains("s3cret"), "tokens never reach a log line: {debug}");
        assert!(debug.contains("\"vault\""), "the audiences do: {debug}");
    }

    #[test]
    fn each_check_in_order_with_its_message() {
        struct Case {
            name: &'static str,
            break_it: fn(&mut NodePublishVolumeRequest),
            expected: &'static str,
        }
        let cases = [
            Case { name: "volume_id", break_it: |r| r.volume_id.clear(), expected: "volume_id is required" },
            Case { name: "target_path", break_it: |r| r.target_path.clear(), expected: "target_path is required" },
            Case {
                name: "target layout",
                break_it: |r| r.target_path = "/etc".into(),
                expected: "target_path \"/etc\" is not a CSI inline volume's directory under the kubelet root: expected /var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount",
            },
            Case {
                name: "capability",
                break_it: |r| r.volume_capability = None,
                expected: "volume_capability is required",
            },
            Case {
                name: "block",
                break_it: |r| {
                    r.volume_capability.as_mut().unwrap().access_type = Some(AccessType::Block(BlockVolume {}))
                },
                expected: "block access is not supported: this driver serves files, use a filesystem volume",
            },
            Case {
                name: "not ephemeral",
                break_it: |r| {
                    r.volume_context.remove(EPHEMERAL);
                },
                expected: "only inline ephemeral volumes are supported: volume_context[\"csi.storage.k8s.io/ephemeral\"] must be \"true\" (declare the volume in the pod's spec.volumes[].csi)",
            },
            Case {
                name: "pod info",
                break_it: |r| {
                    r.volume_context.remove(POD_UID);
                    r.volume_context.insert(SERVICE_ACCOUNT_NAME.into(), String::new());
                },
                expected: "volume_context lacks the pod information csi.storage.k8s.io/pod.uid, csi.storage.k8s.io/serviceAccount.name: set podInfoOnMount: true on the CSIDriver",
            },
            Case {
                name: "no service account",
                break_it: |r| {
                    r.volume_context.insert(SERVICE_ACCOUNT_NAME.into(), String::new());
                },
                expected: "volume_context[\"csi.storage.k8s.io/serviceAccount.name\"] is empty: the pod runs without a service account, and access to a share is granted to one (set spec.serviceAccountName, or enable the ServiceAccount admission plugin)",
            },
            Case {
                name: "readonly",
                break_it: |r| r.readonly = false,
                expected: "this driver only publishes read-only volumes: set readOnly: true on the pod's csi volume",
            },
        ];
        for case in &cases {
            let mut request = valid();
            (case.break_it)(&mut request);
            assert_eq!(message(&request), case.expected, "{}", case.name);
        }
        // With everything broken at once, the first check in the order is the one reported.
        let mut request = valid();
        for case in cases.iter().rev() {
            (case.break_it)(&mut request);
        }
        assert_eq!(message(&request), "volume_id is required");
    }

    #[test]
    fn a_huge_volume_id_is_refused_quoting_only_its_start() {
        let mut request = valid();
        request.volume_id = "v".repeat(1 << 20);
        let refused = message(&request);
        assert_eq!(refused, format!("volume_id \"{}\"... (1048576 bytes) is longer than 4096 bytes", "v".repeat(256)));
        request.volume_id = "v".repeat(4096);
        check(&request, Path::new("/var/lib/kubelet")).unwrap();
    }

    #[test]
    fn an_unpublish_is_checked_at_the_wire_in_order_as_a_publish_is() {
        let root = Path::new("/var/lib/kubelet");
        let valid = || NodeUnpublishVolumeRequest {
            volume_id: "csi-8d2c".into(),
            target_path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/shared/mount".into(),
        };
        let checked = check_unpublish(&valid(), root).unwrap();
        assert_eq!(checked.volume_id, "csi-8d2c");
        assert_eq!(checked.target.as_path(), Path::new(&valid().target_path));
        let refusal = |request: NodeUnpublishVolumeRequest| match check_unpublish(&request, root) {
            Err(Error::Request(message)) => message,
            other => panic!("expected a refused request, got {other:?}"),
        };
        assert_eq!(
            refusal(NodeUnpublishVolumeRequest { volume_id: String::new(), ..valid() }),
            "volume_id is required"
        );
        assert_eq!(
            refusal(NodeUnpublishVolumeRequest { volume_id: String::new(), target_path: String::new() }),
            "volume_id is required",
            "the volume id is checked first"
        );
        assert!(
            refusal(NodeUnpublishVolumeRequest { volume_id: "v".repeat(4097), ..valid() })
                .ends_with("is longer than 4096 bytes")
        );
        assert_eq!(
            refusal(NodeUnpublishVolumeRequest { target_path: String::new(), ..valid() }),
            "target_path is required"
        );
        let outside = NodeUnpublishVolumeRequest { target_path: "/etc/mount".into(), ..valid() };
        assert!(check_unpublish(&outside, root).is_err(), "a target outside kubelet's layout is refused");
    }
}
