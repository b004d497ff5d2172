//! The shares and projections the access notices follow, by their metadata alone, so that no
//! node need watch either kind cluster-wide. A share's change concerns the nodes that read it
//! when its `generation` moved (its spec: the object it names), or it was created or deleted: its
//! status, which every node serving it writes, moves no notice (else each node's write would be
//! told to every other node). Shares are made by the cluster's operators, so their generations
//! are kept, one number per share. A projection (made by tenants, in their namespaces) is kept
//! nowhere: every event of it concerns the nodes that read it (it has no status, so its events
//! are its edits). A relist of either may have missed changes: it concerns every object.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt as _;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt as _};

use super::gathering::{Gathered, ListedWatches, follow_each_change, listed_again, watch_failed};
use super::notices::Concerns;
use crate::content::cluster::share_types::Share;
use sharedresource_api::node_view::NoticedObject;
use sharedresource_api::projection::spec::SharedProjection;
use sharedresource_api::shares::{SharedConfigMap, SharedSecret};

/// The watches here whose first list the lease waits for.
pub const WATCHES: usize = 3;
/// Objects listed per page (metadata only).
const PAGE: u32 = 100;

/// Starts the watches of both kinds of share and of projections.
pub(super) fn follow(client: Client, gathered: Arc<Gathered>, listed: Arc<ListedWatches>) {
    tokio::spawn(follow_shares::<SharedSecret>(Api::all(client.clone()), gathered.clone(), listed.clone()));
    tokio::spawn(follow_shares::<SharedConfigMap>(Api::all(client.clone()), gathered.clone(), listed.clone()));
    tokio::spawn(follow_projections(Api::all(client), gathered, listed));
}

/// The generations of the shares of one kind, by name: what tells an edit of a share's spec from
/// a write of its status.
#[derive(Debug, Default)]
pub struct ShareGenerations(HashMap<String, i64>);

impl ShareGenerations {
    /// Share `name` is now at `generation` (`None`: deleted); whether that is a change its
    /// readers must hear of.
    pub fn changed(&mut self, name: &str, generation: Option<i64>) -> bool {
        match generation {
            Some(generation) => self.0.insert(name.to_string(), generation) != Some(generation),
            None => self.0.remove(name).is_some(),
        }
    }

    /// A relist's generations replace what was known.
    pub fn relisted(&mut self, listed: HashMap<String, i64>) {
        self.0 = listed;
    }
}

/// The shares of kind `S`, metadata only.
async fn follow_shares<S: Share>(api: Api<PartialObjectMeta<S>>, gathered: Arc<Gathered>, listed: Arc<ListedWatches>) {
    let mut known = ShareGenerations::default();
    let mut relisting = HashMap::new();
    let mut first = true;
    let concerns = |name: String| Concerns::Object(NoticedObject::Share(S::KIND, name));
    let mut events = watcher::watcher(api, watcher::Config::default().page_size(PAGE)).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => relisting.clear(),
            Ok(Event::InitApply(share)) => {
                relisting.insert(share.name_any(), share.metadata.generation.unwrap_or_default());
            }
            Ok(Event::InitDone) => {
                known.relisted(std::mem::take(&mut relisting));
                listed_again(&gathered, &listed, &mut first, Concerns::EveryObject);
            }
            Ok(Event::Apply(share)) => {
                let name = share.name_any();
                if known.changed(&name, Some(share.metadata.generation.unwrap_or_default())) {
                    gathered.add(concerns(name));
                }
            }
            Ok(Event::Delete(share)) => {
                let name = share.name_any();
                known.changed(&name, None);
                gathered.add(concerns(name));
            }
            Err(error) => watch_failed(S::KIND.kind(), &error),
        }
    }
}

/// The projections of every namespace, metadata only: each event concerns its readers.
async fn follow_projections(
    api: Api<PartialObjectMeta<SharedProjection>>,
    gathered: Arc<Gathered>,
    listed: Arc<ListedWatches>,
) {
    let of_projection = |projection: PartialObjectMeta<SharedProjection>| {
        let namespace = projection.metadata.namespace.clone().unwrap_or_default();
        Concerns::Object(NoticedObject::Projection(namespace, projection.name_any()))
    };
    follow_each_change(api, (of_projection, Concerns::EveryObject), gathered, listed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_s_readers_hear_of_its_edits_creation_and_deletion_not_of_its_status() {
        let mut known = ShareGenerations::default();
        assert!(known.changed("db", Some(1)), "created");
        assert!(!known.changed("db", Some(1)), "a status write keeps the generation");
        assert!(known.changed("db", Some(2)), "its spec edited");
        assert!(known.changed("db", None), "deleted");
        assert!(!known.changed("db", None), "a deletion seen twice");
        known.relisted([("ca".to_string(), 3)].into());
        assert!(!known.changed("ca", Some(3)));
        assert!(known.changed("db", Some(2)), "not known after the relist");
    }
}
