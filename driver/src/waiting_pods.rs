//! The pods placed on this node before the driver was registered with kubelet (they tolerate
//! the startup taint, or were bound by name), told once it is: kubelet answered their mounts
//! with "driver name ... not found in the list of registered CSI drivers" and retries them on
//! its own backoff (up to about two minutes), which reads as a broken driver unless something
//! says otherwise. Once the CSINode lists the driver, each Pending pod of this node with a
//! volume of the driver gets a Normal Event `DriverRegistered` saying that its mounts succeed at
//! kubelet's next retry; at most a namespace's burst of Events per namespace. Part of the
//! startup taint's opt-in (`startup-taint.yaml` grants the
//! `list pods` it needs); a driver not granted it says so once in its log and tells nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tracing::info;

use crate::DRIVER_NAME;
use crate::apiserver_request::ask;
use crate::quote::Logged;
use crate::volume::pod_events::{NAMESPACE_EVENT_BURST, PodEvent, PodEvents, PodRef};

/// The most pods told: a node runs at most a few hundred (kubelet's `maxPods`, 110 unless
/// raised).
pub const MAX_TOLD: u32 = 500;

/// The Event for `pod`, waiting on node `node`, if it has a volume of this driver.
pub fn event_for(pod: &Pod, node: &str) -> Option<PodEvent> {
    let spec = pod.spec.as_ref()?;
    let volumes: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|volume| volume.csi.as_ref().is_some_and(|csi| csi.driver == DRIVER_NAME))
        .map(|volume| volume.name.as_str())
        .collect();
    if volumes.is_empty() {
        return None;
    }
    let names = volumes.iter().map(|name| format!("{name:?}")).collect::<Vec<_>>().join(", ");
    let note = format!(
        "{DRIVER_NAME} is now registered with kubelet on node {node}: the pod's volumes of it ({names}) are mounted at \
         kubelet's next retry; a FailedMount saying the driver was \"not found in the list of registered CSI \
         drivers\" came before it was"
    );
    let metadata = &pod.metadata;
    Some(PodEvent {
        pod: PodRef {
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
            uid: metadata.uid.clone().unwrap_or_default(),
        },
        warning: false,
        reason: "DriverRegistered",
        note: crate::quote::bounded(note, 1000),
    })
}

/// Tells each Pending pod of node `node` with a volume of this driver that the driver is
/// registered (at most [`MAX_TOLD`]); the list given up after `timeout`, not retried (kubelet
/// retries the mounts all the same).
pub async fn tell(client: kube::Client, node: &str, timeout: Duration, events: Arc<dyn PodEvents>) {
    let pods = Api::<Pod>::all(client);
    let params = ListParams::default().fields(&format!("spec.nodeName={node},status.phase=Pending")).limit(MAX_TOLD);
    let what = || format!("listing the Pending pods of node {}", crate::quote::quote(node));
    let listed = match ask(timeout, what, pods.list(&params)).await {
        Ok(listed) => listed,
        Err(failed) => {
            info!(
                error = %Logged(&failed.0),
                "the pods placed before the driver was registered are not told (startup-taint.yaml grants list pods)"
            );
            return;
        }
    };
    let mut told = 0;
    for event in within_namespace_bursts(listed.items.iter().filter_map(|pod| event_for(pod, node))) {
        events.tell(event);
        told += 1;
    }
    if told > 0 {
        info!(pods = told, "told the pods placed before the driver was registered that it is now");
    }
}

/// `events`, at most a namespace's burst of Events ([`NAMESPACE_EVENT_BURST`], the refresher's)
/// for each namespace: one namespace's many waiting pods cost the apiserver no more than that.
pub fn within_namespace_bursts(events: impl Iterator<Item = PodEvent>) -> Vec<PodEvent> {
    let mut per_namespace: HashMap<String, u32> = HashMap::new();
    events
        .filter(|event| {
            let count = per_namespace.entry(event.pod.namespace.clone()).or_default();
            *count += 1;
            *count <= NAMESPACE_EVENT_BURST
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "early", "namespace": "team-a", "uid": "u-1"},
            "spec": {"nodeName": "n1", "containers": [], "volumes": volumes}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_with_a_volume_of_the_driver_is_told_naming_its_volumes() {
        let volumes = json!([
            {"name": "db", "csi": {"driver": DRIVER_NAME}},
            {"name": "other", "csi": {"driver": "ebs.csi.aws.com"}},
            {"name": "cache", "emptyDir": {}},
            {"name": "ca", "csi": {"driver": DRIVER_NAME}}
        ]);
        let event = event_for(&pod(volumes), "n1").unwrap();
        assert_eq!(event.pod, PodRef { namespace: "team-a".into(), name: "early".into(), uid: "u-1".into() });
        assert_eq!((event.warning, event.reason), (false, "DriverRegistered"));
        assert_eq!(
            event.note,
            "sharedresource.csi.inlineguard.dev is now registered with kubelet on node n1: the pod's volumes of it \
             (\"db\", \"ca\") are mounted at kubelet's next retry; a FailedMount saying the driver was \"not found in \
             the list of registered CSI drivers\" came before it was"
        );
    }

    #[test]
    fn one_namespace_is_told_at_most_its_burst_and_another_still_is() {
        let event = |namespace: &str, name: String| PodEvent {
            pod: PodRef { namespace: namespace.into(), name, uid: "u".into() },
            warning: false,
            reason: "DriverRegistered",
            note: String::new(),
        };
        let many = (0..100).map(|i| event("flood", format!("p{i}")));
        let told = within_namespace_bursts(many.chain([event("calm", "c".into())]));
        let flood = told.iter().filter(|e| e.pod.namespace == "flood").count();
        assert_eq!(flood, NAMESPACE_EVENT_BURST as usize);
        assert!(told.iter().any(|e| e.pod.namespace == "calm"), "another namespace's pod is told");
    }

    #[test]
    fn a_pod_without_a_volume_of_the_driver_is_not_told() {
        assert_eq!(event_for(&pod(json!([{"name": "other", "csi": {"driver": "ebs.csi.aws.com"}}])), "n1"), None);
        assert_eq!(event_for(&pod(json!([])), "n1"), None);
    }
}
