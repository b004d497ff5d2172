//! The lease of the access notices: renewed every [`LEASE_RENEW_SECONDS`] while the controller
//! tells nodes of grant changes, read by every node as "a grant change will reach me" (a node
//! that sees no renewal for [`LEASE_SECONDS`] checks its access answers again on its own). Not a
//! leader election: replicas would renew it alike (see docs/architecture.md). Every node watches
//! it by name, so it also carries the revocations' broadcast ([`broadcast_revocations`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tracing::warn;

use crate::apiserver::request::ask;
use crate::quote::Logged;
pub use sharedresource_api::node_view::LeaseRef;
use sharedresource_api::node_view::{LEASE_RENEW_SECONDS, LEASE_SECONDS};
use sharedresource_api::revocations::{self, RevocationLog};

/// The field manager of the controller's writes.
pub const MANAGER: &str = "sharedresource-access-notices";

/// Renews `lease` every [`LEASE_RENEW_SECONDS`], each request given up after `timeout`; runs
/// until dropped. A failed renewal is logged and the next one tried on time.
pub async fn keep_renewed(client: Client, lease: LeaseRef, timeout: Duration) {
    let api = Api::<Lease>::namespaced(client, lease.namespace.as_str());
    let holder = std::env::var("HOSTNAME").unwrap_or_else(|_| MANAGER.to_string());
    let mut ticks = tokio::time::interval(Duration::from_secs(LEASE_RENEW_SECONDS));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let renewed = Lease {
            metadata: ObjectMeta {
                name: Some(lease.name.as_str().to_string()),
                namespace: Some(lease.namespace.as_str().to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.clone()),
                lease_duration_seconds: Some(LEASE_SECONDS as i32),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                ..LeaseSpec::default()
            }),
        };
        let what = || format!("renewing Lease {lease}");
        let apply = PatchParams::apply(MANAGER).force();
        if let Err(error) = ask(timeout, what, api.patch(lease.name.as_str(), &apply, &Patch::Apply(&renewed))).await {
            warn!(error = %Logged(&error), "the access notices' lease could not be renewed; nodes fall back to checking access on their own if this lasts");
        }
    }
}

/// The field manager of the revocations' broadcast: its own, so that neither the renewals nor
/// the broadcast removes what the other wrote.
const BROADCAST_MANAGER: &str = "sharedresource-access-notices-revocations";

/// Writes `log` into `lease`'s revocations annotation ([`sharedresource_api::revocations`]), the
/// request given up after `timeout`. A failure is logged and left to the nodes' statuses, which
/// tell the same revocations a moment later.
pub async fn broadcast_revocations(client: &Client, lease: &LeaseRef, log: &RevocationLog, timeout: Duration) {
    let api = Api::<Lease>::namespaced(client.clone(), lease.namespace.as_str());
    let annotated = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease.name.as_str(),
            "namespace": lease.namespace.as_str(),
            "annotations": { revocations::ANNOTATION: log.value() },
        },
    });
    let what = || format!("broadcasting revocations on Lease {lease}");
    let apply = PatchParams::apply(BROADCAST_MANAGER).force();
    if let Err(error) = ask(timeout, what, api.patch(lease.name.as_str(), &apply, &Patch::Apply(&annotated))).await {
        warn!(error = %Logged(&error), "revocations could not be broadcast; the nodes' statuses tell them");
    }
}
