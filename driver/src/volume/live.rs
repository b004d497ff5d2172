//! The volumes this process serves, one entry each behind one lock: what is recorded of the
//! volume, what kubelet passed at its last publish (tokens, nodePublishSecretRef data: in memory
//! only, never in a record), the FUSE session of a lazy volume, what its refreshes did
//! (`refresh::record`), and its write generation; beside them, the volume ids and targets an operation holds. A
//! volume is forgotten in one place ([`LiveVolumes::forget`]), so nothing of it outlives it.

pub mod record;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::content::ask::PublishSecrets;
use crate::content::tokens::Tokens;
use crate::quote::{quote, quote_path};
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::error::{Error, Result};
use crate::volume::lazy::LazyMount;
use crate::volume::published::PublishedVolume;
use crate::volume::store::VolumeRecord;
use crate::volume::target_path::TargetPath;
use record::{Outcome, RefreshRecord};

/// One volume this process serves.
pub(crate) struct LiveVolume {
    /// Its record and its target.
    pub(crate) volume: PublishedVolume,
    /// The tokens kubelet passed at its last publish; `None` until this process sees one (a
    /// restart loses them until kubelet's next republish).
    pub(crate) tokens: Option<Tokens>,
    /// The nodePublishSecretRef data of its last publish; `None` as for tokens.
    pub(crate) secrets: Option<PublishSecrets>,
    /// The FUSE session serving it, for a lazy volume this process serves (a successor takes it
    /// over at a planned restart: `volume::lazy::handover`; none survives a crash: see recovery).
    pub(crate) lazy: Option<LazyMount>,
    /// What its refreshes did: the one record of it the refresh wing's reporters read.
    pub(crate) refreshes: RefreshRecord,
    /// What its content lacked, at its last, of what it marks optional: its pod hears of an
    /// absence once, when it begins, not at every refresh while it lasts.
    pub(crate) lacking: BTreeSet<String>,
    /// Changed whenever a publish or a republish writes the volume: a refresh whose content was
    /// fetched under an older generation writes nothing (it could roll the newer write back).
    pub(crate) generation: u64,
}

/// What an operation holds exclusively.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Busy {
    Volume(String),
    Target(PathBuf),
}

#[derive(Default)]
struct Table {
    volumes: HashMap<String, LiveVolume>,
    // Volume ids and targets with an operation under way: a second one on either is told to
    // retry (ABORTED), as the specification asks, instead of racing the first.
    busy: HashSet<Busy>,
}

/// The live volumes of this process.
pub(crate) struct LiveVolumes {
    table: Mutex<Table>,
    // Generations are never reused, not even by a volume published again after an unpublish.
    generations: AtomicU64,
}

impl LiveVolumes {
    /// The volumes a previous run published (recovery kept their records); nothing kubelet
    /// passed is known of them yet.
    pub(crate) fn new(published: Vec<PublishedVolume>) -> LiveVolumes {
        let live = LiveVolumes { table: Mutex::default(), generations: AtomicU64::new(0) };
        for volume in published {
            live.insert(volume, None, None, None);
        }
        live
    }

    /// Serves `volume` from now on with what its publish passed, replacing any entry of its id.
    pub(crate) fn insert(
        &self,
        volume: PublishedVolume,
        tokens: Option<Tokens>,
        secrets: Option<PublishSecrets>,
        lazy: Option<LazyMount>,
    ) {
        let generation = self.next_generation();
        let id = volume.record.volume_id.clone();
        let refreshes = RefreshRecord::new(SystemTime::now());
        let entry = LiveVolume { volume, tokens, secrets, lazy, refreshes, lacking: BTreeSet::new(), generation };
        self.table.locked().volumes.insert(id, entry);
    }

    /// Forgets `volume_id`, everything of it at once (its FUSE session ends when the kernel lets
    /// go of its mount); what was held, if anything.
    pub(crate) fn forget(&self, volume_id: &str) -> Option<LiveVolume> {
        self.table.locked().volumes.remove(volume_id)
    }

    /// What `look` says of `volume_id`'s entry; `None` when it is not served.
    pub(crate) fn with<T>(&self, volume_id: &str, look: impl FnOnce(&LiveVolume) -> T) -> Option<T> {
        self.table.locked().volumes.get(volume_id).map(look)
    }

    /// Changes `volume_id`'s entry by `change`; `None` when it is not served.
    pub(crate) fn with_mut<T>(&self, volume_id: &str, change: impl FnOnce(&mut LiveVolume) -> T) -> Option<T> {
        self.table.locked().volumes.get_mut(volume_id).map(change)
    }

    /// `volume_id`'s record and target.
    pub(crate) fn published(&self, volume_id: &str) -> Option<PublishedVolume> {
        self.with(volume_id, |live| live.volume.clone())
    }

    /// `volume_id`'s record and target, and its write generation.
    pub(crate) fn published_at(&self, volume_id: &str) -> Option<(PublishedVolume, u64)> {
        self.with(volume_id, |live| (live.volume.clone(), live.generation))
    }

