//! What changed since the last refresh: everything (a watch started, the periodic tick), the
//! shares and projections some events name, or the service accounts a grant given or taken may
//! concern (a notice names a namespace: all of its accounts); and, for the pods to hear of, the
//! optional objects volumes began to lack. Watches and notices note changes here; the refresher
//! takes them and refreshes only the volumes they touch, so an update to one Secret rewrites the
//! volumes of the shares backed by it (and of the projections naming those shares), and a
//! RoleBinding of one namespace re-checks only its pods' volumes, not every volume of the node.
//!
//! A grant's change is looked at again a moment later, and until 30 s later
//! ([`Changes::grant_changed`]): the apiserver answers access checks from its own RBAC cache,
//! which can learn of a binding after the notice reaches the driver (just after, usually; seconds
//! after, under load). Those looks are gathered into windows of [`WINDOW`], so a burst
//! of binding changes costs each affected volume a bounded number of checks, not one per change;
//! and the listener is told which looks are first and which again ([`GrantLook`]), so an answer
//! the first look already saw change need not be asked again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::unpoisoned::UnpoisonedMutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// When a grant's change is looked at: at once (in the next window), and four times more while
/// the apiserver's RBAC cache catches up. It usually has within milliseconds; an apiserver under
/// load, or another apiserver of the cluster answering, can lag by seconds, and one whose RBAC
/// watch broke lists again before it learns: a revocation it learns of within 30 s is seen at
/// the next look, one later than that at the answer's periodic recheck (`accessRecheckSeconds`).
/// Each look after the first asks only for the answers not yet seen to change.
pub const GRANT_LOOKS: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_millis(500),
    Duration::from_secs(2),
    Duration::from_secs(8),
    Duration::from_secs(30),
];
/// Looks due within one window are taken together.
pub const WINDOW: Duration = Duration::from_millis(250);

/// The volume attribute naming a projection (kept here so this module needs no other).
const PROJECTION: &str = sharedresource_api::volume_attributes::PROJECTION_ATTRIBUTE;

/// A volume attribute and its value, such as (`sharedSecret`, `db`).
type Named = (String, String);
/// A projection: its namespace and name.
type ProjectionKey = (String, String);

/// The service accounts a change of grants may concern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Accounts {
    /// Every service account (a binding to `system:serviceaccounts` or `system:authenticated`).
    Every,
    /// Every service account of this namespace.
    OfNamespace(String),
    /// One service account: its namespace and name.
    One(String, String),
}

impl Accounts {
    /// Whether service account `name` of `namespace` is among these.
    pub fn include(&self, namespace: &str, name: &str) -> bool {
        match self {
            Accounts::Every => true,
            Accounts::OfNamespace(of) => of == namespace,
            Accounts::One(of, account) => of == namespace && account == name,
        }
    }
}

/// Changes waiting for the refresher.
#[derive(Debug)]
pub struct Changes {
    wake: Notify,
    pending: Mutex<Pending>,
    // Which projections show each share, as last fetched: a change to the share is a change to
    // them.
    users: Mutex<HashMap<Named, HashSet<ProjectionKey>>>,
    // Looks at grants still to come, by the window they fall in (counted from `epoch`).
    looks: Mutex<BTreeMap<u64, WindowLooks>>,
    looks_added: Notify,
    epoch: Instant,
    grant_listener: std::sync::OnceLock<GrantListener>,
}

/// The accounts looked at in one window: first since their grants changed, or again.
#[derive(Debug, Default)]
struct WindowLooks {
    first: HashSet<Accounts>,
    again: HashSet<Accounts>,
}

/// A look at grants, as a grant listener is told of it.
#[derive(Debug, Clone, Copy)]
pub enum GrantLook<'a> {
    /// Grant changes may have been missed (a change for every namespace, a node that hears no
    /// notices): any answer may be stale.
    Relisted,
    /// One window's looks: `first`, the accounts whose grants changed since the last window;
    /// `again`, those looked at again while the apiserver's RBAC cache may be catching up (an
    /// account in both is in `first` only).
    Window {
        /// The accounts looked at for the first time since their grants changed.
        first: &'a [Accounts],
        /// The accounts looked at again.
        again: &'a [Accounts],
    },
}

