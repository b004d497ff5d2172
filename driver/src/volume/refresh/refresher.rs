//! The refresher: what changed (a watch's event, or the periodic tick) becomes a refresh of
//! each volume it touches, run per volume with bounded concurrency, so a volume whose content
//! cannot be had quickly (a slow apiserver answer, given up at the request timeout; a slow
//! provider's helper) never delays another volume's refresh or revocation:
//! - refreshes take slots in two lanes: one for changes of grants (where a revocation may be
//!   due), one for everything else, so slow content never holds up a revocation;
//! - in each lane one namespace's volumes hold at most half of the slots, so one tenant's slow
//!   volumes never hold up another tenant's.
//!
//! A volume already being refreshed when a new change touches it is refreshed once more when
//! its refresh ends (with fresh answers), so no change is lost and no volume is refreshed twice
//! at once. A volume another operation holds (a publish, an unpublish) is tried again shortly.
//!
//! What a refresh did is written into the volume's record by the refresh itself
//! (`NodeService::note_refresh`); here it is told to the volume's pod as an Event, paced
//! (`pod_events`): new content in place, or an update that could not be applied; and what a
//! volume began to lack of what it marks optional (the content source notes it with the
//! changes). Every few seconds the per-share gauges are written from the records.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::content::changes::{Absence, Changes, Pending};
use crate::content::{ContentSource, Gone, PassId};
use crate::fair_slots::FairSlots;
use crate::quote::{Logged, quote};
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::error::Error;
use crate::volume::refresh::node_entries;
use crate::volume::refresh::pod_events::{EventPacing, PodEvents, PodRef, Refreshed, VolumeOfPod, mounts};
use crate::volume::refresh::share_gauges::{self, Mounted};
use crate::volume::service::NodeService;

/// How many volumes are refreshed at once in each lane: enough that a few stalled ones (each
/// given up at the request timeout) leave room for the rest, few enough not to flood the
/// apiserver. One namespace's volumes hold at most half of them.
pub const CONCURRENT_REFRESHES: usize = 8;
/// How often the per-share gauges are written (`share_gauges`).
pub const GAUGES_EVERY: Duration = Duration::from_secs(5);
/// After ABORTED (another operation holds the volume), when to try again.
const RETRY_BUSY_AFTER: Duration = Duration::from_millis(200);
/// How long a burst of events (a RoleBinding and its Role, a Secret applied twice) is gathered
/// into one pass.
const GATHER: Duration = Duration::from_millis(20);

/// Volumes being refreshed, and those a change touched meanwhile (in the lane it asks for).
#[derive(Default)]
struct InFlight {
    running: HashSet<String>,
    again: HashMap<String, Lane>,
}

/// Which slots a refresh waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// A grant changed for the volume's service account: its access may have been withdrawn.
    Access,
    /// Anything else: new content, the periodic recheck.
    Content,
}

impl Lane {
    /// The lane of a volume two changes touched: access when either was about access.
    fn with(self, other: Lane) -> Lane {
        if self == Lane::Access || other == Lane::Access { Lane::Access } else { Lane::Content }
    }
}

/// A volume to refresh: its id, and its pod (whose namespace its slots are counted against, and
/// whom its Events are about).
#[derive(Debug, Clone)]
struct Due {
    volume_id: String,
    of: VolumeOfPod,
}

/// Ends a pass at the content source once its last volume is done with it, with the shares'
/// per-node entries its volumes' records want then.
struct PassGuard {
    node: Arc<NodeService>,
    pass: PassId,
    /// Held while a pass's end reads the records and tells the source: two passes ending
    /// together tell it in the order they read, so the older never lands last.
    ending: Arc<Mutex<()>>,
}

impl Drop for PassGuard {
    fn drop(&mut self) {
        let _ending = self.ending.locked();
        let shares = self
            .node
            .refreshes_where(|record| Some((record.volume_id.clone(), node_entries::share_of(&record.attributes)?)));
        self.node.end_pass(self.pass, Some(node_entries::wanted(&shares)));
    }
}

/// Refreshes `node`'s volumes as the changes `source` notes (when it can tell) and the tick
/// every `every` say, until `stopped` turns true, telling `events` what the refreshes did, and
/// `source` which volumes are gone.
pub async fn run(
    node: Arc<NodeService>,
    source: Arc<dyn ContentSource>,
    every: Duration,
    stopped: watch::Receiver<bool>,
    events: Arc<dyn PodEvents>,
) {
    let changes = source.changes();
    let mut refresher = Refresher::new(node, events);
    refresher.source = Some(source);
    refresher.run(changes, every, stopped).await;
}

