//! This node's view by name: its own `SharedResourceNode`, the only place it learns of grant
//! changes and of changes of the shares and projections its volumes read. The driver writes the
//! spec (the namespaces of the pods whose volumes here the access check guards, and what those
//! volumes read, as [`NodeView`] keeps them) and watches the object by name; the access-notices
//! controller writes the status. A namespace whose value moved (or appeared: a namespace new to
//! the node is looked at once) has its volumes' access looked at again, as a grant's change
//! always was ([`Changes::grant_changed`]); a moved `everyNamespace`, every volume's. An object
//! whose value moved (or appeared) is forgotten by the cache and its volumes refreshed; a moved
//! `everyObject`, every share and volume. Values are compared, not counted, so a watch that
//! lists again after missing events finds what moved. The node keeps no RBAC, watches no kind
//! cluster-wide, and no change of a namespace or object it does not serve reaches it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::broadcast_denials::BroadcastDenials;
use super::cache::ShareCache;
use super::held_answers::HeldAnswers;
use crate::content::changes::{Accounts, Changes};
use crate::content::live_volumes::SecondLook;
use crate::metrics::Metrics;
use crate::quote::Logged;
use crate::unpoisoned::UnpoisonedMutex;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::node_view::{
    MAX_NAMESPACES, MAX_OBJECTS, MAX_QUESTIONS, NodeNotices, NoticedObject, SharedResourceNode, SharedResourceNodeSpec,
};

/// The field manager of the node's writes of its spec.
const MANAGER: &str = "sharedresource-csi-driver";
/// How long changes are gathered before the spec is written: a node starting many pods writes
/// once, and the controller answers once. Nothing waits on it but the controller's knowing what
/// is new (each volume's access was checked at its publish, and what is new to the spec is looked
/// at once when its entry appears); each write costs the apiserver a status write too, and at 200
/// nodes publishing 20 volumes each, a shorter gather wrote each node's object once per volume.
const GATHER: Duration = Duration::from_secs(1);
/// The least time from one write of the spec to the next: a node whose pods arrive over several
/// seconds (as kubelet starts them, or as a busy apiserver lets their publishes through) writes
/// every few seconds, not once per volume. Every write is a whole new copy of the object that
/// the apiserver keeps in its watch cache's history beside the controller's status write that
/// follows it, and the object grows with the volumes, so writes per volume made that history
/// grow with the square of a node's volumes. A volume new to the spec waits at most this long
/// (and [`GATHER`]) for the controller to watch its access; its access was checked at its
/// publish, and is looked at once more when its entry appears.
const SPACING: Duration = Duration::from_secs(4);
/// The first wait before a failed write is tried again, doubled up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The namespaces of the volumes whose access the node checks, and the shares and projections
/// they read, by volume id; the shares each projection shows; since when the object says less
/// than they are (its write pending or failing); and since when its status has lacked an entry
/// for something its spec lists (the controller not telling it).
#[derive(Debug, Default)]
pub struct NodeView {
    volumes: Mutex<(HashMap<String, VolumeReads>, SecondLook)>,
    /// The shares each projection (namespace, name) showed when last fetched.
    shown: Mutex<HashMap<(String, String), BTreeSet<NoticedObject>>>,
    /// The access questions asked for live volumes (forgotten with the last volume of their
    /// pod's namespace and service account).
    questions: Mutex<HashSet<AccessQuestion>>,
    changed: Notify,
    behind_since: Mutex<Option<tokio::time::Instant>>,
    untold_since: Mutex<Option<tokio::time::Instant>>,
    /// The spec last written (`None`: none yet by this run).
    written_spec: Mutex<Option<SharedResourceNodeSpec>>,
    /// The namespaces and objects the spec, as last seen, lists without a status entry.
    untold: Mutex<Lagging>,
}

/// The namespaces and objects of this node's volumes that the controller may not know of or
/// has not told the node of yet: not in the spec last written, or in it without a status entry.
/// Grant and object changes that concern them may not reach the node, which looks at them on its
/// own meanwhile (`notice_lease`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lagging {
    /// Namespaces whose grant changes may not be told.
    pub namespaces: BTreeSet<String>,
    /// Objects (their `NoticedObject::key`) whose changes may not be told.
    pub objects: BTreeSet<String>,
    /// Every namespace's (the spec says `everyNamespace` and the spec written did not).
    pub every_namespace: bool,
    /// Every object's.
    pub every_object: bool,
}

impl Lagging {
    /// Whether nothing lags.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.objects.is_empty() && !self.every_namespace && !self.every_object
    }
}

/// What one volume makes the node hear of: its pod's namespace and service account, and the
/// share or projection it reads (a provider's volume reads neither).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeReads {
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod's service account (whose access questions the node lists).
    pub service_account: String,
    /// The share or projection its attributes name.
    pub object: Option<NoticedObject>,
}

impl VolumeReads {
    /// What a volume of `pod` reading `object` makes the node hear of.
    pub fn of(pod: &crate::content::ask::PodInfo, object: Option<NoticedObject>) -> VolumeReads {
        VolumeReads { namespace: pod.namespace.clone(), service_account: pod.service_account.clone(), object }
    }
}

