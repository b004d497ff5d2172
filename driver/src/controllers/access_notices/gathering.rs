//! What the watches of the access notices share: the notices gathered since the last write
//! and the nodes whose object changed ([`Gathered`]), the count of watches that have listed
//! once ([`ListedWatches`]), and the one way a kind is watched for its changes alone
//! ([`follow_each_change`]). The RBAC watches (`controller`) and those of shares and
//! projections (`objects`) both feed them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;
use tracing::warn;

use super::notices::{Concerns, Notices};
use crate::quote::Logged;
use crate::unpoisoned::UnpoisonedMutex;

/// Objects listed per page: metadata only for Roles and RoleBindings (a tenant's annotations at
/// most), so a page stays a few MiB whatever tenants make.
pub(super) const PAGE: u32 = 20;
/// Notices gathered since the last write, and the nodes whose object changed.
#[derive(Debug, Default)]
pub(super) struct Gathered {
    state: Mutex<(Notices, HashSet<String>)>,
    arrived: Notify,
}

impl Gathered {
    pub(super) fn add(&self, concerns: Concerns) {
        if concerns == Concerns::Nobody {
            return;
        }
        self.state.locked().0.add(concerns);
        self.arrived.notify_one();
    }

    pub(super) fn node_changed(&self, name: String) {
        self.state.locked().1.insert(name);
        self.arrived.notify_one();
    }

    /// Until something arrives (at once when something arrived since the last wait).
    pub(super) async fn arrived(&self) {
        self.arrived.notified().await;
    }

    pub(super) fn take(&self) -> (Notices, HashSet<String>) {
        std::mem::take(&mut *self.state.locked())
    }
}

/// Counts the watches that have listed once.
#[derive(Debug, Default)]
pub(super) struct ListedWatches {
    count: tokio::sync::watch::Sender<usize>,
}

impl ListedWatches {
    pub(super) fn first_listed(&self) {
        self.count.send_modify(|count| *count += 1);
    }

    pub(super) async fn wait_for(&self, watches: usize) {
        let mut count = self.count.subscribe();
        let _ = count.wait_for(|count| *count >= watches).await;
    }
}

/// A watch listed (again): it may have missed changes, which concerns every namespace (an RBAC
/// watch's) or every object (a share or projection watch's: `concerns`); its first list counts
/// toward the lease's start.
pub(super) fn listed_again(gathered: &Gathered, listed: &ListedWatches, first: &mut bool, concerns: Concerns) {
    gathered.add(concerns);
    if std::mem::take(first) {
        listed.first_listed();
    }
}

/// Objects of kind `K`, metadata only, kept nowhere: each change concerns what `concerns` says
/// of it, a relist what `relisted` says.
pub(super) async fn follow_each_change<K>(
    api: Api<PartialObjectMeta<K>>,
    (concerns, relisted): (impl Fn(PartialObjectMeta<K>) -> Concerns, Concerns),
    gathered: Arc<Gathered>,
    listed: Arc<ListedWatches>,
) where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let mut first = true;
    let mut events = watcher::watcher(api, watcher::Config::default().page_size(PAGE)).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::InitDone) => listed_again(&gathered, &listed, &mut first, relisted.clone()),
            Ok(Event::Apply(object) | Event::Delete(object)) => gathered.add(concerns(object)),
            Err(error) => watch_failed(&K::kind(&()), &error),
        }
    }
}

/// Logs a watch's failure; the watch retries with backoff.
pub(super) fn watch_failed(kind: &str, error: &watcher::Error) {
    warn!(kind = %kind, error = %Logged(error), "watch failed; retrying with backoff");
}
