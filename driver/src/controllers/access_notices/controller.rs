//! The access-notices controller: the one place that watches the cluster's RBAC, shares and
//! projections. It follows Roles and RoleBindings by their metadata alone (a change concerns its
//! namespace, whatever it names), ClusterRoles and ClusterRoleBindings whole (made by the
//! cluster's operators; only the names of ClusterRoles that can grant `use` are kept), the shares
//! and projections ([`super::objects`]) and every node's `SharedResourceNode`;
//! gathers what each change concerns ([`super::plan`]) for [`GATHER`], and writes the status of
//! each node it concerns, and of no other. A relist of any watch (it may have missed changes,
//! and it happens at every start) concerns every namespace. A failed write is owed to its node
//! and tried again with backoff. An answer that turns to denied is first broadcast on the lease
//! every node watches ([`super::lease::broadcast_revocations`], at most once a second): one
//! write reaches them all. Beside it, the lease the nodes read as "the notices are kept"
//! ([`super::lease`]) is renewed once every watch has listed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt as _};
use tracing::{debug, info, warn};

use super::answers::AnswerBook;
use super::gathering::{Gathered, ListedWatches, PAGE, follow_each_change, listed_again, watch_failed};
use super::lease::{LeaseRef, keep_renewed};
use super::notices::{Concerns, Notices};
use super::plan::{GrantingClusterRoles, next_status};
use super::status_patch::status_patch;
use super::waiting_pods::{Registrations, tell_asking_nodes};
use crate::apiserver::request::ask;
use crate::quote::Logged;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::node_view::{NodeNotices, SharedResourceNode};
use sharedresource_api::revocations::RevocationLog;

/// How long notices are gathered before the nodes are written: a burst of binding changes costs
/// each node one write, while a revocation waits at most this long here.
pub const GATHER: Duration = Duration::from_millis(50);
/// The least time between two broadcasts of revocations: every node receives each one, so a
/// tenant churning its own grants costs every node at most one Lease event (of at most 64 lines)
/// a second; a revocation in a quiet cluster is written at once.
const BROADCAST_EVERY: Duration = Duration::from_secs(1);
/// Node writes in flight at once.
const WRITES_AT_ONCE: usize = 16;
/// The first wait before owed writes are tried again, doubled up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// What the controller needs to run.
#[derive(Debug, Clone)]
pub struct NoticeSettings {
    /// The lease renewed while the notices are kept.
    pub lease: LeaseRef,
    /// How long one request may take.
    pub timeout: Duration,
    /// Whether the nodes' access questions are answered here ([`super::answers`]); without,
    /// each node asks its own after every notice (the design before, kept as the benchmark's
    /// baseline).
    pub answers: bool,
}

/// Runs the controller with `client` until dropped.
pub async fn run(client: Client, settings: NoticeSettings) {
    let gathered = Arc::new(Gathered::default());
    let registrations = Arc::new(Registrations::default());
    let nodes = follow_nodes(Api::all(client.clone()), gathered.clone(), registrations.clone());
    let listed = Arc::new(ListedWatches::default());
    tokio::spawn(follow_namespaced::<Role>(Api::all(client.clone()), gathered.clone(), listed.clone()));
    tokio::spawn(follow_namespaced::<RoleBinding>(Api::all(client.clone()), gathered.clone(), listed.clone()));
    let roles = Arc::new(Mutex::new(GrantingClusterRoles::default()));
    let cluster_roles = follow_cluster_roles(Api::all(client.clone()), roles.clone(), gathered.clone(), listed.clone());
    tokio::spawn(cluster_roles);
    let bindings = follow_cluster_role_bindings(Api::all(client.clone()), roles, gathered.clone(), listed.clone());
    tokio::spawn(bindings);
    super::objects::follow(client.clone(), gathered.clone(), listed.clone());
    if nodes.wait_until_ready().await.is_err() {
        return;
    }
    tokio::spawn(tell_asking_nodes(client.clone(), nodes.clone(), registrations, settings.timeout));
    listed.wait_for(RBAC_WATCHES + super::objects::WATCHES).await;
    info!("every watch has listed; telling nodes of grant changes");
    let renew = keep_renewed(client.clone(), settings.lease.clone(), settings.timeout);
    let writing = write_notices(client, nodes, gathered, (settings.lease.clone(), settings.timeout, settings.answers));
    futures_util::future::join(renew, writing).await;
}

