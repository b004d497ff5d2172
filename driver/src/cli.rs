//! The command line of `sharedresource-csi-driver`: flags and configuration in, the plugin served
//! until SIGTERM. In the library so that a test binary can run it as a child process of its own.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::apiserver::client::ApiserverClients;
use crate::config::{DriverConfig, SourceKind};
use crate::content::KubernetesSource;
use crate::content::external::helper_confinement;
use crate::content::external::provider::check_providers;
use crate::content::external::providers::Providers;
use crate::content::{ContentSource, StaticDirSource};
use crate::csi::socket::socket_path;
use crate::metrics::Metrics;
use crate::plugin::Plugin;
use crate::volume::mounter::LinuxMounter;
use crate::volume::refresh::pod_event_sink::ApiserverPodEvents;
use crate::volume::refresh::pod_events::{NoEvents, PodEvents};

#[derive(Parser)]
#[command(
    name = "sharedresource-csi-driver",
    version,
    about = "CSI node plugin for shared Secrets and ConfigMaps, read-only inline volumes only"
)]
struct Flags {
    /// The CSI socket, unix:///path.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This node's name (defaults to $NODE_NAME).
    #[arg(long, env = "NODE_NAME")]
    node_id: String,
    /// Configuration file (config/driver.yaml); built-in defaults otherwise.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Do not serve kubelet registration (when a node-driver-registrar sidecar does).
    #[arg(long)]
    no_registration: bool,
}

/// The other name the driver's image starts this program by (a link to it): the read-grants
/// controller's, `controllers::program`.
pub const READ_GRANTS_PROGRAM: &str = "sharedresource-read-grants";

/// Runs the program `args`' first (argv[0]) names by its file name: the read-grants controller
/// for [`READ_GRANTS_PROGRAM`], the node plugin otherwise; the node plugin's `probe` (its first
/// argument) asks the driver of its own pod (`health::probe`, the DaemonSet's exec probes), and
/// its `confine-helper` starts a helper behind its seccomp filter (`helper_confinement`). The
/// driver's image holds one program under both names, so it carries the code they share once.
pub fn main_by_name(args: Vec<OsString>) -> ExitCode {
    if started_as_read_grants(args.first()) {
        crate::controllers::program::main(args)
    } else if args.get(1).is_some_and(|first| first == "probe") {
        crate::health::probe::main(args.into_iter().skip(1))
    } else if args.get(1).is_some_and(|first| first == helper_confinement::CONFINE_HELPER) {
        helper_confinement::main(args.into_iter().skip(1))
    } else {
        main(args)
    }
}

fn started_as_read_grants(argv0: Option<&OsString>) -> bool {
    argv0.and_then(|first| std::path::Path::new(first).file_name()).is_some_and(|name| name == READ_GRANTS_PROGRAM)
}

/// Parses `args` (the program name first), serves until SIGTERM or SIGINT, and returns the exit
/// code: 0 after a clean shutdown, 2 when the driver cannot start.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    crate::program::run_program::<Flags>("sharedresource-csi-driver", args, run)
}

