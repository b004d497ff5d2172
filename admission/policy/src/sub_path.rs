//! The shared-resource driver's volumes mounted with `subPath` or `subPathExpr`: admitted, but
//! warned, because such a mount never follows the volume.
//!
//! kubelet resolves a sub path once, when the container starts, and bind-mounts what it found.
//! The driver replaces a volume's content by swapping the `..data` link to a new directory, so
//! the bound file or directory is the old one for as long as the container runs: an update
//! never reaches it, and neither does a revocation (the volume is emptied, the bound inode is
//! not). Users find this out in production (secrets-store-csi-driver #680); a warning at
//! admission says it while the manifest is still being written.

use sharedresource_api::DRIVER_NAME;
use sharedresource_api::quote::quote;

use crate::pod_spec::{ContainerView, PodSpecView};
use crate::shared_volumes::shared_volumes;

/// The warnings for `spec`: one per container mount of a shared-resource volume with a sub path,
/// containers first, then init and ephemeral containers, each in order. Empty (and
/// allocation-free) for a spec without a volume of the driver, the common case.
pub fn sub_path_warnings(spec: &PodSpecView<'_>) -> Vec<String> {
    let volumes = shared_volumes(spec);
    if volumes.is_empty() {
        return Vec::new();
    }
    let containers: [&[ContainerView<'_>]; 3] = [&spec.containers, &spec.init_containers, &spec.ephemeral_containers];
    let mut warnings = Vec::new();
    for container in containers.into_iter().flatten() {
        for mount in &container.volume_mounts {
            let (field, path) = if !mount.sub_path_expr.is_empty() {
                ("subPathExpr", &mount.sub_path_expr)
            } else if !mount.sub_path.is_empty() {
                ("subPath", &mount.sub_path)
            } else {
                continue;
            };
            // A volume the driver would refuse is refused by its own message; the refresh
            // setting of one it accepts decides what the mount misses.
            let Some(refresh) = volumes
                .iter()
                .find(|volume| volume.name == mount.name)
                .and_then(|volume| volume.attributes.as_ref().ok())
                .map(|attributes| attributes.refresh)
            else {
                continue;
            };
            warnings.push(sub_path_warning(&container.name, &mount.name, field, path, refresh));
        }
    }
    warnings
}

/// `container "app" mounts volume "db" of CSIDriver <driver> with subPath "tls.crt": it will
/// never see ...`. Its wording is part of the API (users grep for it); the path is quoted and
/// bounded.
pub fn sub_path_warning(container: &str, volume: &str, field: &str, path: &str, refresh: bool) -> String {
    let misses = if refresh {
        "it will never see an update or a revocation of the volume's content"
    } else {
        // refreshResource: "false" keeps content as published, but a revocation still empties
        // the volume: the one change such a mount would otherwise have seen.
        "it will keep the volume's content after the pod loses access to it"
    };
    format!(
        "container {container:?} mounts volume {volume:?} of CSIDriver {DRIVER_NAME} with {field} {}: {misses} \
         (kubelet binds what the path was when the container started); mount the volume without {field} and read \
         the file under its mountPath",
        quote(path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_spec::VolumeMountView;
    use crate::shared_volumes::tests::volume;

    fn mount(volume: &str, sub_path: &str, sub_path_expr: &str) -> VolumeMountView<'static> {
        VolumeMountView {
            name: volume.to_string().into(),
            mount_path: "/m".into(),
            sub_path: sub_path.to_string().into(),
            sub_path_expr: sub_path_expr.to_string().into(),
            ..Default::default()
        }
    }

    fn container(name: &str, mounts: Vec<VolumeMountView<'static>>) -> ContainerView<'static> {
        ContainerView { name: name.to_string().into(), volume_mounts: mounts }
    }

    #[test]
    fn each_sub_path_mount_of_the_driver_is_warned_with_what_it_misses() {
        let spec = PodSpecView {
            volumes: vec![
                volume("tls", DRIVER_NAME, &[("sharedSecret", "tls")]),
                volume("kept", DRIVER_NAME, &[("sharedConfigMap", "settings"), ("refreshResource", "false")]),
                volume("other", "csi.example.com", &[]),
                volume("typo", DRIVER_NAME, &[("sharedSecret", "tls"), ("refreshResouce", "false")]),
            ],
            containers: vec![container(
                "app",
                vec![
                    mount("tls", "tls.crt", ""),
                    mount("tls", "", ""),
                    mount("other", "x", ""),
                    mount("typo", "x", ""),
                    mount("missing", "x", ""),
                ],
            )],
            init_containers: vec![container("init", vec![mount("kept", "", "$(POD_NAME)")])],
            ephemeral_containers: vec![container("debug", vec![mount("tls", "a", "b")])],
            ..Default::default()
        };
        assert_eq!(
            sub_path_warnings(&spec),
            [
                "container \"app\" mounts volume \"tls\" of CSIDriver sharedresource.csi.inlineguard.dev with subPath \"tls.crt\": \
                 it will never see an update or a revocation of the volume's content (kubelet binds what the path was when the \
                 container started); mount the volume without subPath and read the file under its mountPath",
                "container \"init\" mounts volume \"kept\" of CSIDriver sharedresource.csi.inlineguard.dev with subPathExpr \
                 \"$(POD_NAME)\": it will keep the volume's content after the pod loses access to it (kubelet binds what the \
                 path was when the container started); mount the volume without subPathExpr and read the file under its mountPath",
                "container \"debug\" mounts volume \"tls\" of CSIDriver sharedresource.csi.inlineguard.dev with subPathExpr \"b\": \
                 it will never see an update or a revocation of the volume's content (kubelet binds what the path was when the \
                 container started); mount the volume without subPathExpr and read the file under its mountPath",
            ]
        );
    }

    #[test]
    fn a_long_or_hostile_path_is_quoted_and_bounded() {
        let warning = sub_path_warning("app", "v", "subPath", &format!("a\n%{}", "x".repeat(5000)), true);
        assert!(warning.contains("with subPath \"a\\n\\u{25}xxx"), "{warning}");
        assert!(warning.contains("... (5003 bytes)"), "{warning}");
        assert!(warning.len() < 700, "{}", warning.len());
    }

    #[test]
    fn a_spec_without_the_driver_or_without_sub_paths_is_not_warned() {
        let without_driver = PodSpecView {
            volumes: vec![volume("v", "csi.example.com", &[])],
            containers: vec![container("app", vec![mount("v", "x", "")])],
            ..Default::default()
        };
        assert!(sub_path_warnings(&without_driver).is_empty());
        let whole = PodSpecView {
            volumes: vec![volume("tls", DRIVER_NAME, &[("sharedSecret", "tls")])],
            containers: vec![container("app", vec![mount("tls", "", "")])],
            ..Default::default()
        };
        assert!(sub_path_warnings(&whole).is_empty());
    }
}
