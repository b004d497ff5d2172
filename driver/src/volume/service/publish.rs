//! NodePublishVolume's work: a republish of a volume in place (new tokens written, a stale
//! volume refreshed), or a new volume built in steps each noted as soon as done, so that a
//! failure undoes exactly what was made.

use std::path::PathBuf;
use std::sync::Arc;

use tracing::warn;

use crate::content::{Opened, Opening, Shown};
use crate::quote::{Logged, quote, quote_path};
use crate::volume::atomic_writer::check_key;
use crate::volume::checked::Publish;
use crate::volume::content_budget::{LAZY_VOLUME_BYTES, LazyCharge};
use crate::volume::error::{Error, Result};
use crate::volume::lazy::LazyMount;
use crate::volume::ownership::mount_tag;
use crate::volume::published::PublishedVolume;
use crate::volume::service::{NodeService, payer_of};
use crate::volume::store::VolumeRecord;
use crate::volume::target_dir::{self, OpenTarget};
use crate::volume::target_path::TargetPath;
use sharedresource_api::volume_attributes::PROJECTION_ATTRIBUTE;

/// What a publish has made so far: directories, its mount, that mount's device once seen, and
/// the FUSE session serving a lazy volume.
struct Made {
    dirs: Vec<PathBuf>,
    mounted: bool,
    device: Option<u64>,
    serving: Option<LazyMount>,
}

impl NodeService {
    /// Publishes a checked request.
    pub fn publish(&self, request: &Publish) -> Result<()> {
        let _operation = self.operation(Error::Handover)?;
        let root = self.kubelet_dir();
        let target = &request.target;
        let _claim = self.claim(&request.ask.volume_id, target.as_path())?;
        let wanted = VolumeRecord {
            volume_id: request.ask.volume_id.clone(),
            target_path: target.as_path().to_path_buf(),
            pod: request.ask.pod.clone(),
            attributes: request.ask.attributes.clone(),
            host_read_only: self.settings.host_read_only,
            created_dirs: Vec::new(),
            device: None,
            complete: true,
            object_versions: Default::default(),
            lazy: false,
            mount_group: request.mount_group,
        };
        let existing = self.live.published(&request.ask.volume_id);
        if let Some(existing) = &existing
            && self.published_already(&existing.record, &wanted, target)?
        {
            return self.republish(request, existing);
        }
        if self.live.target_holds_another_volume(target, &request.ask.volume_id) {
            return Err(Error::Conflict(format!("{} already holds another volume", quote_path(target.as_path()))));
        }

        // Files laid out in a tmpfs, or a lazy provider's files served through FUSE as they
        // are opened.
        let Opened { shown, versions, absent } = self.content.open(&request.ask, Opening::Publish)?;
        if let Shown::Files(payload) = &shown {
            // A hostile key is refused before anything is created or mounted.
            for key in payload.keys() {
                check_key(key)?;
            }
        }
        let made_before = existing.map(|volume| volume.record.created_dirs).unwrap_or_default();
        let lazy = matches!(shown, Shown::Lazy(_));
        let mut record = VolumeRecord { complete: false, created_dirs: made_before.clone(), lazy, ..wanted };
        record.created_dirs.extend(target_dir::missing(root, target)?);
        // In place before anything is made: should the driver die from here on, the next start
        // finds this record and takes back exactly what it names. Renamed into place but not
        // fsynced: a killed process's writes are in the page cache for its successor, and a
        // power loss takes every tmpfs with it, so the most it could leave is an empty directory.
        self.store.put(&record, false)?;

        let mut made = Made { dirs: made_before, mounted: false, device: None, serving: None };
        let result = self.build(target, &record, &shown, &mut made).and_then(|()| {
            record.created_dirs = made.dirs.clone();
            record.device = made.device;
            record.complete = true;
            record.object_versions = versions;
            // Durable before answering: kubelet treats the volume as published from here on.
            self.store.put(&record, true)
        });
        match result {
            Ok(()) => {
                let volume = PublishedVolume { record, target: target.clone() };
                let (tokens, secrets) = (request.ask.tokens.clone(), request.ask.secrets.clone());
                self.live.insert(volume, Some(tokens), Some(secrets), made.serving);
                self.tell_lacking(&request.ask, absent);
                self.count_volumes();
                Ok(())
            }
            Err(error) => {
                self.undo(PublishedVolume { record, target: target.clone() }, made);
                self.count_volumes();
                Err(error)
            }
        }
    }

