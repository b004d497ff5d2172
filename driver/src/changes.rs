//! What changed since the last refresh: everything (a grant given or taken, a watch started, the
//! periodic tick), or the shares some events name. Watches note changes here; the refresher takes
//! them and refreshes only the volumes they touch, so an update to one Secret rewrites the
//! volumes of the shares backed by it, not every volume of the node.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use tokio::sync::Notify;

/// Changes waiting for the refresher.
#[derive(Debug, Default)]
pub struct Changes {
    wake: Notify,
    pending: Mutex<Pending>,
}

/// What a refresh must cover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Every volume.
    pub everything: bool,
    /// The volumes whose attributes hold one of these (attribute, value) pairs, such as
    /// (`sharedSecret`, `db`).
    pub shares: HashSet<(String, String)>,
}

impl Pending {
    /// Every volume.
    pub fn everything() -> Pending {
        Pending { everything: true, shares: HashSet::new() }
    }

    /// Adds what `other` covers.
    pub fn merge(&mut self, other: Pending) {
        self.everything |= other.everything;
        self.shares.extend(other.shares);
    }

    /// Whether a volume with `attributes` is to be refreshed.
    pub fn touches(&self, attributes: &BTreeMap<String, String>) -> bool {
        self.everything || attributes.iter().any(|(key, value)| self.shares.contains(&(key.clone(), value.clone())))
    }
}

impl Changes {
    /// Every volume is to be refreshed.
    pub fn everything(&self) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).everything = true;
        self.wake.notify_one();
    }

    /// The volumes naming `value` in `attribute` are to be refreshed.
    pub fn share(&self, attribute: &str, value: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shares
            .insert((attribute.to_string(), value.to_string()));
        self.wake.notify_one();
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
        assert!(pending.touches(&volume("sharedSecret", "db")));
        assert!(!pending.touches(&volume("sharedSecret", "cache")));
        assert!(!pending.touches(&volume("sharedConfigMap", "db")));
        changes.everything();
        assert!(changes.next().await.touches(&volume("sharedConfigMap", "anything")));
        assert_eq!(changes.take(), Pending::default(), "taken");
    }
}
