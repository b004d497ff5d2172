//! Forgetting what a source kept for volumes that are no longer published, with a second look:
//! the refresher tells the live volumes every few seconds, and a volume is forgotten only when
//! two looks in a row missed it. One look is not enough: a publish computes its content (and
//! notes what it needs remembered) a moment before its volume enters the table.

use std::collections::HashSet;

/// The volumes one look missed.
#[derive(Debug, Default)]
pub struct SecondLook {
    missed: HashSet<String>,
}

impl SecondLook {
    /// Of `kept` (the volumes something is kept for), those to forget now that `live` are the
    /// published ones: missed by this look and the one before.
    pub fn to_forget<'a>(&mut self, kept: impl Iterator<Item = &'a String>, live: &HashSet<String>) -> Vec<String> {
        let mut forget = Vec::new();
        let mut missed = HashSet::new();
        for id in kept.filter(|id| !live.contains(*id)) {
            if self.missed.contains(id) {
                forget.push(id.clone());
            } else {
                missed.insert(id.clone());
            }
        }
        self.missed = missed;
        forget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(items: &[&str]) -> HashSet<String> {
        items.iter().map(|item| item.to_string()).collect()
    }

    #[test]
    fn a_volume_is_forgotten_only_when_two_looks_in_a_row_missed_it() {
        let mut look = SecondLook::default();
        let kept = ids(&["live", "gone", "publishing"]);
        assert!(look.to_forget(kept.iter(), &ids(&["live"])).is_empty(), "one look is not enough");
        // The publishing volume entered the table meanwhile; the gone one did not.
        assert_eq!(look.to_forget(kept.iter(), &ids(&["live", "publishing"])), ["gone"]);
        assert!(look.to_forget(ids(&["live", "publishing"]).iter(), &ids(&["live", "publishing"])).is_empty());
    }
}