/// The refresher's parts, shared by the loop and every volume's task.
#[derive(Clone)]
struct Refresher {
    node: Arc<NodeService>,
    access_slots: Arc<FairSlots>,
    content_slots: Arc<FairSlots>,
    in_flight: Arc<Mutex<InFlight>>,
    events: Arc<dyn PodEvents>,
    pacing: Arc<Mutex<EventPacing>>,
    pass_ends: Arc<Mutex<()>>,
    /// Told which volumes are gone.
    source: Option<Arc<dyn ContentSource>>,
}

impl Refresher {
    fn new(node: Arc<NodeService>, events: Arc<dyn PodEvents>) -> Refresher {
        Refresher {
            node,
            access_slots: FairSlots::halved(CONCURRENT_REFRESHES),
            content_slots: FairSlots::halved(CONCURRENT_REFRESHES),
            in_flight: Arc::default(),
            events,
            pacing: Arc::default(),
            pass_ends: Arc::default(),
            source: None,
        }
    }

    fn slots(&self, lane: Lane) -> &Arc<FairSlots> {
        match lane {
            Lane::Access => &self.access_slots,
            Lane::Content => &self.content_slots,
        }
    }

    async fn run(self, changes: Option<Arc<Changes>>, every: Duration, mut stopped: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        // On its own task: a tick here would drop a change `next_change` had taken.
        tokio::spawn(self.clone().write_gauges(stopped.clone()));
        loop {
            let pending = tokio::select! {
                _ = ticker.tick() => Pending::everything(),
                pending = next_change(changes.as_deref()) => pending,
                _ = stopped.wait_for(|stop| *stop) => return,
            };
            self.tell_absences(&pending.absences);
            self.dispatch(&pending);
        }
    }

    /// Starts a refresh of every volume `pending` touches, in one new pass.
    fn dispatch(&self, pending: &Pending) {
        let due = self.node.volumes_where(|record| {
            let (namespace, account) = (&record.pod.namespace, &record.pod.service_account);
            if !pending.touches(&record.attributes, namespace, account) {
                return None;
            }
            let lane = match pending.accounts.iter().any(|accounts| accounts.include(namespace, account)) {
                true => Lane::Access,
                false => Lane::Content,
            };
            Some((volume_of_pod(record), lane))
        });
        if due.is_empty() {
            return;
        }
        let pass = self.node.start_pass();
        let guard = Arc::new(PassGuard { node: self.node.clone(), pass, ending: self.pass_ends.clone() });
        for (volume_id, (of, lane)) in due {
            let fresh = {
                let mut in_flight = self.in_flight.locked();
                if in_flight.running.contains(&volume_id) {
                    let again = in_flight.again.entry(volume_id.clone()).or_insert(lane);
                    *again = again.with(lane);
                    false
                } else {
                    in_flight.running.insert(volume_id.clone())
                }
            };
            if fresh {
                let due = Due { volume_id, of };
                tokio::spawn(self.clone().refresh(due, lane, Some(guard.clone())));
            }
        }
    }

    /// Refreshes one volume in `lane` (within `pass` at first), again while changes touched it
    /// meanwhile.
    async fn refresh(self, due: Due, mut lane: Lane, mut pass: Option<Arc<PassGuard>>) {
        let Due { volume_id, of } = due;
        loop {
            let permit = self.slots(lane).acquire(&of.pod.namespace).await;
            let node = self.node.clone();
            let id = volume_id.clone();
            // Held until the refresh is done: the pass's end reads what it wrote into the
            // volume's record.
            let this_pass = pass.take();
            let pass_id = this_pass.as_ref().map(|guard| guard.pass);
            let result = tokio::task::spawn_blocking(move || node.refresh_volume(&id, pass_id))
                .await
                .unwrap_or_else(|error| Some(Err(Error::local("the refresh failed", error))));
            drop(permit);
            let busy = matches!(result, Some(Err(Error::Busy(_))));
            self.tell(&volume_id, &of, &result);
            drop(this_pass);
            report(&volume_id, result);
            if busy {
                tokio::time::sleep(RETRY_BUSY_AFTER).await;
                continue;
            }
            let mut in_flight = self.in_flight.locked();
            match in_flight.again.remove(&volume_id) {
                Some(again) => lane = again,
                None => {
                    in_flight.running.remove(&volume_id);
                    return;
                }
            }
        }
    }
}

