//! The refresher: what changed (a watch's event, or the periodic tick) becomes a refresh of
//! each volume it touches, run per volume with bounded concurrency, so a volume whose content
//! cannot be had quickly (a slow apiserver answer, given up at the request timeout) never delays
//! another volume's refresh or revocation. A volume already being refreshed when a new change
//! touches it is refreshed once more when its refresh ends (with fresh answers), so no change
//! is lost and no volume is refreshed twice at once. A volume another operation holds (a
//! publish, an unpublish) is tried again shortly.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

use crate::content::PassId;
use crate::content::changes::{Changes, Pending};
use crate::quote::{Logged, quote};
use crate::volume::error::Error;
use crate::volume::service::NodeService;

/// How many volumes are refreshed at once: enough that a few stalled ones (each given up at
/// the request timeout) leave room for the rest, few enough not to flood the apiserver.
pub const CONCURRENT_REFRESHES: usize = 8;
/// After ABORTED (another operation holds the volume), when to try again.
const RETRY_BUSY_AFTER: Duration = Duration::from_millis(200);
/// How long a burst of events (a RoleBinding and its Role, a Secret applied twice) is gathered
/// into one pass.
const GATHER: Duration = Duration::from_millis(20);

/// Volumes being refreshed, and those a change touched meanwhile.
#[derive(Default)]
struct InFlight {
    running: HashSet<String>,
    again: HashSet<String>,
}

/// Ends a pass at the content source once its last volume is done with it.
struct PassGuard {
    node: Arc<NodeService>,
    pass: PassId,
}

impl Drop for PassGuard {
    fn drop(&mut self) {
        self.node.end_pass(self.pass);
    }
}

/// Refreshes `node`'s volumes as `changes` (when the source can tell) and the tick every
/// `every` say, until `stopped` turns true.
pub async fn run(
    node: Arc<NodeService>,
    changes: Option<Arc<Changes>>,
    every: Duration,
    stopped: watch::Receiver<bool>,
) {
    let refresher =
        Refresher { node, limit: Arc::new(Semaphore::new(CONCURRENT_REFRESHES)), in_flight: Arc::default() };
    refresher.run(changes, every, stopped).await;
}

/// The refresher's parts, shared by the loop and every volume's task.
#[derive(Clone)]
struct Refresher {
    node: Arc<NodeService>,
    limit: Arc<Semaphore>,
    in_flight: Arc<Mutex<InFlight>>,
}

impl Refresher {
    async fn run(self, changes: Option<Arc<Changes>>, every: Duration, mut stopped: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        loop {
            let pending = tokio::select! {
                _ = ticker.tick() => Pending::everything(),
                pending = next_change(changes.as_deref()) => pending,
                _ = stopped.wait_for(|stop| *stop) => return,
            };
            self.dispatch(&pending);
        }
    }

    /// Starts a refresh of every volume `pending` touches, in one new pass.
    fn dispatch(&self, pending: &Pending) {
        let ids = self.node.volume_ids_where(|record| {
            pending.touches(&record.attributes, &record.pod.namespace, &record.pod.service_account)
        });
        if ids.is_empty() {
            return;
        }
        let pass = self.node.start_pass();
        let guard = Arc::new(PassGuard { node: self.node.clone(), pass });
        for volume_id in ids {
            let fresh = {
                let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                if in_flight.running.contains(&volume_id) {
                    in_flight.again.insert(volume_id.clone());
                    false
                } else {
                    in_flight.running.insert(volume_id.clone())
                }
            };
            if fresh {
                tokio::spawn(self.clone().refresh(volume_id, Some(guard.clone())));
            }
        }
    }

    /// Refreshes one volume (within `pass` at first), again while changes touched it meanwhile.
    async fn refresh(self, volume_id: String, mut pass: Option<Arc<PassGuard>>) {
        loop {
            let Ok(permit) = self.limit.clone().acquire_owned().await else { return };
            let node = self.node.clone();
            let id = volume_id.clone();
            let this_pass = pass.take();
            let result = tokio::task::spawn_blocking(move || {
                node.refresh_volume(&id, this_pass.as_ref().map(|guard| guard.pass))
            })
            .await
            .unwrap_or_else(|error| Some(Err(Error::local("the refresh failed", error))));
            drop(permit);
            let busy = matches!(result, Some(Err(Error::Busy(_))));
            report(&volume_id, result);
            if busy {
                tokio::time::sleep(RETRY_BUSY_AFTER).await;
                continue;
            }
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if !in_flight.again.remove(&volume_id) {
                in_flight.running.remove(&volume_id);
                return;
            }
        }
    }
}

/// The next change the source noted (never, for a source that cannot tell), gathered with what
/// follows it closely.
async fn next_change(changes: Option<&Changes>) -> Pending {
    let Some(changes) = changes else {
        return std::future::pending().await;
    };
    let mut pending = changes.next().await;
    tokio::time::sleep(GATHER).await;
    pending.merge(changes.take());
    pending
}

/// Logs what a refresh of `volume_id` did (`None`: the volume was unpublished meanwhile).
fn report(volume_id: &str, result: Option<crate::volume::error::Result<bool>>) {
    let volume = quote(volume_id);
    match result {
        Some(Ok(true)) => info!(%volume, "content refreshed"),
        Some(Ok(false)) | None => {}
        Some(Err(Error::Busy(_))) => debug!(%volume, "another operation holds the volume; refreshing it shortly"),
        Some(Err(error)) => {
            warn!(%volume, error = %Logged(&error), "content refresh failed; serving the previous content")
        }
    }
}

#[cfg(test)]
mod tests;
