//! What one volume's refresh does (when refreshes run, and how many at once, is the refresher's:
//! `volume::refresh`): its content fetched without holding the volume, then written while
//! holding it, unless a publish or republish wrote it meanwhile. Content that may no longer be
//! had empties the volume; a lazy volume's files stop opening instead.

use std::collections::BTreeMap;
use std::time::SystemTime;

use tracing::{info, warn};

use crate::content::ask::VolumeAsk;
use crate::content::changes::Absence;
use crate::content::share_entries::ShareEntries;
use crate::content::{Opened, Opening, PassId, Shown};
use crate::metrics::RefreshResult;
use crate::quote::{Logged, quote, quote_path};
use crate::volume::atomic_writer::Payload;
use crate::volume::error::{Error, Result};
use crate::volume::live::record::Outcome;
use crate::volume::live::record::{EventPace, RefreshRecord};
use crate::volume::published::PublishedVolume;
use crate::volume::service::{NodeService, REFRESH_ATTRIBUTE};
use crate::volume::store::VolumeRecord;
use crate::volume::target_dir;

/// A volume's content as fetched for a refresh.
struct Fetched {
    payload: Payload,
    /// What the volume's provider answered of each object's version (kept in its record).
    versions: BTreeMap<String, String>,
    /// Why the content may no longer be had, when it may not (the payload is then empty).
    withdrawn: Option<crate::content::error::Error>,
}

