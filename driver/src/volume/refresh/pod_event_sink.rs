//! Events on pods, in the apiserver (`events.k8s.io/v1`) as the driver's ServiceAccount, which
//! the shipped RBAC lets `create` and `patch` events and nothing more about them: a repeat of a
//! pod's Event (the same reason and note) within minutes is counted in the first one's `series`
//! (`volume/refresh/event_series.rs`), patched at most every 30 s, not created again. Each write is made
//! in the background on the runtime, timed like every request (`apiserver::request`), and a
//! failure only logged: an Event is a courtesy, never a reason to hold a volume.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::DRIVER_NAME;
use crate::apiserver::request::ask;
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::refresh::event_series::{EventSeries, Occurrence, SeriesWrite};
use crate::volume::refresh::pod_events::{PodEvent, PodEvents};

/// Creates Events through `client`, reported as this node's driver.
pub struct ApiserverPodEvents {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
    instance: String,
    timeout: Duration,
    series: Arc<Mutex<EventSeries>>,
}

impl ApiserverPodEvents {
    /// Events reported by the driver of node `node`, each request given up after `timeout`.
    /// Starts the flush of the series' counts on `runtime`, which ends with the sink.
    pub fn new(client: kube::Client, runtime: tokio::runtime::Handle, node: &str, timeout: Duration) -> Self {
        // reportingInstance holds at most 128 characters; node names may be longer.
        let instance: String = format!("{DRIVER_NAME}-{node}").chars().take(128).collect();
        let series = Arc::new(Mutex::new(EventSeries::default()));
        runtime.spawn(flush(client.clone(), Arc::downgrade(&series), timeout));
        ApiserverPodEvents { client, runtime, instance, timeout, series }
    }
}

/// How often the counts of series whose last repeats no later repeat carried are looked at:
/// each is written once its last write is half a minute old, within this much more.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// Writes, every [`FLUSH_EVERY`], the counts of the series whose last repeats no later one
/// carried and whose last write is old enough, until the sink is gone.
async fn flush(client: kube::Client, series: Weak<Mutex<EventSeries>>, timeout: Duration) {
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(book) = series.upgrade() else { return };
        let due = book.locked().due(std::time::Instant::now());
        for write in due {
            write_count(client.clone(), book.clone(), write, timeout).await;
        }
    }
}

/// Patches a series' count (nothing for another write); a failure (the Event expired or was
/// deleted) forgets the series, so the next repeat creates a new Event.
async fn write_count(client: kube::Client, book: Arc<Mutex<EventSeries>>, write: SeriesWrite, timeout: Duration) {
    let SeriesWrite::Count { namespace, name, count } = write else { return };
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = Patch::Merge(json!({"series": {"count": count, "lastObservedTime": format!("{now:.6}")}}));
    let events = kube::Api::<Event>::namespaced(client, &namespace);
    let what = || format!("counting a repeat in Event {namespace}/{name}");
    if ask(timeout, what, events.patch(&name, &PatchParams::default(), &patch)).await.is_err() {
        book.locked().forget(&namespace, &name);
    }
}

/// The Event object for `event`, reported by `instance` at `now` (RFC 3339, microseconds), named
/// `<pod>.<unique>` as client-go names Events (`unique`: the time in nanoseconds, in hex).
pub fn event_object(event: &PodEvent, instance: &str, now: &str, unique: u128) -> serde_json::Result<Event> {
    // A name holds at most 253 characters; a pod's name may take them all.
    let name = format!("{}.{unique:x}", crate::quote::cut(&event.pod.name, 220));
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": event.pod.namespace},
        "eventTime": now,
        "reportingController": DRIVER_NAME,
        "reportingInstance": instance,
        // What the driver did: registered with kubelet, or refreshed the pod's volume.
        "action": if event.reason == "DriverRegistered" { "Register" } else { "Refresh" },
        "reason": event.reason,
        "type": if event.warning { "Warning" } else { "Normal" },
        "note": event.note,
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": event.pod.namespace,
            "name": event.pod.name,
            "uid": event.pod.uid,
        },
    }))
}

impl PodEvents for ApiserverPodEvents {
    fn tell(&self, event: PodEvent) {
        // MicroTime: RFC 3339 with six fractional digits.
        let now = k8s_openapi::jiff::Timestamp::now();
        let unique = u128::try_from(now.as_nanosecond()).unwrap_or_default();
        let object = match event_object(&event, &self.instance, &format!("{now:.6}"), unique) {
            Ok(object) => object,
            Err(error) => {
                tracing::error!(%error, "an Event of the driver's own making did not decode");
                return;
            }
        };
        let name = object.metadata.name.clone().unwrap_or_default();
        let occurrence = Occurrence {
            uid: &event.pod.uid,
            namespace: &event.pod.namespace,
            reason: event.reason,
            note: &event.note,
            name: &name,
        };
        let write = self.series.locked().seen(occurrence, std::time::Instant::now());
        let timeout = self.timeout;
        match write {
            SeriesWrite::Create => {}
            SeriesWrite::Later => return,
            count @ SeriesWrite::Count { .. } => {
                self.runtime.spawn(write_count(self.client.clone(), self.series.clone(), count, timeout));
                return;
            }
        }
        let events = kube::Api::<Event>::namespaced(self.client.clone(), &event.pod.namespace);
        self.runtime.spawn(async move {
            let what =
                || format!("creating a {} Event on pod {}/{}", event.reason, event.pod.namespace, event.pod.name);
            // A failure is logged by `ask`; nothing else depends on it.
            let _ = ask(timeout, what, events.create(&Default::default(), &object)).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::refresh::pod_events::PodRef;

    fn event(name: &str, warning: bool) -> PodEvent {
        PodEvent {
            pod: PodRef { namespace: "team-a".into(), name: name.into(), uid: "u-1".into() },
            warning,
            reason: "ContentNotUpdated",
            note: "volume \"db\" (SharedSecret \"db\"): ...".into(),
        }
    }

    #[test]
    fn the_event_is_about_the_pod_reported_by_this_driver_and_named_as_client_go_names_them() {
        let object = event_object(&event("web", true), "instance-1", "2026-11-29T08:00:00.123456Z", 0xabc).unwrap();
        let value = serde_json::to_value(&object).unwrap();
        assert_eq!(value["metadata"], json!({"name": "web.abc", "namespace": "team-a"}));
        assert_eq!(value["type"], "Warning");
        assert_eq!(value["reason"], "ContentNotUpdated");
        assert_eq!(value["action"], "Refresh");
        assert_eq!(value["reportingController"], DRIVER_NAME);
        assert_eq!(value["reportingInstance"], "instance-1");
        assert_eq!(value["eventTime"], "2026-11-29T08:00:00.123456Z");
        assert_eq!(
            value["regarding"],
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "web", "uid": "u-1"})
        );
        let normal = serde_json::to_value(event_object(&event("web", false), "i", "2026-11-29T08:00:00Z", 1).unwrap());
        assert_eq!(normal.unwrap()["type"], "Normal");
    }

    #[test]
    fn a_long_pod_name_still_makes_a_valid_event_name() {
        let long = "p".repeat(253);
        let object = event_object(&event(&long, false), "i", "2026-11-29T08:00:00Z", u128::from(u64::MAX)).unwrap();
        let name = object.metadata.name.unwrap();
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with(".ffffffffffffffff"), "{name}");
    }
}
