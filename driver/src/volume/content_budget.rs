//! The node's content budget: how many bytes of volume content the driver may hold in its
//! tmpfs volumes, on the whole node and per namespace. The kernel charges a tmpfs page to the
//! memory cgroup of the process that wrote it (the driver, for every volume) and keeps the charge
//! until the tmpfs is gone, so without a bound one tenant's volumes could push the driver over
//! its memory limit and take publishing, refreshing and revocation away from every other tenant
//! of the node. A write is reserved here before it is made, in the pages and inodes tmpfs will
//! charge, and refused when the node's or the pod's namespace's part would be exceeded. An
//! update holds the old version and the new one at once (the atomic writer swaps them), so the
//! reservation of the new one is counted beside the old until the swap. A version no larger than
//! the one it replaces may go an eighth over the bounds while it is written (a full node can
//! still update its volumes, and the overshoot is bounded), and an empty one (a revocation
//! empties the volume) is never refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::content::payload::Payload;
use crate::quote::quote;
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::error::{Error, Result};

/// tmpfs charges whole pages of data.
pub const PAGE_BYTES: u64 = 4096;
/// What one entry (file, directory, symlink) costs the kernel besides its data: an inode and a
/// dentry, both charged to the writer's cgroup (about 0.8 KiB together); rounded up.
pub const ENTRY_BYTES: u64 = 1024;
/// What a volume costs whatever it holds: its tmpfs (superblock, root, the links the writer keeps
/// at the top) and its record. Counted so that a namespace's part bounds how many volumes it can
/// have on the node too, not only their content: 160 MiB is at most 10 240 empty volumes.
pub const VOLUME_BYTES: u64 = 16 * 1024;

/// What a lazy volume costs the node whatever its files hold: a FUSE connection and its kernel
/// queues, the thread that serves it, its record and descriptors (about a page of kernel memory
/// and a thread's stack resident; rounded up well past both). Counted for its namespace before
/// the mount is made, so one namespace's lazy volumes are bounded as its tmpfs volumes are: at
/// most 2 560 in the shipped 160 MiB part.
pub const LAZY_VOLUME_BYTES: u64 = 64 * 1024;

/// What an empty version costs: its directory and the volume (what a revocation writes).
pub const EMPTY_VERSION_BYTES: u64 = ENTRY_BYTES + VOLUME_BYTES;

/// The bounds of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    /// The most content all volumes of the node may hold together (`contentBudget`).
    pub node_bytes: u64,
    /// The most content the volumes of one namespace's pods may hold (`namespaceContentBudget`).
    pub namespace_bytes: u64,
}

impl BudgetLimits {
    /// No bound at all (tests of what the budget is not about).
    pub const UNBOUNDED: BudgetLimits = BudgetLimits { node_bytes: u64::MAX, namespace_bytes: u64::MAX };
}

/// What `payload` costs once written as one version of a volume: each file's data in whole
/// pages, an entry per file, per directory it needs and per top-level link, and the volume
/// itself ([`VOLUME_BYTES`]).
pub fn charge_of(payload: &Payload) -> u64 {
    let mut directories = std::collections::BTreeSet::new();
    let mut top_level = std::collections::BTreeSet::new();
    let mut bytes: u64 = 0;
    for (key, file) in payload {
        bytes = bytes.saturating_add((file.data.len() as u64).div_ceil(PAGE_BYTES) * PAGE_BYTES + ENTRY_BYTES);
        for (slash, _) in key.match_indices('/') {
            directories.insert(&key[..slash]);
        }
        top_level.insert(key.split('/').next().unwrap_or(key));
    }
    // The version directory itself is one more entry.
    let entries = directories.len() as u64 + top_level.len() as u64 + 1;
    bytes.saturating_add(entries * ENTRY_BYTES).saturating_add(VOLUME_BYTES)
}

/// Who a volume's content is charged to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payer {
    /// The volume.
    pub volume_id: String,
    /// The namespace of its pod.
    pub namespace: String,
}

