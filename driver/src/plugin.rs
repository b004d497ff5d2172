//! The assembled plugin: the state directory locked and both sockets bound first (so a second
//! instance stops before it touches anything), records recovered, services built, everything
//! served until shutdown, and shutdown bounded whatever the clients do.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inline_guard_proto::csi::v1::identity_server::IdentityServer;
use inline_guard_proto::csi::v1::node_server::NodeServer;
use inline_guard_proto::pluginregistration::registration_server::RegistrationServer;
use tokio::sync::watch;
use tonic::service::Routes;
use tracing::{info, warn};

use crate::DRIVER_NAME;
use crate::config::DriverConfig;
use crate::content::ContentSource;
use crate::csi::identity::IdentityService;
use crate::csi::node::NodeGrpc;
use crate::csi::registration::RegistrationService;
use crate::csi::socket::{self, Clients};
use crate::error::{Result, RunError};
use crate::health::{self, Health};
use crate::metrics::Metrics;
use crate::unpoisoned::UnpoisonedMutex;
use crate::volume::lazy::handover::offer::Offer;
use crate::volume::lazy::handover::take::{self, TakenNode, TakenVolume};
use crate::volume::lazy::handover::{ListeningSocket, take_socket};
use crate::volume::lock::{LockError, StateLock};
use crate::volume::mounter::Mounter;
use crate::volume::recovery::recover;
use crate::volume::refresh::pod_events::PodEvents;
use crate::volume::service::{NodeService, VolumeSettings};
use crate::volume::store::{FileVolumeStore, VolumeStore};

/// Everything the plugin runs with.
pub struct Plugin {
    /// The parsed configuration.
    pub config: DriverConfig,
    /// Where the CSI socket goes.
    pub csi_socket: PathBuf,
    /// The node's name.
    pub node_id: String,
    /// Serve kubelet registration in the registry directory.
    pub register: bool,
    /// Mounts.
    pub mounter: Arc<dyn Mounter>,
    /// Volume content.
    pub content: Arc<dyn ContentSource>,
    /// What the driver counts.
    pub metrics: Arc<Metrics>,
    /// Set to true when kubelet says it registered the driver.
    pub registered: Arc<watch::Sender<bool>>,
    /// Where the refresher's Events on pods go.
    pub events: Arc<dyn PodEvents>,
}

impl Plugin {
    /// A plugin keeping everything under `dir` (state, registry, the static shares in
    /// `dir/shares`, and `dir` as the kubelet root, so targets are `dir/pods/...`), with real
    /// mounts and 1 MiB volumes: what the tests and benchmarks run.
    #[cfg(any(test, feature = "test-util"))]
    pub fn in_directory(dir: &std::path::Path, csi_socket: PathBuf) -> Plugin {
        let shares = dir.join("shares");
        Plugin {
            config: DriverConfig {
                state_dir: dir.join("state"),
                registry_dir: dir.join("registry"),
                kubelet_dir: dir.to_path_buf(),
                tmpfs_size: 1 << 20,
                host_read_only: false,
                content_source: None,
                kubeconfig: None,
                static_shares_dir: Some(shares.clone()),
                refresh_seconds: 3600,
                access_recheck_seconds: 600,
                request_timeout_seconds: 10,
                refresh: true,
                pod_metadata: false,
                health_address: None,
                shutdown_timeout_seconds: 10,
                ..DriverConfig::default()
            },
            csi_socket,
            node_id: "test-node".into(),
            register: false,
            mounter: Arc::new(crate::volume::mounter::LinuxMounter),
            content: Arc::new(crate::content::StaticDirSource::new(shares)),
            metrics: Arc::new(Metrics::new()),
            registered: Arc::new(watch::channel(false).0),
            events: Arc::new(crate::volume::refresh::pod_events::NoEvents),
        }
    }

