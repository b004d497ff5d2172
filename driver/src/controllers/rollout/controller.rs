//! The rollout controller, opt-in (`--rollout-on-change` of `sharedresource-read-grants`): it
//! follows the workloads labelled [`RESTART_LABEL`], the shares, and the content version of each
//! object a share names (one watch per object, selected by name: never a namespace's other
//! Secrets), and after any change applies [`decide`] to every workload: a record written, or a
//! restart with the record in one patch conditioned on the resourceVersion the decision was made
//! at (a stale view, or a second replica that acted first, gets a conflict and acts on nothing).
//! A restart is for the shares the workload's pods may `use` (a SubjectAccessReview as their
//! ServiceAccount, as the driver asks at mount): a tenant cannot learn when a share it may not
//! mount changes by labelling a workload that names it. A failed step is retried with backoff
//! (`controllers::pacing`); nothing acts before every watch has listed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource};
use serde_json::json;
use sharedresource_api::ShareKind;
use sharedresource_api::access::{AccessQuestion, Guarded};
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::shares::{ObjectRef, SharedConfigMap, SharedSecret};
use tokio::sync::{Notify, oneshot};
use tracing::{info, warn};

use super::content_version::{self, RecordKey};
use super::plan::{
    Decision, OBSERVED_ANNOTATION, RESTART_LABEL, RESTARTED_AT_ANNOTATION, ShareRef, decide, format_observed,
    unrecorded,
};
use super::record_key::{KeySecret, load_or_make};
use super::workloads::{Skipped, Workload, WorkloadKey, WorkloadKind, Workloads, summarize};
use crate::apiserver::request::{RequestFailed, ask};
use crate::controllers::follow::follow;
use crate::controllers::pacing::PassPacing;
use crate::quote::Logged;
use crate::unpoisoned::UnpoisonedMutex as _;

/// What the controller is given.
#[derive(Debug, Clone)]
pub struct RolloutSettings {
    /// The most workloads followed in one namespace.
    pub workloads_per_namespace: usize,
    /// How long one request may take.
    pub timeout: Duration,
    /// The Secret holding the records' key.
    pub key_secret: KeySecret,
}

/// Labelled workloads listed per page: tenants make them, each up to etcd's object limit (about
/// 1.5 MiB), and a page is held whole while it is read, so two at a time (a page of 500, the
/// watcher's default, of a tenant's thirty 1 MiB workloads took this process from 44 to 102 MiB
/// of its 128 MiB limit; pages of 2, to 55). The many small requests a tenant's many workloads
/// then cost go through the rollout's own rate bucket, not the read grants' (`controllers::program`).
const WORKLOAD_PAGE: u32 = 2;

/// An object a share names: its kind, namespace and name.
type Backing = (ShareKind, String, String);

/// What the watches keep and the passes read.
struct Followed {
    /// What versions are made with, and records read against.
    key: RecordKey,
    workloads: Mutex<Workloads>,
    versions: Mutex<HashMap<Backing, String>>,
    changed: Arc<Notify>,
}

/// A watch of one backing object, stopped when dropped.
struct BackingWatch(tokio::task::JoinHandle<()>);

