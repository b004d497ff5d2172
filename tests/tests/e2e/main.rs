//! The end-to-end suite: the webhook and the driver against a real etcd, kube-apiserver and
//! csi-sanity built from `tests/peers/go.mod` (see `inline_guard_tests::peers`).
//!
//! One control plane serves every scenario (each works in its own namespaces and CSIDrivers), so
//! this binary has its own `main`: it starts the control plane only when a selected scenario needs
//! it, runs the scenarios with libtest-mimic (the usual filters and output), and drops the control
//! plane before exiting, panic or not. Everything it makes is under its run directory
//! (`inline_guard_tests::run_root`): swept at exit (a leak fails the run), on SIGINT/SIGTERM, and
//! by the next run if this one is killed.

// One module per capability, its scenarios in files below it.
mod admission;
mod driver;
mod leader;
mod manifests;
mod node;
mod notices;
mod optional;
mod projections;
mod providers;
mod rollout;
mod rotation_events;
mod share_notices;
mod shares;
mod support;
mod version_skew;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use support::{Outcome, Suite};

/// A scenario's body, borrowing the suite.
type Scenario = Box<dyn Fn(&Suite) -> Pin<Box<dyn Future<Output = Outcome> + Send + '_>> + Send + Sync>;

/// No scenario may hang the run.
const SCENARIO_BOUND: Duration = Duration::from_secs(180);

/// One scenario: its name, as libtest filters it, and its body.
fn scenario<F>(name: &'static str, body: F) -> (&'static str, Scenario)
where
    F: for<'s> Fn(&'s Suite) -> Pin<Box<dyn Future<Output = Outcome> + Send + 's>> + Send + Sync + 'static,
{
    (name, Box::new(body))
}

/// `"name" => |s| call(s, ...)`, one per scenario: the call is the scenario's async function.
macro_rules! scenarios {
    ($($name:literal => |$suite:ident| $call:expr),* $(,)?) => {
        vec![$(scenario($name, |$suite| Box::pin($call))),*]
    };
}

fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        "admission::enforce_table" => |s| admission::tables::table(s, "enforce"),
        "admission::warn_table" => |s| admission::tables::table(s, "warn"),
        "admission::audit_table" => |s| admission::tables::table(s, "audit"),
        "admission::workloads_warned_by_default_denied_when_enforced" =>
            |s| admission::workloads::warned_by_default_denied_when_enforced(s),
        "admission::match_conditions_send_only_objects_with_csi_volumes" =>
            |s| admission::match_conditions::only_objects_with_csi_volumes_are_sent(s),
        "admission::generated_match_conditions_change_no_answer" =>
            |s| admission::match_conditions::generated_conditions_change_no_answer(s),
        "admission::stale_mutating_configuration_refused_not_silently_admitted" =>
            |s| admission::match_conditions::a_stale_mutating_configuration_is_refused_not_silently_admitted(s),
        "admission::read_only_forced_on_every_mount" => |s| admission::read_only::forced_on_every_mount(s),
        "admission::driver_relabel_governs_the_next_pod" => |s| admission::relabel::driver_relabel(s),
        "admission::namespace_relabel_governs_the_next_pod" => |s| admission::relabel::namespace_relabel(s),
        "admission::cold_cache_no_spurious_violation" => |s| admission::cold_cache::no_spurious_violation(s),
        "admission::cold_cache_no_spurious_admission" => |s| admission::cold_cache::no_spurious_admission(s),
        "admission::webhook_killed_and_restarted_admits_nothing_forbidden" =>
            |s| admission::webhook_restart::no_forbidden_pod_admitted(s),
        "admission::a_connection_flood_does_not_keep_the_apiserver_out" =>
            |s| admission::connection_flood::does_not_keep_the_apiserver_out(s),
        "admission::shared_resource_refusals_come_at_creation" =>
            |s| admission::shared_admission::the_drivers_refusals_come_at_creation(s),
        "admission::audit_command_reports_what_tightening_would_deny" =>
            |s| admission::audit_command::reports_what_tightening_would_deny(s),
        "manifests::rbac_grants_the_webhook_exactly_what_it_needs" =>
            |s| manifests::rbac::webhook_gets_exactly_what_it_needs(s),
        "manifests::driver_reads_only_what_shares_name" =>
            |s| manifests::read_grants::driver_reads_only_what_shares_name(s),
        "manifests::read_grants_controller_sees_only_objects_of_its_own_name" =>
            |s| manifests::read_grants::the_read_grants_controller_sees_only_objects_of_its_own_name(s),
        "manifests::a_node_writes_only_its_own_view_and_status_entry" =>
            |s| manifests::node_writes::a_node_writes_only_its_own_view_and_status_entry(s),
        "manifests::deploy_pass_server_side_dry_run" => |s| manifests::dry_run::deploy_manifests_pass_dry_run(s),
        "manifests::examples_pass_server_side_dry_run" => |s| manifests::dry_run::examples_pass_dry_run(s),
        "driver::publish_as_kubelet_admitted_pod_served_unguarded_pod_refused" =>
            |s| driver::kubelet_publish::admitted_pod_publishes_unguarded_pod_is_refused(s),
        "driver::registration_answers_grpc_go_dialled_as_kubelet" =>
            |s| driver::kubelet_registration::grpc_go_dialled_as_kubelet_registers_the_driver(s),
        "driver::apiserver_rate_spaces_the_drivers_requests" =>
            |s| driver::apiserver_rate::the_drivers_requests_keep_to_its_rate(s),
        "driver::startup_taint_removed_only_once_kubelet_lists_the_driver" =>
            |s| driver::startup_taint::removed_only_once_kubelet_lists_the_driver(s),
        "node::kubelet_registers_the_driver" => |s| node::kubelet_registers_the_driver(s),
        "node::kubelet_is_held_to_its_node" => |s| node::kubelet_is_held_to_its_node(s),
        "node::container_reads_sees_updates_cannot_write_and_nothing_is_left" =>
            |s| node::container_reads_sees_updates_cannot_write_and_nothing_is_left(s),
        "node::host_read_only_makes_the_drivers_own_mount_read_only" =>
            |s| node::host_read_only_makes_the_drivers_own_mount_read_only(s),
        "node::pod_without_read_only_never_starts" => |s| node::pod_without_read_only_never_starts(s),
        "node::webhooks_refuse_one_pod_and_patch_another_that_runs" =>
            |s| node::webhooks_refuse_one_pod_and_patch_another_that_runs(s),
        "admission::native_policies_decide_as_the_webhook" =>
            |s| admission::native_policies::native_policies_decide_as_the_webhook(s),
        "node::an_annotated_pod_gets_its_share_injected_and_reads_it" =>
            |s| node::an_annotated_pod_gets_its_share_injected_and_reads_it(s),
        "node::an_optional_share_reaches_a_running_container_once_its_secret_exists" =>
            |s| node::an_optional_share_reaches_a_running_container_once_its_secret_exists(s),
        "node::pod_without_access_waits_and_starts_once_granted" =>
            |s| node::pod_without_access_waits_and_starts_once_granted(s),
        "node::a_tenants_fat_bindings_cost_the_driver_nothing" =>
            |s| node::fat_bindings::a_tenants_fat_bindings_cost_the_driver_nothing(s),
        "node::driver_killed_under_a_running_pod_which_still_reads_and_unpublishes" =>
            |s| node::driver_killed_under_a_running_pod_which_still_reads_and_unpublishes(s),
        "node::kubelet_passes_the_token_and_the_container_reads_the_composed_volume" =>
            |s| node::projection::kubelet_passes_the_token_and_the_container_reads_the_composed_volume(s),
        "projections::sources_compose_update_atomically_revoke_as_one_and_tokens_follow_republish" =>
            |s| projections::sources_compose_update_atomically_revoke_as_one_and_tokens_follow_republish(s),
        "projections::hostile_share_names_never_reach_the_apiserver_and_revocation_still_arrives" =>
            |s| projections::hostile::hostile_share_names_never_reach_the_apiserver_and_revocation_still_arrives(s),
        "shares::a_node_that_hears_no_notices_still_sees_a_revocation" =>
            |s| notices::a_node_that_hears_no_notices_still_sees_a_revocation(s),
        "shares::a_revocation_reaches_a_node_through_the_lease_before_its_status" =>
            |s| notices::a_revocation_reaches_a_node_through_the_lease_before_its_status(s),
        "shares::access_updates_revocation_and_deletion_reach_the_files" =>
            |s| shares::access_updates_revocation_and_deletion_reach_the_files(s),
        "shares::driver_killed_and_restarted_keeps_and_refreshes_the_volume" =>
            |s| shares::driver_killed_and_restarted_keeps_and_refreshes_the_volume(s),
        "shares::content_changes_and_failed_updates_are_told_on_the_pod" =>
            |s| rotation_events::content_changes_and_failed_updates_are_told_on_the_pod(s),
        "shares::nodes_report_failed_updates_without_writing_over_each_other" =>
            |s| rotation_events::nodes_report_failed_updates_without_writing_over_each_other(s),
        "shares::one_namespaces_many_volumes_cannot_spend_the_events_of_another" =>
            |s| rotation_events::one_namespaces_many_volumes_cannot_spend_the_events_of_another(s),
        "shares::an_optional_share_is_served_empty_until_its_secret_exists" =>
            |s| optional::an_optional_share_is_served_empty_until_its_secret_exists(s),
        "shares::the_rollout_controller_may_patch_only_its_two_annotations" =>
            |s| rollout::the_rollout_controller_may_patch_only_its_two_annotations(s),
        "shares::labelled_workloads_restart_once_per_change_never_for_a_revocation" =>
            |s| rollout::labelled_workloads_restart_once_per_change_never_for_a_revocation(s),
        "shares::a_tenants_fat_labelled_workloads_are_listed_a_few_at_a_time" =>
            |s| rollout::a_tenants_fat_labelled_workloads_are_listed_a_few_at_a_time(s),
        "providers::an_exec_provider_serves_the_pods_own_files_to_whom_rbac_grants_use" =>
            |s| providers::an_exec_provider_serves_the_pods_own_files_to_whom_rbac_grants_use(s),
        "providers::a_lazy_exec_provider_fetches_each_file_when_first_opened" =>
            |s| providers::lazy::a_lazy_exec_provider_fetches_each_file_when_first_opened(s),
        "providers::a_secrets_store_provider_serves_its_objects_to_whom_rbac_grants_use" =>
            |s| providers::secrets_store::a_secrets_store_provider_serves_its_objects_to_whom_rbac_grants_use(s),
        "node::a_pod_on_the_node_reads_a_secrets_store_providers_object" =>
            |s| node::secrets_store::a_pod_on_the_node_reads_a_secrets_store_providers_object(s),
        "node::a_pod_on_the_node_reads_a_lazy_providers_file_when_it_first_opens_it" =>
            |s| node::lazy_provider::a_pod_on_the_node_reads_a_lazy_providers_file_when_it_first_opens_it(s),
        "driver::csi_sanity" => |s| driver::csi_sanity::passes_its_node_and_identity_specs(s),
        "manifests::read_grants_replicas_elect_one_leader_and_a_killed_leader_is_replaced" =>
            |s| leader::replicas_elect_one_leader_and_a_killed_leader_is_replaced(s),
        "manifests::each_components_requests_fall_in_its_own_priority_level" =>
            |s| manifests::flow_control::each_components_requests_fall_in_its_own_priority_level(s),
    ]
}