    /// The Node service over the volumes a previous run published and recovery kept (what was
    /// interrupted is undone first, what is no longer there is forgotten), serving the lazy
    /// volumes a predecessor handed over (`taken`).
    fn recovered_node_service(&self, taken: Vec<TakenVolume>) -> Result<Arc<NodeService>> {
        let store = Arc::new(FileVolumeStore::open(&self.config.state_dir)?);
        let (records, problems) = store.load_all()?;
        for problem in problems {
            warn!(problem = %crate::quote::Logged(&problem), "unreadable volume record ignored");
        }
        let kubelet_dir = self.config.kubelet_dir.clone();
        let handed: HashSet<String> = taken.iter().map(|volume| volume.volume_id.clone()).collect();
        let (kept, dropped) = recover(records, self.mounter.as_ref(), store.as_ref(), &kubelet_dir, &handed);
        for line in dropped {
            info!("{}", crate::quote::Logged(&line));
        }
        info!(volumes = kept.len(), handed_over = handed.len(), "recovered published volumes");
        let settings = VolumeSettings {
            tmpfs_bytes: self.config.tmpfs_size,
            host_read_only: self.config.host_read_only,
            kubelet_dir,
            refresh_content: self.config.refresh,
            content_budget: self.config.budget_limits().map_err(RunError::Config)?,
        };
        let store: Arc<dyn VolumeStore> = store;
        let service =
            NodeService::new(self.node_id.clone(), settings, self.mounter.clone(), store, self.content.clone(), kept);
        let service = Arc::new(service.with_metrics(self.metrics.clone()));
        for line in service.adopt_lazy(taken) {
            warn!("{}", crate::quote::Logged(&line));
        }
        Ok(service)
    }

    /// What must be this process's alone on the node, taken before anything is read or served:
    /// the state directory's lock, the CSI socket and (when registering) the registration
    /// socket. When another driver holds the lock and offers a handover, its lazy volumes are
    /// taken first (returned), then the lock it lets go of, and its sockets are accepted on
    /// (or, from a driver that cannot hand them, replaced in place); a driver that offers none
    /// keeps the node, and this one stops.
    async fn claim_node(&self) -> Result<ClaimedNode> {
        let registration_path = self.config.registry_dir.join(format!("{DRIVER_NAME}-reg.sock"));
        let registration_path = self.register.then_some(registration_path.as_path());
        let lock = match StateLock::acquire(&self.config.state_dir) {
            Ok(lock) => lock,
            Err(LockError::Held(message)) => return self.take_node_over(message, registration_path).await,
            Err(error) => return Err(error.into()),
        };
        let csi_socket = socket::bind(&self.csi_socket)?;
        let registration_socket = registration_path.map(socket::bind).transpose()?;
        Ok(ClaimedNode { lock, csi_socket, registration_socket, taken: Vec::new() })
    }

    /// The node, from the driver holding its lock (`held` says who): this driver's sockets are
    /// bound beside the holder's first (what fails there fails before anything is taken), then
    /// its lazy volumes and listening sockets are asked for, then the lock it lets go of is
    /// taken; each socket it handed is accepted on as it is, and the others are put in place of
    /// its own. A holder that offers no handover keeps the node.
    async fn take_node_over(&self, held: String, registration_path: Option<&std::path::Path>) -> Result<ClaimedNode> {
        let csi_beside = socket::bind_beside(&self.csi_socket)?;
        let registration_beside = registration_path.map(socket::bind_beside).transpose()?;
        let (state_dir, content, tmpfs_size) =
            (self.config.state_dir.clone(), self.content.clone(), self.config.tmpfs_size);
        let asked = tokio::task::spawn_blocking(move || {
            let asked = take::ask(&state_dir, content.as_ref(), tmpfs_size);
            let Some(taken) = asked.map_err(|error| RunError::Handover(error.to_string()))? else {
                return Ok(None);
            };
            // The predecessor releases the lock as it lets go of the node.
            let lock = StateLock::acquire_within(&state_dir, crate::volume::lazy::handover::STEP_TIMEOUT)?;
            Ok::<_, RunError>(Some((lock, taken)))
        })
        .await
        .map_err(|error| RunError::Handover(format!("the handover's task: {error}")))?;
        let Some((lock, TakenNode { volumes: taken, mut sockets })) = asked? else {
            return Err(LockError::Held(format!("{held} (it offers no handover)")).into());
        };
        info!(
            volumes = taken.len(),
            sockets = sockets.len(),
            "took over the running driver's lazy volumes, sockets and the node"
        );
        let (csi_socket, _) = in_place(csi_beside, &self.csi_socket, &mut sockets)?;
        let registration_socket = match (registration_beside, registration_path) {
            (Some(beside), Some(path)) => {
                let (socket, inherited) = in_place(beside, path, &mut sockets)?;
                if inherited {
                    // kubelet registered this very socket and sees no change: it sends no new
                    // registration notice, and the one it sent the predecessor stands.
                    info!("kubelet's registration of the driver stands: its socket was handed over");
                    self.registered.send_replace(true);
                }
                Some(socket)
            }
            _ => None,
        };
        Ok(ClaimedNode { lock, csi_socket, registration_socket, taken })
    }