impl Drop for BackingWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the controller until dropped.
pub async fn run(client: Client, settings: RolloutSettings) {
    // The key first: every version is made with it, and every record read against it.
    let key = load_or_make(&client, &settings.key_secret, settings.timeout).await;
    let followed = Arc::new(Followed {
        key,
        workloads: Mutex::new(Workloads::new(settings.workloads_per_namespace)),
        versions: Mutex::new(HashMap::new()),
        changed: Arc::new(Notify::new()),
    });
    let secrets: Store<SharedSecret> =
        follow(Api::all(client.clone()), watcher::Config::default(), followed.changed.clone());
    let config_maps: Store<SharedConfigMap> =
        follow(Api::all(client.clone()), watcher::Config::default(), followed.changed.clone());
    let listed = [
        follow_workloads::<Deployment>(&client, followed.clone(), settings.workloads_per_namespace),
        follow_workloads::<StatefulSet>(&client, followed.clone(), settings.workloads_per_namespace),
        follow_workloads::<DaemonSet>(&client, followed.clone(), settings.workloads_per_namespace),
    ];
    // Each wait fails only when its watch's task is gone (the runtime stopping), as in read_grants.
    for ready in [secrets.wait_until_ready().await, config_maps.wait_until_ready().await] {
        if ready.is_err() {
            return;
        }
    }
    for kind in listed {
        if kind.await.is_err() {
            return;
        }
    }
    info!("every watch has listed; restarting opted-in workloads when a share they mount changes");
    let mut watches: HashMap<Backing, BackingWatch> = HashMap::new();
    let mut pacing = PassPacing::default();
    loop {
        let shares = shares_now(&secrets, &config_maps);
        keep_backing_watches(&client, &shares, &mut watches, &followed);
        let failed = pass(&client, &shares, &followed, settings.timeout).await;
        pacing.next_pass(&followed.changed, failed).await;
    }
}

/// Every share and the object it names. A share naming something that is no object name (a
/// namespace `a,b`, a name `x,metadata.namespace=y`) names nothing: its text never reaches a
/// field selector.
fn shares_now(secrets: &Store<SharedSecret>, config_maps: &Store<SharedConfigMap>) -> BTreeMap<ShareRef, Backing> {
    let named = |kind: ShareKind, share: Option<String>, object: &ObjectRef| {
        let namespace = NamespaceName::parse(&object.namespace).ok()?;
        let name = ObjectName::parse(&object.name).ok()?;
        Some((ShareRef { kind, name: share? }, (kind, namespace.as_str().to_owned(), name.as_str().to_owned())))
    };
    let secrets = secrets
        .state()
        .into_iter()
        .filter_map(|share| named(ShareKind::Secret, share.metadata.name.clone(), &share.spec.secret_ref));
    let config_maps = config_maps
        .state()
        .into_iter()
        .filter_map(|share| named(ShareKind::ConfigMap, share.metadata.name.clone(), &share.spec.config_map_ref));
    secrets.chain(config_maps).collect()
}

/// Follows the labelled workloads of kind `K` into `followed`; the receiver hears when they are
/// first listed.
fn follow_workloads<K>(client: &Client, followed: Arc<Followed>, per_namespace: usize) -> oneshot::Receiver<()>
where
    K: Workload + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (listed, heard) = oneshot::channel();
    let config = watcher::Config::default().labels(&format!("{RESTART_LABEL}=true")).page_size(WORKLOAD_PAGE);
    let mut events = watcher::watcher(Api::<K>::all(client.clone()), config).default_backoff().boxed();
    tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut relisted: Option<Workloads> = None;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => relisted = Some(Workloads::new(per_namespace)),
                Ok(watcher::Event::InitApply(workload)) => {
                    if let (Some(relisted), Some((key, summary))) =
                        (relisted.as_mut(), summarize(&workload, followed.key.id()))
                    {
                        note_skipped(&key, relisted.put(key.clone(), summary));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(relisted) = relisted.take() {
                        followed.workloads.locked().replace_kind(K::KIND, relisted);
                    }
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                    followed.changed.notify_one();
                }
                Ok(watcher::Event::Apply(workload)) => {
                    if let Some((key, summary)) = summarize(&workload, followed.key.id()) {
                        let put = followed.workloads.locked().put(key.clone(), summary);
                        note_skipped(&key, put);
                        followed.changed.notify_one();
                    }
                }
                Ok(watcher::Event::Delete(workload)) => {
                    if let Some((key, _)) = summarize(&workload, followed.key.id()) {
                        followed.workloads.locked().remove(&key);
                    }
                }
                Err(error) => warn!(kind = ?K::KIND, error = %Logged(&error), "watch failed; retrying with backoff"),
            }
        }
    });
    heard
}