/// The RBAC watches whose first list the lease waits for.
const RBAC_WATCHES: usize = 4;

/// Every node's object, kept without managed fields; each event marks its node to be looked at
/// (and, when it asks, its waiting pods to be told).
fn follow_nodes(
    api: Api<SharedResourceNode>,
    gathered: Arc<Gathered>,
    registrations: Arc<Registrations>,
) -> Store<SharedResourceNode> {
    let (store, writer) = reflector::store();
    let events = watcher::watcher(api, watcher::Config::default().page_size(100))
        .default_backoff()
        .modify(|node: &mut SharedResourceNode| node.meta_mut().managed_fields = None)
        .reflect(writer);
    tokio::spawn(events.for_each(move |event| {
        match event {
            Ok(Event::Apply(node) | Event::InitApply(node)) => {
                registrations.changed(&node);
                gathered.node_changed(node.name_any());
            }
            Ok(_) => {}
            Err(error) => watch_failed("SharedResourceNode", &error),
        }
        std::future::ready(())
    }));
    store
}

/// Roles or RoleBindings (`K`), metadata only: a change concerns its namespace.
async fn follow_namespaced<K>(api: Api<PartialObjectMeta<K>>, gathered: Arc<Gathered>, listed: Arc<ListedWatches>)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let of_namespace =
        |object: PartialObjectMeta<K>| Concerns::Namespace(object.metadata.namespace.unwrap_or_default());
    follow_each_change(api, (of_namespace, Concerns::EveryNamespace), gathered, listed).await;
}

/// ClusterRoles, whole: the names of those that can grant `use` are kept.
async fn follow_cluster_roles(
    api: Api<ClusterRole>,
    roles: Arc<Mutex<GrantingClusterRoles>>,
    gathered: Arc<Gathered>,
    listed: Arc<ListedWatches>,
) {
    let mut relisting: Vec<String> = Vec::new();
    let mut first = true;
    let mut events = watcher::watcher(api, watcher::Config::default().page_size(PAGE)).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => relisting.clear(),
            Ok(Event::InitApply(role)) => {
                if super::plan::can_grant_use(role.rules.as_deref().unwrap_or_default()) {
                    relisting.push(role.name_any());
                }
            }
            Ok(Event::InitDone) => {
                let mut known = roles.locked();
                known.relisted(std::mem::take(&mut relisting));
                info!(granting = known.len(), "ClusterRoles that can grant use listed");
                drop(known);
                listed_again(&gathered, &listed, &mut first, Concerns::EveryNamespace);
            }
            Ok(Event::Apply(role)) => {
                let concerns =
                    roles.locked().changed(&role.name_any(), Some(role.rules.as_deref().unwrap_or_default()));
                gathered.add(concerns);
            }
            Ok(Event::Delete(role)) => {
                let concerns = roles.locked().changed(&role.name_any(), None);
                gathered.add(concerns);
            }
            Err(error) => watch_failed("ClusterRole", &error),
        }
    }
}

/// ClusterRoleBindings, whole: a change concerns everyone when the role it names can grant `use`.
/// One seen before the ClusterRoles have listed concerns nobody yet: their list's end concerns
/// everyone.
async fn follow_cluster_role_bindings(
    api: Api<ClusterRoleBinding>,
    roles: Arc<Mutex<GrantingClusterRoles>>,
    gathered: Arc<Gathered>,
    listed: Arc<ListedWatches>,
) {
    let mut first = true;
    let config = watcher::Config::default().page_size(PAGE);
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::InitDone) => listed_again(&gathered, &listed, &mut first, Concerns::EveryNamespace),
            Ok(Event::Apply(binding) | Event::Delete(binding)) => {
                let concerns = roles.locked().binding_changed(&binding.role_ref.kind, &binding.role_ref.name);
                gathered.add(concerns);
            }
            Err(error) => watch_failed("ClusterRoleBinding", &error),
        }
    }
}

