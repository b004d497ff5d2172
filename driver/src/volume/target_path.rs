//! What a NodePublishVolume / NodeUnpublishVolume target may be: kubelet's directory for a CSI
//! inline volume, `<kubeletDir>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount`, spelled
//! one way (absolute, no `.`, `..` or empty components). Pure: the path is only read as text
//! here; `target_dir` then walks it without following a symlink.

use std::path::{Path, PathBuf};

use crate::quote::{quote, quote_path};
use crate::volume::error::{Error, Result};

/// The longest target accepted (Linux's PATH_MAX).
const MAX_TARGET_BYTES: usize = 4096;
/// The longest name of one directory (Linux's NAME_MAX).
const MAX_COMPONENT_BYTES: usize = 255;
/// kubelet's directory of a pod's CSI volumes, below `pods/<uid>/`.
const CSI_VOLUMES: [&str; 2] = ["volumes", "kubernetes.io~csi"];
/// The last element of every CSI volume's target.
const MOUNT: &str = "mount";

/// A target that passed every check: the directory elements below the kubelet root, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetPath {
    full: PathBuf,
    below_root: Vec<String>,
}

impl TargetPath {
    /// Checks `target` against kubelet's layout under `kubelet_dir` (itself absolute and
    /// normalized, as the configuration guarantees).
    pub fn parse(target: &str, kubelet_dir: &Path) -> Result<TargetPath> {
        let invalid = |why: String| Err(Error::Refused(format!("target_path {} {why}", quote(target))));
        if target.len() > MAX_TARGET_BYTES {
            return invalid(format!("is longer than {MAX_TARGET_BYTES} bytes"));
        }
        if target.contains('\0') {
            return invalid("contains a NUL byte".into());
        }
        if !target.starts_with('/') {
            return invalid("is not an absolute path".into());
        }
        let components: Vec<&str> = target[1..].split('/').collect();
        if components.iter().any(|c| c.is_empty() || *c == "." || *c == "..") {
            return invalid("is not normalized: it has \".\", \"..\" or empty elements".into());
        }
        if let Some(long) = components.iter().find(|c| c.len() > MAX_COMPONENT_BYTES) {
            return invalid(format!("has an element longer than {MAX_COMPONENT_BYTES} bytes: {}", quote(long)));
        }
        let root: Vec<String> = kubelet_dir
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let outside = || {
            invalid(format!(
                "is not a CSI inline volume's directory under the kubelet root: expected {}/pods/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount",
                quote_path(kubelet_dir).trim_matches('"')
            ))
        };
        if components.len() != root.len() + 6 || !components.iter().zip(&root).all(|(c, r)| c == r) {
            return outside();
        }
        let below: Vec<&str> = components[root.len()..].to_vec();
        let layout = below[0] == "pods" && below[2..4] == CSI_VOLUMES && below[5] == MOUNT;
        if !layout {
            return outside();
        }
        for (what, name) in [("pod uid", below[1]), ("volume name", below[4])] {
            if !is_plain_name(name) {
                return invalid(format!(
                    "has a {what} {} that is not a plain name (letters, digits, '-', '_' and '.', not first)",
                    quote(name)
                ));
            }
        }
        Ok(TargetPath { full: PathBuf::from(target), below_root: below.into_iter().map(String::from).collect() })
    }

    /// The whole path, as kubelet sent it.
    pub fn as_path(&self) -> &Path {
        &self.full
    }

    /// The pod's name for the volume: kubelet's directory of it, `<volume>` in the layout.
    pub fn volume_name(&self) -> &str {
        &self.below_root[4]
    }

    /// The directory elements below the kubelet root: `pods`, the pod uid, `volumes`,
    /// `kubernetes.io~csi`, the volume name, `mount`.
    pub fn below_root(&self) -> &[String] {
        &self.below_root
    }
}

