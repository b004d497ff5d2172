//! NodeUnpublishVolume's work: the volume's own mount taken down (never a mount the driver did
//! not make), its own directories removed while empty, and the volume forgotten.

use tracing::warn;

use crate::quote::{Logged, quote};
use crate::volume::checked::Unpublish;
use crate::volume::error::{Error, Result};
use crate::volume::ownership::{Ownership, ownership};
use crate::volume::service::NodeService;
use crate::volume::target_dir;

impl NodeService {
    /// Unpublishes a checked request. A volume the driver does not hold at its target is
    /// already done; a mount the driver did not make is never unmounted.
    pub fn unpublish(&self, request: &Unpublish) -> Result<()> {
        let (volume_id, target) = (request.volume_id.as_str(), &request.target);
        let _operation = self.operation(Error::Handover)?;
        let _claim = self.claim(volume_id, target.as_path())?;
        let Some(volume) = self.live.published(volume_id).filter(|volume| volume.target == *target) else {
            // No record (never the driver's, or lost with its state directory): only a tmpfs
            // carrying this volume's own tag can be the driver's, and only that is taken down;
            // no directory is removed, since none is known to be the driver's.
            if let Ok(Some(opened)) = target_dir::open(self.kubelet_dir(), target)
                && let Ok(Ownership::Own) = ownership(self.mounter.as_ref(), &opened, volume_id, None)
            {
                self.mounter.unmount(&opened.target)?;
            }
            return Ok(());
        };
        if let Some(opened) = target_dir::open(self.kubelet_dir(), target)? {
            // Refused (FAILED_PRECONDITION) when another mount covers the volume's: kubelet
            // retries, and nothing of someone else's is taken down meanwhile.
            if self.holds_own_mount(&opened, volume_id, volume.record.device)? {
                self.mounter.unmount(&opened.target)?;
            }
        }
        // Unmounted, or never the driver's mount: its pages are no longer the driver's.
        self.budget.release(volume_id);
        for problem in self.take_down(&volume, false) {
            warn!(volume = %quote(volume_id), problem = %Logged(&problem), "unpublish left something");
        }
        // Unmounted above: a lazy volume's session ends as soon as the kernel lets go of it.
        self.live.forget(volume_id);
        self.metrics.set_stale_volumes(self.live.stale_count());
        self.content.gone(crate::content::Gone::Volume(volume_id));
        self.count_volumes();
        Ok(())
    }
}