    /// A republish of a volume whose mount is in place (the CSIDriver's requiresRepublish): a
    /// projection's new tokens are written at once, whatever the volume's refresh setting, since
    /// the old ones expire. A share's volume shows no token: its content is left to the refresh,
    /// so `refreshResource: "false"` still keeps it as published.
    fn republish(&self, request: &Publish, existing: &PublishedVolume) -> Result<()> {
        let volume_id = &request.ask.volume_id;
        let (held, stale) = self
            .live
            .with_mut(volume_id, |live| {
                let held = live.tokens.replace(request.ask.tokens.clone());
                live.secrets = Some(request.ask.secrets.clone());
                (held, live.refreshes.stale())
            })
            .unwrap_or_default();
        // After a restart the held tokens are unknown: a republish without tokens (the
        // CSIDriver requests none) has nothing to write.
        let new_tokens = match &held {
            None => request.ask.tokens.audiences().next().is_some(),
            Some(held) => *held != request.ask.tokens,
        };
        let rewrite_tokens = new_tokens && existing.record.attributes.contains_key(PROJECTION_ATTRIBUTE);
        // A volume whose last refresh failed is refreshed again now, and a failure is
        // kubelet's to report: it records it as the pod's event.
        if !(rewrite_tokens || stale) {
            return Ok(());
        }
        // A refresh that fetched before this write must not write after it.
        self.live.new_generation(volume_id);
        let refreshed = self.refresh(existing, rewrite_tokens);
        if refreshed.is_err() && rewrite_tokens {
            // Kept only once written: kubelet's retry brings them again.
            self.live.with_mut(volume_id, |live| live.tokens = held);
        }
        refreshed.map(drop)
    }

    /// Whether `existing`, the record of the volume a publish names, is this publish done
    /// already (its mount in place): a republish. Published with other arguments is a
    /// conflict; recorded but with its mount gone (unmounted behind the driver's back), it is
    /// published again, keeping the record of what was made before.
    fn published_already(&self, existing: &VolumeRecord, wanted: &VolumeRecord, target: &TargetPath) -> Result<bool> {
        if !existing.same_publish(wanted) {
            return Err(Error::Conflict(format!(
                "volume {} is already published with other arguments",
                quote(&wanted.volume_id)
            )));
        }
        match target_dir::open(self.kubelet_dir(), target)? {
            Some(opened) => self.holds_own_mount(&opened, &wanted.volume_id, existing.device),
            None => Ok(false),
        }
    }

    /// Takes back what a failed publish of `volume` made (`made`), and forgets the volume.
    fn undo(&self, mut volume: PublishedVolume, made: Made) {
        self.live.forget(&volume.record.volume_id);
        volume.record.created_dirs = made.dirs;
        volume.record.device = made.device;
        for problem in self.take_down(&volume, made.mounted) {
            warn!(volume = %quote(&volume.record.volume_id), problem = %Logged(&problem), "undoing a failed publish");
        }
    }

    /// The steps of a publish that make something, each noted in `made` as soon as it is done.
    fn build(&self, target: &TargetPath, record: &VolumeRecord, shown: &Shown, made: &mut Made) -> Result<()> {
        let volume_id = record.volume_id.as_str();
        let mut created = Vec::new();
        let opened = target_dir::create(self.kubelet_dir(), target, &mut created);
        made.dirs.extend(created);
        let opened = opened?;
        // Its own tag can already be there only when a publish of this volume lost its mount's
        // record; a tmpfs's content is rewritten below.
        let own_already = self.holds_own_mount(&opened, volume_id, None)?;
        match shown {
            Shown::Files(_) if own_already => {}
            Shown::Files(_) => {
                self.mounter.mount_tmpfs(&opened.target, self.settings.tmpfs_bytes, &mount_tag(volume_id))?;
            }
            Shown::Lazy(files) => {
                // What its files hold in the driver's memory counts for its pod's namespace.
                let payer = payer_of(record);
                let charge = LazyCharge { budget: self.budget.clone(), payer: payer.clone() };
                files.charge_to(Arc::new(charge));
                // The mount itself is charged before anything is made (a refusal makes
                // nothing), and given back if it cannot be made: a failure before `mounted`
                // takes nothing down.
                self.budget.grow(&payer, LAZY_VOLUME_BYTES)?;
                let mount = || {
                    // A FUSE mount of its own found here was served by a process that is gone:
                    // it answers nothing, so it is replaced.
                    let replaced = match own_already {
                        true => {
                            self.mounter.unmount(&opened.target)?;
                            Some(opened.reopen()?)
                        }
                        false => None,
                    };
                    let at = replaced.as_ref().unwrap_or(&opened.target);
                    self.mounter.mount_fuse(at, &mount_tag(volume_id))
                };
                let device = mount().inspect_err(|_| self.budget.release(volume_id))?;
                made.mounted = true;
                made.serving = Some(LazyMount::serve(volume_id, device, files.clone(), record.mount_group)?);
            }
        }
        made.mounted = true;
        // The descriptor opened before the mount is the directory under it; the volume's root
        // is reached by opening the target again from the same parent. Nothing else mounts on a
        // target this operation holds, so the mount found there now is the one just made.
        let volume = OpenTarget { target: opened.reopen()?, parent: opened.parent };
        let Some(device) = self.mounter.mount_device(&volume.parent, &volume.target)? else {
            return Err(Error::Fault(format!(
                "the volume mounted at {} is not there any more",
                quote_path(target.as_path())
            )));
        };
        made.device = Some(device);
        match shown {
            Shown::Files(payload) => self.write(&volume.target, record, payload, false).map(drop),
            Shown::Lazy(_) => Ok(()),
        }
    }
}
