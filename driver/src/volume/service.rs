//! The Node service's volume work (behind its wire adapter `csi::node`): a publish builds a
//! per-volume tmpfs at the target and fills it through the atomic writer, an unpublish takes it
//! down, a refresh writes what changed; one file each below (`publish`, `unpublish`,
//! `refresh`). Here: the service's parts, the gate a handover closes, and what the operations
//! share (the ownership test, the write, the take-down). The driver owns only what it creates:
//! the record of a volume, in place before anything is made, names the directories it is about
//! to create, and its tmpfs carries a tag derived from the volume id (and, once seen, the record
//! keeps its device number), so undo, unpublish and recovery remove exactly what it made: its
//! own mount (never another one found at a target), and its own directories, only while empty.

mod publish;
mod refresh;
mod unpublish;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use crate::content::ContentSource;
use crate::metrics::Metrics;
use crate::quote::{quote, quote_path};
use crate::unpoisoned::UnpoisonedRwLock;
use crate::volume::atomic_writer::{AtomicWriter, Payload};
use crate::volume::content_budget::{
    BudgetLimits, ContentBudget, ENTRY_BYTES, LAZY_VOLUME_BYTES, LazyCharge, Payer, VOLUME_BYTES,
};
use crate::volume::error::{Error, Result};
use crate::volume::lazy::LazyMount;
use crate::volume::lazy::TakenVolume;
use crate::volume::lazy::{HandOver, HandsOverLazy};
use crate::volume::live::{Claim, LiveVolumes};
use crate::volume::mounter::Mounter;
use crate::volume::ownership::{Ownership, ownership};
use crate::volume::published::PublishedVolume;
use crate::volume::store::{VolumeRecord, VolumeStore};
use crate::volume::target_dir::{self, OpenDir, OpenTarget};

/// How volumes are built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSettings {
    /// The size limit of each volume's tmpfs.
    pub tmpfs_bytes: u64,
    /// Mount the tmpfs read-only on the host too (kubelet's bind mount into the container is
    /// read-only either way, since readonly is required).
    pub host_read_only: bool,
    /// kubelet's root: every target lies below it in kubelet's layout.
    pub kubelet_dir: PathBuf,
    /// Whether content updates reach published volumes (revocations always do).
    pub refresh_content: bool,
    /// How much content the node's volumes, and one namespace's, may hold.
    pub content_budget: BudgetLimits,
}

/// The offer reaches the node's lazy volumes through this (see [`HandsOverLazy`]).
impl HandsOverLazy for NodeService {
    fn hand_over_lazy(&self, hand: HandOver<'_>) -> Result<()> {
        NodeService::hand_over_lazy(self, hand)
    }
}

#[cfg(test)]
impl VolumeSettings {
    /// The settings unit tests build volumes with: 1 MiB tmpfs, content refreshed.
    pub(crate) fn for_tests(kubelet_dir: PathBuf, host_read_only: bool) -> VolumeSettings {
        VolumeSettings {
            tmpfs_bytes: 1 << 20,
            host_read_only,
            kubelet_dir,
            refresh_content: true,
            content_budget: BudgetLimits::UNBOUNDED,
        }
    }
}

/// The volume attribute that turns refreshing off for one volume (`"false"`; default on): its
/// content stays as published, as with the OpenShift driver, except that losing access (or the
/// share) still empties it.
pub use sharedresource_api::volume_attributes::REFRESH_ATTRIBUTE;

/// The Node service.
pub struct NodeService {
    node_id: String,
    settings: VolumeSettings,
    mounter: Arc<dyn Mounter>,
    store: Arc<dyn VolumeStore>,
    content: Arc<dyn ContentSource>,
    metrics: Arc<Metrics>,
    live: LiveVolumes,
    // What the volumes' tmpfs pages cost the driver's memory, node-wide and per namespace.
    budget: ContentBudget,
    passes: AtomicU64,
    // Held (shared) by every publish, unpublish and refresh for its whole run, and exclusively
    // by a handover to a successor, which so waits for those under way.
    operations: RwLock<()>,
    // Set once a handover starts: every operation from then on is refused; cleared again only
    // when the handover fails (the volumes stay this process's).
    handing_over: AtomicBool,
}