    /// Serves kubelet's registration on `socket` (when this driver registers itself) until
    /// `stopped` turns true.
    async fn serve_registration(
        &self,
        socket: Option<socket::BoundSocket>,
        stopped: watch::Receiver<bool>,
    ) -> socket::Result<()> {
        let Some(socket) = socket else {
            return Ok(());
        };
        let routes = Routes::new(RegistrationServer::new(RegistrationService::new(
            self.csi_socket.clone(),
            self.registered.clone(),
        )));
        socket::serve(socket, routes, Clients::KubeletRegistration, until_stopped(stopped)).await
    }

    /// What the health port tells: not serving yet, nothing handed over.
    fn health(&self) -> Arc<Health> {
        Arc::new(Health {
            serving: std::sync::atomic::AtomicBool::new(false),
            handed_over: std::sync::atomic::AtomicBool::new(false),
            content: self.content.clone(),
            metrics: self.metrics.clone(),
        })
    }

    /// Serves until `shutdown` completes, then removes its sockets. After `shutdown`, requests
    /// in flight get `shutdownTimeoutSeconds` to finish; then the servers are dropped with
    /// whatever connections are still open. A successor's handover (see `volume::lazy::handover`)
    /// stops the serving early: this driver then waits, not ready, for `shutdown`, leaving its
    /// socket files to the successor.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        // Bound first: what can fail is to fail before a predecessor's volumes are taken (a
        // successor that stopped after taking them would leave them to nobody).
        // The health port, and beside it the probe socket named by its port.
        let health_listeners = match self.config.health_address {
            Some(address) => Some(bind_health(address).await?),
            None => None,
        };
        let ClaimedNode { lock, csi_socket, registration_socket, taken } = self.claim_node().await?;
        let node = self.recovered_node_service(taken)?;
        // Without an offer this driver still serves; only its successor cannot take its lazy
        // volumes over (it then stops, and the rollout waits).
        let offer = Offer::open(&self.config.state_dir, self.config.tmpfs_size)
            .inspect_err(|error| warn!(problem = %crate::quote::Logged(error), "no handover can be offered"))
            .ok();
        let health = self.health();
        let csi_routes = Routes::new(IdentityServer::new(IdentityService::new(self.content.clone())))
            .add_service(NodeServer::new(NodeGrpc::new(node.clone())));
        let mut sockets_kept = vec![csi_socket.keeper()];
        sockets_kept.extend(registration_socket.as_ref().map(|socket| socket.keeper()));
        let handed_sockets = listening_copies(std::iter::once(&csi_socket).chain(registration_socket.as_ref()));

        // `stop_node` ends what serves the node (the sockets, the refresher): at shutdown, or
        // once a successor took the volumes; `stop` ends everything (the health port too).
        let (stop_node, node_stopped) = watch::channel(false);
        let (stop, stopped) = watch::channel(false);
        let csi = socket::serve(csi_socket, csi_routes, Clients::AsSent, until_stopped(node_stopped.clone()));
        let registration = self.serve_registration(registration_socket, node_stopped.clone());
        let refresher = crate::volume::refresh::run(
            node.clone(),
            self.content.clone(),
            Duration::from_secs(self.config.refresh_seconds),
            node_stopped.clone(),
            self.events.clone(),
        );
        let health_port = serve_health(health_listeners, health.clone(), stopped.clone());
        // Held until this driver lets go of the node to a successor, or to the end of `run`.
        let lock = std::sync::Mutex::new(Some(lock));
        let let_go = || {
            // The successor replaces the socket files in place: they are not removed here.
            for kept in &sockets_kept {
                kept.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            health.handed_over.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = stop_node.send(true);
            drop(lock.locked().take());
        };
        let offering = offer_until_stopped(offer, node.clone(), handed_sockets, let_go, stopped.clone());
        health.serving.store(true, std::sync::atomic::Ordering::SeqCst);
        info!(socket = %self.csi_socket.display(), "serving CSI Identity and Node");
        let signal = async {
            shutdown.await;
            let _ = stop_node.send(true);
            let _ = stop.send(true);
        };
        let grace = Duration::from_secs(self.config.shutdown_timeout_seconds);
        let deadline = async {
            until_stopped(stopped.clone()).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            (csi, registration, (), (), (), ()) = async { tokio::join!(csi, registration, signal, refresher, health_port, offering) } => {
                csi.and(registration).map_err(RunError::from)
            }
            () = deadline => {
                warn!(?grace, "shutdown: connections still open after the grace period; closing them");
                Ok(())
            }
        }
    }
}