/// The scenarios run a second time against the oldest Kubernetes minor the project claims
/// (`tests/peers/oldest`: its apiserver and kubelet), named `oldest::<name>`: the webhook's
/// admission on its own and through kubelet, the driver on a real node of that minor. What is
/// left out, and why, is in docs/compatibility.md ("What is proven on which minor").
const ON_THE_OLDEST_MINOR: [&str; 12] = [
    "admission::enforce_table",
    "admission::warn_table",
    "admission::audit_table",
    "admission::workloads_warned_by_default_denied_when_enforced",
    "admission::match_conditions_send_only_objects_with_csi_volumes",
    "admission::read_only_forced_on_every_mount",
    "admission::shared_resource_refusals_come_at_creation",
    "node::kubelet_registers_the_driver",
    "node::container_reads_sees_updates_cannot_write_and_nothing_is_left",
    "node::pod_without_read_only_never_starts",
    "node::webhooks_refuse_one_pod_and_patch_another_that_runs",
    "node::kubelet_passes_the_token_and_the_container_reads_the_composed_volume",
];

/// Set to `1`, the oldest minor's round is not run (and says so): building that minor's
/// apiserver, kubelet and controller-manager is five minutes of a cold run's two cores, so a
/// commit's run (`tests/run`) leaves it to a release's (`tests/release`).
const SKIP_OLDEST: &str = "INLINE_GUARD_SKIP_OLDEST_MINOR";

/// Scenarios only the oldest minor runs: what the docs say it lacks, seen lacking.
fn oldest_only_scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![
        "compatibility::the_oldest_minor_serves_no_mutating_admission_policy_the_native_policies_use" =>
            |s| admission::native_policies::not_served_on_the_oldest_minor(s),
        "compatibility::the_controller_manager_is_of_the_apiservers_release" =>
            |s| version_skew::the_controller_manager_is_of_the_apiservers_release(s),
    ]
}

