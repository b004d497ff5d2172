//! Events on pods, created in the apiserver (`events.k8s.io/v1`) as the driver's
//! ServiceAccount, which the shipped RBAC lets `create` events and nothing more about them. Each
//! is created in the background on the runtime, timed like every request (`apiserver_request`),
//! and a failure only logged: an Event is a courtesy, never a reason to hold a volume.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use serde_json::json;

use crate::DRIVER_NAME;
use crate::apiserver_request::ask;
use crate::volume::pod_events::{PodEvent, PodEvents};

/// Creates Events through `client`, reported as this node's driver.
pub struct ApiserverPodEvents {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
    instance: String,
    timeout: Duration,
}

impl ApiserverPodEvents {
    /// Events reported by the driver of node `node`, each request given up after `timeout`.
    pub fn new(client: kube::Client, runtime: tokio::runtime::Handle, node: &str, timeout: Duration) -> Self {
        // reportingInstance holds at most 128 characters; node names may be longer.
        let instance: String = format!("{DRIVER_NAME}-{node}").chars().take(128).collect();
        ApiserverPodEvents { client, runtime, instance, timeout }
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
        let events = kube::Api::<Event>::namespaced(self.client.clone(), &event.pod.namespace);
        let timeout = self.timeout;
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
    use crate::volume::pod_events::PodRef;

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
