//! The read-grants program's replicas elect one leader on a Lease (`read_grants/leader.rs`), as
//! its own ServiceAccount with the shipped RBAC, on a Lease of the scenario's (a Role of the
//! scenario's lets it get and update that name, as the shipped one does the shipped name): the
//! first replica leads and renews, a second waits and never takes the Lease while the first
//! renews it; the first SIGKILLed, the second takes over once the Lease has gone unrenewed for
//! its duration (by its own clock), not before; the second stopped with SIGTERM hands the Lease
//! back and exits cleanly. A replica whose role may not read its Lease (a role older than the
//! program) runs without electing, and says so.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use sharedresource_csi_driver::controllers::leader::{LEASE_DURATION, RETRY};

use crate::support::{Outcome, READ_GRANTS_USER, Suite};
use inline_guard_tests::cluster::ChildProcess;
use inline_guard_tests::node::plugin::start_read_grants_as;

const NAMESPACE: &str = "inline-guard-driver";
const LEASE: &str = "e2e-read-grants-leader";
/// The Role and RoleBinding letting the read-grants identity keep [`LEASE`].
const GRANT: &str = "e2e-read-grants-leader";

/// The Lease's holder and renew time, `None` while there is no Lease.
async fn lease(admin: &kube::Client) -> Result<Option<(String, String, i32)>, String> {
    let lease = Api::<Lease>::namespaced(admin.clone(), NAMESPACE).get_opt(LEASE).await.map_err(|e| e.to_string())?;
    Ok(lease.map(|lease| {
        let spec = lease.spec.unwrap_or_default();
        let renewed = spec.renew_time.map(|t| format!("{:?}", t.0)).unwrap_or_default();
        (spec.holder_identity.unwrap_or_default(), renewed, spec.lease_transitions.unwrap_or(0))
    }))
}

/// Waits until the Lease's holder passes `wanted`, for at most `bound`; the holder.
async fn holder_until(admin: &kube::Client, bound: Duration, wanted: impl Fn(&str) -> bool) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let seen = lease(admin).await?;
        if let Some((holder, _, _)) = &seen
            && wanted(holder)
        {
            return Ok(holder.clone());
        }
        if started.elapsed() > bound {
            return Err(format!("the Lease {NAMESPACE}/{LEASE} is {seen:?} after {bound:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to 30 s) until `process`'s log says `text`.
async fn logs(process: &ChildProcess, text: &str) -> Outcome {
    let started = Instant::now();
    while !process.log_text().contains(text) {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("the log never said {text:?}:\n{}", process.log_tail(20)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn start(suite: &Suite, name: &str, lease: &str) -> Result<ChildProcess, String> {
    let kubeconfig = suite.cluster.kubeconfig_as(READ_GRANTS_USER)?;
    // The suite's own controller tells the nodes of grant changes; these would write their
    // objects too.
    let args = ["--leader-election-lease", &format!("{NAMESPACE}/{lease}"), "--no-access-notices"].map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_read_grants_as(name, &kubeconfig, suite.cluster.run_dir(), &args)
}

pub async fn replicas_elect_one_leader_and_a_killed_leader_is_replaced(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let grant = vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": GRANT, "namespace": NAMESPACE},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE], "verbs": ["get", "update"]}]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": GRANT, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": GRANT},
            "subjects": [{"kind": "ServiceAccount", "name": "sharedresource-read-grants", "namespace": NAMESPACE}]
        }),
    ];
    inline_guard_tests::apply::apply(admin, &grant, false).await?;
    let outcome = async {
        let mut first = start(suite, "leader-first", LEASE)?;
        let leader = holder_until(admin, Duration::from_secs(30), |holder| !holder.is_empty()).await?;
        logs(&first, "leading").await?;
        let mut second = start(suite, "leader-second", LEASE)?;
        logs(&second, "another replica leads; waiting").await?;
        // Three renewals with both running (waited for, not timed): the first renews, the second
        // never takes it.
        let mut renewals = 0;
        let (_, mut renewed, _) = lease(admin).await?.ok_or("no Lease")?;
        let started = Instant::now();
        while renewals < 3 {
            let (holder, renewed_now, transitions) = lease(admin).await?.ok_or("no Lease")?;
            if holder != leader || transitions != 0 {
                return Err(format!(
                    "with both replicas running, the Lease went from {leader} to {holder} ({transitions} transitions)"
                ));
            }
            if renewed_now != renewed {
                (renewals, renewed) = (renewals + 1, renewed_now);
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!("the leader renewed its Lease {renewals} times in 120 s"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (holder, renewed_after, transitions) = lease(admin).await?.ok_or("no Lease")?;
        if holder != leader || renewed_after.is_empty() || transitions != 0 {
            return Err(format!(
                "with both replicas running, expected {leader} to keep renewing the Lease: it is held by {holder} \
                 (renewed {renewed} then {renewed_after}, {transitions} transitions)"
            ));
        }
        if second.log_text().contains("leading") {
            return Err(format!("the second replica led beside the first:\n{}", second.log_tail(20)));
        }
        first.kill();
        let killed = Instant::now();
        // Waited for: a busy machine only makes it later, never earlier.
        let bound = Duration::from_secs(120);
        let next = holder_until(admin, bound, |holder| !holder.is_empty() && holder != leader).await?;
        let took = killed.elapsed();
        println!("leader: {next} took the Lease {took:?} after {leader} was killed");
        // It waited out the Lease's duration from the last renewal it saw (at most one look
        // before the kill, whose renewal was at most one look before that).
        if took + RETRY * 2 < LEASE_DURATION {
            return Err(format!("the second replica took the Lease {took:?} after the kill, before it expired"));
        }
        logs(&second, "leading").await?;
        let (_, _, transitions) = lease(admin).await?.ok_or("no Lease")?;
        if transitions != 1 {
            return Err(format!("expected one transition of the Lease, it says {transitions}"));
        }
        let status = second.terminate(Duration::from_secs(10))?;
        if !status.success() {
            return Err(format!("the second replica exited {status} on SIGTERM:\n{}", second.log_tail(20)));
        }
        let (holder, _, _) = lease(admin).await?.ok_or("no Lease")?;
        if !holder.is_empty() {
            return Err(format!("the stopped leader did not hand the Lease back: held by {holder}"));
        }
        // A Lease its role may not read (no Role of the scenario's names it).
        let unelected = start(suite, "leader-unelected", "e2e-read-grants-unreadable")?;
        logs(&unelected, "running without electing a leader").await?;
        Ok(())
    }
    .await;
    let _ = Api::<Lease>::namespaced(admin.clone(), NAMESPACE).delete(LEASE, &DeleteParams::default()).await;
    let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), NAMESPACE);
    let _ = roles.delete(GRANT, &DeleteParams::default()).await;
    let bindings = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), NAMESPACE);
    let _ = bindings.delete(GRANT, &DeleteParams::default()).await;
    outcome
}
