//! The pods placed on a node before its driver was registered with kubelet (they tolerate the
//! startup taint, or were bound by name), told once it is: kubelet answered their mounts with
//! "driver name ... not found in the list of registered CSI drivers" and retries them on its own
//! backoff (up to about two minutes), which reads as a broken driver unless something says
//! otherwise. A node's driver, with the startup taint's opt-in, writes when it was registered
//! into its `SharedResourceNode` (`driverRegistered`); this controller, which alone may list
//! pods (`startup-taint.yaml`), then gives each Pending pod of that node with a volume of the
//! driver a Normal Event `DriverRegistered` saying that its mounts succeed at kubelet's next
//! retry, at most a namespace's burst of Events per namespace, and records the value it told
//! (`registrationTold`), so a restart of the controller tells nobody twice. No node's identity
//! can list pods: RBAC cannot narrow a list to one node's pods.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use sharedresource_api::node_view::SharedResourceNode;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::DRIVER_NAME;
use crate::apiserver::request::ask;
use crate::quote::Logged;
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::refresh::pod_event_sink::ApiserverPodEvents;
use crate::volume::refresh::pod_events::{NAMESPACE_EVENT_BURST, PodEvent, PodEvents, PodRef};

/// The most pods told: a node runs at most a few hundred (kubelet's `maxPods`, 110 unless
/// raised).
pub const MAX_TOLD: u32 = 500;
/// How long after telling a node's pods they are told again for a new registration of its
/// driver: a driver restarted twice within it had its waiting pods told once already.
pub const RETELL_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The registration of `node` whose waiting pods are still to be told, if any: its spec's
/// `driverRegistered` when the status has not recorded it told.
pub fn registration_to_tell(node: &SharedResourceNode) -> Option<i64> {
    let registered = node.spec.driver_registered?;
    let told = node.status.as_ref().and_then(|status| status.registration_told);
    (told != Some(registered)).then_some(registered)
}

/// The nodes whose object asks for its waiting pods to be told, gathered between looks (a set:
/// however often a node writes, it is one entry).
#[derive(Debug, Default)]
pub struct Registrations {
    asking: Mutex<HashSet<String>>,
    arrived: Notify,
}

impl Registrations {
    /// Node `node`'s object changed: looked at when it asks.
    pub fn changed(&self, node: &SharedResourceNode) {
        if registration_to_tell(node).is_some() {
            self.asking.locked().insert(node.name_any());
            self.arrived.notify_one();
        }
    }
}

/// Tells the waiting pods of each node that asks (its object in `nodes`), through `client`
/// (each request given up after `timeout`), and records it told; runs until dropped. A node
/// whose pods could not be listed is recorded told too: the Events are a courtesy, kubelet
/// retries the mounts all the same.
pub async fn tell_asking_nodes(
    client: kube::Client,
    nodes: Store<SharedResourceNode>,
    registrations: Arc<Registrations>,
    timeout: Duration,
) {
    let api = Api::<SharedResourceNode>::all(client.clone());
    // What this process told, by node, and when: the store may still show a node's object from
    // before the status that records it; and a node's object is its driver's to write, so a
    // compromised node could ask again and again: its pods are listed at most once a
    // [`RETELL_AFTER`] (a registration asked sooner is recorded told without a list).
    let mut told: HashMap<String, (i64, tokio::time::Instant)> = HashMap::new();
    loop {
        registrations.arrived.notified().await;
        let asking = std::mem::take(&mut *registrations.asking.locked());
        told.retain(|name, _| nodes.get(&ObjectRef::new(name)).is_some());
        for name in asking {
            let Some(node) = nodes.get(&ObjectRef::new(&name)) else { continue };
            let Some(registered) = registration_to_tell(&node) else { continue };
            let last = told.get(&name).copied();
            if last.is_some_and(|(value, _)| value == registered) {
                continue;
            }
            if last.is_none_or(|(_, at)| at.elapsed() >= RETELL_AFTER) {
                let events = Arc::new(ApiserverPodEvents::new(
                    client.clone(),
                    tokio::runtime::Handle::current(),
                    &name,
                    timeout,
                ));
                tell(client.clone(), &name, timeout, events).await;
            }
            let patch = Patch::Merge(serde_json::json!({"status": {"registrationTold": registered}}));
            let what = || format!("recording node {name}'s waiting pods told");
            match ask(timeout, what, api.patch_status(&name, &PatchParams::default(), &patch)).await {
                Ok(_) => {
                    let at = last
                        .filter(|(_, at)| at.elapsed() < RETELL_AFTER)
                        .map_or_else(tokio::time::Instant::now, |(_, at)| at);
                    told.insert(name, (registered, at));
                }
                // Asked again at the node object's next change.
                Err(error) => warn!(node = %name, error = %Logged(&error.0), "could not record the waiting pods told"),
            }
        }
    }
}

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
                node = %crate::quote::quote(node),
                error = %Logged(&failed.0),
                "the pods placed before the driver was registered are not told (startup-taint.yaml grants this controller list pods)"
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
        info!(node = %crate::quote::quote(node), pods = told, "told the pods placed before the driver was registered that it is now");
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
    fn a_node_asks_until_the_registration_it_names_is_recorded_told() {
        use sharedresource_api::node_view::NodeNotices;
        let mut node = SharedResourceNode::new("n1", Default::default());
        assert_eq!(registration_to_tell(&node), None, "no registration: nothing to tell");
        node.spec.driver_registered = Some(5);
        assert_eq!(registration_to_tell(&node), Some(5));
        node.status = Some(NodeNotices { registration_told: Some(4), ..NodeNotices::default() });
        assert_eq!(registration_to_tell(&node), Some(5), "a registration before it was told, not this one");
        node.status = Some(NodeNotices { registration_told: Some(5), ..NodeNotices::default() });
        assert_eq!(registration_to_tell(&node), None);
    }

    #[test]
    fn only_a_node_that_asks_is_gathered_and_once_however_often_it_changes() {
        let registrations = Registrations::default();
        let mut node = SharedResourceNode::new("n1", Default::default());
        registrations.changed(&node);
        assert!(registrations.asking.locked().is_empty(), "a node that does not ask");
        node.spec.driver_registered = Some(5);
        registrations.changed(&node);
        registrations.changed(&node);
        assert_eq!(*registrations.asking.locked(), HashSet::from(["n1".to_string()]));
    }

    #[test]
    fn a_pod_without_a_volume_of_the_driver_is_not_told() {
        assert_eq!(event_for(&pod(json!([{"name": "other", "csi": {"driver": "ebs.csi.aws.com"}}])), "n1"), None);
        assert_eq!(event_for(&pod(json!([])), "n1"), None);
    }
}