/// The node's content budget (cheap to clone: one shared ledger).
#[derive(Clone)]
pub struct ContentBudget {
    limits: BudgetLimits,
    ledger: Arc<Mutex<Ledger>>,
}

/// What is charged: per volume (its live content), per namespace and in all, reservations in
/// flight included.
#[derive(Default)]
struct Ledger {
    held: HashMap<String, (String, u64)>,
    by_namespace: HashMap<String, u64>,
    total: u64,
}

impl Ledger {
    fn add(&mut self, namespace: &str, bytes: u64) {
        self.total = self.total.saturating_add(bytes);
        let used = self.by_namespace.entry(namespace.to_string()).or_default();
        *used = used.saturating_add(bytes);
    }

    fn subtract(&mut self, namespace: &str, bytes: u64) {
        self.total = self.total.saturating_sub(bytes);
        if let Some(used) = self.by_namespace.get_mut(namespace) {
            *used = used.saturating_sub(bytes);
            if *used == 0 {
                self.by_namespace.remove(namespace);
            }
        }
    }
}

impl ContentBudget {
    /// An empty budget with `limits`.
    pub fn new(limits: BudgetLimits) -> ContentBudget {
        ContentBudget { limits, ledger: Arc::default() }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.locked()
    }

    /// Why `bytes` more for `payer`'s volume do not fit what `ledger` holds, if they do not.
    /// The node's bound is checked first (a full node is the pod's reason to go elsewhere),
    /// then the namespace's part (see [`ContentBudget::namespace_part`]). `slack` (a version
    /// no larger than the one it replaces) judges the namespace against its configured part
    /// alone, and lets both go an eighth over: an update that grows nothing is never refused
    /// because other namespaces grew since.
    fn refusal(&self, ledger: &Ledger, payer: &Payer, bytes: u64, slack: bool) -> Option<Error> {
        let over = |bound: u64| if slack { bound.saturating_add(bound / 8) } else { bound };
        if ledger.total.saturating_add(bytes) > over(self.limits.node_bytes) {
            return Some(Error::OverBudget(format!(
                "the volume's content needs {bytes} bytes of memory on the node, and the node's volumes already \
                 hold {} of the {} bytes the driver may hold (contentBudget); the pod can run on another node",
                ledger.total, self.limits.node_bytes
            )));
        }
        let namespace_used = ledger.by_namespace.get(&payer.namespace).copied().unwrap_or(0);
        let part = if slack { self.limits.namespace_bytes } else { self.namespace_part(ledger, namespace_used) };
        if namespace_used.saturating_add(bytes) > over(part) {
            return Some(Error::OverBudget(format!(
                "the volume's content needs {bytes} bytes of memory on the node, and the volumes of namespace {} \
                 already hold {namespace_used} of the {part} bytes it may hold on this node now (at most \
                 namespaceContentBudget, {}, and at most half of what other namespaces leave of contentBudget, {}); \
                 remove other volumes of the namespace from this node or ask the cluster's operator to raise the budget",
                quote(&payer.namespace),
                self.limits.namespace_bytes,
                self.limits.node_bytes
            )));
        }
        None
    }

    /// How much one namespace may hold on the node, given that it holds `namespace_used` of
    /// what `ledger` holds: its configured part, but never more than half of what the other
    /// namespaces leave of the node's budget. A fixed part of half the node would let two
    /// namespaces fill it; with this one, a namespace that fills the node as far as it may
    /// leaves half of it, a second then finds a quarter, a third an eighth: a namespace never
    /// finds nothing while the node has room, and each part grows back as others' volumes go.
    /// What a namespace already holds beyond a part that shrank is kept (and its updates that
    /// grow nothing are granted); it only cannot grow.
    fn namespace_part(&self, ledger: &Ledger, namespace_used: u64) -> u64 {
        let others = ledger.total.saturating_sub(namespace_used);
        let left = self.limits.node_bytes.saturating_sub(others);
        self.limits.namespace_bytes.min(left / 2)
    }

