//! The content layer's one way to the cluster: [`Cluster`], the handle every cluster-backed
//! source reads through. It holds the apiserver client and the runtime its calls run on, the
//! request timeout ([`Cluster::ask`]), what it keeps (the shares read and their backing objects'
//! latest copies in [`cache`]), the watches of backing objects (which objects were served, in
//! [`watch`]), this node's own object through which grant, share and projection changes arrive
//! ([`node_view`], owned by the Node: [`node_owner`]) and the lease that says they do
//! ([`notice_lease`]), the access answers held until a grant's change may concern them
//! ([`held_answers`], asked in [`access`]), the refresh passes and what
//! each saw ([`pass`], the shares' status written from it in [`share_status`]), and the metrics.
//! The two kinds of share as types for code generic over them are in [`share_types`].
//!
//! The sources (shares, projection, external) import this floor and the content face, never
//! each other's insides (a projection reads shares through the shares' source).

pub mod access;
pub mod broadcast_denials;
pub mod cache;
pub mod held_answers;
pub mod node_owner;
pub mod node_view;
pub mod notice_lease;
pub mod pass;
pub mod share_status;
pub mod share_types;
pub mod watch;
pub mod written_entries;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::cache::ShareCache;
use self::held_answers::{DEFAULT_ACCESS_RECHECK, HeldAnswers};
use self::node_view::NodeView;
use self::pass::Pass;
use self::watch::{Served, watch_changes};
use self::written_entries::WrittenEntries;
use crate::apiserver::client::{ApiserverClients, WatchConnections};
use crate::apiserver::request::DEFAULT_REQUEST_TIMEOUT;
use crate::content::PassId;
use crate::content::changes::Changes;
use crate::content::error::Result;
use crate::content::share_entries::ShareEntries;
use crate::metrics::Metrics;
use crate::unpoisoned::UnpoisonedMutex;

/// The cluster as the content layer sees it: one client, one timeout, one set of watches and
/// caches, shared by every source that reads the cluster.
pub struct Cluster {
    client: kube::Client,
    // Publish and refresh run on the blocking pool; the client's calls run on this runtime.
    runtime: tokio::runtime::Handle,
    served: Arc<Served>,
    cache: Arc<ShareCache>,
    answers: Arc<HeldAnswers>,
    changes: Arc<Changes>,
    passes: Mutex<HashMap<PassId, Pass>>,
    metrics: Arc<Metrics>,
    request_timeout: Duration,
    watches: tokio::task::JoinHandle<()>,
    watch_connections: Arc<WatchConnections>,
    /// This node's name, for its entries in the shares' status and its own object; neither
    /// written without it.
    node: Option<String>,
    written_entries: Arc<WrittenEntries>,
    /// The namespaces of the volumes whose access this node checks.
    node_view: Arc<NodeView>,
    /// The node's own object and the notices' lease followed, once it has a name.
    node_watches: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.watches.abort();
        if let Some(watches) = &self.node_watches {
            watches.abort();
        }
    }
}

/// How a node hears of grant changes.
#[derive(Debug, Clone)]
pub struct NoticeSettings {
    /// The Lease the access-notices controller renews (`accessLease`).
    pub lease: sharedresource_api::node_view::LeaseRef,
    /// How often every access answer is asked again while it is not renewed
    /// (`accessFallbackSeconds`).
    pub fallback: Duration,
}

/// How often a node that hears no notices asks every access answer again, by default.
pub const DEFAULT_ACCESS_FALLBACK: Duration = Duration::from_secs(30);

impl Default for NoticeSettings {
    fn default() -> NoticeSettings {
        NoticeSettings {
            lease: sharedresource_api::node_view::LeaseRef::parse(sharedresource_api::node_view::DEFAULT_LEASE)
                .expect("the default lease is a valid NAMESPACE/NAME"),
            fallback: DEFAULT_ACCESS_FALLBACK,
        }
    }
}

impl Cluster {
    /// The cluster `clients` talk to (requests on one client, watches on the other), on
    /// `runtime`, counting into `metrics`, whose watches start now. Each request is given up
    /// after 10 s ([`Cluster::with_request_timeout`] changes it).
    pub fn new(
        clients: impl Into<ApiserverClients>,
        runtime: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
    ) -> Cluster {
        let ApiserverClients { requests: client, watches: watch_connections } = clients.into();
        let served = Arc::new(Served::default());
        let cache = Arc::new(ShareCache::default());
        let changes = Arc::new(Changes::default());
        let answers = Arc::new(HeldAnswers::new(DEFAULT_ACCESS_RECHECK));
        changes.on_grant_looks({
            let answers = answers.clone();
            move |look| answers.look(look)
        });
        let watches = runtime.spawn(watch_changes(
            watch_connections.clone(),
            served.clone(),
            cache.clone(),
            changes.clone(),
            metrics.clone(),
        ));
        Cluster {
            client,
            runtime,
            served,
            cache,
            answers,
            changes,
            passes: Mutex::default(),
            metrics,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            watches,
            watch_connections,
            node: None,
            written_entries: Arc::default(),
            node_view: Arc::default(),
            node_watches: None,
        }
    }

