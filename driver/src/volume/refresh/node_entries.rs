//! The shares' per-node entries this node wants, composed from its live volumes' refresh
//! records at a pass's end: for each share a volume mounts and has said something of, no entry
//! while its volumes are current, or how many serve their previous content, why the first
//! does and since when the earliest fails. Only a share's volumes count: a projection's
//! failure may be the projection's, not a share's. Pure; the content source writes what
//! changed (`content::cluster::written_entries`).

use std::collections::BTreeMap;
use std::time::SystemTime;

use sharedresource_api::Selection;
use sharedresource_api::volume_attributes::selection;

use crate::content::share_entries::{NodeEntry, ShareEntries, ShareKey};
use crate::volume::live::record::{Failing, RefreshRecord, ShareSaid};

/// The share a volume with `attributes` mounts, if it mounts one.
pub fn share_of(attributes: &BTreeMap<String, String>) -> Option<ShareKey> {
    match selection(attributes).ok()? {
        Selection::Share(kind, name) => Some((kind, name.as_str().to_string())),
        _ => None,
    }
}

/// The entries wanted for `volumes` (the share each mounts, by volume id, and what its
/// refreshes did).
pub fn wanted(volumes: &[((String, ShareKey), RefreshRecord)]) -> ShareEntries {
    let mut wanted: ShareEntries = BTreeMap::new();
    let mut failing: BTreeMap<&ShareKey, Vec<(&String, &Failing)>> = BTreeMap::new();
    for ((volume, share), record) in volumes {
        match &record.share {
            ShareSaid::NotYet => continue,
            ShareSaid::Current => {}
            ShareSaid::Failing(failure) => failing.entry(share).or_default().push((volume, failure)),
        }
        wanted.entry(share.clone()).or_insert(None);
    }
    for (share, mut volumes) in failing {
        // By volume id: the same volume is "the first" from one pass to the next.
        volumes.sort_by(|a, b| a.0.cmp(b.0));
        let since = volumes.iter().map(|(_, failure)| failure.since).min().unwrap_or(SystemTime::UNIX_EPOCH);
        let message = match volumes.as_slice() {
            [(_, first)] => format!("1 volume on this node serves its previous content: {}", first.why),
            [(_, first), ..] => {
                format!("{} volumes on this node serve their previous content; the first: {}", volumes.len(), first.why)
            }
            [] => continue,
        };
        wanted.insert(share.clone(), Some(NodeEntry { message, since }));
    }
    wanted
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sharedresource_api::ShareKind;

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn db() -> ShareKey {
        (ShareKind::Secret, "db".into())
    }

    fn volume(id: &str, share: ShareSaid) -> ((String, ShareKey), RefreshRecord) {
        ((id.into(), db()), RefreshRecord { share, ..RefreshRecord::new(at(1)) })
    }

    fn failing(why: &str, since: u64) -> ShareSaid {
        ShareSaid::Failing(Failing { since: at(since), why: why.into() })
    }

    #[test]
    fn a_share_with_current_volumes_wants_no_entry_and_one_not_yet_told_is_left_alone() {
        assert_eq!(wanted(&[volume("v1", ShareSaid::Current)]), BTreeMap::from([(db(), None)]));
        assert!(wanted(&[volume("v1", ShareSaid::NotYet)]).is_empty(), "nothing said: nothing written at a start");
    }

    #[test]
    fn failing_volumes_are_counted_the_first_named_and_the_earliest_since_given() {
        let one = wanted(&[volume("v1", ShareSaid::Current), volume("v2", failing("too large", 20))]);
        let entry =
            NodeEntry { message: "1 volume on this node serves its previous content: too large".into(), since: at(20) };
        assert_eq!(one, BTreeMap::from([(db(), Some(entry))]));
        let two = wanted(&[volume("v2", failing("gone", 30)), volume("v1", failing("too large", 40))]);
        let entry = NodeEntry {
            message: "2 volumes on this node serve their previous content; the first: too large".into(),
            since: at(30),
        };
        assert_eq!(two, BTreeMap::from([(db(), Some(entry))]), "the first by volume id; since the earliest");
    }

    #[test]
    fn only_a_shares_volume_has_a_share() {
        let attributes = |key: &str, value: &str| BTreeMap::from([(key.to_string(), value.to_string())]);
        assert_eq!(share_of(&attributes("sharedSecret", "db")), Some(db()));
        assert_eq!(share_of(&attributes("projection", "app")), None);
    }
}