/// Logs why `key` is not followed, unless already said for its namespace.
fn note_skipped(key: &WorkloadKey, put: Result<(), Skipped>) {
    match put {
        Ok(()) | Err(Skipped::NamespaceStillFull) => {}
        Err(why) => warn!(workload = %key, %why, "not restarted on a share's change"),
    }
}

/// Starts a watch of each object a share names that has none, and stops (forgetting its version)
/// each one no share names any more.
fn keep_backing_watches(
    client: &Client,
    shares: &BTreeMap<ShareRef, Backing>,
    watches: &mut HashMap<Backing, BackingWatch>,
    followed: &Arc<Followed>,
) {
    let wanted: BTreeSet<&Backing> = shares.values().collect();
    watches.retain(|backing, _| {
        let keep = wanted.contains(backing);
        if !keep {
            followed.versions.locked().remove(backing);
        }
        keep
    });
    for backing in wanted {
        if !watches.contains_key(backing) {
            let watch = match backing.0 {
                ShareKind::Secret => {
                    follow_backing(client, backing.clone(), content_version::of_secret, followed.clone())
                }
                ShareKind::ConfigMap => {
                    follow_backing(client, backing.clone(), content_version::of_config_map, followed.clone())
                }
            };
            watches.insert(backing.clone(), watch);
        }
    }
}

/// Watches the one object `backing` names (selected by its name) and keeps its content version:
/// the content itself is dropped as soon as its version is computed.
fn follow_backing<K>(
    client: &Client,
    backing: Backing,
    version_of: fn(&RecordKey, (&str, &str), &K) -> String,
    followed: Arc<Followed>,
) -> BackingWatch
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api = Api::<K>::namespaced(client.clone(), &backing.1);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", backing.2));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    BackingWatch(tokio::spawn(async move {
        let mut seen_in_list = false;
        while let Some(event) = events.next().await {
            let version = match event {
                Ok(watcher::Event::Init) => {
                    seen_in_list = false;
                    continue;
                }
                Ok(watcher::Event::InitApply(object)) => {
                    seen_in_list = true;
                    Some(version_of(&followed.key, (&backing.1, &backing.2), &object))
                }
                Ok(watcher::Event::Apply(object)) => Some(version_of(&followed.key, (&backing.1, &backing.2), &object)),
                Ok(watcher::Event::InitDone) if seen_in_list => continue,
                Ok(watcher::Event::InitDone | watcher::Event::Delete(_)) => None,
                Err(error) => {
                    warn!(kind = %K::kind(&()), namespace = %backing.1, name = %backing.2, error = %Logged(&error),
                        "watch failed; retrying with backoff");
                    continue;
                }
            };
            let mut versions = followed.versions.locked();
            let changed = match version {
                Some(version) => versions.insert(backing.clone(), version.clone()).as_ref() != Some(&version),
                None => versions.remove(&backing).is_some(),
            };
            drop(versions);
            if changed {
                followed.changed.notify_one();
            }
        }
    }))
}

