//! A volume's publish and unpublish on the node (the CSI Node service's work, behind its wire
//! adapter `csi::node`): publish builds a per-volume tmpfs at the target and fills it through
//! the atomic writer; unpublish takes it down. Both are idempotent. The driver owns only what it
//! creates: the record of a volume, in place before anything is made, names the directories it
//! is about to create, and its tmpfs carries a tag derived from the volume id (and, once seen, the
//! record keeps its device number), so undo, unpublish and recovery remove exactly what it made:
//! its own mount (never another one found at a target), and its own directories, only while
//! empty.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use tracing::{info, warn};

use crate::content::ask::{PublishSecrets, VolumeAsk};
use crate::content::external::lazy_files::LazyFiles;
use crate::content::projection::tokens::Tokens;
use crate::content::{ContentSource, PassId};
use crate::metrics::{Metrics, RefreshResult};
use crate::quote::{Logged, quote, quote_path};
use crate::volume::atomic_writer::{AtomicWriter, check_key};
use crate::volume::content_budget::{BudgetLimits, ContentBudget, ENTRY_BYTES, LazyCharge, Payer, VOLUME_BYTES};
use crate::volume::error::{Error, Result};
use crate::volume::handover::take::TakenVolume;
use crate::volume::lazy_filesystem::LazyMount;
use crate::volume::mounter::Mounter;
use crate::volume::ownership::{Ownership, mount_tag, ownership};
use crate::volume::publish::{Publish, check_volume_id};
use crate::volume::published::PublishedVolume;
use crate::volume::store::{VolumeRecord, VolumeStore};
use crate::volume::target_dir::{self, OpenDir, OpenTarget};
use crate::volume::target_path::TargetPath;
use sharedresource_api::volume_attributes::PROJECTION_ATTRIBUTE;

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

/// What an operation holds exclusively.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Busy {
    Volume(String),
    Target(PathBuf),
}

/// The Node service.
pub struct NodeService {
    node_id: String,
    settings: VolumeSettings,
    mounter: Arc<dyn Mounter>,
    store: Arc<dyn VolumeStore>,
    content: Arc<dyn ContentSource>,
    metrics: Arc<Metrics>,
    volumes: Mutex<HashMap<String, PublishedVolume>>,
    // The tokens kubelet passed at each volume's last publish: in memory only, never in a
    // record (a restart loses them until kubelet's next republish).
    tokens: Mutex<HashMap<String, Tokens>>,
    // The nodePublishSecretRef data of each volume's last publish: in memory only, as tokens.
    secrets: Mutex<HashMap<String, PublishSecrets>>,
    // The lazy volumes this process serves through FUSE (a successor takes them over at a
    // planned restart: `volume::handover`; none survives a crash: see recovery).
    lazy_mounts: Mutex<HashMap<String, LazyMount>>,
    // Volume ids and targets with an operation under way: a second one on either is told to
    // retry (ABORTED), as the specification asks, instead of racing the first.
    busy: Mutex<HashSet<Busy>>,
    // The volumes whose last refresh failed: their content is not current.
    stale: Mutex<HashSet<String>>,
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
    /// A Node service for `node_id` over the given parts, remembering `records` as published.
    pub fn new(
        node_id: String,
        settings: VolumeSettings,
        mounter: Arc<dyn Mounter>,
        store: Arc<dyn VolumeStore>,
        content: Arc<dyn ContentSource>,
        published: Vec<PublishedVolume>,
    ) -> NodeService {
        let volumes: HashMap<String, PublishedVolume> =
            published.into_iter().map(|volume| (volume.record.volume_id.clone(), volume)).collect();
        let metrics = Arc::new(Metrics::new());
        metrics.set_volumes(volumes.len());
        let budget = ContentBudget::new(settings.content_budget);
        for volume in volumes.values().filter(|volume| !volume.record.lazy) {
            let held = measured_content(&settings, volume).unwrap_or(settings.tmpfs_bytes);
            budget.hold(&payer_of(&volume.record), held);
        }
        NodeService {
            node_id,
            settings,
            mounter,
            store,
            content,
            metrics,
            volumes: Mutex::new(volumes),
            tokens: Mutex::default(),
            secrets: Mutex::default(),
            lazy_mounts: Mutex::default(),
            busy: Mutex::default(),
            stale: Mutex::default(),
            budget,
            passes: AtomicU64::new(0),
            operations: RwLock::new(()),
            handing_over: AtomicBool::new(false),
        }
    }