/// libtest's selection rules, so that a filtered `cargo test` run does not start a control plane
/// for nothing.
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |pattern: &str| if args.exact { name == pattern } else { name.contains(pattern) };
    !args.list && args.filter.as_deref().is_none_or(matches) && !args.skip.iter().any(|s| matches(s))
}

fn main() -> ExitCode {
    inline_guard_tests::webhook::run_cli_if_child();
    inline_guard_tests::node::plugin::run_driver_if_child();
    let args = Arguments::from_args();
    // Before anything is made on the machine: sweeps what a killed run left, and tears this run
    // down on SIGINT/SIGTERM/SIGHUP.
    if let Err(error) = inline_guard_tests::run_root::claim() {
        eprintln!("e2e: no run directory: {error}");
        return ExitCode::FAILURE;
    }

    let newest = scenarios().into_iter().map(|(name, scenario)| (name.to_string(), scenario)).collect();
    let mut trials = vec![Trial::test("support::warning_headers_are_unescaped", || {
        support::warning_headers_are_unescaped().map_err(Failed::from)
    })];
    let start_newest = || inline_guard_tests::peers::peers().and_then(Suite::start);
    trials.extend(trials_on(&args, "", start_newest, newest));
    let conclusion = libtest_mimic::run(&args, trials);

    // The oldest minor, once the newest's control plane and node are gone (one node per machine);
    // a release's check (tests/release), which tests/run leaves out: said here, never silent.
    let oldest_conclusion = if std::env::var_os(SKIP_OLDEST).is_some_and(|v| v == "1") {
        eprintln!(
            "e2e: NOT RUN: the oldest minor's scenarios (oldest::…): {SKIP_OLDEST}=1, as tests/run sets; \
             tests/release runs them"
        );
        None
    } else {
        let oldest: Vec<(String, Scenario)> = scenarios()
            .into_iter()
            .filter(|(name, _)| ON_THE_OLDEST_MINOR.contains(name))
            .chain(oldest_only_scenarios())
            .map(|(name, scenario)| (format!("oldest::{name}"), scenario))
            .collect();
        let start_oldest = || {
            let peers = inline_guard_tests::peers::peers()?;
            Suite::start(peers.with_release(inline_guard_tests::peers::oldest_release()?))
        };
        Some(libtest_mimic::run(&args, trials_on(&args, "oldest ", start_oldest, oldest)))
    };

    // A green run that leaves a mount or a process behind is not green.
    if let Err(leak) = inline_guard_tests::run_root::finish() {
        eprintln!("e2e: FAILED: {leak}");
        return ExitCode::FAILURE;
    }
    match oldest_conclusion {
        Some(oldest) if !conclusion.has_failed() => oldest.exit_code(),
        _ => conclusion.exit_code(),
    }
}

/// A trial per scenario, on one control plane (started by `start` before the first, only when a
/// selected scenario needs it, and stopped when the last trial is dropped).
fn trials_on(
    args: &Arguments,
    label: &str,
    start: impl FnOnce() -> Result<Suite, String>,
    scenarios: Vec<(String, Scenario)>,
) -> Vec<Trial> {
    let suite: Arc<Result<Suite, String>> = if scenarios.iter().any(|(name, _)| selected(args, name)) {
        let started = Instant::now();
        let suite = start();
        if let Err(error) = &suite {
            eprintln!("e2e: THE {label}CONTROL PLANE DID NOT START; every scenario fails with this:\n{error}");
        } else {
            eprintln!("e2e: {label}control plane and webhooks ready in {:?}", started.elapsed());
        }
        Arc::new(suite)
    } else {
        Arc::new(Err("not started: no selected scenario needs it".into()))
    };
    let mut trials = Vec::new();
    for (name, scenario) in scenarios {
        let suite = suite.clone();
        trials.push(Trial::test(name, move || {
            let suite = suite.as_ref().as_ref().map_err(|e| Failed::from(format!("control plane: {e}")))?;
            // The timer is created inside the runtime: `timeout` needs its reactor.
            let outcome = suite.runtime.block_on(async { tokio::time::timeout(SCENARIO_BOUND, scenario(suite)).await });
            let outcome = outcome.unwrap_or_else(|_| Err(format!("timed out after {SCENARIO_BOUND:?}")));
            outcome.map_err(|error| {
                Failed::from(format!("{error}\n{}\n{}", suite.shared.log_tail(15), suite.openshift.log_tail(15)))
            })
        }));
    }
    // Every trial holds its clone: the control plane goes with the last trial run.
    trials
}