impl NodeView {
    /// Since when the node's object has not said what its volumes serve, or its status has not
    /// answered what its spec says (`None`: neither). Meanwhile, grant and object changes some
    /// volume depends on may not be told to the node.
    pub fn behind_since(&self) -> Option<tokio::time::Instant> {
        let behind = *self.behind_since.locked();
        let untold = *self.untold_since.locked();
        behind.into_iter().chain(untold).min()
    }

    /// The object, as last seen, lists in its spec these namespaces and objects without a status
    /// entry (`untold`; empty: none).
    fn seen(&self, untold: Lagging) {
        let mut since = self.untold_since.locked();
        if untold.is_empty() {
            *since = None;
        } else {
            since.get_or_insert_with(tokio::time::Instant::now);
        }
        *self.untold.locked() = untold;
    }

    /// What lags now: of the namespaces and objects the volumes need told, those the spec last
    /// written does not list, or lists with no status entry yet.
    pub fn lagging(&self) -> Lagging {
        let now = self.spec();
        let written = self.written_spec.locked().clone().unwrap_or_default();
        let untold = self.untold.locked().clone();
        let lags = |listed: &[String], written: &[String], untold: &BTreeSet<String>| -> BTreeSet<String> {
            listed.iter().filter(|item| !written.contains(item) || untold.contains(*item)).cloned().collect()
        };
        Lagging {
            namespaces: lags(&now.namespaces, &written.namespaces, &untold.namespaces),
            objects: lags(&now.objects, &written.objects, &untold.objects),
            every_namespace: now.every_namespace && !written.every_namespace,
            every_object: now.every_object && !written.every_object,
        }
    }

    /// What the volumes read changed: the object is behind until written again.
    fn mark_changed(&self) {
        self.behind_since.locked().get_or_insert_with(tokio::time::Instant::now);
        self.changed.notify_one();
    }

    /// `spec` was written: the object is current if the volumes still say `spec`.
    fn written(&self, spec: &SharedResourceNodeSpec) {
        // Held while the volumes are read: a change after the read marks it behind again.
        let mut behind = self.behind_since.locked();
        if self.spec() == *spec {
            *behind = None;
        }
        *self.written_spec.locked() = Some(spec.clone());
    }

    /// Volume `volume_id` reads `reads` (noted at each ask, before its access is asked or what it
    /// reads is read).
    pub fn note(&self, volume_id: &str, reads: VolumeReads) {
        let mut volumes = self.volumes.locked();
        // Every refresh notes its volume again: a volume already noted costs one lookup, not a
        // scan of the node's volumes.
        if volumes.0.get(volume_id).is_some_and(|noted| *noted == reads) {
            return;
        }
        let new_namespace = !volumes.0.values().any(|v| v.namespace == reads.namespace);
        let new_object =
            reads.object.as_ref().is_some_and(|o| !volumes.0.values().any(|v| v.object.as_ref() == Some(o)));
        volumes.0.insert(volume_id.to_string(), reads);
        drop(volumes);
        if new_namespace || new_object {
            self.mark_changed();
        }
    }

    /// `question` was asked (or answered from what is held) for a live volume.
    pub fn asked(&self, question: &AccessQuestion) {
        let mut questions = self.questions.locked();
        if questions.contains(question) {
            return;
        }
        questions.insert(question.clone());
        drop(questions);
        self.mark_changed();
    }

    /// The questions asked for live volumes of `namespace` (of every namespace: `None`).
    pub fn questions_of(&self, namespace: Option<&str>) -> Vec<AccessQuestion> {
        let questions = self.questions.locked();
        questions.iter().filter(|q| namespace.is_none_or(|namespace| q.namespace == namespace)).cloned().collect()
    }

    /// Projection `name` of `namespace` shows `shares` (as last fetched).
    pub fn shows(&self, namespace: &str, name: &str, shares: BTreeSet<NoticedObject>) {
        let key = (namespace.to_string(), name.to_string());
        let mut shown = self.shown.locked();
        if shown.get(&key) == Some(&shares) {
            return;
        }
        shown.insert(key, shares);
        drop(shown);
        self.mark_changed();
    }

    /// Forgets the volumes two looks in a row did not find among `live`.
    pub fn retain_live(&self, live: &HashSet<String>) {
        let mut volumes = self.volumes.locked();
        let (table, look) = &mut *volumes;
        let forget = look.to_forget(table.keys(), live);
        for id in &forget {
            table.remove(id);
        }
        drop(volumes);
        if !forget.is_empty() {
            self.forget_unread_projections();
            self.forget_unasked_questions();
            self.mark_changed();
        }
    }

    /// Volume `volume_id` was unpublished.
    pub fn released(&self, volume_id: &str) {
        if self.volumes.locked().0.remove(volume_id).is_some() {
            self.forget_unread_projections();
            self.forget_unasked_questions();
            self.mark_changed();
        }
    }

    /// Forgets what projections no volume reads any more showed.
    fn forget_unread_projections(&self) {
        let read: HashSet<NoticedObject> = self.volumes.locked().0.values().filter_map(|v| v.object.clone()).collect();
        self.shown
            .locked()
            .retain(|(namespace, name), _| read.contains(&NoticedObject::Projection(namespace.clone(), name.clone())));
    }

