//! The cache with its stores fed by hand and an injected live lookup: sync gating, hits, misses
//! remembered for their TTL, one live GET for a storm of misses, and label changes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;

use super::*;

struct CountingLookup {
    calls: AtomicUsize,
    namespaces: BTreeMap<String, Labels>,
    delay: Duration,
}

#[async_trait]
impl LiveLookup for CountingLookup {
    async fn namespace_labels(&self, name: &str) -> Result<Option<Labels>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        Ok(self.namespaces.get(name).cloned())
    }

    async fn csi_driver_labels(&self, _: &str) -> Result<Option<Labels>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err("connection refused".into())
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn namespace(name: &str, pairs: &[(&str, &str)]) -> NamespaceMeta {
    NamespaceMeta {
        types: None,
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels(pairs)), ..Default::default() },
        _phantom: Default::default(),
    }
}

struct Fixture {
    facts: Arc<KubeFacts>,
    namespaces: Arc<LabelStore>,
    csi_drivers: Arc<LabelStore>,
    lookup: Arc<CountingLookup>,
    metrics: Arc<Metrics>,
}

fn fixture(settings: CacheSettings) -> Fixture {
    let namespaces = Arc::new(LabelStore::new(CacheKind::Namespace));
    let csi_drivers = Arc::new(LabelStore::new(CacheKind::CsiDriver));
    let lookup = Arc::new(CountingLookup {
        calls: AtomicUsize::new(0),
        namespaces: [("fresh".to_string(), labels(&[("pod-security.kubernetes.io/enforce", "baseline")]))].into(),
        delay: Duration::from_millis(20),
    });
    let metrics = Arc::new(Metrics::new());
    let facts =
        Arc::new(KubeFacts::new(namespaces.clone(), csi_drivers.clone(), lookup.clone(), settings, metrics.clone()));
    Fixture { facts, namespaces, csi_drivers, lookup, metrics }
}

fn sync(fixture: &Fixture, objects: Vec<NamespaceMeta>) {
    fixture.namespaces.apply(Event::<NamespaceMeta>::Init);
    for object in objects {
        fixture.namespaces.apply(Event::InitApply(object));
    }
    fixture.namespaces.apply(Event::<NamespaceMeta>::InitDone);
    fixture.csi_drivers.apply(Event::<CsiDriverMeta>::Init);
    fixture.csi_drivers.apply(Event::<CsiDriverMeta>::InitDone);
}

fn settings() -> CacheSettings {
    CacheSettings {
        sync_wait: Duration::from_millis(100),
        miss_ttl: Duration::from_millis(300),
        ..CacheSettings::default()
    }
}

#[tokio::test]
async fn before_the_first_sync_a_lookup_waits_its_bound_then_is_unavailable() {
    let fixture = fixture(settings());
    assert_eq!(fixture.facts.ready(), Err("the namespaces and csidrivers caches have not synced".into()));
    let started = Instant::now();
    let error = fixture.facts.namespace_labels("apps").await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(error, FactsError::Unavailable("the namespaces cache has not synced after 100ms".into()));
}

#[tokio::test]
async fn a_lookup_waiting_for_the_first_sync_is_answered_once_it_completes() {
    let fixture = fixture(CacheSettings { sync_wait: Duration::from_secs(5), ..settings() });
    let facts = fixture.facts.clone();
    let waiting = tokio::spawn(async move { facts.namespace_labels("apps").await });
    // The test runtime has one thread: yielding lets the lookup run until it parks. Unfinished
    // then, it is waiting for the sync (it has no other way to park: no live lookup is made).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished(), "the lookup answered before the sync instead of waiting for it");
    sync(&fixture, vec![namespace("apps", &[("pod-security.kubernetes.io/audit", "baseline")])]);
    let labels = waiting.await.unwrap().unwrap().unwrap();
    assert_eq!(labels.get("pod-security.kubernetes.io/audit").map(String::as_str), Some("baseline"));
    assert_eq!(fixture.facts.ready(), Ok(()));
    assert_eq!(fixture.lookup.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn label_changes_from_the_watch_govern_the_next_lookup() {
    let fixture = fixture(settings());
    sync(&fixture, vec![namespace("apps", &[("pod-security.kubernetes.io/enforce", "privileged")])]);
    fixture.namespaces.apply(Event::Apply(namespace("apps", &[("pod-security.kubernetes.io/enforce", "restricted")])));
    let labels = fixture.facts.namespace_labels("apps").await.unwrap().unwrap();
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("restricted"));
    fixture.namespaces.apply(Event::Delete(namespace("apps", &[])));
    assert_eq!(fixture.facts.namespace_labels("apps").await.unwrap(), None, "deleted, and not found live either");
}

#[tokio::test]
async fn a_miss_is_looked_up_live_once_and_remembered_for_its_ttl() {
    let fixture = fixture(settings());
    sync(&fixture, vec![]);
    let found = fixture.facts.namespace_labels("fresh").await.unwrap().unwrap();
    assert_eq!(found.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("baseline"));
    assert_eq!(fixture.facts.namespace_labels("missing").await.unwrap(), None);
    assert_eq!(fixture.facts.namespace_labels("fresh").await.unwrap(), Some(found));
    assert_eq!(fixture.facts.namespace_labels("missing").await.unwrap(), None, "absence is remembered too");
    assert_eq!(fixture.lookup.calls.load(Ordering::SeqCst), 2);
    assert!(fixture.metrics.encode().contains("csi_volume_admission_live_lookups_total 2"));

    tokio::time::sleep(Duration::from_millis(1100)).await;
    fixture.facts.namespace_labels("fresh").await.unwrap();
    assert_eq!(fixture.lookup.calls.load(Ordering::SeqCst), 3, "looked up again after the TTL");
}

#[tokio::test]
async fn a_storm_of_misses_costs_one_live_lookup() {
    let fixture = fixture(settings());
    sync(&fixture, vec![]);
    let lookups: Vec<_> = (0..100)
        .map(|_| {
            let facts = fixture.facts.clone();
            tokio::spawn(async move { facts.namespace_labels("fresh").await })
        })
        .collect();
    for lookup in lookups {
        assert!(lookup.await.unwrap().unwrap().is_some());
    }
    assert_eq!(fixture.lookup.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failing_live_lookup_is_unavailable_not_absent() {
    let fixture = fixture(settings());
    sync(&fixture, vec![]);
    assert_eq!(
        fixture.facts.csi_driver_labels("csi.example.com").await,
        Err(FactsError::Unavailable("live lookup of csidriver csi.example.com: connection refused".into()))
    );
}