impl NodeService {
    /// Re-reads every published volume's content and rewrites what changed (the atomic writer
    /// makes an unchanged volume a no-op), one volume after another in one pass. A volume whose
    /// content may no longer be had (the share is gone, access was withdrawn) is emptied, not
    /// left serving stale data. Returns, per volume, whether it changed. The driver's own
    /// refresher runs volumes concurrently instead ([`crate::volume::refresh`]); this is for
    /// tests and benchmarks.
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
        self.end_pass(pass, None);
        results
    }

    /// The published volumes `touched` selects.
    pub fn volume_ids_where(&self, touched: impl Fn(&VolumeRecord) -> bool) -> Vec<String> {
        self.volumes_where(|record| touched(record).then_some(())).into_iter().map(|(id, ())| id).collect()
    }

    /// The published volumes `pick` selects, each with what `pick` said of it.
    pub fn volumes_where<T>(&self, pick: impl Fn(&VolumeRecord) -> Option<T>) -> Vec<(String, T)> {
        self.live.select(pick)
    }

    /// The live volumes `pick` selects, each with what `pick` said of it and what its
    /// refreshes did (the refresh wing's reporters read them).
    pub fn refreshes_where<T>(&self, pick: impl Fn(&VolumeRecord) -> Option<T>) -> Vec<(T, RefreshRecord)> {
        self.live.select_refreshes(pick)
    }

    /// What `tell` says, given when `volume_id`'s pod was last told of its refreshes (to
    /// update); `None` when the volume is not served.
    pub fn with_event_pace<T>(&self, volume_id: &str, tell: impl FnOnce(&mut EventPace) -> T) -> Option<T> {
        self.live.with_mut(volume_id, |live| tell(&mut live.refreshes.told))
    }

    /// A new refresh pass, started at the content source.
    pub fn start_pass(&self) -> PassId {
        let pass = PassId(self.passes.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        self.content.start_pass(pass);
        pass
    }

    /// Ends refresh pass `pass` at the content source (which may start writing the shares'
    /// status in the background), with this node's entries in the shares' status as `entries`
    /// says (`None`: the pass says nothing of them; the refresher's passes do, tests' need not).
    pub fn end_pass(&self, pass: PassId, entries: Option<ShareEntries>) {
        self.content.end_pass(pass, entries);
    }

    /// Refreshes one volume, within refresh pass `pass` when given; `None` when the volume is
    /// not published (any more). The content is fetched without holding the volume, so an
    /// unpublish never waits for the apiserver: the volume is held only while its new content
    /// is written, and a refresh that finds the volume unpublished, or written by a publish or
    /// republish meanwhile (a projection's new tokens: this older content must not roll the
    /// token file back), writes nothing. Another operation holding the volume answers ABORTED
    /// (retry).
    pub fn refresh_volume(&self, volume_id: &str, pass: Option<PassId>) -> Option<Result<bool>> {
        let (volume, generation) = self.live.published_at(volume_id)?;
        // Handing over, refreshes are not failures: the successor refreshes.
        let _operation = match self.operation(Error::Busy) {
            Ok(operation) => operation,
            Err(refused) => return Some(Err(refused)),
        };
        let fetched = self.fetch(&volume, pass);
        let result =
            self.claim(volume_id, volume.target.as_path()).and_then(|_claim| match self.live.published_at(volume_id) {
                Some((current, now)) if now == generation => self.apply(&current, fetched?, false),
                _ => Ok(false),
            });
        let counted = match &result {
            Ok(true) => RefreshResult::Changed,
            Ok(false) => RefreshResult::Unchanged,
            Err(_) => RefreshResult::Failed,
        };
        self.metrics.refresh(counted, result.as_ref().err().map(Error::error_type));
        self.note_refresh(volume_id, &result);
        Some(result)
    }

    /// Writes how a refresh of `volume_id` ended into its record (an operation under way is no
    /// outcome: the refresh is tried again), so the next republish can report a failure to
    /// kubelet, which records it as the pod's event, and the refresh wing's reporters (gauges,
    /// the shares' per-node entries) see it: a volume serving old content is not known to the
    /// driver's log alone.
    fn note_refresh(&self, volume_id: &str, result: &Result<bool>) {
        let outcome = Outcome::of(result);
        if let Some(outcome) = outcome {
            self.live.note_refresh(volume_id, outcome, SystemTime::now());
        }
        self.metrics.set_stale_volumes(self.live.stale_count());
        self.metrics.set_content_bytes(self.budget.used());
    }

    /// Rewrites one volume's content now, holding it; `forced` writes it even where the volume
    /// keeps what it was published with (a republish bringing new tokens).
    pub(super) fn refresh(&self, volume: &PublishedVolume, forced: bool) -> Result<bool> {
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
            tokens: self.live.tokens_of(&record.volume_id),
            secrets: self.live.secrets_of(&record.volume_id),
            object_versions: record.object_versions.clone(),
        };
        let answer = self.content.open(&ask, Opening::Refresh(pass));
        match answer {
            Ok(Opened { shown: Shown::Files(payload), versions, absent }) => {
                self.tell_lacking(&ask, absent);
                Ok(Fetched { payload, versions, withdrawn: None })
            }
            Ok(Opened { shown: Shown::Lazy(_), .. }) => Err(Error::Fault(format!(
                "the content source opened volume {} for a refresh as lazy files",
                quote(&record.volume_id)
            ))),
            Err(error) if error.withdraws_content() => Ok(Fetched {
                payload: Default::default(),
                versions: record.object_versions.clone(),
                withdrawn: Some(error),
            }),
            Err(error) => Err(error.into()),
        }
    }

    /// Notes what `ask`'s volume lacks now of what it marks optional, and tells its pod (through
    /// the source's changes, to the refresher, which paces the Events) of what it began to lack.
    pub(super) fn tell_lacking(&self, ask: &VolumeAsk, absent: Vec<String>) {
        let begun = self.live.note_lacking(&ask.volume_id, absent);
        if begun.is_empty() {
            return;
        }
        if let Some(changes) = self.content.changes() {
            changes.absent(Absence {
                pod: ask.pod.clone(),
                volume_name: ask.volume_name.clone(),
                attributes: ask.attributes.clone(),
                absent: begun,
            });
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
        self.note_object_versions(&record.volume_id, fetched.versions);
        Ok(changed)
    }

    /// A lazy volume's refresh: its files are fetched when opened, so only access is at stake:
    /// withdrawn, every open fails and nothing stays cached; back, they open again. Whether
    /// that changed. A lazy volume this process does not serve (one of a previous run, before
    /// kubelet republishes it) has nothing to change.
    fn apply_lazy(&self, record: &VolumeRecord, fetched: Fetched) -> bool {
        let withdrawn = fetched.withdrawn.is_some();
        let changed = self
            .live
            .with(&record.volume_id, |live| live.lazy.as_ref().map(|mount| mount.files().set_withdrawn(withdrawn)))
            .flatten()
            .unwrap_or(false);
        if changed && let Some(reason) = &fetched.withdrawn {
            self.metrics.revocation();
            info!(volume = %quote(&record.volume_id), reason = %Logged(reason), "access withdrawn; the lazy volume's files no longer open");
        }
        changed
    }

    /// Records what the volume's provider answered last, when it changed, so that a restarted
    /// driver sends it back too. Not worth failing a refresh over: a record not rewritten costs
    /// the provider one full answer after a restart.
    fn note_object_versions(&self, volume_id: &str, versions: BTreeMap<String, String>) {
        let record = self.live.with_mut(volume_id, |live| {
            let record = &mut live.volume.record;
            (record.object_versions != versions).then(|| {
                record.object_versions = versions;
                record.clone()
            })
        });
        let Some(record) = record.flatten() else {
            return;
        };
        if let Err(error) = self.store.put(&record, false) {
            warn!(volume = %quote(volume_id), problem = %Logged(&error), "the provider's object versions were not recorded");
        }
    }
}