/// One pass over every followed workload; true when a step failed (it is retried).
async fn pass(client: &Client, shares: &BTreeMap<ShareRef, Backing>, followed: &Followed, timeout: Duration) -> bool {
    let current: BTreeMap<ShareRef, String> = {
        let versions = followed.versions.locked();
        shares.iter().filter_map(|(share, backing)| Some((share.clone(), versions.get(backing)?.clone()))).collect()
    };
    let workloads: Vec<_> =
        followed.workloads.locked().all().map(|(key, summary)| (key.clone(), summary.clone())).collect();
    let mut answers = HashMap::new();
    let mut failed = false;
    for (key, summary) in workloads {
        // A version is written only for a share the workload's pods may `use`: the record tells a
        // tenant nothing of a share it may not read, not even that it changed.
        let mut visible: BTreeMap<ShareRef, String> =
            summary.shares.iter().filter_map(|share| Some((share.clone(), current.get(share)?.clone()))).collect();
        let mut unchecked = false;
        for share in unrecorded(&summary.shares, &summary.observed, &current) {
            match may_use(client, &key.namespace, &summary.service_account, &share, &mut answers, timeout).await {
                Ok(true) => {}
                Ok(false) => {
                    visible.remove(&share);
                }
                Err(error) => {
                    warn!(workload = %key, error = %Logged(&error), "not recorded or restarted yet: its access could not be checked");
                    unchecked = true;
                }
            }
        }
        // Neither restarted nor recorded: the next pass asks again.
        if unchecked {
            failed = true;
            continue;
        }
        let decision = decide(&summary.shares, &summary.observed, &visible);
        let (observed, body, restarted) = match decision {
            Decision::Nothing => continue,
            Decision::Record(observed) => {
                let body = json!({"metadata": {
                    "resourceVersion": summary.resource_version,
                    "annotations": {OBSERVED_ANNOTATION: format_observed(followed.key.id(), &observed)},
                }});
                (observed, body, None)
            }
            Decision::Restart { observed, changed } => {
                // RFC 3339 as kubectl writes it, to the nanosecond: two restarts within one second
                // must still differ, or the second would roll nothing.
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let body = json!({
                    "metadata": {
                        "resourceVersion": summary.resource_version,
                        "annotations": {OBSERVED_ANNOTATION: format_observed(followed.key.id(), &observed)},
                    },
                    "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: now}}}},
                });
                (observed, body, Some(changed))
            }
        };
        match patch(client, &key, body, timeout).await {
            Ok(Some(resource_version)) => {
                if let Some(changed) = restarted {
                    let shares: Vec<String> = changed.iter().map(ToString::to_string).collect();
                    info!(workload = %key, shares = %shares.join(","), "restarted: a share its pods mount changed");
                }
                followed.workloads.locked().patched(&key, observed, resource_version);
            }
            // Changed since the decision: the watch brings the new one, and the next pass decides again.
            Ok(None) => {}
            Err(error) => {
                warn!(workload = %key, error = %Logged(&error), "could not be patched; retrying with backoff");
                failed = true;
            }
        }
    }
    failed
}

/// May `account` of `namespace` `use` `share`? Asked once per pass.
async fn may_use(
    client: &Client,
    namespace: &str,
    account: &str,
    share: &ShareRef,
    answers: &mut HashMap<AccessQuestion, bool>,
    timeout: Duration,
) -> Result<bool, RequestFailed> {
    let question = AccessQuestion {
        namespace: namespace.to_owned(),
        service_account: account.to_owned(),
        kind: Guarded::Share(share.kind),
        name: share.name.clone(),
    };
    if let Some(answer) = answers.get(&question) {
        return Ok(*answer);
    }
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let what = || format!("asking whether {namespace}/{account} may use {share}");
    let review = ask(timeout, what, api.create(&PostParams::default(), &question.review())).await?;
    let allowed = review.status.is_some_and(|status| status.allowed);
    answers.insert(question, allowed);
    Ok(allowed)
}

/// Patches the workload `key` with `body` (a merge patch carrying the resourceVersion it was
/// decided at): its new resourceVersion, or `None` when it changed since (409).
async fn patch(
    client: &Client,
    key: &WorkloadKey,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<Option<String>, RequestFailed> {
    match key.kind {
        WorkloadKind::Deployment => patch_kind::<Deployment>(client, key, body, timeout).await,
        WorkloadKind::StatefulSet => patch_kind::<StatefulSet>(client, key, body, timeout).await,
        WorkloadKind::DaemonSet => patch_kind::<DaemonSet>(client, key, body, timeout).await,
    }
}

async fn patch_kind<K>(
    client: &Client,
    key: &WorkloadKey,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<Option<String>, RequestFailed>
where
    K: Workload + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let api = Api::<K>::namespaced(client.clone(), &key.namespace);
    let what = || format!("patching {key}");
    let patched = async {
        match api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Ok(workload) => Ok(Some(workload.meta().resource_version.clone().unwrap_or_default())),
            Err(error) => Err(error),
        }
    };
    ask(timeout, what, patched).await
}

#[cfg(test)]
mod tests;