    /// The same service, counting into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> NodeService {
        self.metrics = metrics;
        self.count_volumes();
        self
    }

    fn count_volumes(&self) {
        self.metrics.set_volumes(self.volumes.lock().unwrap_or_else(|p| p.into_inner()).len());
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
        let held = self.operations.read().unwrap_or_else(|p| p.into_inner());
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
    pub fn hand_over_lazy(&self, hand: impl FnOnce(&mut HashMap<String, LazyMount>) -> Result<()>) -> Result<()> {
        self.handing_over.store(true, Ordering::SeqCst);
        let _all = self.operations.write().unwrap_or_else(|p| p.into_inner());
        let mut mounts = self.lazy_mounts.lock().unwrap_or_else(|p| p.into_inner());
        let handed = hand(&mut mounts);
        match handed {
            // The successor holds its own descriptors of the connections: closing these ends
            // nothing.
            Ok(()) => mounts.clear(),
            Err(_) => self.handing_over.store(false, Ordering::SeqCst),
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
            let Some(published) = self.published(&id).filter(|published| published.record.lazy) else {
                lines.push(format!("volume {}: handed over but not recorded as lazy here; not served", quote(&id)));
                continue;
            };
            let charge = LazyCharge { budget: self.budget.clone(), payer: payer_of(&published.record) };
            volume.files.charge_to(Arc::new(charge));
            match LazyMount::take_over(&id, volume.mount, volume.device, volume.files) {
                Ok(mount) => {
                    self.lazy_mounts.lock().unwrap_or_else(|p| p.into_inner()).insert(id, mount);
                }
                Err(error) => {
                    self.volumes.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
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
        let keys = [Busy::Volume(volume_id.to_string()), Busy::Target(target.to_path_buf())];
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(taken) = keys.iter().find(|key| busy.contains(key)) {
            let what = match taken {
                Busy::Volume(id) => format!("volume {}", quote(id)),
                Busy::Target(path) => quote_path(path),
            };
            return Err(Error::Busy(format!("an operation on {what} is in progress")));
        }
        busy.extend(keys.iter().cloned());
        Ok(Claim { service: self, keys })
    }

    /// The tokens of `volume_id`'s last publish, or [`Tokens::lost`] when this process has not
    /// seen one.
    fn tokens_of(&self, volume_id: &str) -> Tokens {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner()).get(volume_id).cloned().unwrap_or_else(Tokens::lost)
    }

    /// Holds `tokens` for `volume_id` (`None`: forgets them).
    fn keep_tokens(&self, volume_id: &str, tokens: Option<&Tokens>) {
        let mut held = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        match tokens {
            Some(tokens) => held.insert(volume_id.to_string(), tokens.clone()),
            None => held.remove(volume_id),
        };
    }

    /// Holds `secrets` for `volume_id` (`None`: forgets them).
    fn keep_secrets(&self, volume_id: &str, secrets: Option<&PublishSecrets>) {
        let mut held = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        match secrets {
            Some(secrets) => held.insert(volume_id.to_string(), secrets.clone()),
            None => held.remove(volume_id),
        };
    }

    fn published(&self, volume_id: &str) -> Option<PublishedVolume> {
        self.volumes.lock().unwrap_or_else(|p| p.into_inner()).get(volume_id).cloned()
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

    /// A republish of a volume whose mount is in place (the CSIDriver's requiresRepublish): a
    /// projection's new tokens are written at once, whatever the volume's refresh setting, since
    /// the old ones expire. A share's volume shows no token: its content is left to the refresh,
    /// so `refreshResource: "false"` still keeps it as published.
    fn republish(&self, request: &Publish, existing: &PublishedVolume) -> Result<()> {
        let held = self.tokens_of(&request.ask.volume_id);
        // After a restart the held tokens are unknown: a republish without tokens (the
        // CSIDriver requests none) has nothing to write.
        let new_tokens =
            if held.is_lost() { request.ask.tokens.audiences().next().is_some() } else { held != request.ask.tokens };
        let shows_tokens = existing.record.attributes.contains_key(PROJECTION_ATTRIBUTE);
        self.keep_tokens(&request.ask.volume_id, Some(&request.ask.tokens));
        self.keep_secrets(&request.ask.volume_id, Some(&request.ask.secrets));
        let rewrite_tokens = new_tokens && shows_tokens;
        // A volume whose last refresh failed is refreshed again now, and a failure is
        // kubelet's to report: it records it as the pod's event.
        let stale = self.stale.lock().unwrap_or_else(|p| p.into_inner()).contains(&request.ask.volume_id);
        if (rewrite_tokens || stale)
            && let Err(error) = self.refresh(existing, rewrite_tokens)
        {
            if rewrite_tokens {
                // Kept only once written: kubelet's retry brings them again.
                self.keep_tokens(&request.ask.volume_id, Some(&held).filter(|held| !held.is_lost()));
            }
            return Err(error);
        }
        Ok(())
    }

    /// Whether another volume's record names `target`.
    fn target_holds_another_volume(&self, target: &TargetPath, volume_id: &str) -> bool {
        self.volumes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|volume| volume.target == *target && volume.record.volume_id != volume_id)
    }

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
        let existing = self.published(&request.ask.volume_id);
        if let Some(existing) = &existing
            && self.published_already(&existing.record, &wanted, target)?
        {
            return self.republish(request, existing);
        }
        if self.target_holds_another_volume(target, &request.ask.volume_id) {
            return Err(Error::Conflict(format!("{} already holds another volume", quote_path(target.as_path()))));
        }

        self.content.check_attributes(&request.ask)?;
        let shown = match self.content.lazy(&request.ask)? {
            Some(files) => Shown::Lazy(files),
            None => {
                let payload = self.content.content(&request.ask)?;
                // A hostile key is refused before anything is created or mounted.
                for key in payload.keys() {
                    check_key(key)?;
                }
                Shown::Files(payload)
            }
        };
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
            record.object_versions = self.content.object_versions(&record.volume_id);
            // Durable before answering: kubelet treats the volume as published from here on.
            self.store.put(&record, true)
        });
        match result {
            Ok(()) => {
                if let Some(serving) = made.serving {
                    self.lazy_mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(record.volume_id.clone(), serving);
                }
                self.keep_tokens(&record.volume_id, Some(&request.ask.tokens));
                self.keep_secrets(&record.volume_id, Some(&request.ask.secrets));
                let volume = PublishedVolume { record, target: target.clone() };
                self.volumes.lock().unwrap_or_else(|p| p.into_inner()).insert(volume.record.volume_id.clone(), volume);
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
        self.volumes.lock().unwrap_or_else(|p| p.into_inner()).remove(&volume.record.volume_id);
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
                let charge = LazyCharge { budget: self.budget.clone(), payer: payer_of(record) };
                files.charge_to(Arc::new(charge));
                // A FUSE mount of its own found here was served by a process that is gone: it
                // answers nothing, so it is replaced.
                let replaced = match own_already {
                    true => {
                        self.mounter.unmount(&opened.target)?;
                        Some(opened.reopen()?)
                    }
                    false => None,
                };
                let at = replaced.as_ref().unwrap_or(&opened.target);
                let device = self.mounter.mount_fuse(at, &mount_tag(volume_id))?;
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

    /// Writes `payload` into the volume whose root is `volume`, within the node's content
    /// budget, its files belonging to the record's group when it names one; on a read-only
    /// host mount the tmpfs is opened for writing only for the write (`reopen` for a refresh of
    /// a finished one).
    fn write(
        &self,
        volume: &OpenDir,
        record: &VolumeRecord,
        payload: &crate::volume::atomic_writer::Payload,
        reopen: bool,
    ) -> Result<bool> {
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

    /// Re-reads every published volume's content and rewrites what changed (the atomic writer
    /// makes an unchanged volume a no-op), one volume after another in one pass. A volume whose
    /// content may no longer be had (the share is gone, access was withdrawn) is emptied, not
    /// left serving stale data. Returns, per volume, whether it changed. The driver's own
    /// refresher runs volumes concurrently instead ([`crate::volume::refresh`]); this is for tests and
    /// benchmarks.
    pub fn refresh_all(&self) -> Vec<(String, Result<bool>)> {
        self.refresh_where(|_| true)
    }

    /// [`NodeService::refresh_all`] for the volumes `touched` selects.
    pub fn refresh_where(&self, touched: impl Fn(&VolumeRecord) -> bool) -> Vec<(String, Result<bool>)> {
        let pass = self.start_pass();
        let results = self
            .volume_ids_where(touched)
            .into_iter()
            .filter_map(|volume_id| {
                let result = self.refresh_volume(&volume_id, Some(pass))?;
                Some((volume_id, result))
            })
            .collect();
        self.end_pass(pass);
        results
    }

    /// The published volumes `touched` selects.
    pub fn volume_ids_where(&self, touched: impl Fn(&VolumeRecord) -> bool) -> Vec<String> {
        self.volumes_where(|record| touched(record).then_some(())).into_iter().map(|(id, ())| id).collect()
    }

    /// The published volumes `pick` selects, each with what `pick` said of it.
    pub fn volumes_where<T>(&self, pick: impl Fn(&VolumeRecord) -> Option<T>) -> Vec<(String, T)> {
        let volumes = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        volumes.values().filter_map(|volume| Some((volume.record.volume_id.clone(), pick(&volume.record)?))).collect()
    }

    /// A new refresh pass, started at the content source.
    pub fn start_pass(&self) -> PassId {
        let pass = PassId(self.passes.fetch_add(1, Ordering::Relaxed));
        self.content.start_pass(pass);
        pass
    }

    /// Ends refresh pass `pass` at the content source (which may start writing the shares'
    /// status in the background).
    pub fn end_pass(&self, pass: PassId) {
        self.content.end_pass(pass);
    }

    /// Refreshes one volume, within refresh pass `pass` when given; `None` when the volume is
    /// not published (any more). The content is fetched without holding the volume, so an
    /// unpublish never waits for the apiserver: the volume is held only while its new content
    /// is written, and a refresh that finds the volume unpublished or republished meanwhile
    /// writes nothing. Another operation holding the volume answers ABORTED (retry).
    pub fn refresh_volume(&self, volume_id: &str, pass: Option<PassId>) -> Option<Result<bool>> {
        let volume = self.published(volume_id)?;
        // Handing over, refreshes are not failures: the successor refreshes.
        let _operation = match self.operation(Error::Busy) {
            Ok(operation) => operation,
            Err(refused) => return Some(Err(refused)),
        };
        // A volume showing tokens: a republish that brings new ones while this content is
        // fetched writes the volume with them itself, and this older content must not roll the
        // token file back (it is dropped: the republish read the content afresh).
        let shows_tokens = volume.record.attributes.contains_key(PROJECTION_ATTRIBUTE);
        let tokens = shows_tokens.then(|| self.tokens_of(volume_id));
        let fetched = self.fetch(&volume, pass);
        let result =
            self.claim(volume_id, volume.target.as_path()).and_then(|_claim| match self.published(volume_id) {
                Some(current)
                    if current.record.same_publish(&volume.record)
                        && tokens.as_ref().is_none_or(|tokens| self.tokens_of(volume_id) == *tokens) =>
                {
                    self.apply(&current, fetched?, false)
                }
                _ => Ok(false),
            });
        self.metrics.refresh(match &result {
            Ok(true) => RefreshResult::Changed,
            Ok(false) => RefreshResult::Unchanged,
            Err(_) => RefreshResult::Failed,
        });
        self.note_refresh(volume_id, &result);
        Some(result)
    }

    /// Remembers whether `volume_id`'s last refresh failed (an operation under way is not a
    /// failure), so the next republish can report it to kubelet, which records it as the pod's
    /// event: a volume serving old content is not known to the driver's log alone.
    fn note_refresh(&self, volume_id: &str, result: &Result<bool>) {
        let mut stale = self.stale.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Err(Error::Busy(_)) => {}
            Err(_) => {
                stale.insert(volume_id.to_string());
            }
            Ok(_) => {
                stale.remove(volume_id);
            }
        }
        self.metrics.set_stale_volumes(stale.len());
        self.metrics.set_content_bytes(self.budget.used());
    }

    /// Rewrites one volume's content now, holding it; `forced` writes it even where the volume
    /// keeps what it was published with (a republish bringing new tokens).
    fn refresh(&self, volume: &PublishedVolume, forced: bool) -> Result<bool> {
        let fetched = self.fetch(volume, None)?;
        let result = self.apply(volume, fetched, forced);
        self.note_refresh(&volume.record.volume_id, &result);
        result
    }

    /// The content `volume` should show now. A share gone, or access withdrawn, is
    /// content withdrawn (the volume is emptied, and stays mounted); a source that cannot answer
    /// now is an error (nothing changes).
    fn fetch(&self, volume: &PublishedVolume, pass: Option<PassId>) -> Result<Fetched> {
        let record = &volume.record;
        let ask = VolumeAsk {
            volume_id: record.volume_id.clone(),
            volume_name: volume.target.volume_name().to_string(),
            mount_point: volume.target.as_path().to_path_buf(),
            pod: record.pod.clone(),
            attributes: record.attributes.clone(),
            tokens: self.tokens_of(&record.volume_id),
            // After a restart, none until kubelet's next republish brings them.
            secrets: self
                .secrets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&record.volume_id)
                .cloned()
                .unwrap_or_default(),
            object_versions: record.object_versions.clone(),
        };
        let answer = match pass {
            Some(pass) => self.content.content_in_pass(&ask, pass),
            None => self.content.content(&ask),
        };
        match answer {
            Ok(payload) => Ok(Fetched { payload, withdrawn: None }),
            Err(error) if error.withdraws_content() => {
                Ok(Fetched { payload: Default::default(), withdrawn: Some(error) })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Writes `fetched` into `record`'s volume, unless the volume keeps what it was published
    /// with; whether it changed.
    fn apply(&self, volume: &PublishedVolume, fetched: Fetched, forced: bool) -> Result<bool> {
        let record = &volume.record;
        if record.lazy {
            return Ok(self.apply_lazy(record, fetched));
        }
        // `refreshResource: "false"`: the volume keeps what it was published with; a revocation
        // still empties it (access is never kept by a setting of the pod's own).
        let kept = !self.settings.refresh_content
            || record.attributes.get(REFRESH_ATTRIBUTE).is_some_and(|value| value == "false");
        if fetched.withdrawn.is_none() && kept && !forced {
            return Ok(false);
        }
        let opened = target_dir::open(self.kubelet_dir(), &volume.target)?;
        let Some(opened) =
            opened.filter(|opened| self.holds_own_mount(opened, &record.volume_id, record.device).unwrap_or(false))
        else {
            return Err(Error::Fault(format!(
                "{} no longer holds the volume's tmpfs; not written",
                quote_path(volume.target.as_path())
            )));
        };
        let changed = self.write(&opened.target, record, &fetched.payload, true)?;
        if changed && let Some(reason) = &fetched.withdrawn {
            self.metrics.revocation();
            info!(volume = %quote(&record.volume_id), reason = %Logged(reason), "content withdrawn; the volume was emptied");
        }
        self.note_object_versions(&record.volume_id);
        Ok(changed)
    }

    /// A lazy volume's refresh: its files are fetched when opened, so only access is at stake:
    /// withdrawn, every open fails and nothing stays cached; back, they open again. Whether
    /// that changed. A lazy volume this process does not serve (one of a previous run, before
    /// kubelet republishes it) has nothing to change.
    fn apply_lazy(&self, record: &VolumeRecord, fetched: Fetched) -> bool {
        let mounts = self.lazy_mounts.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mount) = mounts.get(&record.volume_id) else {
            return false;
        };
        let changed = mount.files().set_withdrawn(fetched.withdrawn.is_some());
        if changed && let Some(reason) = &fetched.withdrawn {
            self.metrics.revocation();
            info!(volume = %quote(&record.volume_id), reason = %Logged(reason), "access withdrawn; the lazy volume's files no longer open");
        }
        changed
    }

    /// Records what the volume's provider answered last, when it changed, so that a restarted
    /// driver sends it back too. Not worth failing a refresh over: a record not rewritten costs
    /// the provider one full answer after a restart.
    fn note_object_versions(&self, volume_id: &str) {
        let versions = self.content.object_versions(volume_id);
        let record = {
            let mut volumes = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
            let Some(volume) = volumes.get_mut(volume_id).filter(|v| v.record.object_versions != versions) else {
                return;
            };
            volume.record.object_versions = versions;
            volume.record.clone()
        };
        if let Err(error) = self.store.put(&record, false) {
            warn!(volume = %quote(volume_id), problem = %Logged(&error), "the provider's object versions were not recorded");
        }
    }

    /// Unpublishes. A volume the driver does not hold at `target` is already done; a mount the
    /// driver did not make is never unmounted.
    pub fn unpublish(&self, volume_id: &str, target: &str) -> Result<()> {
        check_volume_id(volume_id)?;
        if target.is_empty() {
            return Err(Error::Refused("target_path is required".into()));
        }
        let target = TargetPath::parse(target, self.kubelet_dir())?;
        let _operation = self.operation(Error::Handover)?;
        let _claim = self.claim(volume_id, target.as_path())?;
        let Some(volume) = self.published(volume_id).filter(|volume| volume.target == target) else {
            // No record (never the driver's, or lost with its state directory): only a tmpfs
            // carrying this volume's own tag can be the driver's, and only that is taken down;
            // no directory is removed, since none is known to be the driver's.
            if let Ok(Some(opened)) = target_dir::open(self.kubelet_dir(), &target)
                && let Ok(Ownership::Own) = ownership(self.mounter.as_ref(), &opened, volume_id, None)
            {
                self.mounter.unmount(&opened.target)?;
            }
            return Ok(());
        };
        if let Some(opened) = target_dir::open(self.kubelet_dir(), &target)? {
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
        self.volumes.lock().unwrap_or_else(|p| p.into_inner()).remove(volume_id);
        // Unmounted above: the session ends as soon as the kernel lets go of the filesystem.
        self.lazy_mounts.lock().unwrap_or_else(|p| p.into_inner()).remove(volume_id);
        self.note_refresh(volume_id, &Ok(false));
        self.keep_tokens(volume_id, None);
        self.keep_secrets(volume_id, None);
        self.content.released(volume_id);
        self.count_volumes();
        Ok(())
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

/// A volume's content as fetched for a refresh.
struct Fetched {
    payload: crate::volume::atomic_writer::Payload,
    /// Why the content may no longer be had, when it may not (the payload is then empty).
    withdrawn: Option<crate::content::error::Error>,
}

/// What a volume shows: files laid out in a tmpfs, or a lazy provider's files served through
/// FUSE as they are opened.
enum Shown {
    Files(crate::volume::atomic_writer::Payload),
    Lazy(Arc<LazyFiles>),
}

/// What a publish has made so far: directories, its mount, that mount's device once seen, and
/// the FUSE session serving a lazy volume.
struct Made {
    dirs: Vec<PathBuf>,
    mounted: bool,
    device: Option<u64>,
    serving: Option<LazyMount>,
}

/// Marks a volume id and a target busy for the life of an operation.
pub(crate) struct Claim<'a> {
    service: &'a NodeService,
    keys: [Busy; 2],
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut busy = self.service.busy.lock().unwrap_or_else(|p| p.into_inner());
        for key in &self.keys {
            busy.remove(key);
        }
    }
}