    /// Reserves `bytes` for a new version of `payer`'s volume, beside what the volume holds now.
    /// Refused when the node or the namespace would hold more than its bound. A version no
    /// larger than the one it replaces may take them an eighth over (it never grows what is
    /// held once the old one is gone); an empty version is always granted (a revocation must
    /// never wait for room).
    pub fn reserve(&self, payer: &Payer, bytes: u64) -> Result<Reservation> {
        let mut ledger = self.ledger();
        let current = ledger.held.get(&payer.volume_id).map_or(0, |(_, held)| *held);
        if bytes > EMPTY_VERSION_BYTES
            && let Some(refusal) = self.refusal(&ledger, payer, bytes, bytes <= current)
        {
            return Err(refusal);
        }
        ledger.add(&payer.namespace, bytes);
        Ok(Reservation { budget: self.clone(), payer: payer.clone(), bytes, settled: false })
    }

    /// Charges `payer`'s volume `bytes` as it stands, refusing nothing: what a restarted driver
    /// finds in the volumes it recovers is held whatever the budget says (it is in memory
    /// already), and later writes are judged against it.
    pub fn hold(&self, payer: &Payer, bytes: u64) {
        let mut ledger = self.ledger();
        if let Some((namespace, old)) = ledger.held.remove(&payer.volume_id) {
            ledger.subtract(&namespace, old);
        }
        ledger.add(&payer.namespace, bytes);
        ledger.held.insert(payer.volume_id.clone(), (payer.namespace.clone(), bytes));
    }

    /// Counts `bytes` more for `payer`'s volume, unless the node or the namespace would then hold
    /// more than its bound (the error says which). For content a volume holds outside a tmpfs
    /// (a lazy volume's, in the driver's heap), which grows and shrinks a file at a time.
    pub fn grow(&self, payer: &Payer, bytes: u64) -> Result<()> {
        let mut ledger = self.ledger();
        if let Some(refusal) = self.refusal(&ledger, payer, bytes, false) {
            return Err(refusal);
        }
        ledger.add(&payer.namespace, bytes);
        let held = ledger.held.entry(payer.volume_id.clone()).or_insert_with(|| (payer.namespace.clone(), 0));
        held.1 = held.1.saturating_add(bytes);
        Ok(())
    }

    /// Counts `bytes` fewer for `volume_id` (nothing once the volume is released).
    pub fn shrink(&self, volume_id: &str, bytes: u64) {
        let mut ledger = self.ledger();
        let Some((namespace, held)) = ledger.held.get_mut(volume_id) else { return };
        let bytes = bytes.min(*held);
        *held -= bytes;
        let namespace = namespace.clone();
        ledger.subtract(&namespace, bytes);
    }

    /// Forgets what `volume_id` holds (its tmpfs is gone).
    pub fn release(&self, volume_id: &str) {
        let mut ledger = self.ledger();
        if let Some((namespace, bytes)) = ledger.held.remove(volume_id) {
            ledger.subtract(&namespace, bytes);
        }
    }

    /// The bytes held on the node, reservations in flight included.
    pub fn used(&self) -> u64 {
        self.ledger().total
    }

    /// The bytes `namespace`'s volumes hold, reservations in flight included.
    #[cfg(test)]
    pub fn used_by(&self, namespace: &str) -> u64 {
        self.ledger().by_namespace.get(namespace).copied().unwrap_or(0)
    }

    /// The bytes `volume_id` holds.
    #[cfg(test)]
    pub fn held_by(&self, volume_id: &str) -> u64 {
        self.ledger().held.get(volume_id).map_or(0, |(_, bytes)| *bytes)
    }
}

/// The budget as a lazy volume's memory charge: what its files hold in the driver's memory is
/// counted for its pod's namespace.
pub struct LazyCharge {
    /// The budget.
    pub budget: ContentBudget,
    /// Whose content it is.
    pub payer: Payer,
}