    /// Forgets the questions of service accounts no live volume's pod runs as.
    fn forget_unasked_questions(&self) {
        let accounts: HashSet<(String, String)> =
            self.volumes.locked().0.values().map(|v| (v.namespace.clone(), v.service_account.clone())).collect();
        self.questions.locked().retain(|q| accounts.contains(&(q.namespace.clone(), q.service_account.clone())));
    }

    /// The spec saying these namespaces and objects: listed when they fit, `everyNamespace` or
    /// `everyObject` otherwise.
    fn spec(&self) -> SharedResourceNodeSpec {
        let volumes = self.volumes.locked();
        let namespaces: BTreeSet<String> = volumes.0.values().map(|v| v.namespace.clone()).collect();
        let read: BTreeSet<NoticedObject> = volumes.0.values().filter_map(|v| v.object.clone()).collect();
        drop(volumes);
        let shown = self.shown.locked();
        let mut objects: BTreeSet<String> = BTreeSet::new();
        for object in &read {
            objects.insert(object.key());
            if let NoticedObject::Projection(namespace, name) = object
                && let Some(shares) = shown.get(&(namespace.clone(), name.clone()))
            {
                objects.extend(shares.iter().map(NoticedObject::key));
            }
        }
        drop(shown);
        let questions: BTreeSet<String> = self.questions.locked().iter().map(AccessQuestion::key).collect();
        let every_namespace = namespaces.len() > MAX_NAMESPACES;
        let every_object = objects.len() > MAX_OBJECTS;
        SharedResourceNodeSpec {
            namespaces: if every_namespace { Vec::new() } else { namespaces.into_iter().collect() },
            every_namespace,
            objects: if every_object { Vec::new() } else { objects.into_iter().collect() },
            every_object,
            // Beyond the list, a namespace's questions are not all answered by the controller:
            // the node looks at them itself.
            questions: questions.into_iter().take(MAX_QUESTIONS).collect(),
            // The startup taint's field, applied by its own manager (`startup_taint`).
            driver_registered: None,
        }
    }
}

/// What a node learns from a new status, compared with the one it saw before.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Told {
    /// Every volume's access is to be looked at again.
    pub every_namespace: bool,
    /// The access of these namespaces' volumes is to be looked at again.
    pub namespaces: Vec<String>,
    /// The controller's answers to hold in place of this node's own.
    pub answers: Vec<(AccessQuestion, bool)>,
    /// The accounts the controller answered for whole (a moved namespace or `everyNamespace`):
    /// any other answer of theirs held is forgotten, and their volumes refreshed.
    pub answered: Vec<Accounts>,
    /// The accounts one of whose answers flipped: their volumes are refreshed.
    pub flipped: Vec<Accounts>,
    /// Every share and projection is to be read again.
    pub every_object: bool,
    /// These shares and projections are to be read again.
    pub objects: Vec<NoticedObject>,
    /// Questions the status says are allowed while their denial, taken from the revocations'
    /// broadcast, is doubted: the node asks the apiserver itself rather than take either.
    pub ask_again: Vec<AccessQuestion>,
}

/// What the node's own volumes ask, as [`told`] compares it with the object: the questions its
/// spec lists (`listed`, sorted keys) and those its live volumes ask (`known`).
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    /// The spec's questions, as the object read says them.
    pub listed: &'a [String],
    /// The questions of live volumes.
    pub known: &'a [AccessQuestion],
    /// The questions denied from the revocations' broadcast that no status has confirmed yet
    /// ([`super::broadcast_denials`]).
    pub doubted: &'a [AccessQuestion],
}

impl Asking<'_> {
    /// Whether every known question of `namespace` (of every namespace: `None`) is listed, so
    /// that the controller answered each.
    fn covers(&self, namespace: Option<&str>) -> bool {
        self.known
            .iter()
            .filter(|q| namespace.is_none_or(|namespace| q.namespace == namespace))
            .all(|q| self.listed.binary_search(&q.key()).is_ok())
    }
}

