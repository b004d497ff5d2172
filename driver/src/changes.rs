//! What changed since the last refresh: everything (a grant given or taken, a watch started, the
//! periodic tick), or the shares and projections some events name. Watches note changes here; the
//! refresher takes them and refreshes only the volumes they touch, so an update to one Secret
//! rewrites the volumes of the shares backed by it (and of the projections naming those shares),
//! not every volume of the node.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use tokio::sync::Notify;

/// The volume attribute naming a projection (kept here so this module needs no other).
const PROJECTION: &str = crate::projection::api::PROJECTION_ATTRIBUTE;

/// A volume attribute and its value, such as (`sharedSecret`, `db`).
type Named = (String, String);
/// A projection: its namespace and name.
type ProjectionKey = (String, String);

/// Changes waiting for the refresher.
#[derive(Debug, Default)]
pub struct Changes {
    wake: Notify,
    pending: Mutex<Pending>,
    // Which projections show each share, as last fetched: a change to the share is a change to
    // them.
    users: Mutex<HashMap<Named, HashSet<ProjectionKey>>>,
}

/// What a refresh must cover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Every volume.
    pub everything: bool,
    /// The volumes whose attributes hold one of these (attribute, value) pairs, such as
    /// (`sharedSecret`, `db`).
    pub shares: HashSet<Named>,
    /// The volumes of these projections (namespace, name).
    pub projections: HashSet<ProjectionKey>,
}

impl Pending {
    /// Every volume.
    pub fn everything() -> Pending {
        Pending { everything: true, ..Pending::default() }
    }

    /// Adds what `other` covers.
    pub fn merge(&mut self, other: Pending) {
        self.everything |= other.everything;
        self.shares.extend(other.shares);
        self.projections.extend(other.projections);
    }

    /// Whether a volume with `attributes`, for a pod of `namespace`, is to be refreshed.
    pub fn touches(&self, attributes: &BTreeMap<String, String>, namespace: &str) -> bool {
        self.everything
            || attributes.iter().any(|(key, value)| self.shares.contains(&(key.clone(), value.clone())))
            || attributes
                .get(PROJECTION)
                .is_some_and(|name| self.projections.contains(&(namespace.to_string(), name.clone())))
    }
}

impl Changes {
    /// Every volume is to be refreshed.
    pub fn everything(&self) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).everything = true;
        self.wake.notify_one();
    }

    /// The volumes naming `value` in `attribute` are to be refreshed, and those of the
    /// projections showing it.
    pub fn share(&self, attribute: &str, value: &str) {
        let named = (attribute.to_string(), value.to_string());
        let users = self.users.lock().unwrap_or_else(|p| p.into_inner()).get(&named).cloned().unwrap_or_default();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.shares.insert(named);
        pending.projections.extend(users);
        drop(pending);
        self.wake.notify_one();
    }

    /// The volumes of projection `name` in `namespace` are to be refreshed.
    pub fn projection(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).projections.insert(key);
        self.wake.notify_one();
    }

    /// Notes that projection `name` in `namespace` shows the shares named by `shares`
    /// ((attribute, value) pairs, as a volume of one share names them), replacing what was
    /// noted of it before.
    pub fn projection_uses<'a>(&self, namespace: &str, name: &str, shares: impl Iterator<Item = (&'a str, &'a str)>) {
        let key = (namespace.to_string(), name.to_string());
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        users.retain(|_, projections| {
            projections.remove(&key);
            !projections.is_empty()
        });
        for (attribute, value) in shares {
            users.entry((attribute.to_string(), value.to_string())).or_default().insert(key.clone());
        }
    }

    /// Waits for a change, then takes everything noted so far.
    pub async fn next(&self) -> Pending {
        self.wake.notified().await;
        self.take()
    }

    /// Takes everything noted so far, without waiting.
    pub fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn noted_shares_touch_only_their_volumes_and_everything_touches_all() {
        let changes = Changes::default();
        changes.share("sharedSecret", "db");
        changes.share("sharedSecret", "db");
        let pending = changes.next().await;
        let volume = |key: &str, value: &str| BTreeMap::from([(key.to_string(), value.to_string())]);
        assert!(pending.touches(&volume("sharedSecret", "db"), "ns"));
        assert!(!pending.touches(&volume("sharedSecret", "cache"), "ns"));
        assert!(!pending.touches(&volume("sharedConfigMap", "db"), "ns"));
        changes.everything();
        assert!(changes.next().await.touches(&volume("sharedConfigMap", "anything"), "ns"));
        assert_eq!(changes.take(), Pending::default(), "taken");
    }

    #[tokio::test]
    async fn a_share_change_touches_the_projections_showing_it_in_their_namespace_only() {
        let changes = Changes::default();
        let app = BTreeMap::from([("projection".to_string(), "app".to_string())]);
        changes.projection_uses("team-a", "app", [("sharedSecret", "db"), ("sharedConfigMap", "ca")].into_iter());
        changes.share("sharedSecret", "db");
        let pending = changes.next().await;
        assert!(pending.touches(&app, "team-a"));
        assert!(!pending.touches(&app, "team-b"), "a projection of the same name elsewhere");
        // The projection no longer shows db: a change to db leaves it alone; to ca, not.
        changes.projection_uses("team-a", "app", [("sharedConfigMap", "ca")].into_iter());
        changes.share("sharedSecret", "db");
        assert!(!changes.next().await.touches(&app, "team-a"));
        changes.share("sharedConfigMap", "ca");
        assert!(changes.next().await.touches(&app, "team-a"));
        // The projection itself edited.
        changes.projection("team-a", "app");
        let pending = changes.next().await;
        assert!(pending.touches(&app, "team-a") && !pending.touches(&app, "team-b"));
    }
}