    /// The same cluster, giving up each request after `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Cluster {
        self.request_timeout = timeout;
        self
    }

    /// The same cluster, holding an access answer for about `recheck` (±10%) unless a grant's
    /// change concerns it first.
    pub fn with_access_recheck(self, recheck: Duration) -> Cluster {
        self.answers.set_recheck(recheck);
        self
    }

    /// The client requests are made with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The runtime the client's calls run on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Where what changed is noted.
    pub fn changes(&self) -> &Arc<Changes> {
        &self.changes
    }

    /// The backing objects served, by the shares that named them.
    pub fn served(&self) -> &Served {
        &self.served
    }

    /// The watches' latest copies of shares and backing objects.
    pub fn cache(&self) -> &ShareCache {
        &self.cache
    }

    /// `call`'s answer within the request timeout, its failure in the driver's words.
    pub async fn ask<T>(
        &self,
        what: impl FnOnce() -> String,
        call: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
    ) -> Result<T> {
        Ok(crate::apiserver::request::ask(self.request_timeout, what, call).await?)
    }

    /// `use_it` on pass `pass`, when there is one and it has not ended.
    pub fn with_pass<T>(&self, pass: Option<PassId>, use_it: impl FnOnce(&mut Pass) -> T) -> Option<T> {
        let pass = pass?;
        self.passes.locked().get_mut(&pass).map(use_it)
    }

    /// `compute`'s answer for `key`, shared within pass `pass` through the map `field` picks.
    pub async fn shared<K, V, F>(
        &self,
        pass: Option<PassId>,
        key: K,
        field: fn(&mut Pass) -> &mut HashMap<K, V>,
        compute: F,
    ) -> Result<V>
    where
        K: std::hash::Hash + Eq,
        V: Clone,
        F: std::future::Future<Output = Result<V>>,
    {
        if let Some(Some(value)) = self.with_pass(pass, |p| field(p).get(&key).cloned()) {
            return Ok(value);
        }
        let value = compute.await?;
        self.with_pass(pass, |p| field(p).insert(key, value.clone()));
        Ok(value)
    }

    /// Refresh pass `pass` starts: answers may be shared within it from now on.
    pub fn start_pass(&self, pass: PassId) {
        self.passes.locked().insert(pass, Pass::default());
    }

    /// Refresh pass `pass` is over: its shared answers are dropped, and the status of every
    /// share it saw is written where it changed, with this node's entries as `entries` says
    /// (`None`: as wanted before).
    pub fn end_pass(&self, pass: PassId, entries: Option<ShareEntries>) {
        let pass = self.passes.locked().remove(&pass);
        if let Some(pass) = pass {
            if let Some(entries) = entries {
                self.written_entries.want(entries);
            }
            // Spawned, not awaited: a pass may end anywhere (its last volume's task, shutdown),
            // and the statuses are a report, not part of any volume's refresh.
            let statuses =
                share_status::write_statuses(self.client.clone(), self.request_timeout, pass.seen, self.cache.clone());
            self.runtime.spawn(statuses);
            if let Some(node) = &self.node {
                let entries = self.written_entries.clone();
                let write =
                    share_status::write_node_entries(self.client.clone(), self.request_timeout, node.clone(), entries);
                self.runtime.spawn(write);
            }
        }
    }

    /// The same cluster as node `node`: writing its entries in the shares' status, and its own
    /// `SharedResourceNode`, through which it hears of grant changes as `notices` says. Without
    /// a node, grant changes reach volumes only when their answers are due.
    pub fn with_node(mut self, node: String, notices: NoticeSettings) -> Cluster {
        // Two watches of one named object each: this node's own, and the lease.
        match self.watch_connections.lease(2) {
            Ok(lease) => {
                let denials = Arc::new(broadcast_denials::BroadcastDenials::default());
                let view = node_view::follow(
                    (self.client.clone(), lease.client.clone()),
                    node.clone(),
                    (self.node_view.clone(), denials.clone()),
                    (self.changes.clone(), self.cache.clone(), self.answers.clone()),
                    (self.metrics.clone(), self.request_timeout),
                );
                let heard = notice_lease::follow(
                    lease.client.clone(),
                    notices.lease,
                    (self.node_view.clone(), self.changes.clone(), self.cache.clone()),
                    (self.answers.clone(), denials),
                    notices.fallback,
                    self.metrics.clone(),
                );
                self.node_watches = Some(self.runtime.spawn(async move {
                    let _lease = lease;
                    futures_util::future::join(view, heard).await;
                }));
            }
            Err(error) => {
                tracing::warn!(error = %crate::quote::Logged(&error), "no connection for this node's view; grant changes reach volumes only when their answers are due");
            }
        }
        self.node = Some(node);
        self
    }

    /// The namespaces of the volumes whose access this node checks.
    pub fn node_view(&self) -> &NodeView {
        &self.node_view
    }

    /// The node this driver serves, when it has one.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Which shares' volumes on this node could not take an update.
    pub fn written_entries(&self) -> &WrittenEntries {
        &self.written_entries
    }
}