/// Told of each look at grants and of each time grant changes may have been missed: what holds answers
/// about grants forgets them then.
struct GrantListener(Box<ForgetAnswers>);

/// What a grant listener is called as.
type ForgetAnswers = dyn Fn(GrantLook<'_>) + Send + Sync;

impl std::fmt::Debug for GrantListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantListener")
    }
}

impl Default for Changes {
    fn default() -> Changes {
        Changes {
            wake: Notify::new(),
            pending: Mutex::default(),
            users: Mutex::default(),
            looks: Mutex::default(),
            looks_added: Notify::new(),
            epoch: Instant::now(),
            grant_listener: std::sync::OnceLock::new(),
        }
    }
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
    /// The volumes of pods whose service account is among these.
    pub accounts: HashSet<Accounts>,
    /// What volumes began to lack of what they mark optional, for their pods to hear of (no
    /// refresh: the content computed already says it). At most [`MAX_PENDING_ABSENCES`], and
    /// [`MAX_PENDING_ABSENCES_PER_NAMESPACE`] of one namespace.
    pub absences: Vec<Absence>,
}

/// The most absences held for the refresher: beyond, an absence is not told (the volume is
/// served as it should be; only the courtesy of an Event is lost).
pub const MAX_PENDING_ABSENCES: usize = 1024;
/// The most absences of one namespace's pods held at once: what its bucket of Events could tell
/// at once (the refresher's burst of 20), so one namespace's many volumes never take the room
/// of another's.
pub const MAX_PENDING_ABSENCES_PER_NAMESPACE: usize = 20;

/// Optional objects a volume's content began to lack: it is served without them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Absence {
    /// The pod the volume is published for.
    pub pod: crate::content::ask::PodInfo,
    /// The pod's name for the volume.
    pub volume_name: String,
    /// The volume's attributes (what it mounts).
    pub attributes: BTreeMap<String, String>,
    /// What it lacks, each said as the error would have said it had it not been optional.
    pub absent: Vec<String>,
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
        self.accounts.extend(other.accounts);
        for absence in other.absences {
            self.hold_absence(absence);
        }
    }

    /// Holds `absence` when there is room for it: overall, and for its pod's namespace.
    fn hold_absence(&mut self, absence: Absence) {
        let namespace = &absence.pod.namespace;
        let of_namespace = self.absences.iter().filter(|held| held.pod.namespace == *namespace).count();
        if self.absences.len() < MAX_PENDING_ABSENCES && of_namespace < MAX_PENDING_ABSENCES_PER_NAMESPACE {
            self.absences.push(absence);
        }
    }

    /// Whether a volume with `attributes`, for a pod of `namespace` running as `service_account`,
    /// is to be refreshed.
    pub fn touches(&self, attributes: &BTreeMap<String, String>, namespace: &str, service_account: &str) -> bool {
        self.everything
            || self.accounts.iter().any(|accounts| accounts.include(namespace, service_account))
            || attributes.iter().any(|(key, value)| self.shares.contains(&(key.clone(), value.clone())))
            || attributes
                .get(PROJECTION)
                .is_some_and(|name| self.projections.contains(&(namespace.to_string(), name.clone())))
    }
}

impl Changes {
    /// Every volume is to be refreshed.
    pub fn everything(&self) {
        self.pending.locked().everything = true;
        self.wake.notify_one();
    }

    /// The volumes naming `value` in `attribute` are to be refreshed, and those of the
    /// projections showing it.
    pub fn share(&self, attribute: &str, value: &str) {
        let named = (attribute.to_string(), value.to_string());
        let users = self.users.locked().get(&named).cloned().unwrap_or_default();
        let mut pending = self.pending.locked();
        pending.shares.insert(named);
        pending.projections.extend(users);
        drop(pending);
        self.wake.notify_one();
    }