/// Writes the nodes' status as notices arrive: after each [`GATHER`], the questions the notices
/// (and the looks again they left) concern are answered ([`super::answers`], when `answering`),
/// the answers that turned to denied are broadcast on `lease` (every node watches it: one write
/// reaches them all, [`super::lease::broadcast_revocations`]), and every node the notices concern
/// (or whose object changed, or that lists an answer that changed) gets the status
/// [`next_status`] computes, when it differs. What the controller wrote last is its base for the
/// next write (its own watch may lag it).
async fn write_notices(
    client: Client,
    nodes: Store<SharedResourceNode>,
    gathered: Arc<Gathered>,
    (lease, timeout, answering): (LeaseRef, Duration, bool),
) {
    let mut writer = NoticeWriter {
        api: Api::all(client.clone()),
        client,
        nodes,
        lease,
        timeout,
        answering,
        written: HashMap::new(),
        owed: HashMap::new(),
        book: AnswerBook::default(),
        revocations: RevocationLog::default(),
        unsent: false,
        next_broadcast: tokio::time::Instant::now(),
        retry: FIRST_RETRY,
        reviews_failed: false,
    };
    loop {
        tokio::select! {
            _ = gathered.arrived() => {}
            _ = sleep_until(writer.wake_at()) => {}
        }
        tokio::time::sleep(GATHER).await;
        let (notices, changed) = gathered.take();
        writer.round(&notices, &changed).await;
    }
}

/// The writer of the nodes' status, and what it keeps from one round to the next.
struct NoticeWriter {
    client: Client,
    api: Api<SharedResourceNode>,
    nodes: Store<SharedResourceNode>,
    lease: LeaseRef,
    timeout: Duration,
    answering: bool,
    /// What it wrote last for each node: its base for the next write.
    written: HashMap<String, NodeNotices>,
    /// What a failed write still owes each node.
    owed: HashMap<String, Notices>,
    book: AnswerBook,
    revocations: RevocationLog,
    /// Lines not broadcast yet, and when the next broadcast may be written.
    unsent: bool,
    next_broadcast: tokio::time::Instant,
    retry: Duration,
    /// A review failed (refused under load, or timed out): its question is not current, so its
    /// nodes look at their volumes themselves until a round answers it. Nothing else may come
    /// to start that round, so it is started as an owed write would be.
    reviews_failed: bool,
}

/// One node's write: its name, the status written, the patch that writes it, and what it owes
/// the node should it fail.
type NodeWrite = (String, NodeNotices, serde_json::Value, Notices);

impl NoticeWriter {
    /// When a round is due without a notice: an answer's look again, a retry, a broadcast.
    fn wake_at(&self) -> Option<tokio::time::Instant> {
        let retry_at = (!self.owed.is_empty() || self.reviews_failed).then(|| tokio::time::Instant::now() + self.retry);
        let broadcast_at = self.unsent.then_some(self.next_broadcast);
        self.book.next_look().into_iter().chain(retry_at).chain(broadcast_at).min()
    }

    /// One round over `notices` and the nodes whose objects `changed`.
    async fn round(&mut self, notices: &Notices, changed: &HashSet<String>) {
        self.book.begin_round();
        // Answers asked before these changes are no longer current for their namespaces.
        self.book.noticed(notices);
        let mut concerned = self.book.due_looks(tokio::time::Instant::now());
        concerned.extend(notices);
        let states = self.nodes.state();
        let answers_changed =
            if self.answering { self.answer(&states, &concerned, notices).await } else { HashSet::new() };
        let writes = self.writes_due(&states, notices, changed, &answers_changed);
        // What was owed to or written for a node gone from the cluster is forgotten.
        let nodes = &self.nodes;
        self.written.retain(|name, _| nodes.get(&reflector::ObjectRef::new(name)).is_some());
        self.owed.retain(|name, _| nodes.get(&reflector::ObjectRef::new(name)).is_some());
        let failed = self.write(writes).await;
        self.retry = if failed || self.reviews_failed { (self.retry * 2).min(MAX_RETRY) } else { FIRST_RETRY };
    }

