//! What the watches know, kept so that a publish need not ask the apiserver for it: every share's
//! backing object and conditions (from the shares watch, once it has listed them all), and each
//! backing object's content as last read, used only while it is at the resourceVersion its
//! namespace watch last saw. A miss, or a version the watch has moved past, is read from the
//! apiserver; only objects some share names are ever held.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::content::payload::Payload;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::ShareKind;
use sharedresource_api::shares::ObjectRef;

type ObjectKey = (ShareKind, String, String);
/// A share as the watch holds it: the object it names and the conditions it reports.
pub type CachedShare = (ObjectRef, Vec<Condition>);

/// The cache; every method is a short critical section.
#[derive(Debug, Default)]
pub struct ShareCache {
    shares: Mutex<HashMap<(ShareKind, String), CachedShare>>,
    listed: Mutex<HashSet<ShareKind>>,
    versions: Mutex<HashMap<ObjectKey, String>>,
    contents: Mutex<HashMap<ObjectKey, (String, Payload)>>,
    reads: Mutex<HashMap<ObjectKey, ReadsSinceList>>,
}

/// The versions of a backing object read since its watch last listed it: the first, and
/// whether any other was read.
#[derive(Debug)]
struct ReadsSinceList {
    version: String,
    mixed: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.locked()
}

impl ShareCache {
    /// The share `name` of `kind`, when the watch holds it.
    pub fn share(&self, kind: ShareKind, name: &str) -> Option<CachedShare> {
        lock(&self.shares).get(&(kind, name.to_string())).cloned()
    }

    /// Replaces every share of `kind` (the watch's complete list).
    pub fn list_shares(&self, kind: ShareKind, shares: HashMap<String, CachedShare>) {
        let mut all = lock(&self.shares);
        all.retain(|(k, _), _| *k != kind);
        all.extend(shares.into_iter().map(|(name, value)| ((kind, name), value)));
        lock(&self.listed).insert(kind);
    }

    /// Notes a share created or changed (`Some`) or deleted (`None`).
    pub fn set_share(&self, kind: ShareKind, name: &str, value: Option<CachedShare>) {
        let key = (kind, name.to_string());
        match value {
            Some(value) => lock(&self.shares).insert(key, value),
            None => lock(&self.shares).remove(&key),
        };
    }

    /// Notes the resourceVersion a namespace watch saw for a backing object (`None`: deleted).
    pub fn saw_version(&self, kind: ShareKind, namespace: &str, name: &str, version: Option<String>) {
        let key = (kind, namespace.to_string(), name.to_string());
        match version {
            Some(version) => lock(&self.versions).insert(key, version),
            None => {
                lock(&self.contents).remove(&key);
                lock(&self.reads).remove(&key);
                lock(&self.versions).remove(&key)
            }
        };
    }

    /// The content of a backing object, when it was read at the version the watch last saw.
    pub fn content(&self, kind: ShareKind, namespace: &str, name: &str) -> Option<Payload> {
        let key = (kind, namespace.to_string(), name.to_string());
        let version = lock(&self.versions).get(&key).cloned()?;
        lock(&self.contents).get(&key).filter(|(read, _)| *read == version).map(|(_, payload)| payload.clone())
    }

    /// Keeps the content of a backing object read at `version`.
    pub fn store_content(&self, kind: ShareKind, namespace: &str, name: &str, version: String, payload: Payload) {
        let key = (kind, namespace.to_string(), name.to_string());
        lock(&self.reads)
            .entry(key.clone())
            .and_modify(|reads| reads.mixed |= reads.version != version)
            .or_insert_with(|| ReadsSinceList { version: version.clone(), mixed: false });
        lock(&self.contents).insert(key, (version, payload));
    }

    /// Notes the version a watch's list found for a backing object (`None`: not found), and
    /// says whether the volumes served from it may hold another: unless every read since the
    /// last list, and the last event the watch saw, were at the listed version. So a watch
    /// that starts after the publish that read its object, and lists what was read, wakes no
    /// volume; a relist after an error wakes them only when it finds a change it missed.
    pub fn listed_version(&self, kind: ShareKind, namespace: &str, name: &str, listed: Option<String>) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        let reads = lock(&self.reads).remove(&key);
        let watched = lock(&self.versions).get(&key).cloned();
        let may_differ = match &listed {
            None => true,
            Some(listed) => {
                let reads_agree = reads.as_ref().is_none_or(|r| !r.mixed && r.version == *listed);
                let watch_agrees = watched.as_ref().is_none_or(|w| w == listed);
                let anything_known = reads.is_some() || watched.is_some();
                !(reads_agree && watch_agrees && anything_known)
            }
        };
        self.saw_version(kind, namespace, name, listed);
        may_differ
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::payload::FileContent;