/// What moved from `before` to `now`. At the first sight (`before` is `None`) everything may
/// have: an answer or a share read before it (a publish while the watch was still starting, or
/// retrying) could predate a change whose entry this first status already carries, so what the
/// node holds is looked at again (at a driver's start, usually nothing). An entry of no known
/// form is passed over.
///
/// A moved namespace (or `everyNamespace`) the controller says it answered, whose every question
/// `asking` knows is listed, is taken from its answers: nothing is asked. Any other is looked at
/// by the node itself, as when no controller answers. An answer that flipped since `before` (the
/// controller asked again while the apiserver's RBAC cache could lag) is taken too.
pub fn told(before: Option<&NodeNotices>, now: &NodeNotices, asking: Asking<'_>) -> Told {
    let Some(before) = before else {
        return Told { every_namespace: true, every_object: true, ..Told::default() };
    };
    let mut told = Told {
        every_object: before.every_object != now.every_object,
        objects: now
            .objects
            .iter()
            .filter(|entry| before.of_object(&entry.object) != Some(entry.noticed))
            .filter_map(|entry| NoticedObject::parse(&entry.object))
            .collect(),
        ..Told::default()
    };
    let answers_of = |namespace: Option<&str>| -> Vec<(AccessQuestion, bool)> {
        now.answers
            .iter()
            .filter_map(|entry| AccessQuestion::parse(&entry.question).map(|q| (q, entry.allowed)))
            .filter(|(q, _)| namespace.is_none_or(|namespace| q.namespace == namespace))
            .collect()
    };
    if before.every_namespace != now.every_namespace {
        if now.every_namespace_answered && asking.covers(None) {
            told.answers.extend(answers_of(None));
            told.answered.push(Accounts::Every);
        } else {
            told.every_namespace = true;
            return told;
        }
    }
    for entry in now.namespaces.iter().filter(|entry| before.of(&entry.namespace) != Some(entry.noticed)) {
        if entry.answered && asking.covers(Some(&entry.namespace)) {
            told.answers.extend(answers_of(Some(&entry.namespace)));
            told.answered.push(Accounts::OfNamespace(entry.namespace.clone()));
        } else {
            told.namespaces.push(entry.namespace.clone());
        }
    }
    for (question, allowed) in answers_of(None) {
        let flipped = before.answer(&question.key()) == Some(!allowed);
        // A namespace the node looks at itself is not taken from answers at all.
        let looked_at = told.namespaces.contains(&question.namespace);
        let taken = told.answers.iter().any(|(q, _)| *q == question);
        if flipped && !looked_at && !taken && asking.known.contains(&question) {
            told.flipped.push(Accounts::One(question.namespace.clone(), question.service_account.clone()));
            told.answers.push((question, allowed));
        }
    }
    told.answers.retain(|(q, _)| asking.known.contains(q));
    // An allow that may be older than a denial taken from the broadcast is not taken.
    let (doubted, taken): (Vec<_>, Vec<_>) =
        told.answers.into_iter().partition(|(q, allowed)| *allowed && asking.doubted.contains(q));
    told.answers = taken;
    told.ask_again = doubted.into_iter().map(|(q, _)| q).collect();
    told
}

/// Says `told` to the node: the controller's answers held in `answers`, its volumes woken
/// through `wake`, and the shares held in `cache` that changed forgotten first, so their
/// volumes read them again.
pub fn tell(told: Told, wake: &Changes, (cache, answers): (&ShareCache, &HeldAnswers)) {
    if told.every_namespace {
        wake.grants_relisted();
    } else {
        // Answers the node holds already (taken from the revocations' broadcast, or told before)
        // leave its volumes as they are: nothing to refresh.
        let held_changed =
            (!told.answers.is_empty() || !told.answered.is_empty()) && answers.told(told.answers, &told.answered);
        if held_changed && (!told.answered.is_empty() || !told.flipped.is_empty()) {
            wake.answered(told.answered.into_iter().chain(told.flipped));
        }
        if !told.namespaces.is_empty() {
            wake.grant_changed(told.namespaces.into_iter().map(Accounts::OfNamespace));
        }
    }
    if !told.ask_again.is_empty() {
        wake.grant_changed(super::broadcast_denials::accounts_of(&told.ask_again));
    }
    if told.every_object {
        cache.forget_shares();
        wake.everything();
        return;
    }
    for object in told.objects {
        match object {
            NoticedObject::Share(kind, name) => {
                cache.forget_share(kind, &name);
                wake.share(kind.attribute(), &name);
            }
            NoticedObject::Projection(namespace, name) => wake.projection(&namespace, &name),
        }
    }
}

/// Keeps node `node`'s object: writes its spec as `view` changes and follows its status into
/// `wake`, requests on `client`, the watch on `watches`; runs until dropped.
pub async fn follow(
    (client, watches): (kube::Client, kube::Client),
    node: String,
    (view, denials): (Arc<NodeView>, Arc<BroadcastDenials>),
    (wake, cache, answers): (Arc<Changes>, Arc<ShareCache>, Arc<HeldAnswers>),
    (metrics, timeout): (Arc<Metrics>, Duration),
) {
    let rewrite = Arc::new(Notify::new());
    futures_util::future::join(
        write_spec(client, &node, &view, &rewrite, timeout),
        watch_status(watches, (&node, &view, &denials), (&wake, &cache, &answers), &rewrite, &metrics),
    )
    .await;
}