impl crate::content::lazy::MemoryCharge for LazyCharge {
    fn grow(&self, bytes: u64) -> std::result::Result<(), String> {
        self.budget.grow(&self.payer, bytes).map_err(|refusal| refusal.to_string())
    }

    fn shrink(&self, bytes: u64) {
        self.budget.shrink(&self.payer.volume_id, bytes);
    }
}

/// Room reserved for one version of a volume: dropped unused, it is given back; [`Reservation::commit`]
/// makes it what the volume holds, in place of the version it replaced.
pub struct Reservation {
    budget: ContentBudget,
    payer: Payer,
    bytes: u64,
    settled: bool,
}

impl Reservation {
    /// The new version is the volume's content now: what it held before is given back.
    pub fn commit(mut self) {
        self.settled = true;
        let mut ledger = self.budget.ledger();
        if let Some((namespace, old)) = ledger.held.remove(&self.payer.volume_id) {
            ledger.subtract(&namespace, old);
        }
        ledger.held.insert(self.payer.volume_id.clone(), (self.payer.namespace.clone(), self.bytes));
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.budget.ledger().subtract(&self.payer.namespace, self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::payload::FileContent;

    fn payer(volume: &str, namespace: &str) -> Payer {
        Payer { volume_id: volume.into(), namespace: namespace.into() }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_payload_costs_whole_pages_and_an_entry_per_file_directory_and_link() {
        let payload = Payload::from([
            ("a".to_string(), FileContent::new(vec![0; 1])),
            ("d/b".to_string(), FileContent::new(vec![0; 4097])),
            ("d/e/c".to_string(), FileContent::new(Vec::new())),
        ]);
        // Data: 1 page + 2 pages + 0; entries: 3 files, directories d and d/e, links a and d,
        // the version directory.
        assert_eq!(charge_of(&payload), 3 * PAGE_BYTES + (3 + 2 + 2 + 1) * ENTRY_BYTES + VOLUME_BYTES);
        assert_eq!(charge_of(&Payload::new()), ENTRY_BYTES + VOLUME_BYTES, "an empty version: its directory");
        let flat = Payload::from([
            ("x".to_string(), FileContent::new(Vec::new())),
            ("y".to_string(), FileContent::new(Vec::new())),
        ]);
        // No directory, two links: the entries add up, whatever the counts are.
        assert_eq!(charge_of(&flat), (2 + 2 + 1) * ENTRY_BYTES + VOLUME_BYTES);
    }

    #[test]
    fn a_namespace_s_part_bounds_how_many_volumes_it_has_not_only_their_content() {
        // The shipped part (160 MiB) holds at most 10 240 volumes however little each holds:
        // the number of tmpfs mounts and records one namespace can make the driver keep.
        let empty = charge_of(&Payload::new());
        assert!(160 * MIB / empty <= 10_240, "{} empty volumes fit 160 MiB", 160 * MIB / empty);
        assert!(160 * MIB / empty >= 9_000, "an empty volume is not charged far beyond what it costs: {empty} bytes");
    }

    #[test]
    fn a_namespace_is_refused_beyond_its_part_while_another_is_served() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 10 * MIB, namespace_bytes: 4 * MIB });
        for volume in ["a1", "a2", "a3", "a4"] {
            budget.reserve(&payer(volume, "attacker"), MIB).unwrap().commit();
        }
        let refused = budget.reserve(&payer("a5", "attacker"), MIB).err().expect("over the namespace's part");
        let message = refused.to_string();
        assert!(message.contains("namespace \"attacker\" already hold 4194304 of the 4194304 bytes"), "{message}");
        assert!(message.contains("namespaceContentBudget"), "{message}");
        // Half of the 6 MiB the attacker leaves.
        budget.reserve(&payer("v1", "victim"), 3 * MIB).unwrap().commit();
        assert_eq!(budget.used(), 7 * MIB);
    }

