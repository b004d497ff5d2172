//! What each volume lacked of what it marks optional at its last content, so that its pod hears
//! of an absence once, when it begins (at publish, or when the object is deleted), and not at
//! every refresh while it lasts. One entry per volume lacking something: a volume served whole
//! again, or unpublished, is forgotten.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use crate::content::live_volumes::SecondLook;
use crate::unpoisoned::UnpoisonedMutex;

/// The optional objects each volume lacks, by volume id.
#[derive(Debug, Default)]
pub struct Absences {
    by_volume: Mutex<HashMap<String, BTreeSet<String>>>,
    looks: Mutex<SecondLook>,
}

impl Absences {
    /// Notes that `volume_id`'s content now lacks `absent`; returns those it did not lack at
    /// its previous content, for its pod to hear of.
    pub fn note(&self, volume_id: &str, absent: Vec<String>) -> Vec<String> {
        let mut by_volume = self.by_volume.locked();
        if absent.is_empty() {
            by_volume.remove(volume_id);
            return Vec::new();
        }
        let now: BTreeSet<String> = absent.into_iter().collect();
        let before = by_volume.insert(volume_id.to_string(), now.clone()).unwrap_or_default();
        now.into_iter().filter(|what| !before.contains(what)).collect()
    }

    /// Forgets `volume_id` (unpublished).
    pub fn forget(&self, volume_id: &str) {
        self.by_volume.locked().remove(volume_id);
    }

    /// Forgets the volumes two looks in a row did not find among `live` (see `live_volumes`).
    pub fn retain_live(&self, live: &HashSet<String>) {
        let mut by_volume = self.by_volume.locked();
        for id in self.looks.locked().to_forget(by_volume.keys(), live) {
            by_volume.remove(&id);
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
        let absences = Absences::default();
        assert_eq!(absences.note("v", texts(&["a"])), ["a"], "at publish");
        assert!(absences.note("v", texts(&["a"])).is_empty(), "a refresh while it lasts");
        assert_eq!(absences.note("v", texts(&["a", "b"])), ["b"], "a second object gone: only it");
        assert!(absences.note("v", texts(&["b"])).is_empty(), "one back, the other still gone");
        assert!(absences.note("v", Vec::new()).is_empty(), "whole again");
        assert_eq!(absences.by_volume.locked().len(), 0, "a volume served whole is forgotten");
        assert_eq!(absences.note("v", texts(&["b"])), ["b"], "gone again: told again");
        assert_eq!(absences.note("w", texts(&["b"])), ["b"], "another volume has its own");
        absences.forget("v");
        assert_eq!(absences.by_volume.locked().keys().collect::<Vec<_>>(), ["w"]);
        // Noted again after its unpublish (a refresh ending late): gone after two looks.
        absences.note("v", texts(&["b"]));
        let live: HashSet<String> = ["w".to_string()].into();
        absences.retain_live(&live);
        assert_eq!(absences.by_volume.locked().len(), 2, "one look is not enough");
        absences.retain_live(&live);
        assert_eq!(absences.by_volume.locked().keys().collect::<Vec<_>>(), ["w"]);
    }
}