    /// A new write generation for `volume_id`, as a publish or republish is about to write it.
    pub(crate) fn new_generation(&self, volume_id: &str) {
        let generation = self.next_generation();
        self.with_mut(volume_id, |live| live.generation = generation);
    }

    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed)
    }

    /// The tokens of `volume_id`'s last publish, or [`Tokens::lost`] when this process has not
    /// seen one.
    pub(crate) fn tokens_of(&self, volume_id: &str) -> Tokens {
        self.with(volume_id, |live| live.tokens.clone()).flatten().unwrap_or_else(Tokens::lost)
    }

    /// The nodePublishSecretRef data of `volume_id`'s last publish; none after a restart, until
    /// kubelet's next republish brings them.
    pub(crate) fn secrets_of(&self, volume_id: &str) -> PublishSecrets {
        self.with(volume_id, |live| live.secrets.clone()).flatten().unwrap_or_default()
    }

    /// Notes how a refresh of `volume_id` ended, at `now`; nothing when it is no longer served
    /// (a refresh that ends after its volume's unpublish leaves nothing behind).
    pub(crate) fn note_refresh(&self, volume_id: &str, outcome: Outcome, now: SystemTime) {
        self.with_mut(volume_id, |live| live.refreshes.note(outcome, now));
    }

    /// Notes that `volume_id`'s content now lacks `absent`; returns those it did not lack at its
    /// previous content, for its pod to hear of (none when the volume is not served).
    pub(crate) fn note_lacking(&self, volume_id: &str, absent: Vec<String>) -> Vec<String> {
        self.with_mut(volume_id, |live| begun_absences(&mut live.lacking, absent)).unwrap_or_default()
    }

    /// How many volumes' last refresh failed.
    pub(crate) fn stale_count(&self) -> usize {
        self.table.locked().volumes.values().filter(|live| live.refreshes.stale()).count()
    }

    /// The volumes `pick` selects, each with what `pick` said of it and what its refreshes did.
    pub(crate) fn select_refreshes<T>(&self, pick: impl Fn(&VolumeRecord) -> Option<T>) -> Vec<(T, RefreshRecord)> {
        let table = self.table.locked();
        table.volumes.values().filter_map(|live| Some((pick(&live.volume.record)?, live.refreshes.clone()))).collect()
    }

    /// How many volumes are served.
    pub(crate) fn len(&self) -> usize {
        self.table.locked().volumes.len()
    }

    /// The volumes `pick` selects, each with what `pick` said of it.
    pub(crate) fn select<T>(&self, pick: impl Fn(&VolumeRecord) -> Option<T>) -> Vec<(String, T)> {
        let table = self.table.locked();
        table.volumes.iter().filter_map(|(id, live)| Some((id.clone(), pick(&live.volume.record)?))).collect()
    }

    /// Whether another volume is served at `target`.
    pub(crate) fn target_holds_another_volume(&self, target: &TargetPath, volume_id: &str) -> bool {
        self.table
            .locked()
            .volumes
            .values()
            .any(|live| live.volume.target == *target && live.volume.record.volume_id != volume_id)
    }

    /// Takes every FUSE session this process serves out of the table, for `hand` to pass to a
    /// successor, without holding the table meanwhile (its caller holds every operation off).
    /// Handed (`Ok`), they are dropped: the successor holds its own descriptors of the
    /// connections. Failed, they are put back as `hand` left them (it resumes them).
    pub(crate) fn hand_over_lazy(&self, hand: impl FnOnce(&mut Vec<(String, LazyMount)>) -> Result<()>) -> Result<()> {
        let mut mounts: Vec<(String, LazyMount)> = {
            let mut table = self.table.locked();
            table.volumes.iter_mut().filter_map(|(id, live)| Some((id.clone(), live.lazy.take()?))).collect()
        };
        let handed = hand(&mut mounts);
        if handed.is_err() {
            let mut table = self.table.locked();
            for (id, mount) in mounts {
                if let Some(live) = table.volumes.get_mut(&id) {
                    live.lazy = Some(mount);
                }
            }
        }
        handed
    }

    /// Marks `volume_id` and `target` busy until the claim is dropped (ABORTED meanwhile).
    pub(crate) fn claim(&self, volume_id: &str, target: &Path) -> Result<Claim<'_>> {
        let keys = [Busy::Volume(volume_id.to_string()), Busy::Target(target.to_path_buf())];
        let mut table = self.table.locked();
        if let Some(taken) = keys.iter().find(|key| table.busy.contains(key)) {
            let what = match taken {
                Busy::Volume(id) => format!("volume {}", quote(id)),
                Busy::Target(path) => quote_path(path),
            };
            return Err(Error::Busy(format!("an operation on {what} is in progress")));
        }
        table.busy.extend(keys.iter().cloned());
        Ok(Claim { live: self, keys })
    }
}

/// Replaces `lacking` by `absent`; those of `absent` it did not hold.
fn begun_absences(lacking: &mut BTreeSet<String>, absent: Vec<String>) -> Vec<String> {
    let now: BTreeSet<String> = absent.into_iter().collect();
    let begun = now.difference(lacking).cloned().collect();
    *lacking = now;
    begun
}

/// Marks a volume id and a target busy for the life of an operation.
pub(crate) struct Claim<'a> {
    live: &'a LiveVolumes,
    keys: [Busy; 2],
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut table = self.live.table.locked();
        for key in &self.keys {
            table.busy.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| item.to_string()).collect()
    }

    #[test]
    fn an_absence_is_told_when_it_begins_and_again_only_after_it_ended() {
        let mut lacking = BTreeSet::new();
        assert_eq!(begun_absences(&mut lacking, texts(&["a"])), ["a"], "at publish");
        assert!(begun_absences(&mut lacking, texts(&["a"])).is_empty(), "a refresh while it lasts");
        assert_eq!(begun_absences(&mut lacking, texts(&["a", "b"])), ["b"], "a second object gone: only it");
        assert!(begun_absences(&mut lacking, texts(&["b"])).is_empty(), "one back, the other still gone");
        assert!(begun_absences(&mut lacking, Vec::new()).is_empty(), "whole again");
        assert!(lacking.is_empty());
        assert_eq!(begun_absences(&mut lacking, texts(&["b"])), ["b"], "gone again: told again");
    }
}
