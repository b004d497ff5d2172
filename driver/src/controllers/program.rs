//! The command line of `sharedresource-read-grants`: which cluster, which ServiceAccount the
//! grants are for, the lease of the access notices (`crate::controllers::access_notices`), whether it
//! restarts workloads on a share's change (`crate::controllers::rollout`), then the controllers until SIGTERM.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use super::read_grants::plan::DriverAccount;

#[derive(Parser)]
#[command(
    name = "sharedresource-read-grants",
    version,
    about = "Keeps RBAC letting the shared-resource CSI driver read exactly the Secrets and ConfigMaps shares name"
)]
struct Flags {
    /// Kubeconfig to use; $KUBECONFIG or the in-cluster ServiceAccount otherwise.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The driver's ServiceAccount, NAMESPACE/NAME: the grants' only subject.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "inline-guard-driver/sharedresource-csi-driver")]
    driver_service_account: String,
    /// How long one request to the apiserver may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    request_timeout_seconds: u64,
    /// Requests a second to the apiserver after a burst (client-go's QPS).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    apiserver_qps: u32,
    /// Requests sent at once after a quiet time (client-go's Burst).
    #[arg(long, value_name = "N", default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..))]
    apiserver_burst: u32,
    /// The Lease renewed while grant changes are told to the nodes (NAMESPACE/NAME); the drivers'
    /// `accessLease` names the same.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = sharedresource_api::node_view::DEFAULT_LEASE)]
    access_lease: String,
    /// Requests a second of the access notices' writes to the nodes, on a client of their own
    /// (a revocation reaching 200 nodes is 200 small writes; the read grants keep their rate).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    notices_qps: u32,
    /// Writes of the access notices sent at once after a quiet time.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    notices_burst: u32,
    /// The Lease the program's replicas elect their leader on (NAMESPACE/NAME): only the leader
    /// grants, tells nodes and restarts workloads.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = super::leader::DEFAULT_LEADER_LEASE)]
    leader_election_lease: String,
    /// Run without electing a leader (one replica, or a process beside the elected ones whose
    /// work differs, as the test suite's rollout controller).
    #[arg(long)]
    no_leader_election: bool,
    /// Do not tell nodes of grant changes (another process does; its nodes fall back to their
    /// own rechecks otherwise).
    #[arg(long)]
    no_access_notices: bool,
    /// Tell nodes of grant changes without answering their access questions: each node asks
    /// its own after every notice (the design before the central answers; a benchmark's
    /// baseline).
    #[arg(long)]
    no_central_answers: bool,
    /// Also restart the workloads labelled `sharedresource.inlineguard.dev/restart-on-change=true`
    /// when a share their pods mount changes (needs config/deploy/driver/rollout-on-change.yaml).
    #[arg(long)]
    rollout_on_change: bool,
    /// With --rollout-on-change: the most labelled workloads followed in one namespace (those
    /// beyond are logged and not restarted).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    rollout_workloads_per_namespace: u32,
    /// With --rollout-on-change: the Secret (NAMESPACE/NAME) holding the key the workloads'
    /// records are made with (made when missing; rollout-on-change.yaml lets it).
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = crate::controllers::rollout::record_key::DEFAULT_KEY_SECRET)]
    rollout_key_secret: String,
}

/// Parses `args` (the program name first) and runs until SIGTERM or SIGINT: 0 then, 2 when it
/// cannot start.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    crate::program::run_program::<Flags>("sharedresource-read-grants", args, run)
}

fn run(flags: Flags) -> Result<(), Box<dyn std::error::Error>> {
    let driver = DriverAccount::parse(&flags.driver_service_account)?;
    let lease = crate::controllers::access_notices::lease::LeaseRef::parse(&flags.access_lease)
        .map_err(|e| format!("--access-lease: {e}"))?;
    let leader_lease = crate::controllers::access_notices::lease::LeaseRef::parse(&flags.leader_election_lease)
        .map_err(|e| format!("--leader-election-lease: {e}"))?;
    let key_secret = crate::controllers::rollout::record_key::KeySecret::parse(&flags.rollout_key_secret)
        .map_err(|e| format!("--rollout-key-secret: {e}"))?;
    if flags.request_timeout_seconds == 0 {
        return Err("--request-timeout-seconds must be at least 1".into());
    }
    let timeout = Duration::from_secs(flags.request_timeout_seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        // Caught before the controller starts: a signal must stop it, not kill the process.
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let rate = crate::apiserver::rate::RateLayer::new(flags.apiserver_qps, flags.apiserver_burst);
        let client = crate::apiserver::client::kube_client(flags.kubeconfig.as_deref(), rate).await?;
        // The rollout on a client and rate bucket of its own: the requests tenants' labelled
        // workloads cost it (listed a few at a time) never delay the read grants.
        let rollout_rate = crate::apiserver::rate::RateLayer::new(flags.apiserver_qps, flags.apiserver_burst);
        let rollout_client = crate::apiserver::client::kube_client(flags.kubeconfig.as_deref(), rollout_rate).await?;
        let rollout = async {
            if flags.rollout_on_change {
                let settings = crate::controllers::rollout::controller::RolloutSettings {
                    workloads_per_namespace: flags.rollout_workloads_per_namespace as usize,
                    timeout,
                    key_secret: key_secret.clone(),
                };
                crate::controllers::rollout::controller::run(rollout_client, settings).await;
            }
        };
        let grants = super::read_grants::controller::run(client.clone(), driver, timeout);
        let settings = crate::controllers::access_notices::controller::NoticeSettings {
            lease,
            timeout,
            answers: !flags.no_central_answers,
        };
        let notices_rate = crate::apiserver::rate::RateLayer::new(flags.notices_qps, flags.notices_burst);
        let notices_client = crate::apiserver::client::kube_client(flags.kubeconfig.as_deref(), notices_rate).await?;
        let notices = async {
            if !flags.no_access_notices {
                crate::controllers::access_notices::controller::run(notices_client, settings).await;
            }
        };
        let work = async {
            futures_util::future::join3(grants, rollout, notices).await;
        };
        if flags.no_leader_election {
            tokio::select! {
                () = work => {}
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            return Ok(());
        }
        let mut election =
            super::leader::Election::new(client.clone(), leader_lease, super::leader::identity(), timeout);
        let led = tokio::select! {
            led = election.lead(work) => led,
            _ = terminate.recv() => Ok(()),
            _ = interrupt.recv() => Ok(()),
        };
        // Told to stop, or stopped leading: the Lease is handed back (when still held) so that
        // another replica leads at its next look.
        election.release().await;
        led.map_err(|lost| Box::new(lost) as Box<dyn std::error::Error>)
    })?;
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(())
}