    #[test]
    fn content_is_served_only_at_the_version_the_watch_last_saw() {
        let cache = ShareCache::default();
        let payload: Payload = [("k".to_string(), FileContent::new("v"))].into();
        cache.store_content(ShareKind::Secret, "ns", "s", "5".into(), payload.clone());
        assert_eq!(cache.content(ShareKind::Secret, "ns", "s"), None, "the watch has not seen it");
        cache.saw_version(ShareKind::Secret, "ns", "s", Some("5".into()));
        assert_eq!(cache.content(ShareKind::Secret, "ns", "s"), Some(payload));
        cache.saw_version(ShareKind::Secret, "ns", "s", Some("6".into()));
        assert_eq!(cache.content(ShareKind::Secret, "ns", "s"), None, "changed since it was read");
        cache.saw_version(ShareKind::Secret, "ns", "s", None);
        assert_eq!(cache.content(ShareKind::Secret, "ns", "s"), None);
    }

    fn payload(value: &str) -> Payload {
        [("k".to_string(), FileContent::new(value))].into()
    }

    #[test]
    fn a_first_list_at_the_version_the_publish_read_wakes_nothing() {
        let cache = ShareCache::default();
        cache.store_content(ShareKind::Secret, "ns", "s", "5".into(), payload("v"));
        assert!(!cache.listed_version(ShareKind::Secret, "ns", "s", Some("5".into())));
        assert_eq!(cache.content(ShareKind::Secret, "ns", "s"), Some(payload("v")));
    }

    #[test]
    fn a_list_that_may_differ_from_what_volumes_hold_wakes_them() {
        struct Case {
            name: &'static str,
            reads: &'static [&'static str],
            watched: Option<&'static str>,
            listed: Option<&'static str>,
        }
        let cases = [
            Case { name: "changed between the read and the list", reads: &["5"], watched: None, listed: Some("6") },
            Case { name: "two publishes read two versions", reads: &["5", "6"], watched: None, listed: Some("6") },
            Case {
                name: "a relist finds a change the watch missed",
                reads: &[],
                watched: Some("5"),
                listed: Some("7"),
            },
            Case { name: "deleted before the list", reads: &["5"], watched: None, listed: None },
            Case { name: "nothing known of it", reads: &[], watched: None, listed: Some("5") },
        ];
        for case in cases {
            let cache = ShareCache::default();
            if let Some(watched) = case.watched {
                cache.saw_version(ShareKind::Secret, "ns", "s", Some(watched.into()));
            }
            for version in case.reads {
                cache.store_content(ShareKind::Secret, "ns", "s", version.to_string(), payload(version));
            }
            let listed = case.listed.map(str::to_string);
            assert!(cache.listed_version(ShareKind::Secret, "ns", "s", listed), "{}", case.name);
        }
    }

    #[test]
    fn a_relist_that_finds_what_the_watch_saw_wakes_nothing_and_forgets_the_reads() {
        let cache = ShareCache::default();
        cache.store_content(ShareKind::Secret, "ns", "s", "5".into(), payload("v"));
        cache.store_content(ShareKind::Secret, "ns", "s", "6".into(), payload("w"));
        assert!(cache.listed_version(ShareKind::Secret, "ns", "s", Some("6".into())), "two versions were read");
        assert!(!cache.listed_version(ShareKind::Secret, "ns", "s", Some("6".into())), "the relist found no change");
    }

    #[test]
    fn shares_follow_the_watch() {
        let cache = ShareCache::default();
        let backing = ObjectRef { namespace: "infra".into(), name: "db".into() };
        cache.list_shares(ShareKind::Secret, [("a".to_string(), (backing.clone(), vec![]))].into());
        assert_eq!(cache.share(ShareKind::Secret, "a").map(|s| s.0), Some(backing.clone()));
        assert_eq!(cache.share(ShareKind::ConfigMap, "a"), None);
        cache.set_share(ShareKind::Secret, "a", None);
        assert_eq!(cache.share(ShareKind::Secret, "a"), None);
    }
}
