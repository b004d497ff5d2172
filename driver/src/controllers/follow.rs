//! The one way the controllers keep a kind of object in memory: a reflector fed by a watch,
//! kept current in the background, with what no controller reads stripped from every object.

use std::sync::Arc;

use futures_util::StreamExt as _;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::Notify;
use tracing::warn;

use crate::quote::Logged;

/// A reflector of `api` (as `config` selects) kept current in the background until the runtime
/// ends; every event notifies `changed`.
pub fn follow<K>(api: Api<K>, config: watcher::Config, changed: Arc<Notify>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    // What the controller never reads is not kept: a tenant's large annotations stay out.
    let events = watcher::watcher(api, config).default_backoff().modify(|object: &mut K| {
        let meta = object.meta_mut();
        meta.managed_fields = None;
        meta.annotations = None;
    });
    let events = events.reflect(writer);
    tokio::spawn(events.for_each(move |event| {
        match event {
            Ok(_) => changed.notify_one(),
            Err(error) => {
                warn!(kind = %K::kind(&()), error = %Logged(&error), "watch failed; retrying with backoff")
            }
        }
        std::future::ready(())
    }));
    store
}
