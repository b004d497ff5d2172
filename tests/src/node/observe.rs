//! What a scenario observes on the node: a container's log lines, a pod's volume (its mount under
//! kubelet's pods directory and the driver's record naming it), and a pod's deletion completing
//! (kubelet deletes a pod only once its volumes are unpublished).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

use super::Node;

impl Node {
    /// Waits (up to `within`) until container `container` of pod `namespace/pod` has logged a
    /// line for which `wanted` holds (`what` names it in the error); returns the log.
    pub async fn wait_for_log(
        &self,
        (namespace, pod, container): (&str, &str, &str),
        what: &str,
        wanted: impl Fn(&str) -> bool,
        within: Duration,
    ) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + within;
        loop {
            let log = self.container_log(namespace, pod, container);
            if log.iter().any(|line| wanted(line)) {
                return Ok(log);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{namespace}/{pod} never logged {what} in {within:?}; its log: {log:?}\n{}",
                    self.log_tails()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The mounts under pod `uid`'s directory and the driver records naming the pod.
    pub fn volume_traces(&self, uid: &str) -> Result<(Vec<String>, Vec<PathBuf>), String> {
        let mounts: Vec<String> = self.pod_mounts().into_iter().filter(|m| m.contains(uid)).collect();
        let mut records = Vec::new();
        for record in self.driver_records()? {
            let text = std::fs::read_to_string(&record).map_err(|e| format!("{}: {e}", record.display()))?;
            if text.contains(uid) {
                records.push(record);
            }
        }
        Ok((mounts, records))
    }

    /// The positive control of [`Node::nothing_left`]: while the pod runs, the same filters find
    /// its volume's mount and the driver's record of it.
    pub fn volume_present(&self, uid: &str) -> Result<(), String> {
        let (mounts, records) = self.volume_traces(uid)?;
        if mounts.is_empty() || records.is_empty() {
            return Err(format!("the running pod {uid}'s volume is not seen: mounts {mounts:?}, records {records:?}"));
        }
        self.seen_volumes.lock().unwrap_or_else(|p| p.into_inner()).insert(uid.to_string());
        Ok(())
    }

    /// Nothing of pod `uid`'s volumes is left: no mount under its pod directory, no driver record.
    /// Refused unless [`Node::volume_present`] saw this pod's volume first: a check that never saw
    /// the thing it looks for could not fail.
    pub fn nothing_left(&self, uid: &str) -> Result<(), String> {
        if !self.seen_volumes.lock().unwrap_or_else(|p| p.into_inner()).contains(uid) {
            return Err(format!(
                "nothing_left({uid}) without volume_present({uid}) first: the check never saw what it looks for"
            ));
        }
        let (mounts, records) = self.volume_traces(uid)?;
        if !mounts.is_empty() || !records.is_empty() {
            return Err(format!("left behind for pod {uid}: mounts {mounts:?}, records {records:?}"));
        }
        Ok(())
    }
}

/// Deletes pod `namespace/name` and waits (up to 60 s) until it is gone.
pub async fn delete_and_wait(client: &kube::Client, namespace: &str, name: &str) -> Result<(), String> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    pods.delete(name, &DeleteParams::default()).await.map_err(|e| format!("deleting {namespace}/{name}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pods.get_opt(name).await.map_err(|e| e.to_string())?.is_some() {
        if Instant::now() > deadline {
            return Err(format!("{namespace}/{name} still exists 60 s after its deletion"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
