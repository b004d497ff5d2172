//! What the node knows of the cluster, kept so that a publish need not ask the apiserver for it:
//! each share's backing object and conditions as last read, held until this node's object tells
//! of a change of that share (or of every object, or the node stops hearing notices:
//! [`super::node_view`], [`super::notice_lease`]); and each backing object's content as last
//! read, used only while it is at the resourceVersion its own watch last saw. A miss, or a
//! version the watch has moved past, is read from the apiserver; only shares this node read and
//! objects some share names are ever held.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
#[cfg(test)]
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::content::payload::Payload;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::ShareKind;
use sharedresource_api::shares::ObjectRef;

type ObjectKey = (ShareKind, String, String);

/// The shares held, by kind and name.
type HeldShares = HashMap<(ShareKind, String), CachedShare>;

/// Where a read of a share began, against the cache's forgets.
#[derive(Debug, Clone, Copy)]
pub struct ShareRead(u64);
/// A share as the watch holds it: the object it names and the conditions it reports.
pub type CachedShare = (ObjectRef, Vec<Condition>);

/// The cache; every method is a short critical section.
#[derive(Debug, Default)]
pub struct ShareCache {
    /// The shares read, and how many times shares were forgotten: a read that began before a
    /// forget may hold what the forget was for, so it is not kept.
    shares: Mutex<(HeldShares, u64)>,
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
    /// The share `name` of `kind`, when held.
    pub fn share(&self, kind: ShareKind, name: &str) -> Option<CachedShare> {
        lock(&self.shares).0.get(&(kind, name.to_string())).cloned()
    }

    /// Where a read of a share begins: [`ShareCache::keep_share`] keeps what it read only if no
    /// share was forgotten since.
    pub fn read_begins(&self) -> ShareRead {
        ShareRead(lock(&self.shares).1)
    }

    /// Keeps share `name` of `kind` as read (`None`: it does not exist, nothing is kept), unless
    /// a share was forgotten since `read` began.
    pub fn keep_share(&self, read: ShareRead, kind: ShareKind, name: &str, value: Option<CachedShare>) {
        let mut shares = lock(&self.shares);
        let Some(value) = value else { return };
        if shares.1 == read.0 {
            shares.0.insert((kind, name.to_string()), value);
        }
    }

    /// The conditions this node wrote to share `name` of `kind`: what it holds says them.
    pub fn wrote_conditions(&self, kind: ShareKind, name: &str, conditions: Vec<Condition>) {
        if let Some(held) = lock(&self.shares).0.get_mut(&(kind, name.to_string())) {
            held.1 = conditions;
        }
    }

    /// Forgets share `name` of `kind` (it changed): the next look reads it.
    pub fn forget_share(&self, kind: ShareKind, name: &str) {
        let mut shares = lock(&self.shares);
        shares.0.remove(&(kind, name.to_string()));
        shares.1 += 1;
    }

    /// Forgets every share held.
    pub fn forget_shares(&self) {
        let mut shares = lock(&self.shares);
        shares.0.clear();
        shares.1 += 1;
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
    fn a_share_read_is_held_until_forgotten_unless_a_forget_came_during_the_read() {
        let cache = ShareCache::default();
        let backing = ObjectRef { namespace: "infra".into(), name: "db".into() };
        let read = cache.read_begins();
        cache.keep_share(read, ShareKind::Secret, "a", Some((backing.clone(), vec![])));
        assert_eq!(cache.share(ShareKind::Secret, "a").map(|s| s.0), Some(backing.clone()));
        assert_eq!(cache.share(ShareKind::ConfigMap, "a"), None);
        cache.forget_share(ShareKind::Secret, "a");
        assert_eq!(cache.share(ShareKind::Secret, "a"), None);

        let slow = cache.read_begins();
        cache.forget_share(ShareKind::Secret, "b");
        cache.keep_share(slow, ShareKind::Secret, "a", Some((backing.clone(), vec![])));
        assert_eq!(cache.share(ShareKind::Secret, "a"), None, "read before a forget: not held");

        cache.keep_share(cache.read_begins(), ShareKind::Secret, "a", Some((backing.clone(), vec![])));
        let condition = Condition {
            type_: "BackingObjectExists".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            status: "True".into(),
            reason: "Found".into(),
            message: String::new(),
            observed_generation: None,
        };
        cache.wrote_conditions(ShareKind::Secret, "a", vec![condition.clone()]);
        assert_eq!(cache.share(ShareKind::Secret, "a").map(|s| s.1), Some(vec![condition]));
        cache.forget_shares();
        assert_eq!(cache.share(ShareKind::Secret, "a"), None);
    }
}