    /// Answers the questions `concerned` reaches of the nodes' lists, broadcasts what turned
    /// to denied when a broadcast may be written, and returns the keys of the answers that
    /// changed.
    async fn answer(
        &mut self,
        states: &[Arc<SharedResourceNode>],
        concerned: &Notices,
        notices: &Notices,
    ) -> HashSet<String> {
        let listing = states.iter().map(|node| {
            let status = self.written.get(&node.name_any()).or(node.status.as_ref());
            (&node.spec, status)
        });
        let questions = self.book.to_ask(listing, concerned);
        let asked = super::answers::ask(&self.client, self.timeout, questions, &mut self.book).await;
        self.book.look_again(tokio::time::Instant::now(), notices);
        self.reviews_failed = asked.failed;
        self.unsent |= self.revocations.revoked(&asked.revoked, now_millis());
        if self.unsent && tokio::time::Instant::now() >= self.next_broadcast {
            super::lease::broadcast_revocations(&self.client, &self.lease, &self.revocations, self.timeout).await;
            (self.unsent, self.next_broadcast) = (false, tokio::time::Instant::now() + BROADCAST_EVERY);
        }
        asked.changed
    }

    /// The writes this round owes: every node the notices concern, whose object changed, that
    /// lists an answer that changed, or that a failed write is owed to, when its status differs.
    fn writes_due(
        &mut self,
        states: &[Arc<SharedResourceNode>],
        notices: &Notices,
        changed: &HashSet<String>,
        answers_changed: &HashSet<String>,
    ) -> Vec<NodeWrite> {
        let now = now_millis();
        let mut writes = Vec::new();
        for node in states {
            let name = node.name_any();
            let mut due = self.owed.remove(&name).unwrap_or_default();
            if notices.concern(&node.spec) {
                due.extend(notices);
            }
            let lists_changed = node.spec.questions.iter().any(|key| answers_changed.contains(key));
            if due.is_empty() && !changed.contains(&name) && !lists_changed {
                continue;
            }
            let current = self.written.get(&name).cloned().unwrap_or_else(|| node.status.clone().unwrap_or_default());
            if let Some(status) = next_status(&node.spec, &current, &due, now, &self.book) {
                debug!(node = %name, namespaces = ?due.namespaces, every_namespace = due.every_namespace, objects = ?due.objects, every_object = due.every_object, node_changed = changed.contains(&name), "telling a node of changes");
                // What the stored status may still hold: as written last, and as last seen.
                let before: Vec<NodeNotices> =
                    self.written.get(&name).cloned().into_iter().chain(node.status.clone()).collect();
                let patch = status_patch(&status, &before.iter().collect::<Vec<_>>());
                writes.push((name, status, patch, due));
            }
        }
        writes
    }

    /// Writes `writes`, [`WRITES_AT_ONCE`] at a time; what failed is owed to its node. Whether
    /// any failed.
    async fn write(&mut self, writes: Vec<NodeWrite>) -> bool {
        let timeout = self.timeout;
        let results = futures_util::stream::iter(writes)
            .map(|(name, status, patch, due)| {
                let api = self.api.clone();
                async move {
                    // The registration's entry is the waiting pods' teller's: never written from here.
                    let patch = Patch::Merge(patch);
                    let what = || format!("telling node {name} of grant changes");
                    let wrote = ask(timeout, what, api.patch_status(&name, &PatchParams::default(), &patch)).await;
                    (name, status, due, wrote.map(drop))
                }
            })
            .buffer_unordered(WRITES_AT_ONCE)
            .collect::<Vec<_>>()
            .await;
        let mut failed = false;
        for (name, status, due, wrote) in results {
            match wrote {
                Ok(()) => {
                    self.written.insert(name, status);
                }
                Err(error) => {
                    warn!(node = %name, error = %Logged(&error), "a node could not be told of grant changes; trying again");
                    self.owed.insert(name, due);
                    failed = true;
                }
            }
        }
        failed
    }
}

/// Waits until `at`; forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}