/// Writes the spec whenever the namespaces change (or `rewrite` asks: the object was deleted).
async fn write_spec(client: kube::Client, node: &str, view: &NodeView, rewrite: &Notify, timeout: Duration) {
    let owner = super::node_owner::own_node_uid(&client, node, timeout).await;
    let api = Api::<SharedResourceNode>::all(client);
    let mut written: Option<SharedResourceNodeSpec> = None;
    let mut last_write: Option<tokio::time::Instant> = None;
    let mut retry = FIRST_RETRY;
    let mut failed = false;
    loop {
        let wait = async {
            if failed {
                tokio::time::sleep(retry).await;
            } else {
                view.changed.notified().await;
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = rewrite.notified() => {
                written = None;
                view.mark_changed();
            }
        }
        // The first write waits for nothing: the object must exist before any notice can reach it.
        if written.is_some() {
            let gathered = tokio::time::Instant::now() + GATHER;
            let spaced = last_write.map_or(gathered, |at| at + SPACING);
            tokio::time::sleep_until(gathered.max(spaced)).await;
        }
        let spec = view.spec();
        if written.as_ref() == Some(&spec) {
            view.written(&spec);
            continue;
        }
        let mut object = serde_json::json!({
            "apiVersion": "sharedresource.inlineguard.dev/v1alpha1",
            "kind": "SharedResourceNode",
            "metadata": {"name": node},
            "spec": spec,
        });
        if let Some(uid) = &owner {
            object["metadata"]["ownerReferences"] = super::node_owner::owned_by_node(node, uid);
        }
        let what = || format!("writing SharedResourceNode {node}");
        let apply = PatchParams::apply(MANAGER).force();
        last_write = Some(tokio::time::Instant::now());
        match crate::apiserver::request::ask(timeout, what, api.patch(node, &apply, &Patch::Apply(&object))).await {
            Ok(_) => {
                info!(
                    namespaces = spec.namespaces.len(),
                    every_namespace = spec.every_namespace,
                    objects = spec.objects.len(),
                    every_object = spec.every_object,
                    "this node's view written"
                );
                view.written(&spec);
                written = Some(spec);
                (failed, retry) = (false, FIRST_RETRY);
            }
            Err(error) => {
                warn!(error = %Logged(&error), "this node's view could not be written; trying again (grant changes reach its volumes through the periodic rechecks meanwhile)");
                (failed, retry) = (true, (retry * 2).min(MAX_RETRY));
            }
        }
    }
}

/// Follows the object's status by name, waking the volumes a moved value concerns.
async fn watch_status(
    client: kube::Client,
    (node, view, denials): (&str, &NodeView, &BroadcastDenials),
    (wake, cache, answers): (&Changes, &ShareCache, &HeldAnswers),
    rewrite: &Notify,
    metrics: &Metrics,
) {
    let api = Api::<SharedResourceNode>::all(client);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = watch_stream(api, by_name).default_backoff().boxed();
    let mut seen: Option<NodeNotices> = None;
    while let Some(event) = events.next().await {
        let object = match event {
            Ok(Event::Apply(object) | Event::InitApply(object)) => object,
            Ok(Event::Delete(_)) => {
                rewrite.notify_one();
                continue;
            }
            Ok(Event::Init | Event::InitDone) => continue,
            Err(error) => {
                metrics.watch_error("SharedResourceNode");
                warn!(error = %Logged(&error), "watch of this node's view failed; retrying with backoff (the periodic rechecks continue)");
                continue;
            }
        };
        let status = object.status.unwrap_or_default();
        // The controller answers a namespace or object new to the spec with an entry: one missing
        // for long means it is not telling this node (its writes refused, or it does not run).
        let spec = &object.spec;
        let untold = |listed: &[String], every: bool, entry: &dyn Fn(&str) -> bool| -> BTreeSet<String> {
            if every { BTreeSet::new() } else { listed.iter().filter(|item| !entry(item)).cloned().collect() }
        };
        view.seen(Lagging {
            namespaces: untold(&spec.namespaces, spec.every_namespace, &|n| status.of(n).is_some()),
            objects: untold(&spec.objects, spec.every_object, &|o| status.of_object(o).is_some()),
            ..Lagging::default()
        });
        let (known, doubted) = (view.questions_of(None), denials.doubted());
        let asking = Asking { listed: &spec.questions, known: &known, doubted: &doubted };
        let told = told(seen.as_ref(), &status, asking);
        denials.seen(&status);
        denials.asked_again(&told.ask_again);
        tell(told, wake, (cache, answers));
        seen = Some(status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedresource_api::ShareKind;
    use sharedresource_api::node_view::{NamespaceGrantChanges, ObjectChanges};

    fn status(every: i64, entries: &[(&str, i64)]) -> NodeNotices {
        NodeNotices {
            namespaces: entries
                .iter()
                .map(|(namespace, noticed)| NamespaceGrantChanges {
                    namespace: namespace.to_string(),
                    noticed: *noticed,
                    answered: false,
                })
                .collect(),
            every_namespace: every,
            ..NodeNotices::default()
        }
    }

    fn with_objects(mut status: NodeNotices, every: i64, entries: &[(&str, i64)]) -> NodeNotices {
        status.every_object = every;
        status.objects = entries
            .iter()
            .map(|(object, noticed)| ObjectChanges { object: object.to_string(), noticed: *noticed })
            .collect();
        status
    }

    fn reads(namespace: &str, object: Option<NoticedObject>) -> VolumeReads {
        VolumeReads { namespace: namespace.into(), service_account: "reader".into(), object }
    }

    const NO_QUESTIONS: Asking<'static> = Asking { listed: &[], known: &[], doubted: &[] };

    fn share(name: &str) -> NoticedObject {
        NoticedObject::Share(ShareKind::Secret, name.into())
    }

    #[test]
    fn a_moved_or_new_namespace_is_told_and_everything_at_the_first_sight() {
        let before = status(1, &[("team-a", 10), ("team-b", 10)]);
        let first = told(None, &before, NO_QUESTIONS);
        assert!(first.every_namespace && first.every_object, "{first:?}");
        assert_eq!(told(Some(&before), &before, NO_QUESTIONS), Told::default());
        let moved = status(1, &[("team-a", 11), ("team-b", 10), ("team-c", 5)]);
        assert_eq!(told(Some(&before), &moved, NO_QUESTIONS).namespaces, ["team-a", "team-c"]);
        // A namespace gone from the status is no longer served: nothing to look at.
        assert_eq!(told(Some(&before), &status(1, &[("team-a", 10)]), NO_QUESTIONS), Told::default());
        let every = told(Some(&before), &status(2, &[("team-a", 10), ("team-b", 10)]), NO_QUESTIONS);
        assert!(every.every_namespace && !every.every_object);
    }

    #[test]
    fn a_moved_or_new_object_is_told_and_an_entry_of_no_known_form_is_passed_over() {
        let before = with_objects(status(1, &[]), 1, &[("SharedSecret/db", 10)]);
        let moved = with_objects(
            status(1, &[]),
            1,
            &[("SharedSecret/db", 11), ("SharedProjection/team-a/app", 3), ("Bogus/x", 4)],
        );
        let said = told(Some(&before), &moved, NO_QUESTIONS);
        assert_eq!(said.objects, [share("db"), NoticedObject::Projection("team-a".into(), "app".into())]);
        assert!(said.namespaces.is_empty() && !said.every_object);
        assert!(
            told(Some(&before), &with_objects(status(1, &[]), 2, &[("SharedSecret/db", 10)]), NO_QUESTIONS)
                .every_object
        );
    }

    #[test]
    fn a_told_share_is_forgotten_and_its_volumes_woken() {
        let cache = ShareCache::default();
        let backing = sharedresource_api::shares::ObjectRef { namespace: "infra".into(), name: "db".into() };
        for name in ["db", "ca"] {
            cache.keep_share(cache.read_begins(), ShareKind::Secret, name, Some((backing.clone(), vec![])));
        }
        let wake = Changes::default();
        let answers = HeldAnswers::new(Duration::from_secs(600));
        tell(Told { objects: vec![share("db")], ..Told::default() }, &wake, (&cache, &answers));
        assert!(cache.share(ShareKind::Secret, "db").is_none(), "told: read again");
        assert!(cache.share(ShareKind::Secret, "ca").is_some(), "not told: held");
        let pending = wake.take();
        let attributes =
            |name: &str| std::collections::BTreeMap::from([("sharedSecret".to_string(), name.to_string())]);
        assert!(pending.touches(&attributes("db"), "team-a", "reader"));
        assert!(!pending.touches(&attributes("ca"), "team-a", "reader"));
        tell(Told { every_object: true, ..Told::default() }, &wake, (&cache, &answers));
        assert!(cache.share(ShareKind::Secret, "ca").is_none(), "every object: nothing held");
    }

    #[test]
    fn the_object_is_behind_from_a_change_until_the_spec_saying_it_is_written() {
        let view = NodeView::default();
        assert_eq!(view.behind_since(), None, "nothing to say yet");
        view.note("v1", reads("team-a", None));
        let since = view.behind_since().expect("behind once a namespace is new");
        view.note("v2", reads("team-b", None));
        assert_eq!(view.behind_since(), Some(since), "behind since the first change");
        view.written(&SharedResourceNodeSpec { namespaces: vec!["team-a".into()], ..Default::default() });
        assert_eq!(view.behind_since(), Some(since), "an older spec leaves it behind");
        view.written(&view.spec());
        assert_eq!(view.behind_since(), None);
        view.note("v3", reads("team-a", None));
        assert_eq!(view.behind_since(), None, "a namespace it lists already changes nothing");
        view.note("v4", reads("team-a", Some(share("db"))));
        assert!(view.behind_since().is_some(), "an object it does not list yet");
        view.written(&view.spec());
        let db_untold = || Lagging { objects: BTreeSet::from(["SharedSecret/db".to_string()]), ..Lagging::default() };
        view.seen(db_untold());
        let untold = view.behind_since().expect("behind while the status lacks an entry");
        view.seen(db_untold());
        assert_eq!(view.behind_since(), Some(untold), "since the first sight");
        view.seen(Lagging::default());
        assert_eq!(view.behind_since(), None);
    }

    #[test]
    fn what_lags_is_what_the_spec_written_lacks_or_the_status_has_not_told() {
        let view = NodeView::default();
        view.note("v1", reads("team-a", Some(share("db"))));
        view.note("v2", reads("team-b", Some(share("ca"))));
        // Nothing written yet: all of it lags.
        let all = view.lagging();
        assert_eq!(all.namespaces, BTreeSet::from(["team-a".to_string(), "team-b".to_string()]));
        assert_eq!(all.objects, BTreeSet::from(["SharedSecret/ca".to_string(), "SharedSecret/db".to_string()]));
        view.written(&view.spec());
        // Written, and the status tells team-a and db only.
        view.seen(Lagging {
            namespaces: BTreeSet::from(["team-b".to_string()]),
            objects: BTreeSet::from(["SharedSecret/ca".to_string()]),
            ..Lagging::default()
        });
        let untold = view.lagging();
        assert_eq!(untold.namespaces, BTreeSet::from(["team-b".to_string()]));
        assert_eq!(untold.objects, BTreeSet::from(["SharedSecret/ca".to_string()]));
        // Everything told; a new volume's namespace and object lag until written and told.
        view.seen(Lagging::default());
        assert!(view.lagging().is_empty(), "{:?}", view.lagging());
        view.note("v3", reads("team-c", Some(share("db"))));
        let new = view.lagging();
        assert_eq!(new.namespaces, BTreeSet::from(["team-c".to_string()]));
        assert!(new.objects.is_empty(), "db is written and told: {new:?}");
        // A volume gone: what only it needed no longer lags.
        view.released("v3");
        assert!(view.lagging().is_empty(), "{:?}", view.lagging());
    }

    #[test]
    fn the_spec_lists_the_namespaces_of_live_volumes_until_too_many() {
        let view = NodeView::default();
        view.note("v1", reads("team-b", None));
        view.note("v2", reads("team-a", None));
        view.note("v3", reads("team-a", None));
        assert_eq!(view.spec().namespaces, ["team-a", "team-b"]);
        view.released("v1");
        assert_eq!(view.spec().namespaces, ["team-a"]);
        let live: HashSet<String> = ["v2".to_string()].into();
        view.retain_live(&live);
        view.retain_live(&live);
        assert_eq!(view.spec().namespaces, ["team-a"]);
        view.retain_live(&HashSet::new());
        assert_eq!(view.spec().namespaces, ["team-a"], "one look is not enough");
        view.retain_live(&HashSet::new());
        assert!(view.spec().namespaces.is_empty());
        for i in 0..=MAX_NAMESPACES {
            view.note(&format!("v{i}"), reads(&format!("ns-{i}"), None));
        }
        assert_eq!(view.spec(), SharedResourceNodeSpec { every_namespace: true, ..Default::default() });
    }

    #[test]
    fn the_spec_lists_what_live_volumes_read_and_what_their_projections_show() {
        let view = NodeView::default();
        let app = NoticedObject::Projection("team-a".into(), "app".into());
        view.note("v1", reads("team-a", Some(share("db"))));
        view.note("v2", reads("team-a", Some(app.clone())));
        view.shows("team-a", "app", [share("ca"), share("db")].into());
        view.shows("team-b", "unread", [share("other")].into());
        assert_eq!(view.spec().objects, ["SharedProjection/team-a/app", "SharedSecret/ca", "SharedSecret/db"]);
        view.released("v1");
        assert_eq!(view.spec().objects, ["SharedProjection/team-a/app", "SharedSecret/ca", "SharedSecret/db"]);
        view.released("v2");
        assert!(view.spec().objects.is_empty());
        assert!(view.shown.locked().is_empty(), "what no volume reads is forgotten");
        for i in 0..=MAX_OBJECTS {
            view.note(&format!("v{i}"), reads("team-a", Some(share(&format!("s-{i}")))));
        }
        let spec = view.spec();
        assert!(spec.every_object && spec.objects.is_empty() && spec.namespaces == ["team-a"]);
    }

    #[test]
    fn an_answered_namespace_is_taken_from_the_controller_only_when_every_known_question_is_listed() {
        let question = |account: &str| AccessQuestion::parse(&format!("team-a/{account}/sharedsecrets/db")).unwrap();
        let (web, api) = (question("web"), question("api"));
        let answered = |noticed: i64, answers: &[(&AccessQuestion, bool)]| NodeNotices {
            namespaces: vec![NamespaceGrantChanges { namespace: "team-a".into(), noticed, answered: true }],
            answers: answers
                .iter()
                .map(|(q, allowed)| sharedresource_api::node_view::CentralAnswer {
                    question: q.key(),
                    allowed: *allowed,
                })
                .collect(),
            ..NodeNotices::default()
        };
        let before = answered(1, &[(&web, true)]);
        let now = answered(2, &[(&web, false)]);
        let listed = [web.key()];
        let known = [web.clone()];
        let said = told(Some(&before), &now, Asking { listed: &listed, known: &known, doubted: &[] });
        assert_eq!(said.answers, [(web.clone(), false)]);
        assert_eq!(said.answered, [Accounts::OfNamespace("team-a".into())]);
        assert!(said.namespaces.is_empty(), "nothing to ask: {said:?}");

        // A question the node asks that its spec does not list yet: the node looks itself.
        let known = [web.clone(), api.clone()];
        let said = told(Some(&before), &now, Asking { listed: &listed, known: &known, doubted: &[] });
        assert_eq!(said.namespaces, ["team-a"]);
        assert!(said.answers.is_empty() && said.answered.is_empty());

        // Not answered (a review failed): the node looks itself.
        let mut unanswered = now.clone();
        unanswered.namespaces[0].answered = false;
        let known = [web.clone()];
        assert_eq!(
            told(Some(&before), &unanswered, Asking { listed: &listed, known: &known, doubted: &[] }).namespaces,
            ["team-a"]
        );

        // An answer flipped without a moved namespace (asked again while RBAC lagged): taken.
        let flipped = answered(1, &[(&web, false)]);
        let said = told(Some(&before), &flipped, Asking { listed: &listed, known: &known, doubted: &[] });
        assert_eq!(said.answers, [(web.clone(), false)]);
        assert_eq!(said.flipped, [Accounts::One("team-a".into(), "web".into())]);
        assert!(said.answered.is_empty() && said.namespaces.is_empty());
        // ... but not for a question no live volume asks.
        assert_eq!(told(Some(&before), &flipped, NO_QUESTIONS), Told::default());

        // A denial taken from the broadcast is doubted: an allow is not taken over it (it may be
        // older than the line), the node asks itself; a denial is taken.
        let doubted = [web.clone()];
        let regranted = answered(3, &[(&web, true)]);
        let said = told(Some(&now), &regranted, Asking { listed: &listed, known: &known, doubted: &doubted });
        assert!(said.answers.is_empty(), "{said:?}");
        assert_eq!(said.ask_again, std::slice::from_ref(&web));
        let said = told(Some(&before), &now, Asking { listed: &listed, known: &known, doubted: &doubted });
        assert_eq!(said.answers, [(web.clone(), false)]);
        assert!(said.ask_again.is_empty());
    }

    #[tokio::test]
    async fn told_answers_are_held_and_their_accounts_refreshed() {
        let question = AccessQuestion::parse("team-a/web/sharedsecrets/db").unwrap();
        let (wake, cache) = (Changes::default(), ShareCache::default());
        let answers = HeldAnswers::new(Duration::from_secs(600));
        answers.hold(&question, true, answers.asking());
        let namespace = vec![Accounts::OfNamespace("team-a".into())];
        let said = Told { answers: vec![(question.clone(), false)], answered: namespace, ..Told::default() };
        tell(said, &wake, (&cache, &answers));
        assert_eq!(answers.answer(&question), Some(false));
        let pending = wake.take();
        let attributes = std::collections::BTreeMap::from([("sharedSecret".to_string(), "db".to_string())]);
        assert!(pending.touches(&attributes, "team-a", "web"));
        assert!(!pending.touches(&attributes, "team-b", "web"));
    }

    #[test]
    fn the_spec_lists_the_questions_of_live_volumes() {
        let view = NodeView::default();
        view.note("v1", reads("team-a", Some(share("db"))));
        let question = |account: &str| AccessQuestion::parse(&format!("team-a/{account}/sharedsecrets/db")).unwrap();
        view.asked(&question("reader"));
        assert!(view.behind_since().is_some());
        assert_eq!(view.spec().questions, ["team-a/reader/sharedsecrets/db"]);
        view.released("v1");
        assert!(view.spec().questions.is_empty(), "no live volume of its account");
        for i in 0..=MAX_QUESTIONS {
            let account = format!("sa{i:04}");
            view.note(&format!("v{i}"), VolumeReads { service_account: account.clone(), ..reads("team-a", None) });
            view.asked(&question(&account));
        }
        let listed = view.spec().questions;
        assert_eq!(listed.len(), MAX_QUESTIONS, "the first, sorted");
        assert_eq!(listed[0], "team-a/sa0000/sharedsecrets/db");
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_whose_volumes_arrive_one_by_one_writes_its_spec_every_spacing_not_per_volume() {
        use bytes::Bytes;
        use http_body_util::Full;
        use hyper::{Method, Request, Response, StatusCode};
        // An apiserver that takes every write of the node's object and knows nothing else (so the
        // object has no owner): when each write came.
        let writes: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
        let service = tower::service_fn({
            let writes = writes.clone();
            move |request: Request<kube::client::Body>| {
                let write = request.method() == Method::PATCH && request.uri().path().contains("/sharedresourcenodes/");
                let (status, body) = if write {
                    writes.lock().unwrap().push(tokio::time::Instant::now());
                    let node = serde_json::json!({
                        "apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedResourceNode",
                        "metadata": {"name": "node-a"}, "spec": {}
                    });
                    (StatusCode::OK, node)
                } else {
                    let missing = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
                    (StatusCode::NOT_FOUND, missing)
                };
                let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
                *response.status_mut() = status;
                async move { Ok::<_, std::convert::Infallible>(response) }
            }
        });
        let client = kube::Client::new(service, "default");
        let view = Arc::new(NodeView::default());
        let writer = tokio::spawn({
            let view = view.clone();
            async move { write_spec(client, "node-a", &view, &Notify::new(), Duration::from_secs(10)).await }
        });
        // 20 volumes, one every half second, as a busy apiserver lets their publishes through.
        let started = tokio::time::Instant::now();
        for volume in 0..20 {
            view.note(&format!("v{volume}"), reads("team-a", Some(share(&format!("s{volume}")))));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(SPACING * 2).await;
        let writes = writes.lock().unwrap().clone();
        writer.abort();
        assert_eq!(view.behind_since(), None, "the last write says every volume");
        assert!(writes.len() >= 2, "the positive control: the spec was written as the volumes came: {writes:?}");
        for pair in writes.windows(2) {
            assert!(pair[1] - pair[0] >= SPACING, "two writes {:?} apart", pair[1] - pair[0]);
        }
        // The first at once, then at most one per SPACING over the 10 s the volumes took and
        // the spacing after: 4, where a write per gathered second made 10.
        let span = writes.last().unwrap().duration_since(started);
        assert!(writes.len() <= 4, "{} writes over {span:?}", writes.len());
    }
}