/// Serves the health port and its probe socket, when they were bound, until `stopped`.
async fn serve_health(
    listeners: Option<(tokio::net::TcpListener, tokio::net::UnixListener)>,
    health: Arc<Health>,
    stopped: watch::Receiver<bool>,
) {
    if let Some((listener, probes)) = listeners {
        tokio::join!(
            health::serve(listener, health.clone(), until_stopped(stopped.clone())),
            health::serve_probes(probes, health, until_stopped(stopped)),
        );
    }
}

/// Offers this driver's node to a successor on `offer` (when it could be opened) until
/// `stopped`; a successor that takes it calls `let_go`.
async fn offer_until_stopped(
    offer: Option<Offer>,
    node: Arc<NodeService>,
    sockets: Vec<ListeningSocket>,
    let_go: impl FnOnce(),
    stopped: watch::Receiver<bool>,
) {
    let Some(offer) = offer else {
        return;
    };
    tokio::select! {
        offered = offer.serve(node, sockets, let_go) => {
            if let Err(error) = offered {
                warn!(problem = %crate::quote::Logged(&error), "no handover can be offered");
            }
        }
        () = until_stopped(stopped) => {}
    }
}

/// Completes once `stopped` turns true.
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The health port at `address`, and beside it the probe socket named by its port.
async fn bind_health(address: std::net::SocketAddr) -> Result<(tokio::net::TcpListener, tokio::net::UnixListener)> {
    let listener = health::bind(address).await?;
    let port = listener.local_addr().map_or(address.port(), |bound| bound.port());
    Ok((listener, health::bind_probe_socket(port)?))
}

/// What a successor accepts on after a handover: copies of the listening sockets `bound` (one
/// that cannot be copied is replaced by the successor).
fn listening_copies<'a>(bound: impl Iterator<Item = &'a socket::BoundSocket>) -> Vec<ListeningSocket> {
    let mut copies = Vec::new();
    for bound in bound {
        match bound.listener_copy() {
            Ok(listener) => copies.push(ListeningSocket { path: bound.path().to_path_buf(), listener }),
            Err(error) => warn!(problem = %crate::quote::Logged(&error), "a successor will replace this socket"),
        }
    }
    copies
}

/// The socket for `path`: the one the predecessor handed over (taken out of `handed`; `true`
/// returned with it), or, when none was or it is unusable, `beside` put in place of its own.
fn in_place(
    beside: socket::Beside,
    path: &std::path::Path,
    handed: &mut Vec<ListeningSocket>,
) -> Result<(socket::BoundSocket, bool)> {
    if let Some(handed) = take_socket(handed, path) {
        match socket::inherit(handed.listener, path) {
            // Dropping `beside` removes its temporary file.
            Ok(inherited) => return Ok((inherited, true)),
            Err(error) => warn!(problem = %crate::quote::Logged(&error), "a handed socket is replaced instead"),
        }
    }
    Ok((beside.put_in_place()?, false))
}

/// What [`Plugin::claim_node`] took.
struct ClaimedNode {
    lock: StateLock,
    csi_socket: socket::BoundSocket,
    registration_socket: Option<socket::BoundSocket>,
    taken: Vec<TakenVolume>,
}

#[cfg(test)]
mod tests;
