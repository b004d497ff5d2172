//! What the lister cache keeps of each watched object: its name and the labels decisions read,
//! with identical label sets shared (most namespaces carry one of a handful of Pod Security
//! combinations). Applies watch events with the reflector's semantics: a re-list replaces the
//! whole state at once when it completes, and the store is ready after the first one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use inline_guard_policy::Labels;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use crate::metrics::CacheKind;

/// Labels by object name, for one kind.
pub struct LabelStore {
    kind: CacheKind,
    state: RwLock<State>,
    ready: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    current: HashMap<Box<str>, Arc<Labels>>,
    // Objects of a re-list in progress; swapped in whole when it completes.
    relisting: Option<HashMap<Box<str>, Arc<Labels>>>,
    shared: HashSet<Arc<Labels>>,
}

impl State {
    fn share(&mut self, labels: Labels) -> Arc<Labels> {
        if let Some(existing) = self.shared.get(&labels) {
            return existing.clone();
        }
        let labels = Arc::new(labels);
        self.shared.insert(labels.clone());
        labels
    }
}

impl LabelStore {
    /// An empty, not yet ready store for `kind`.
    pub fn new(kind: CacheKind) -> LabelStore {
        LabelStore { kind, state: RwLock::new(State::default()), ready: watch::channel(false).0 }
    }

    /// Applies one watch event.
    pub fn apply<K>(&self, event: Event<PartialObjectMeta<K>>) {
        let mut state = self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        match event {
            Event::Init => state.relisting = Some(HashMap::new()),
            Event::InitApply(object) => {
                if let Some((name, labels)) = self.entry(object) {
                    let labels = state.share(labels);
                    state.relisting.get_or_insert_with(HashMap::new).insert(name, labels);
                }
            }
            Event::InitDone => {
                let listed = state.relisting.take().unwrap_or_default();
                state.current = listed;
                // Forget label sets no object uses any more.
                let in_use: HashSet<Arc<Labels>> = state.current.values().cloned().collect();
                state.shared = in_use;
                self.ready.send_replace(true);
            }
            Event::Apply(object) => {
                if let Some((name, labels)) = self.entry(object) {
                    let labels = state.share(labels);
                    state.current.insert(name, labels);
                }
            }
            Event::Delete(object) => {
                if let Some(name) = object.metadata.name {
                    state.current.remove(name.as_str());
                }
            }
        }
    }

    fn entry<K>(&self, object: PartialObjectMeta<K>) -> Option<(Box<str>, Labels)> {
        let name = object.metadata.name?;
        let labels = object
            .metadata
            .labels
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, _)| self.kind.reads_label(key))
            .collect();
        Some((name.into_boxed_str(), labels))
    }

    /// The labels of `name`, if the store holds it.
    pub fn get(&self, name: &str) -> Option<Arc<Labels>> {
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner()).current.get(name).cloned()
    }

    /// The kind of object stored.
    pub fn kind(&self) -> CacheKind {
        self.kind
    }

    /// How many objects the store holds.
    pub fn len(&self) -> usize {
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner()).current.len()
    }

    /// True when the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the first list has completed.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first list has completed.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as the store, so this only returns once ready.
        let _ = ready.wait_for(|ready| *ready).await;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::ObjectMeta;

    use super::*;

    fn namespace(name: &str, pairs: &[(&str, &str)]) -> PartialObjectMeta<Namespace> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                annotations: Some([("huge".to_string(), "x".repeat(1000))].into()),
                ..Default::default()
            },
            _phantom: Default::default(),
        }
    }

    #[test]
    fn a_relist_replaces_the_state_only_when_complete() {
        let store = LabelStore::new(CacheKind::Namespace);
        assert!(!store.is_ready());
        store.apply(Event::<PartialObjectMeta<Namespace>>::Init);
        store.apply(Event::InitApply(namespace("a", &[])));
        assert!(store.get("a").is_none(), "not visible before the list completes");
        store.apply(Event::<PartialObjectMeta<Namespace>>::InitDone);
        assert!(store.is_ready());
        assert!(store.get("a").is_some());

        store.apply(Event::<PartialObjectMeta<Namespace>>::Init);
        store.apply(Event::InitApply(namespace("b", &[])));
        assert!(store.get("a").is_some(), "the previous state serves during a re-list");
        store.apply(Event::<PartialObjectMeta<Namespace>>::InitDone);
        assert!(store.get("a").is_none(), "gone after the re-list");
        assert!(store.get("b").is_some());
    }

    #[test]
    fn only_the_labels_decisions_read_are_kept_and_identical_sets_are_shared() {
        let store = LabelStore::new(CacheKind::Namespace);
        store.apply(Event::<PartialObjectMeta<Namespace>>::Init);
        for name in ["a", "b"] {
            store.apply(Event::InitApply(namespace(
                name,
                &[
                    ("pod-security.kubernetes.io/enforce", "baseline"),
                    ("team", name),
                    ("kubernetes.io/metadata.name", name),
                ],
            )));
        }
        store.apply(Event::<PartialObjectMeta<Namespace>>::InitDone);
        let a = store.get("a").unwrap();
        assert_eq!(*a, [("pod-security.kubernetes.io/enforce".to_string(), "baseline".to_string())].into());
        assert!(Arc::ptr_eq(&a, &store.get("b").unwrap()));
    }

    #[test]
    fn applies_and_deletes_take_effect_at_once() {
        let store = LabelStore::new(CacheKind::Namespace);
        store.apply(Event::<PartialObjectMeta<Namespace>>::Init);
        store.apply(Event::<PartialObjectMeta<Namespace>>::InitDone);
        store.apply(Event::Apply(namespace("a", &[("pod-security.kubernetes.io/warn", "restricted")])));
        assert_eq!(store.get("a").unwrap().len(), 1);
        store.apply(Event::Delete(namespace("a", &[])));
        assert!(store.get("a").is_none());
        assert!(store.is_empty());
    }
}
