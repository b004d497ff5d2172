//! Which shares have volumes on this node that could not take their latest update (and so
//! serve what they had), for the shares' status: the refresher tells each refresh of a share's
//! volume how it ended, and when a pass ends the shares whose entry for this node should change
//! are written (`share_status::write_node_entries`). Only changes are written: an entry once
//! when a share's volumes start failing, again when what is said changes, removed when they are
//! current again or unpublished. A share whose status, as this run first read it, lists this
//! node is written once after the driver starts, so an entry a previous run left is removed
//! when the failure is gone; one whose status does not list it needs nothing written (every
//! node applying a removal to every share it serves at its start was a server-side apply per
//! node and share, each costing the apiserver more the more nodes' field managers the share
//! carries).
//!
//! Bounded by the volumes of this node: one record per volume, one per share with volumes (or
//! whose entry is still to be removed).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::SystemTime;

use sharedresource_api::ShareKind;

use crate::content::live_volumes::SecondLook;
use crate::unpoisoned::UnpoisonedMutex;

/// The longest reason quoted in an entry.
pub const MAX_WHY_BYTES: usize = 512;

/// A share, by kind and name.
pub type ShareKey = (ShareKind, String);

/// This node's entry in a share's status: how many of its volumes fail, why the first does,
/// and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// The words of the entry.
    pub message: String,
    /// When the first of those volumes started failing.
    pub since: SystemTime,
}

/// One volume's last refresh.
#[derive(Debug, Clone)]
struct VolumeState {
    share: ShareKey,
    /// Why its last refresh failed, and since when it fails; `None` when it succeeded.
    failing: Option<(String, SystemTime)>,
}

#[derive(Debug, Default)]
struct Inner {
    volumes: HashMap<String, VolumeState>,
    looks: SecondLook,
    /// What was last written for each share (`None`: no entry); a share absent was never
    /// written since the driver started.
    written: HashMap<ShareKey, Option<NodeEntry>>,
}

/// The refreshes' outcomes by volume, and the entries written.
#[derive(Debug, Default)]
pub struct UpdateFailures {
    inner: Mutex<Inner>,
    /// Held by whoever takes entries to write until they are written: two passes ending
    /// together would otherwise write one share's entries in either order, and the older could
    /// land last.
    pub writing: tokio::sync::Mutex<()>,
}

impl UpdateFailures {
    /// A refresh of `volume_id`, a volume of `share`, failed with `why` at `now`, or succeeded
    /// (`why` is `None`).
    pub fn refreshed(&self, volume_id: &str, share: ShareKey, why: Option<String>, now: SystemTime) {
        let mut inner = self.inner.locked();
        let since = inner
            .volumes
            .get(volume_id)
            .filter(|state| state.share == share)
            .and_then(|state| state.failing.as_ref().map(|(_, since)| *since));
        let failing = why.map(|why| (crate::quote::bounded(why, MAX_WHY_BYTES), since.unwrap_or(now)));
        inner.volumes.insert(volume_id.to_string(), VolumeState { share, failing });
    }

    /// A read of `share` found its status listing this node (`listed`) or not. Not listed, and
    /// not written since the driver started: nothing is there to remove. Listed where this run
    /// wrote no entry (a previous run's, or a removal not landed when the share was read): it is
    /// written again.
    pub fn read_status(&self, share: ShareKey, listed: bool) {
        let mut inner = self.inner.locked();
        match (listed, inner.written.get(&share)) {
            (false, None) => {
                inner.written.insert(share, None);
            }
            (true, Some(None)) => {
                inner.written.remove(&share);
            }
            _ => {}
        }
    }

    /// `volume_id` is unpublished.
    pub fn released(&self, volume_id: &str) {
        self.inner.locked().volumes.remove(volume_id);
    }

    /// Forgets the volumes two looks in a row did not find among `live`: a refresh that ended
    /// just after its volume's unpublish noted it again, and its failure would otherwise keep
    /// this node's entry forever.
    pub fn retain_live(&self, live: &HashSet<String>) {
        let mut inner = self.inner.locked();
        let Inner { volumes, looks, .. } = &mut *inner;
        for id in looks.to_forget(volumes.keys(), live) {
            volumes.remove(&id);
        }
    }

    /// The entries to write: each share whose wanted entry differs from the last written (or
    /// was never written), with the entry wanted (`None`: remove it). They count as written;
    /// [`UpdateFailures::not_written`] undoes that for a write that failed.
    pub fn to_write(&self) -> Vec<(ShareKey, Option<NodeEntry>)> {
        let mut inner = self.inner.locked();
        let mut wanted: BTreeMap<ShareKey, Option<NodeEntry>> = BTreeMap::new();
        let mut failing: BTreeMap<&ShareKey, Vec<(&String, &String, SystemTime)>> = BTreeMap::new();
        for (volume, state) in &inner.volumes {
            wanted.entry(state.share.clone()).or_insert(None);
            if let Some((why, since)) = &state.failing {
                failing.entry(&state.share).or_default().push((volume, why, *since));
            }
        }
        for (share, mut volumes) in failing {
            volumes.sort();
            let since = volumes.iter().map(|(_, _, since)| *since).min().unwrap_or(SystemTime::UNIX_EPOCH);
            let message = match volumes.as_slice() {
                [(_, why, _)] => format!("1 volume on this node serves its previous content: {why}"),
                [(_, why, _), ..] => {
                    format!("{} volumes on this node serve their previous content; the first: {why}", volumes.len())
                }
                [] => continue,
            };
            wanted.insert(share.clone(), Some(NodeEntry { message, since }));
        }
        // Shares no volume of this node mounts any more: their entry goes, then they are
        // forgotten.
        let gone: Vec<ShareKey> = inner.written.keys().filter(|share| !wanted.contains_key(*share)).cloned().collect();
        let mut writes = Vec::new();
        for share in gone {
            if let Some(Some(_)) = inner.written.remove(&share) {
                writes.push((share, None));
            }
        }
        for (share, entry) in wanted {
            if inner.written.get(&share) != Some(&entry) {
                inner.written.insert(share.clone(), entry.clone());
                writes.push((share, entry));
            }
        }
        writes
    }