fn run(flags: Flags) -> Result<(), Box<dyn std::error::Error>> {
    crate::program::raise_open_files_limit();
    let config = match &flags.config {
        Some(path) => DriverConfig::load(path)?,
        None => DriverConfig::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let metrics = Arc::new(Metrics::new());
    let providers = check_providers(&config.providers)?;
    confine_helpers()?;
    // Checked before anything starts: a budget that could not hold is a configuration error.
    config.budget_limits()?;
    let (content, events) = content_source(&config, &flags, &runtime, &metrics, providers)?;
    let registered = Arc::new(tokio::sync::watch::channel(false).0);
    if config.startup_taint {
        remove_taint_when_registered(&config, &flags, &runtime, &registered)?;
    }
    let plugin = Plugin {
        config,
        csi_socket: socket_path(&flags.endpoint)?,
        node_id: flags.node_id,
        register: !flags.no_registration,
        mounter: Arc::new(LinuxMounter),
        content,
        metrics,
        registered,
        events,
    };
    serve_until_signalled(runtime, plugin)
}

/// Sets the process up so that every helper program is started through it, behind its seccomp
/// filter, and none gains a privilege by executing a file.
fn confine_helpers() -> Result<(), Box<dyn std::error::Error>> {
    // Before any helper can run: none gains a privilege by executing a file.
    crate::content::external::helper_run::no_new_privileges()
        .map_err(|error| format!("setting no_new_privs, so that no helper gains privileges: {error}"))?;
    // Every helper is started through this program, behind its seccomp filter; a filter this
    // machine cannot have is a start-up error, not a helper's first failure.
    helper_confinement::filters().map_err(|error| format!("the helpers' seccomp filter: {error}"))?;
    helper_confinement::confine_helpers_through_this_program();
    Ok(())
}

/// Where volumes' content comes from, and where the refresher's Events on pods go.
type ContentAndEvents = (Arc<dyn ContentSource>, Arc<dyn PodEvents>);

/// The content source `config` names, with `providers`, and where the refresher's Events on
/// pods go (nowhere without a cluster).
fn content_source(
    config: &DriverConfig,
    flags: &Flags,
    runtime: &tokio::runtime::Runtime,
    metrics: &Arc<Metrics>,
    providers: std::collections::BTreeMap<String, crate::content::external::provider::Provider>,
) -> Result<ContentAndEvents, Box<dyn std::error::Error>> {
    let mut events: Arc<dyn PodEvents> = Arc::new(NoEvents);
    let content: Arc<dyn ContentSource> = match config.source()? {
        SourceKind::Static if !providers.is_empty() => {
            return Err(
                "providers need contentSource: kubernetes (who may use a provider is asked of the apiserver)".into()
            );
        }
        SourceKind::Static => Arc::new(StaticDirSource::new(config.static_shares_dir.clone().unwrap_or_default())),
        SourceKind::Kubernetes => {
            // kube's client spawns its buffer's task: it is made on the runtime.
            let clients = runtime.block_on(async {
                let rate = crate::apiserver::rate::RateLayer::new(config.apiserver_qps, config.apiserver_burst);
                let config = crate::apiserver::client::kube_config(config.kubeconfig.as_deref()).await?;
                Ok::<_, Box<dyn std::error::Error>>(ApiserverClients::new(config, rate)?)
            })?;
            let timeout = std::time::Duration::from_secs(config.request_timeout_seconds);
            events = Arc::new(ApiserverPodEvents::new(
                clients.requests.clone(),
                runtime.handle().clone(),
                &flags.node_id,
                timeout,
            ));
            Arc::new(
                KubernetesSource::new(clients, runtime.handle().clone(), metrics.clone())
                    .with_request_timeout(timeout)
                    .with_access_recheck(std::time::Duration::from_secs(config.access_recheck_seconds))
                    .with_pod_metadata(config.pod_metadata)
                    .with_content_limit(config.tmpfs_size)
                    .with_node(
                        flags.node_id.clone(),
                        crate::content::cluster::NoticeSettings {
                            lease: config.access_lease.clone(),
                            fallback: std::time::Duration::from_secs(config.access_fallback_seconds),
                        },
                    )
                    .with_providers(
                        Providers::new(providers, config.helper_concurrency).with_volume_limit(config.tmpfs_size),
                    ),
            )
        }
    };
    Ok((content, events))
}

/// Removes the node's startup taint once kubelet says it registered the driver (`registered`).
fn remove_taint_when_registered(
    config: &DriverConfig,
    flags: &Flags,
    runtime: &tokio::runtime::Runtime,
    registered: &Arc<tokio::sync::watch::Sender<bool>>,
) -> Result<(), Box<dyn std::error::Error>> {
    if flags.no_registration {
        return Err("startupTaint needs the driver's own registration with kubelet (it waits for kubelet's \
                    answer to it): drop --no-registration"
            .into());
    }
    // Made on the runtime (kube's client spawns its buffer's task there), with a bucket of
    // its own at the configured rate: it asks a few times at start, then never again.
    let client = runtime.block_on(async {
        let rate = crate::apiserver::rate::RateLayer::new(config.apiserver_qps, config.apiserver_burst);
        crate::apiserver::client::kube_client(config.kubeconfig.as_deref(), rate).await
    })?;
    let timeout = std::time::Duration::from_secs(config.request_timeout_seconds);
    runtime.spawn(crate::controllers::startup_taint::remove_when_registered(
        client,
        flags.node_id.clone(),
        registered.subscribe(),
        timeout,
    ));
    Ok(())
}

/// Serves `plugin` on `runtime` until SIGTERM or SIGINT, then lets the runtime go.
fn serve_until_signalled(runtime: tokio::runtime::Runtime, plugin: Plugin) -> Result<(), Box<dyn std::error::Error>> {
    let served = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        // Registered before anything is served: a SIGTERM arriving the moment the driver is
        // ready must start the graceful shutdown, not kill the process (the default action).
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        plugin.run(shutdown).await.map_err(Box::<dyn std::error::Error>::from)
    });
    // The plugin has waited its grace period; a publish still running on the blocking pool is
    // cut off here, as a SIGKILL would, and undone at the next start.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    served?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_grants_controller_runs_when_started_by_its_name_wherever_it_lies() {
        for (argv0, read_grants) in [
            (Some("/usr/local/bin/sharedresource-read-grants"), true),
            (Some("sharedresource-read-grants"), true),
            (Some("/usr/local/bin/sharedresource-csi-driver"), false),
            (Some("/usr/local/bin/sharedresource-read-grants-old"), false),
            (Some("/sharedresource-read-grants/sharedresource-csi-driver"), false),
            (None, false),
        ] {
            assert_eq!(started_as_read_grants(argv0.map(OsString::from).as_ref()), read_grants, "{argv0:?}");
        }
    }
}