impl Refresher {
    /// Tells `of`'s pod what a refresh of `volume_id` did, when the pacing lets it.
    fn tell(&self, volume_id: &str, of: &VolumeOfPod, result: &Option<crate::volume::error::Result<bool>>) {
        let refreshed = match result {
            // Unpublished meanwhile: its pace went with its entry.
            None => return,
            // Another operation holds the volume: it is tried again shortly, nothing happened.
            Some(Err(Error::Busy(_))) => return,
            Some(Ok(true)) => Refreshed::Changed,
            Some(Ok(false)) => Refreshed::Unchanged,
            Some(Err(error)) => Refreshed::Failed { why: error.to_string() },
        };
        let now = Instant::now();
        let event =
            self.node.with_event_pace(volume_id, |paced| self.pacing.locked().event(paced, of, &refreshed, now));
        if let Some(event) = event.flatten() {
            self.events.tell(event);
        }
    }
}

impl Refresher {
    /// Writes the per-share gauges every [`GAUGES_EVERY`] until `stopped` turns true.
    async fn write_gauges(self, mut stopped: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(GAUGES_EVERY);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.update_gauges(),
                _ = stopped.wait_for(|stop| *stop) => return,
            }
        }
    }

    /// Writes the per-share gauges from the node's live volumes and their records, and tells
    /// the source which volumes are live.
    fn update_gauges(&self) {
        let mounted = self.node.refreshes_where(|record| Mounted::of(&record.attributes, &record.pod.namespace));
        let series = share_gauges::series(&mounted, SystemTime::now());
        self.node.metrics().set_share_series(&series);
        if let Some(source) = &self.source {
            let live: HashSet<String> = self.node.volume_ids_where(|_| true).into_iter().collect();
            source.gone(Gone::AllBut(&live));
        }
    }

    /// Tells each pod what its volume began to lack of what it marks optional, when its
    /// namespace's Events allow.
    fn tell_absences(&self, absences: &[Absence]) {
        for absence in absences {
            let pod = &absence.pod;
            let of = VolumeOfPod {
                pod: PodRef { namespace: pod.namespace.clone(), name: pod.name.clone(), uid: pod.uid.clone() },
                volume: absence.volume_name.clone(),
                mounts: mounts(&absence.attributes),
            };
            let event = self.pacing.locked().absent(&of, &absence.absent, Instant::now());
            if let Some(event) = event {
                self.events.tell(event);
            }
        }
    }
}

/// `record`'s volume as its pod's Events name it: the pod, the volume's name in the pod (the
/// directory kubelet made for it above the target), what it mounts.
fn volume_of_pod(record: &crate::volume::store::VolumeRecord) -> VolumeOfPod {
    let pod = &record.pod;
    let volume = record.target_path.parent().and_then(|dir| dir.file_name()).map(|name| name.to_string_lossy());
    VolumeOfPod {
        pod: PodRef { namespace: pod.namespace.clone(), name: pod.name.clone(), uid: pod.uid.clone() },
        volume: volume.map(|name| name.into_owned()).unwrap_or_default(),
        mounts: mounts(&record.attributes),
    }
}

/// The next change the source noted (never, for a source that cannot tell), gathered with what
/// follows it closely.
async fn next_change(changes: Option<&Changes>) -> Pending {
    let Some(changes) = changes else {
        return std::future::pending().await;
    };
    let mut pending = changes.next().await;
    tokio::time::sleep(GATHER).await;
    pending.merge(changes.take());
    pending
}

/// Logs what a refresh of `volume_id` did (`None`: the volume was unpublished meanwhile).
fn report(volume_id: &str, result: Option<crate::volume::error::Result<bool>>) {
    let volume = quote(volume_id);
    match result {
        Some(Ok(true)) => info!(%volume, "content refreshed"),
        Some(Ok(false)) | None => {}
        Some(Err(Error::Busy(_))) => debug!(%volume, "another operation holds the volume; refreshing it shortly"),
        Some(Err(error)) => {
            warn!(%volume, error = %Logged(&error), "content refresh failed; serving the previous content")
        }
    }
}

#[cfg(test)]
mod tests;