    /// Writing `share`'s entry failed: it is written again at the next pass's end.
    pub fn not_written(&self, share: &ShareKey) {
        self.inner.locked().written.remove(share);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn db() -> ShareKey {
        (ShareKind::Secret, "db".into())
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn an_entry_is_written_when_failing_starts_changes_and_ends_and_only_then() {
        let failures = UpdateFailures::default();
        failures.refreshed("v1", db(), None, at(10));
        assert_eq!(failures.to_write(), [(db(), None)], "once after a start: an old run's entry removed");
        assert_eq!(failures.to_write(), [], "nothing changed");

        failures.refreshed("v1", db(), Some("too large".into()), at(20));
        let one =
            NodeEntry { message: "1 volume on this node serves its previous content: too large".into(), since: at(20) };
        assert_eq!(failures.to_write(), [(db(), Some(one))]);
        failures.refreshed("v1", db(), Some("too large".into()), at(30));
        assert_eq!(failures.to_write(), [], "still failing the same way: since stays, nothing written");

        failures.refreshed("v2", db(), Some("too large".into()), at(40));
        let two = NodeEntry {
            message: "2 volumes on this node serve their previous content; the first: too large".into(),
            since: at(20),
        };
        assert_eq!(failures.to_write(), [(db(), Some(two.clone()))], "since is the earliest");
        failures.not_written(&db());
        assert_eq!(failures.to_write(), [(db(), Some(two))], "a failed write is tried again");

        failures.refreshed("v1", db(), None, at(50));
        failures.released("v2");
        assert_eq!(failures.to_write(), [(db(), None)], "current again: removed");
        failures.released("v1");
        assert_eq!(failures.to_write(), [], "no entry to remove: the share is forgotten");
        assert!(failures.inner.locked().written.is_empty());
    }

    #[test]
    fn a_share_read_without_this_nodes_entry_needs_no_removal_at_start() {
        let failures = UpdateFailures::default();
        failures.read_status(db(), false);
        failures.refreshed("v1", db(), None, at(10));
        assert_eq!(failures.to_write(), [], "the share lists no entry of this node: nothing to remove");
        failures.refreshed("v1", db(), Some("too large".into()), at(20));
        assert_eq!(failures.to_write().len(), 1, "a failure is still written");

        // Listed: a previous run's entry, removed once the volume is current.
        let failures = UpdateFailures::default();
        failures.read_status(db(), true);
        failures.refreshed("v1", db(), None, at(10));
        assert_eq!(failures.to_write(), [(db(), None)]);
        assert_eq!(failures.to_write(), []);
        // Read again while that removal had not landed: written again, not assumed gone.
        failures.read_status(db(), true);
        assert_eq!(failures.to_write(), [(db(), None)]);
        // A read not listing it after an entry of this run's was written changes nothing.
        failures.refreshed("v1", db(), Some("too large".into()), at(20));
        assert_eq!(failures.to_write().len(), 1);
        failures.read_status(db(), false);
        assert_eq!(failures.to_write(), [], "this run's entry stays its own to remove");
    }

    #[test]
    fn a_share_whose_last_failing_volume_is_unpublished_has_its_entry_removed() {
        let failures = UpdateFailures::default();
        failures.refreshed("v1", db(), Some("too large".into()), at(10));
        assert_eq!(failures.to_write().len(), 1);
        failures.released("v1");
        assert_eq!(failures.to_write(), [(db(), None)]);
        assert_eq!(failures.to_write(), []);
    }

    #[test]
    fn a_failure_noted_after_its_volumes_unpublish_goes_at_the_second_look() {
        let failures = UpdateFailures::default();
        failures.refreshed("v1", db(), Some("too large".into()), at(10));
        assert_eq!(failures.to_write().len(), 1);
        // Unpublished, then the late refresh's end noted again.
        failures.released("v1");
        failures.refreshed("v1", db(), Some("too large".into()), at(11));
        assert_eq!(failures.to_write().len(), 1, "a ghost, failing since the late note");
        let live = HashSet::new();
        failures.retain_live(&live);
        assert_eq!(failures.to_write(), [], "one look is not enough");
        failures.retain_live(&live);
        assert_eq!(failures.to_write(), [(db(), None)], "gone: the entry is removed");
    }

    #[test]
    fn a_long_reason_is_bounded() {
        let failures = UpdateFailures::default();
        failures.refreshed("v1", db(), Some("x".repeat(10_000)), at(10));
        let written = failures.to_write();
        let Some(entry) = &written[0].1 else { panic!("{written:?}") };
        assert!(entry.message.len() < MAX_WHY_BYTES + 100, "{}", entry.message.len());
    }
}
