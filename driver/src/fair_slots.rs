//! Slots shared fairly: at most `total` held at once, and by any one owner (a namespace) at most
//! `per_owner` and at most half of what the other owners leave, so that no tenant, nor two, can
//! hold every slot of the node (helper programs, refreshes, publishes) and make the others wait
//! behind their slow work. A waiter whose owner is at its part
//! waits for its own owner's slots, never ahead of another owner that could run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::unpoisoned::UnpoisonedMutex;
use tokio::sync::Notify;

/// A pool of slots with a bound per owner.
pub struct FairSlots {
    total: usize,
    per_owner: usize,
    held: Mutex<Held>,
    freed: Notify,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_owner: HashMap<String, usize>,
}

impl FairSlots {
    /// `total` slots (at least one), at most `per_owner` of them (at least one, at most
    /// `total`) held by one owner.
    pub fn new(total: usize, per_owner: usize) -> Arc<FairSlots> {
        let total = total.max(1);
        Arc::new(FairSlots {
            total,
            per_owner: per_owner.clamp(1, total),
            held: Mutex::default(),
            freed: Notify::new(),
        })
    }

    /// `total` slots, at most half of them (rounded up) to one owner: two owners can always
    /// run side by side.
    pub fn halved(total: usize) -> Arc<FairSlots> {
        FairSlots::new(total, total.max(1).div_ceil(2))
    }

    /// The pool's bounds: (total, per owner).
    #[cfg(test)]
    pub fn bounds(&self) -> (usize, usize) {
        (self.total, self.per_owner)
    }

    /// A slot for `owner`, now if one is free for it, else once one is.
    pub async fn acquire(self: &Arc<Self>, owner: &str) -> FairSlot {
        loop {
            // Registered before looking, so a slot freed between the look and the wait wakes it.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.try_acquire(owner) {
                return slot;
            }
            freed.await;
        }
    }

    /// A slot for `owner` if one is free for it now.
    pub fn try_acquire(self: &Arc<Self>, owner: &str) -> Option<FairSlot> {
        let mut held = self.held.locked();
        let of_owner = held.by_owner.get(owner).copied().unwrap_or(0);
        // Half of what the other owners leave (rounded up), within the owner's bound: a fixed
        // half would let two owners hold every slot; so, a second owner finds a quarter, a third
        // an eighth, and no owner finds none while a slot is free.
        let left = self.total.saturating_sub(held.total - of_owner);
        let part = self.per_owner.min(left.div_ceil(2));
        if held.total >= self.total || of_owner >= part {
            return None;
        }
        held.total += 1;
        held.by_owner.insert(owner.to_string(), of_owner + 1);
        Some(FairSlot { slots: self.clone(), owner: owner.to_string() })
    }

    /// How many slots `owner` holds now.
    #[cfg(test)]
    pub fn held_by(&self, owner: &str) -> usize {
        self.held.locked().by_owner.get(owner).copied().unwrap_or(0)
    }
}

/// One slot, given back when dropped.
pub struct FairSlot {
    slots: Arc<FairSlots>,
    owner: String,
}

impl Drop for FairSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.locked();
        held.total = held.total.saturating_sub(1);
        if let Some(count) = held.by_owner.get_mut(&self.owner) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.by_owner.remove(&self.owner);
            }
        }
        drop(held);
        // Every waiter looks again: which one may run depends on its owner.
        self.slots.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn one_owner_holds_at_most_its_part_and_another_still_gets_a_slot() {
        let slots = FairSlots::new(4, 2);
        let first = slots.try_acquire("attacker").unwrap();
        let _second = slots.try_acquire("attacker").unwrap();
        assert!(slots.try_acquire("attacker").is_none(), "a third is beyond the owner's part");
        let _victim = slots.try_acquire("victim").unwrap();
        let _other = slots.try_acquire("other").unwrap();
        assert!(slots.try_acquire("fourth").is_none(), "all four are held");
        drop(first);
        assert_eq!(slots.held_by("attacker"), 1);
        assert!(slots.try_acquire("fourth").is_some());
    }

    #[test]
    fn two_owners_cannot_hold_every_slot_and_each_next_one_finds_one() {
        let slots = FairSlots::halved(8);
        let mut held = Vec::new();
        let mut took = Vec::new();
        for owner in ["first", "second", "third", "fourth", "fifth"] {
            let before = held.len();
            while let Some(slot) = slots.try_acquire(owner) {
                held.push(slot);
            }
            took.push(held.len() - before);
        }
        assert_eq!(took, [4, 2, 1, 1, 0], "half of what the others leave, rounded up, until the pool is full");
        // The first owner's slots go: the second may take more than its quarter now.
        held.drain(..4);
        assert!(slots.try_acquire("second").is_some());
    }

    #[test]
    fn halved_lets_two_owners_run_side_by_side() {
        assert_eq!(FairSlots::halved(8).bounds(), (8, 4));
        assert_eq!(FairSlots::halved(3).bounds(), (3, 2));
        assert_eq!(FairSlots::halved(1).bounds(), (1, 1));
        assert_eq!(FairSlots::new(2, 9).bounds(), (2, 2));
    }

    #[tokio::test]
    async fn a_waiter_at_its_part_does_not_hold_up_another_owner() {
        let slots = FairSlots::new(3, 1);
        let held = slots.acquire("attacker").await;
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire("attacker").await }
        });
        // The victim runs although the attacker is waiting ahead of it.
        let victim = tokio::time::timeout(Duration::from_secs(60), slots.acquire("victim")).await.expect("not held up");
        drop(victim);
        // The test's runtime has one thread: yielding lets the waiter run and look again.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "the attacker's second slot waits for its first");
        assert_eq!(slots.held_by("attacker"), 1);
        drop(held);
        let second = tokio::time::timeout(Duration::from_secs(60), waiting).await.expect("woken").unwrap();
        assert_eq!(slots.held_by("attacker"), 1);
        drop(second);
        assert_eq!(slots.held_by("attacker"), 0);
    }
}