    #[test]
    fn the_node_is_refused_beyond_its_budget_naming_it() {
        // New content alone never takes the node over (each namespace leaves half of what the
        // others leave): what a restarted driver finds can.
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 4 * MIB, namespace_bytes: 2 * MIB });
        budget.hold(&payer("a", "one"), 3 * MIB);
        let error = budget.reserve(&payer("b", "two"), 2 * MIB).err().expect("over the node's budget");
        assert!(matches!(error, Error::OverBudget(_)));
        assert!(error.to_string().contains("hold 3145728 of the 4194304 bytes the driver may hold (contentBudget)"));
        budget.reserve(&payer("b", "two"), MIB / 2).unwrap().commit();
    }

    #[test]
    fn an_update_counts_both_versions_until_it_commits() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 32 * MIB, namespace_bytes: 16 * MIB });
        budget.reserve(&payer("v", "ns"), 14 * MIB).unwrap().commit();
        let growing = budget.reserve(&payer("v", "ns"), 14 * MIB + PAGE_BYTES).err().expect("over the budget");
        assert!(matches!(growing, Error::OverBudget(_)), "14 MiB held and a larger version beside it do not fit");
        // A version no larger than the old one may go an eighth over the budget while it is
        // written (16 + 2 MiB here), not more.
        let same = budget.reserve(&payer("v", "ns"), 14 * MIB).err().expect("28 MiB is more than 18");
        assert!(matches!(same, Error::OverBudget(_)));
        let smaller = budget.reserve(&payer("v", "ns"), 4 * MIB).unwrap();
        assert_eq!(budget.used(), 18 * MIB, "both versions are counted while the new one is written");
        smaller.commit();
        assert_eq!((budget.used(), budget.held_by("v")), (4 * MIB, 4 * MIB));
    }

    #[test]
    fn a_revocation_is_granted_whatever_is_held() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 2 * MIB, namespace_bytes: MIB });
        budget.reserve(&payer("v", "ns"), MIB).unwrap().commit();
        budget.reserve(&payer("other", "ns"), 0).unwrap().commit();
        assert_eq!(charge_of(&Payload::new()), EMPTY_VERSION_BYTES);
        // A volume holding nothing yet, its namespace full: its empty version is granted too
        // (given back here unused).
        drop(budget.reserve(&payer("new", "ns"), EMPTY_VERSION_BYTES).unwrap());
        budget.reserve(&payer("v", "ns"), EMPTY_VERSION_BYTES).unwrap().commit();
        assert_eq!(budget.used(), EMPTY_VERSION_BYTES);
    }

    #[test]
    fn a_reservation_dropped_unused_is_given_back_and_a_release_forgets_the_volume() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 8 * MIB, namespace_bytes: 4 * MIB });
        drop(budget.reserve(&payer("v", "ns"), 3 * MIB).unwrap());
        assert_eq!(budget.used(), 0);
        budget.reserve(&payer("v", "ns"), 3 * MIB).unwrap().commit();
        assert_eq!(budget.used_by("ns"), 3 * MIB);
        budget.release("v");
        assert_eq!((budget.used(), budget.used_by("ns"), budget.held_by("v")), (0, 0, 0));
    }

    #[test]
    fn what_a_restart_finds_is_held_even_over_the_budget() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: MIB, namespace_bytes: MIB });
        budget.hold(&payer("old", "ns"), 2 * MIB);
        assert_eq!(budget.used(), 2 * MIB);
        assert!(budget.reserve(&payer("new", "other"), EMPTY_VERSION_BYTES + PAGE_BYTES).is_err(), "nothing more fits");
        budget.hold(&payer("old", "ns"), MIB / 2);
        assert_eq!(budget.used(), MIB / 2, "held again, not twice");
    }

    #[test]
    fn two_namespaces_cannot_fill_the_node_and_every_next_one_finds_room() {
        // The shipped shape: each namespace's configured part is half the node.
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 64 * MIB, namespace_bytes: 32 * MIB });
        // Each namespace in turn takes all it may, a MiB at a time.
        let mut took = Vec::new();
        for (index, namespace) in ["first", "second", "third", "fourth"].iter().enumerate() {
            let mut held = 0;
            while budget
                .reserve(&payer(&format!("{namespace}-{held}"), namespace), MIB)
                .map(Reservation::commit)
                .is_ok()
            {
                held += 1;
            }
            took.push(held);
            assert!(held > 0, "namespace {index} found no room with {} MiB of 64 held", budget.used() / MIB);
        }
        assert_eq!(took, [32, 16, 8, 4], "each takes half of what the others leave");
        // The first namespace's volumes go: the last one's part grows back.
        for volume in 0..32 {
            budget.release(&format!("first-{volume}"));
        }
        assert!(budget.reserve(&payer("fourth-more", "fourth"), 8 * MIB).is_ok());
    }

    #[test]
    fn a_namespace_over_a_part_that_shrank_keeps_its_volumes_and_their_updates() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 64 * MIB, namespace_bytes: 32 * MIB });
        budget.reserve(&payer("second", "second"), 16 * MIB).unwrap().commit();
        for volume in 0..12 {
            budget.reserve(&payer(&format!("first-{volume}"), "first"), 2 * MIB).unwrap().commit();
        }
        budget.reserve(&payer("third", "third"), 12 * MIB).unwrap().commit();
        // The first's part is now (64 − 28) / 2 = 18 MiB, less than the 24 it holds.
        let growing = budget.reserve(&payer("first-new", "first"), MIB).err().expect("over its part now");
        assert!(growing.to_string().contains("already hold 25165824 of the 18874368 bytes"), "{growing}");
        // An update that grows nothing is judged against the configured part alone (and may go
        // an eighth over it while both versions are held).
        budget.reserve(&payer("first-0", "first"), 2 * MIB).unwrap().commit();
        assert_eq!((budget.held_by("first-0"), budget.used_by("first")), (2 * MIB, 24 * MIB));
    }

    #[test]
    fn a_lazy_volume_grows_and_shrinks_within_its_namespace_s_part_and_nothing_after_release() {
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 8 * MIB, namespace_bytes: 4 * MIB });
        budget.reserve(&payer("eager", "tenant"), 3 * MIB).unwrap().commit();
        assert!(budget.grow(&payer("lazy", "tenant"), MIB).is_ok(), "the namespace's fourth MiB");
        let refused = budget.grow(&payer("lazy", "tenant"), 1).expect_err("nothing more for the namespace");
        assert!(refused.to_string().contains("namespaceContentBudget"), "{refused}");
        assert!(budget.grow(&payer("other", "victim"), 2 * MIB).is_ok(), "another namespace is served");
        budget.shrink("lazy", MIB / 2);
        assert_eq!((budget.used_by("tenant"), budget.held_by("lazy")), (3 * MIB + MIB / 2, MIB / 2));
        budget.release("lazy");
        budget.shrink("lazy", MIB / 2);
        assert_eq!(budget.used_by("tenant"), 3 * MIB, "a late shrink of a released volume changes nothing");
    }

    #[test]
    fn a_lazy_volume_s_charge_counts_and_refuses_through_the_budget() {
        use crate::content::lazy::MemoryCharge as _;
        let budget = ContentBudget::new(BudgetLimits { node_bytes: 8 * MIB, namespace_bytes: 2 * MIB });
        let charge = LazyCharge { budget: budget.clone(), payer: payer("lazy", "tenant") };
        charge.grow(MIB).unwrap();
        assert_eq!(budget.used_by("tenant"), MIB, "what its files hold counts for its namespace");
        let refused = charge.grow(2 * MIB).unwrap_err();
        assert!(refused.contains("namespaceContentBudget"), "{refused}");
        assert_eq!(budget.used_by("tenant"), MIB, "a refusal counts nothing");
        charge.shrink(MIB);
        assert_eq!(budget.used_by("tenant"), 0);
    }
}