/// A pod uid (a UUID, or a hash for static pods) or a volume name (a DNS label) as kubelet
/// writes them into its paths.
fn is_plain_name(name: &str) -> bool {
    !name.starts_with('.') && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/var/lib/kubelet";
    const GOOD: &str = "/var/lib/kubelet/pods/0c5e/volumes/kubernetes.io~csi/shared/mount";

    #[test]
    fn a_good_target_names_its_volume_and_its_elements_below_the_root() {
        let target = TargetPath::parse(GOOD, Path::new(ROOT)).unwrap();
        assert_eq!(target.as_path(), Path::new(GOOD));
        assert_eq!(target.volume_name(), "shared");
        assert_eq!(target.below_root(), ["pods", "0c5e", "volumes", "kubernetes.io~csi", "shared", "mount"]);
    }

    fn message(target: &str) -> String {
        match TargetPath::parse(target, Path::new(ROOT)) {
            Err(Error::Refused(message)) => message,
            other => panic!("{target}: expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[test]
    fn kubelets_layout_is_accepted() {
        let target = TargetPath::parse(GOOD, Path::new(ROOT)).unwrap();
        assert_eq!(target.as_path(), Path::new(GOOD));
        assert_eq!(target.below_root(), ["pods", "0c5e", "volumes", "kubernetes.io~csi", "shared", "mount"]);
        let at_slash = TargetPath::parse("/pods/u/volumes/kubernetes.io~csi/v/mount", Path::new("/")).unwrap();
        assert_eq!(at_slash.below_root().len(), 6);
    }

    #[test]
    fn every_other_form_is_refused_naming_the_path() {
        let outside = "is not a CSI inline volume's directory under the kubelet root: expected /var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount";
        struct Case {
            target: &'static str,
            why: &'static str,
        }
        let not_normal = "is not normalized: it has \".\", \"..\" or empty elements";
        for case in [
            Case { target: "pods/u/volumes/kubernetes.io~csi/v/mount", why: "is not an absolute path" },
            Case { target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/../v/mount", why: not_normal },
            Case { target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/./mount", why: not_normal },
            Case { target: "/var/lib/kubelet//pods/u/volumes/kubernetes.io~csi/v/mount", why: not_normal },
            Case { target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount/", why: not_normal },
            Case { target: "/etc", why: outside },
            Case { target: "/var/lib/kubelet", why: outside },
            Case { target: "/var/lib/kubeletX/pods/u/volumes/kubernetes.io~csi/v/mount", why: outside },
            Case { target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~secret/v/mount", why: outside },
            Case { target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/data", why: outside },
            Case { target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount/deeper", why: outside },
            Case { target: "/var/lib/kubelet/plugins/u/volumes/kubernetes.io~csi/v/mount", why: outside },
            Case { target: "/var/lib/kubelet/pods/u/v\0/kubernetes.io~csi/v/mount", why: "contains a NUL byte" },
            Case {
                target: "/var/lib/kubelet/pods/..u/volumes/kubernetes.io~csi/v/mount",
                why: "has a pod uid \"..u\" that is not a plain name (letters, digits, '-', '_' and '.', not first)",
            },
            Case {
                target: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v\nforged/mount",
                why: "has a volume name \"v\\nforged\" that is not a plain name (letters, digits, '-', '_' and '.', not first)",
            },
        ] {
            assert_eq!(message(case.target), format!("target_path {:?} {}", case.target, case.why));
        }
    }

    #[test]
    fn huge_targets_are_refused_with_a_bounded_message() {
        let huge = format!("/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/v/mount", "u".repeat(1 << 20));
        let refused = message(&huge);
        assert!(refused.len() < 400, "{}", refused.len());
        assert!(refused.ends_with("is longer than 4096 bytes"), "{refused}");
        let long_element = format!("/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/v/mount", "u".repeat(300));
        assert!(message(&long_element).contains("has an element longer than 255 bytes"));
    }

    #[test]
    fn targets_and_elements_may_reach_linux_limits_but_not_pass_them() {
        let volume = "v".repeat(255);
        let at_limit = format!("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/{volume}/mount");
        assert!(TargetPath::parse(&at_limit, Path::new(ROOT)).is_ok());
        let over = format!("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/{volume}v/mount");
        assert!(message(&over).contains("has an element longer than 255 bytes"));

        // A kubelet root deep enough that its target is exactly PATH_MAX long.
        let tail = "/pods/u/volumes/kubernetes.io~csi/v/mount";
        let depth = (4096 - tail.len()) / 2;
        let mut root = "/d".repeat(depth);
        root.push_str(&"x".repeat(4096 - tail.len() - root.len()));
        let target = format!("{root}{tail}");
        assert_eq!(target.len(), 4096);
        assert!(TargetPath::parse(&target, Path::new(&root)).is_ok());
        let longer_root = format!("{root}x");
        let refused = TargetPath::parse(&format!("{longer_root}{tail}"), Path::new(&longer_root)).unwrap_err();
        assert!(refused.to_string().ends_with("is longer than 4096 bytes"), "{refused}");
    }
}
