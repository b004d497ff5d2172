//! Which of this node's entries in the shares' status are to be written: the volume layer says
//! at each refresh pass's end what it wants for each share (`share_entries`), and only changes
//! are written (`share_status::write_node_entries`): an entry once when a share's volumes start
//! failing, again when what is said changes, removed when they are current again or
//! unpublished. A share whose status, as this run first read it, lists this node is written
//! once after the driver starts, so an entry a previous run left is removed when the failure is
//! gone; one whose status does not list it needs nothing written (every node applying a
//! removal to every share it serves at its start was a server-side apply per node and share,
//! each costing the apiserver more the more nodes' field managers the share carries).
//!
//! Kept by share, never by volume: bounded by the shares this node's volumes mount (and those
//! whose entry is still to be removed).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::content::share_entries::{NodeEntry, ShareEntries, ShareKey};
use crate::unpoisoned::UnpoisonedMutex;

#[derive(Debug, Default)]
struct Inner {
    /// What the volume layer wants, as of the last pass's end.
    wanted: ShareEntries,
    /// What was last written for each share (`None`: no entry); a share absent was never
    /// written since the driver started.
    written: HashMap<ShareKey, Option<NodeEntry>>,
}

/// The entries wanted, and those written.
#[derive(Debug, Default)]
pub struct WrittenEntries {
    inner: Mutex<Inner>,
    /// Held by whoever takes entries to write until they are written: two passes ending
    /// together would otherwise write one share's entries in either order, and the older could
    /// land last.
    pub writing: tokio::sync::Mutex<()>,
}

impl WrittenEntries {
    /// The volume layer wants `wanted` now (a pass ended): it replaces what it wanted before.
    pub fn want(&self, wanted: ShareEntries) {
        self.inner.locked().wanted = wanted;
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

    /// The entries to write: each share whose wanted entry differs from the last written (or
    /// was never written), with the entry wanted (`None`: remove it). They count as written;
    /// [`WrittenEntries::not_written`] undoes that for a write that failed.
    pub fn to_write(&self) -> Vec<(ShareKey, Option<NodeEntry>)> {
        let mut inner = self.inner.locked();
        let Inner { wanted, written } = &mut *inner;
        // Shares no volume of this node mounts any more: their entry goes, then they are
        // forgotten.
        let gone: Vec<ShareKey> = written.keys().filter(|share| !wanted.contains_key(*share)).cloned().collect();
        let mut writes = Vec::new();
        for share in gone {
            if let Some(Some(_)) = written.remove(&share) {
                writes.push((share, None));
            }
        }
        for (share, entry) in wanted.iter() {
            if written.get(share) != Some(entry) {
                written.insert(share.clone(), entry.clone());
                writes.push((share.clone(), entry.clone()));
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
    use std::time::{Duration, SystemTime};

    use sharedresource_api::ShareKind;

    use super::*;

    fn db() -> ShareKey {
        (ShareKind::Secret, "db".into())
    }

    fn failing(message: &str, since: u64) -> Option<NodeEntry> {
        Some(NodeEntry { message: message.into(), since: SystemTime::UNIX_EPOCH + Duration::from_secs(since) })
    }

    fn wanted(entries: &[(ShareKey, Option<NodeEntry>)]) -> ShareEntries {
        entries.iter().cloned().collect()
    }

    #[test]
    fn an_entry_is_written_when_failing_starts_changes_and_ends_and_only_then() {
        let entries = WrittenEntries::default();
        entries.want(wanted(&[(db(), None)]));
        assert_eq!(entries.to_write(), [(db(), None)], "once after a start: an old run's entry removed");
        assert_eq!(entries.to_write(), [], "nothing changed");

        entries.want(wanted(&[(db(), failing("1 volume", 20))]));
        assert_eq!(entries.to_write(), [(db(), failing("1 volume", 20))]);
        entries.want(wanted(&[(db(), failing("1 volume", 20))]));
        assert_eq!(entries.to_write(), [], "still failing the same way: nothing written");

        entries.want(wanted(&[(db(), failing("2 volumes", 20))]));
        assert_eq!(entries.to_write(), [(db(), failing("2 volumes", 20))]);
        entries.not_written(&db());
        assert_eq!(entries.to_write(), [(db(), failing("2 volumes", 20))], "a failed write is tried again");

        entries.want(wanted(&[(db(), None)]));
        assert_eq!(entries.to_write(), [(db(), None)], "current again: removed");
        entries.want(wanted(&[]));
        assert_eq!(entries.to_write(), [], "no entry to remove: the share is forgotten");
        assert!(entries.inner.locked().written.is_empty());
    }

    #[test]
    fn a_share_read_without_this_nodes_entry_needs_no_removal_at_start() {
        let entries = WrittenEntries::default();
        entries.read_status(db(), false);
        entries.want(wanted(&[(db(), None)]));
        assert_eq!(entries.to_write(), [], "the share lists no entry of this node: nothing to remove");
        entries.want(wanted(&[(db(), failing("1 volume", 20))]));
        assert_eq!(entries.to_write().len(), 1, "a failure is still written");

        // Listed: a previous run's entry, removed once the volume is current.
        let entries = WrittenEntries::default();
        entries.read_status(db(), true);
        entries.want(wanted(&[(db(), None)]));
        assert_eq!(entries.to_write(), [(db(), None)]);
        assert_eq!(entries.to_write(), []);
        // Read again while that removal had not landed: written again, not assumed gone.
        entries.read_status(db(), true);
        assert_eq!(entries.to_write(), [(db(), None)]);
        // A read not listing it after an entry of this run's was written changes nothing.
        entries.want(wanted(&[(db(), failing("1 volume", 20))]));
        assert_eq!(entries.to_write().len(), 1);
        entries.read_status(db(), false);
        assert_eq!(entries.to_write(), [], "this run's entry stays its own to remove");
    }

    #[test]
    fn a_share_whose_last_failing_volume_is_unpublished_has_its_entry_removed() {
        let entries = WrittenEntries::default();
        entries.want(wanted(&[(db(), failing("1 volume", 10))]));
        assert_eq!(entries.to_write().len(), 1);
        entries.want(wanted(&[]));
        assert_eq!(entries.to_write(), [(db(), None)]);
        assert_eq!(entries.to_write(), []);
    }
}
