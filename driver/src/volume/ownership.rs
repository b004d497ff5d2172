//! "Is this my mount?", asked in one place by publish, unpublish and recovery: the driver owns
//! only the tmpfs (or, for a lazy volume, the FUSE filesystem) it mounted for a volume, recognised by the device number its record keeps
//! (without reading the mount table) or else by the tag derived from the volume id.

use crate::volume::error::Result;
use crate::volume::mounter::{MountSource, Mounter};
use crate::volume::store::volume_digest;
use crate::volume::target_dir::OpenTarget;

/// The source name of the tmpfs or FUSE filesystem the driver mounts for `volume_id`: how it recognises its own
/// mount at a target.
pub fn mount_tag(volume_id: &str) -> String {
    format!("inline-guard:{}", &volume_digest(volume_id)[..32])
}

/// Whose mount is at a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// The tmpfs or FUSE filesystem the driver mounted for this volume.
    Own,
    /// A mount the driver did not make (never taken down).
    Foreign(MountSource),
    /// Nothing is mounted there.
    Unmounted,
}

/// Whose mount is at `opened`, for volume `volume_id` whose record saw device `device`.
pub fn ownership(
    mounter: &dyn Mounter,
    opened: &OpenTarget,
    volume_id: &str,
    device: Option<u64>,
) -> Result<Ownership> {
    // A device that cannot be read (a FUSE mount whose server is gone answers no stat) leaves
    // the question to the mount table.
    if let Some(device) = device
        && matches!(mounter.mount_device(&opened.parent, &opened.target), Ok(Some(seen)) if seen == device)
    {
        return Ok(Ownership::Own);
    }
    Ok(match mounter.mount_source(&opened.parent, &opened.target)? {
        None => Ownership::Unmounted,
        Some(source) if source.is(&mount_tag(volume_id)) => Ownership::Own,
        Some(source) => Ownership::Foreign(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::mounter::FakeMounter;
    use crate::volume::target_path::TargetPath;

    /// A kubelet target under `root`, opened, with nothing mounted on it.
    fn opened_target(root: &std::path::Path) -> (std::path::PathBuf, OpenTarget) {
        let text = root.join("pods/u/volumes/kubernetes.io~csi/v/mount");
        let target = TargetPath::parse(text.to_str().unwrap(), root).unwrap();
        let opened = crate::volume::target_dir::create(root, &target, &mut Vec::new()).unwrap();
        (text, opened)
    }

    #[test]
    fn the_tag_names_the_driver_and_one_volume() {
        let tag = mount_tag("csi-0123");
        assert!(tag.starts_with("inline-guard:") && tag.len() == "inline-guard:".len() + 32, "{tag}");
        assert_eq!(tag, mount_tag("csi-0123"), "the tag is the same at every ask");
        assert_ne!(tag, mount_tag("csi-0124"), "two volumes have two tags");
    }

    #[test]
    fn another_volumes_mount_is_foreign_and_its_own_volume_owns_it() {
        let root = tempfile::tempdir().unwrap();
        let (path, opened) = opened_target(root.path());
        let mounter = FakeMounter::default();
        assert_eq!(ownership(&mounter, &opened, "volume-a", None).unwrap(), Ownership::Unmounted);
        let a = MountSource { fs_type: "tmpfs".into(), source: mount_tag("volume-a") };
        mounter.mount_foreign(&path, a.clone());
        assert_eq!(ownership(&mounter, &opened, "volume-a", None).unwrap(), Ownership::Own);
        assert_eq!(ownership(&mounter, &opened, "volume-b", None).unwrap(), Ownership::Foreign(a.clone()));
        // A recorded device decides without the tag; a device that is not the mount's leaves it
        // to the tag.
        let device = mounter.mount_device(&opened.parent, &opened.target).unwrap().unwrap();
        assert_eq!(ownership(&mounter, &opened, "volume-b", Some(device)).unwrap(), Ownership::Own);
        assert_eq!(ownership(&mounter, &opened, "volume-b", Some(device + 1)).unwrap(), Ownership::Foreign(a));
        assert_eq!(ownership(&mounter, &opened, "volume-a", Some(device + 1)).unwrap(), Ownership::Own);
    }
}