impl NodeService {
    /// A Node service for `node_id` over the given parts, remembering `published` as published.
    pub fn new(
        node_id: String,
        settings: VolumeSettings,
        mounter: Arc<dyn Mounter>,
        store: Arc<dyn VolumeStore>,
        content: Arc<dyn ContentSource>,
        published: Vec<PublishedVolume>,
    ) -> NodeService {
        let budget = ContentBudget::new(settings.content_budget);
        for volume in published.iter().filter(|volume| !volume.record.lazy) {
            let held = measured_content(&settings, volume).unwrap_or(settings.tmpfs_bytes);
            budget.hold(&payer_of(&volume.record), held);
        }
        let service = NodeService {
            node_id,
            settings,
            mounter,
            store,
            content,
            metrics: Arc::new(Metrics::new()),
            live: LiveVolumes::new(published),
            budget,
            passes: AtomicU64::new(0),
            operations: RwLock::new(()),
            handing_over: AtomicBool::new(false),
        };
        service.count_volumes();
        service
    }

    /// The same service, counting into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> NodeService {
        self.metrics = metrics;
        self.count_volumes();
        self
    }

    fn count_volumes(&self) {
        self.metrics.set_volumes(self.live.len());
        self.metrics.set_content_bytes(self.budget.used());
    }

    /// The node's id, as NodeGetInfo reports it.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// What the service counts.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// kubelet's root, as configured.
    pub fn kubelet_dir(&self) -> &Path {
        &self.settings.kubelet_dir
    }

    /// The right to run one operation, held for all of it; refused with `refusal` once this
    /// process hands its volumes to a successor (which serves the retry).
    fn operation(&self, refusal: fn(String) -> Error) -> Result<RwLockReadGuard<'_, ()>> {
        let held = self.operations.shared();
        if self.handing_over.load(Ordering::SeqCst) {
            return Err(refusal("this driver is handing its volumes to its successor, which serves the retry".into()));
        }
        Ok(held)
    }

    /// Hands the lazy volumes this process serves to a successor: stops taking publishes,
    /// unpublishes and refreshes, waits for those under way, then lets `hand` send every lazy
    /// volume. Done (`Ok`), the volumes are the successor's: this process drops its side of
    /// them and refuses every operation from then on. Failed, `hand` has resumed them and
    /// operations are taken again.
    pub fn hand_over_lazy(&self, hand: impl FnOnce(&mut Vec<(String, LazyMount)>) -> Result<()>) -> Result<()> {
        self.handing_over.store(true, Ordering::SeqCst);
        let _all = self.operations.exclusive();
        let handed = self.live.hand_over_lazy(hand);
        if handed.is_err() {
            self.handing_over.store(false, Ordering::SeqCst);
        }
        handed
    }

    /// Serves the lazy volumes a predecessor handed over (`taken`), each under its record
    /// (which recovery kept): what the kernel holds of each mount stays true, and its files'
    /// memory counts for its namespace from now on. A volume without such a record, or one
    /// that cannot be served, is taken down as recovery takes down a dead lazy volume. A line
    /// for each volume not served.
    pub fn adopt_lazy(&self, taken: Vec<TakenVolume>) -> Vec<String> {
        let mut lines = Vec::new();
        for volume in taken {
            let id = volume.volume_id;
            let Some(published) = self.live.published(&id).filter(|published| published.record.lazy) else {
                lines.push(format!("volume {}: handed over but not recorded as lazy here; not served", quote(&id)));
                continue;
            };
            // The mount counts as a lazy publish counts it; its files' memory, from now on.
            let payer = payer_of(&published.record);
            self.budget.hold(&payer, LAZY_VOLUME_BYTES);
            let charge = LazyCharge { budget: self.budget.clone(), payer };
            volume.files.charge_to(Arc::new(charge));
            match LazyMount::take_over(&id, volume.mount, volume.device, volume.files) {
                Ok(mount) => {
                    self.live.with_mut(&id, |live| live.lazy = Some(mount));
                }
                Err(error) => {
                    self.live.forget(&id);
                    let mut line = format!("volume {}: handed over but not served ({error}); taken down", quote(&id));
                    for problem in self.take_down(&published, true) {
                        line.push_str("; ");
                        line.push_str(&problem);
                    }
                    lines.push(line);
                }
            }
        }
        self.count_volumes();
        lines
    }

    /// Marks `volume_id` and `target` busy until the claim is dropped (ABORTED meanwhile).
    pub(crate) fn claim(&self, volume_id: &str, target: &Path) -> Result<Claim<'_>> {
        self.live.claim(volume_id, target)
    }

    /// Whether `opened` has this volume's own tmpfs on it; an error when something else is
    /// mounted there. The device the record remembers answers without reading the mount table;
    /// otherwise the mount's tag decides.
    fn holds_own_mount(&self, opened: &OpenTarget, volume_id: &str, device: Option<u64>) -> Result<bool> {
        match ownership(self.mounter.as_ref(), opened, volume_id, device)? {
            Ownership::Own => Ok(true),
            Ownership::Unmounted => Ok(false),
            Ownership::Foreign(source) => Err(Error::Foreign(format!(
                "{} has a {} mount the driver did not make; it is left alone",
                quote_path(opened.target.path()),
                quote(&source.fs_type)
            ))),
        }
    }

    /// Writes `payload` into the volume whose root is `volume`, within the node's content
    /// budget, its files belonging to the record's group when it names one; on a read-only
    /// host mount the tmpfs is opened for writing only for the write (`reopen` for a refresh of
    /// a finished one).
    fn write(&self, volume: &OpenDir, record: &VolumeRecord, payload: &Payload, reopen: bool) -> Result<bool> {
        let writer = AtomicWriter::new(volume.proc_path())
            .with_group(record.mount_group)
            .charging(&self.budget, payer_of(record));
        if !self.settings.host_read_only {
            return writer.write(payload);
        }
        if reopen {
            self.mounter.remount(volume, false)?;
        }
        let written = writer.write(payload);
        self.mounter.remount(volume, true)?;
        written
    }

    /// Takes down what `volume`'s record says the driver made: its own mount when `mounted`
    /// (never another), then its own directories while empty. Returns a line for each thing
    /// left.
    fn take_down(&self, volume: &PublishedVolume, mounted: bool) -> Vec<String> {
        let mut left = Vec::new();
        let (root, record) = (self.kubelet_dir(), &volume.record);
        if mounted {
            let unmounted = target_dir::open(root, &volume.target).and_then(|opened| {
                let Some(opened) = opened else {
                    return Ok(());
                };
                if self.holds_own_mount(&opened, &record.volume_id, record.device)? {
                    self.mounter.unmount(&opened.target)?;
                }
                Ok(())
            });
            if let Err(error) = unmounted {
                left.push(error.to_string());
            }
        }
        left.extend(target_dir::remove_created(root, volume.target.as_path(), &record.created_dirs));
        if mounted {
            self.budget.release(&record.volume_id);
        }
        let _ = self.store.remove(&record.volume_id);
        left
    }
}

/// Who pays for `record`'s content: the namespace of its pod.
fn payer_of(record: &VolumeRecord) -> Payer {
    Payer { volume_id: record.volume_id.clone(), namespace: record.pod.namespace.clone() }
}

/// What the tmpfs of a volume a previous run published holds now, pages and entries, as its
/// filesystem reports them, and the volume itself; `None` when it cannot be measured.
fn measured_content(settings: &VolumeSettings, volume: &PublishedVolume) -> Option<u64> {
    let opened = target_dir::open(&settings.kubelet_dir, &volume.target).ok()??;
    let stat = nix::sys::statvfs::statvfs(&opened.target.proc_path()).ok()?;
    let unit = stat.fragment_size();
    let data = (stat.blocks().saturating_sub(stat.blocks_free())).saturating_mul(unit);
    let entries = stat.files().saturating_sub(stat.files_free());
    Some(data.saturating_add(entries.saturating_mul(ENTRY_BYTES)).saturating_add(VOLUME_BYTES))
}
