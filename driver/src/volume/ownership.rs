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