    /// A volume began to lack optional objects: its pod is to hear of it (dropped when its
    /// namespace's [`MAX_PENDING_ABSENCES_PER_NAMESPACE`], or [`MAX_PENDING_ABSENCES`] in all,
    /// are waiting already).
    pub fn absent(&self, absence: Absence) {
        self.pending.locked().hold_absence(absence);
        self.wake.notify_one();
    }

    /// The volumes of projection `name` in `namespace` are to be refreshed.
    pub fn projection(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.pending.locked().projections.insert(key);
        self.wake.notify_one();
    }

    /// Notes that projection `name` in `namespace` shows the shares named by `shares`
    /// ((attribute, value) pairs, as a volume of one share names them), replacing what was
    /// noted of it before.
    pub fn projection_uses<'a>(&self, namespace: &str, name: &str, shares: impl Iterator<Item = (&'a str, &'a str)>) {
        let key = (namespace.to_string(), name.to_string());
        let mut users = self.users.locked();
        users.retain(|_, projections| {
            projections.remove(&key);
            !projections.is_empty()
        });
        for (attribute, value) in shares {
            users.entry((attribute.to_string(), value.to_string())).or_default().insert(key.clone());
        }
    }

    /// Tells `listener` of each look at grants, before the volumes it touches are refreshed,
    /// and of each time grant changes may have been missed. Only the first listener is kept.
    pub fn on_grant_looks(&self, listener: impl Fn(GrantLook<'_>) + Send + Sync + 'static) {
        let _ = self.grant_listener.set(GrantListener(Box::new(listener)));
    }

    /// Grant changes may have been missed (told for every namespace, or heard by no notice):
    /// every answer about grants is forgotten, and every volume looked at.
    pub fn grants_relisted(&self) {
        if let Some(listener) = self.grant_listener.get() {
            (listener.0)(GrantLook::Relisted);
        }
        self.everything();
    }

    /// The volumes of `accounts` are to be refreshed with the access answers now held (the
    /// access-notices controller answered for them): no look at grants, no answer forgotten.
    pub fn answered(&self, accounts: impl IntoIterator<Item = Accounts>) {
        self.pending.locked().accounts.extend(accounts);
        self.wake.notify_one();
    }

    /// A grant given or taken that may concern `accounts`: their volumes are looked at in the
    /// next window and again as [`GRANT_LOOKS`] says. Nothing when `accounts` is empty (the
    /// binding names no service account).
    pub fn grant_changed(&self, accounts: impl IntoIterator<Item = Accounts>) {
        let accounts: HashSet<Accounts> = accounts.into_iter().collect();
        if accounts.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut looks = self.looks.locked();
        for (index, delay) in GRANT_LOOKS.into_iter().enumerate() {
            // The window that ends at or after the look is due.
            let window = (now + delay - self.epoch).as_nanos().div_ceil(WINDOW.as_nanos()) as u64;
            let window = looks.entry(window).or_default();
            let kind = if index == 0 { &mut window.first } else { &mut window.again };
            kind.extend(accounts.iter().cloned());
        }
        drop(looks);
        self.looks_added.notify_one();
    }

    /// `accounts`' volumes are looked at in the next window, once (a node asking on its own
    /// about what notices may not reach: no grant is known to have changed, so no look again).
    pub fn look_once(&self, accounts: impl IntoIterator<Item = Accounts>) {
        let accounts: Vec<Accounts> = accounts.into_iter().collect();
        if accounts.is_empty() {
            return;
        }
        let window = (Instant::now() - self.epoch).as_nanos().div_ceil(WINDOW.as_nanos()) as u64;
        self.looks.locked().entry(window).or_default().first.extend(accounts);
        self.looks_added.notify_one();
    }

    /// Hands each window's looks at grants to the refresher when the window ends; runs until
    /// dropped.
    pub async fn deliver_grant_looks(&self) {
        loop {
            let next = self.looks.locked().keys().next().copied();
            let Some(window) = next else {
                self.looks_added.notified().await;
                continue;
            };
            let ends = self.epoch + WINDOW * u32::try_from(window).unwrap_or(u32::MAX);
            tokio::select! {
                _ = tokio::time::sleep_until(ends) => {}
                // An earlier window may have been added meanwhile.
                _ = self.looks_added.notified() => continue,
            }
            let (first, again) = {
                let mut looks = self.looks.locked();
                let later = looks.split_off(&(window + 1));
                let mut due = WindowLooks::default();
                for window in std::mem::replace(&mut *looks, later).into_values() {
                    due.first.extend(window.first);
                    due.again.extend(window.again);
                }
                let again: Vec<Accounts> = due.again.into_iter().filter(|a| !due.first.contains(a)).collect();
                (due.first.into_iter().collect::<Vec<_>>(), again)
            };
            if let Some(listener) = self.grant_listener.get() {
                (listener.0)(GrantLook::Window { first: &first, again: &again });
            }
            self.pending.locked().accounts.extend(first.into_iter().chain(again));
            self.wake.notify_one();
        }
    }

    /// Waits for a change, then takes everything noted so far.
    pub async fn next(&self) -> Pending {
        self.wake.notified().await;
        self.take()
    }

    /// Takes everything noted so far, without waiting.
    pub fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.locked())
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
        assert!(pending.touches(&volume("sharedSecret", "db"), "ns", "sa"));
        assert!(!pending.touches(&volume("sharedSecret", "cache"), "ns", "sa"));
        assert!(!pending.touches(&volume("sharedConfigMap", "db"), "ns", "sa"));
        changes.everything();
        assert!(changes.next().await.touches(&volume("sharedConfigMap", "anything"), "ns", "sa"));
        assert_eq!(changes.take(), Pending::default(), "taken");
    }

    #[tokio::test]
    async fn a_share_change_touches_the_projections_showing_it_in_their_namespace_only() {
        let changes = Changes::default();
        let app = BTreeMap::from([("projection".to_string(), "app".to_string())]);
        changes.projection_uses("team-a", "app", [("sharedSecret", "db"), ("sharedConfigMap", "ca")].into_iter());
        changes.share("sharedSecret", "db");
        let pending = changes.next().await;
        assert!(pending.touches(&app, "team-a", "sa"));
        assert!(!pending.touches(&app, "team-b", "sa"), "a projection of the same name elsewhere");
        // The projection no longer shows db: a change to db leaves it alone; to ca, not.
        changes.projection_uses("team-a", "app", [("sharedConfigMap", "ca")].into_iter());
        changes.share("sharedSecret", "db");
        assert!(!changes.next().await.touches(&app, "team-a", "sa"));
        changes.share("sharedConfigMap", "ca");
        assert!(changes.next().await.touches(&app, "team-a", "sa"));
        // The projection itself edited.
        changes.projection("team-a", "app");
        let pending = changes.next().await;
        assert!(pending.touches(&app, "team-a", "sa") && !pending.touches(&app, "team-b", "sa"));
    }

    #[test]
    fn one_namespaces_absences_never_take_the_room_of_anothers() {
        let changes = Changes::default();
        let absence = |namespace: &str, volume: usize| Absence {
            pod: crate::content::ask::PodInfo {
                name: format!("p{volume}"),
                namespace: namespace.into(),
                uid: "u".into(),
                service_account: "sa".into(),
            },
            volume_name: "v".into(),
            attributes: BTreeMap::new(),
            absent: vec!["Secret x/y, shared by SharedSecret \"y\", not found".into()],
        };
        for volume in 0..5_000 {
            changes.absent(absence("flood", volume));
        }
        changes.absent(absence("calm", 0));
        let pending = changes.take();
        let flood = pending.absences.iter().filter(|a| a.pod.namespace == "flood").count();
        assert_eq!(flood, MAX_PENDING_ABSENCES_PER_NAMESPACE);
        assert!(pending.absences.iter().any(|a| a.pod.namespace == "calm"), "another namespace's is held");
    }

    #[test]
    fn accounts_include_the_service_accounts_they_name() {
        let one = Accounts::One("team-a".into(), "web".into());
        assert!(one.include("team-a", "web"));
        assert!(!one.include("team-a", "db") && !one.include("team-b", "web"));
        let namespace = Accounts::OfNamespace("team-a".into());
        assert!(namespace.include("team-a", "web") && namespace.include("team-a", "db"));
        assert!(!namespace.include("team-b", "web"));
        assert!(Accounts::Every.include("any", "one"));
    }

    /// Changes whose looks at grants are being delivered, and the task delivering them.
    fn delivering_looks() -> (std::sync::Arc<Changes>, tokio::task::JoinHandle<()>) {
        let changes = std::sync::Arc::new(Changes::default());
        let delivering = tokio::spawn({
            let changes = changes.clone();
            async move { changes.deliver_grant_looks().await }
        });
        (changes, delivering)
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_touches_its_accounts_volumes_now_and_four_times_later_and_a_burst_is_gathered() {
        let (changes, delivering) = delivering_looks();
        // The refresher, taking each look as it comes.
        let refresher = tokio::spawn({
            let changes = changes.clone();
            async move {
                let volume = BTreeMap::from([("sharedSecret".to_string(), "db".to_string())]);
                let mut looks = Vec::new();
                loop {
                    let pending = changes.next().await;
                    assert!(pending.touches(&volume, "team-a", "web"), "{pending:?}");
                    assert!(!pending.touches(&volume, "team-a", "db") && !pending.touches(&volume, "team-b", "web"));
                    looks.push(Instant::now());
                    if looks.len() == 22 {
                        return looks;
                    }
                }
            }
        });
        // A burst: 100 changes of bindings of team-a/web within one second.
        let started = Instant::now();
        for _ in 0..100 {
            changes.grant_changed([Accounts::One("team-a".into(), "web".into())]);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The windows of 250 ms that end at 0, 0.25, ... 1.5 s (each change at once, and 0.5 s
        // later), at 2, 2.25, ... 3 s (2 s later), at 8, ... 9 s and at 30, ... 31 s: 22 looks
        // instead of 500 (5 per change).
        let looks = tokio::time::timeout(Duration::from_secs(40), refresher).await.expect("22 looks").unwrap();
        assert_eq!(looks.last().unwrap().duration_since(started), Duration::from_secs(31));
        tokio::time::sleep(Duration::from_secs(40)).await;
        assert_eq!(changes.take(), Pending::default(), "no 23rd look");
        delivering.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn the_listener_is_told_which_looks_are_first_and_which_again() {
        let (changes, delivering) = delivering_looks();
        /// When each window was told, and its first and again accounts.
        type Told = Vec<(Duration, Vec<Accounts>, Vec<Accounts>)>;
        let told: std::sync::Arc<Mutex<Told>> = Default::default();
        let started = Instant::now();
        changes.on_grant_looks({
            let told = told.clone();
            move |look| {
                if let GrantLook::Window { first, again } = look {
                    told.lock().unwrap().push((started.elapsed(), first.to_vec(), again.to_vec()));
                }
            }
        });
        let web = Accounts::One("team-a".into(), "web".into());
        changes.grant_changed([web.clone()]);
        tokio::time::sleep(Duration::from_millis(1_900)).await;
        // A second change whose first look falls in the window of the first change's last look.
        changes.grant_changed([web.clone()]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let told = told.lock().unwrap().clone();
        let kinds: Vec<(bool, bool)> =
            told.iter().map(|(_, first, again)| (!first.is_empty(), !again.is_empty())).collect();
        assert_eq!(
            kinds,
            [(true, false), (false, true), (true, false), (false, true), (false, true)],
            "first, again, first (the 2 s look of the first change merged into it), again, again: {told:?}"
        );
        delivering.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_binding_that_names_no_service_account_wakes_nothing() {
        let (changes, delivering) = delivering_looks();
        changes.grant_changed([]);
        assert!(tokio::time::timeout(Duration::from_secs(10), changes.next()).await.is_err());
        assert_eq!(changes.take(), Pending::default());
        delivering.abort();
    }
}
