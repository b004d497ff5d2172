//! The assembled server: the webhook on HTTPS, health on HTTP, certificate and cluster-state
//! reloads, and one shutdown sequence for all of it: drain (readiness fails, responses close
//! their connections, the listener still accepts), then after the shutdown delay stop accepting,
//! finish what is in flight and close the rest.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use inline_guard_admission::Chain;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{error, info};

use crate::body_budget::BodyBudget;
use crate::drain::Drain;
use crate::fair_share::ShareLimits;
use crate::health::{Health, Readiness};
use crate::listener::{self, Endpoint, Handler, Timeouts};
use crate::metrics::{Metrics, ReloadResult};
use crate::reload::{self, Reload};
use crate::standalone::FileFacts;
use crate::tls::{ReloadingCertificate, server_config};
use crate::webhook::{Limits, Webhook};

/// After the listener closes, how long connections are still served before idle ones close
/// (never longer than the shutdown delay: a server told not to wait does not).
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Health connections served at once (probes and scrapes), apart from the webhook's.
const HEALTH_CONNECTIONS: usize = 32;
/// Health connections from one address: the port is reachable from every pod unless a
/// NetworkPolicy says otherwise, and kubelet's probes, from the node's address, must find a slot
/// whatever one pod does.
const HEALTH_CONNECTIONS_PER_PEER: usize = 4;

/// Addresses and bounds, validated by the command line.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The HTTPS webhook address.
    pub listen: SocketAddr,
    /// The plain-HTTP health address.
    pub health_listen: SocketAddr,
    /// TLS handshake, request head and request body bounds (each).
    pub request_timeout: Duration,
    /// How long shutdown waits for in-flight requests once the listener is closed.
    pub shutdown_grace: Duration,
    /// From the start of shutdown until the listener closes: long enough for the endpoints
    /// controller to take the pod out of the Service, so no client is refused meanwhile.
    pub shutdown_delay: Duration,
    /// Webhook connections served at once. When all are taken, a new one takes the place of an
    /// idle connection of the address holding the most; when none is idle, it waits (at most a
    /// half as many wait, each at most `request_timeout`) for the next place freed.
    pub max_connections: usize,
    /// Bytes of request bodies held in memory at once; a request over it is answered 429.
    pub body_budget_bytes: usize,
    /// How often certificate and cluster-state files are checked for changes.
    pub reload_interval: Duration,
}

/// Sized with the shipped Deployment's `limits.memory: 128Mi`: connections cost up to about
/// 150 KiB each (TLS and HTTP buffers), so 256 of them about 38 MiB.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Eight 3 MiB reviews; with the copies made while decoding, about 50 MiB at the worst moment.
/// With the connections and the process itself (about 15 MiB), under 128 MiB with margin.
pub const DEFAULT_BODY_BUDGET_BYTES: usize = 24 << 20;

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listen: SocketAddr::from(([0, 0, 0, 0], 8443)),
            health_listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            request_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(20),
            shutdown_delay: Duration::from_secs(5),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body_budget_bytes: DEFAULT_BODY_BUDGET_BYTES,
            reload_interval: Duration::from_secs(2),
        }
    }
}

/// What the server decides with.
pub struct Parts {
    /// The admission chain.
    pub chain: Chain,
    /// Whether the facts behind the chain are ready.
    pub readiness: Arc<dyn Readiness>,
    /// Standalone mode's file-backed facts, reloaded on change.
    pub file_facts: Option<Arc<FileFacts>>,
    /// The serving certificate.
    pub certificate: Arc<ReloadingCertificate>,
    /// Where metrics go.
    pub metrics: Arc<Metrics>,
}

/// A running server.
pub struct Server {
    webhook_addr: SocketAddr,
    health_addr: SocketAddr,
    drain: Arc<Drain>,
    shutdown_delay: Duration,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Server {
    /// Binds both addresses and starts serving.
    pub async fn start(options: ServerOptions, parts: Parts) -> io::Result<Server> {
        let webhook_listener = TcpListener::bind(options.listen).await?;
        let health_listener = TcpListener::bind(options.health_listen).await?;
        let webhook_addr = webhook_listener.local_addr()?;
        let health_addr = health_listener.local_addr()?;
        let tls = server_config(parts.certificate.clone()).map_err(io::Error::other)?;
        let drain = Arc::new(Drain::new());
        let limits =
            Limits { body_timeout: options.request_timeout, body_budget: BodyBudget::new(options.body_budget_bytes) };
        let webhook = Arc::new(Webhook::new(parts.chain, parts.metrics.clone(), limits, drain.clone()));
        let health = Arc::new(Health::new(parts.metrics.clone(), parts.readiness, drain.clone()));
        let endpoints = vec![
            Endpoint {
                listener: webhook_listener,
                tls: Some(TlsAcceptor::from(tls)),
                handler: Handler::Webhook(webhook),
                limits: ShareLimits::shared(options.max_connections),
            },
            Endpoint {
                listener: health_listener,
                tls: None,
                handler: Handler::Health(health),
                limits: ShareLimits {
                    capacity: HEALTH_CONNECTIONS,
                    waiting: HEALTH_CONNECTIONS / 4,
                    per_address: Some(HEALTH_CONNECTIONS_PER_PEER),
                },
            },
        ];
        let (stop, stopped) = watch::channel(false);

        let certificate = parts.certificate;
        let metrics = parts.metrics;
        let certificates =
            reload::poll(options.reload_interval, stopped.clone(), move || match certificate.reload_if_changed() {
                Reload::Unchanged => {}
                Reload::Reloaded => {
                    info!("serving certificate reloaded");
                    metrics.tls_reload(ReloadResult::Success);
                }
                Reload::Rejected(reason) => {
                    error!(%reason, "new serving certificate rejected; still serving the previous one");
                    metrics.tls_reload(ReloadResult::Failure);
                }
            });
        let file_facts = parts.file_facts;
        let cluster_state = reload::poll(options.reload_interval, stopped.clone(), move || {
            match file_facts.as_ref().map(|facts| facts.reload_if_changed()) {
                None | Some(Reload::Unchanged) => {}
                Some(Reload::Reloaded) => info!("cluster state reloaded"),
                Some(Reload::Rejected(reason)) => {
                    error!(%reason, "cluster state edit rejected; keeping the previous state")
                }
            }
        });
        let timeouts = Timeouts {
            request: options.request_timeout,
            shutdown_grace: options.shutdown_grace,
            close_linger: CLOSE_LINGER.min(options.shutdown_delay),
        };
        let task = tokio::spawn(async move {
            tokio::join!(listener::serve(endpoints, timeouts, stopped), certificates, cluster_state);
        });
        Ok(Server { webhook_addr, health_addr, drain, shutdown_delay: options.shutdown_delay, stop, task })
    }

    /// Where the webhook listens.
    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook_addr
    }

    /// Where the health endpoints listen.
    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    /// The same server, shutting down without the drain delay (for an interactive stop).
    pub fn without_shutdown_delay(self) -> Server {
        Server { shutdown_delay: Duration::ZERO, ..self }
    }

    /// Drains for the shutdown delay (readiness fails, every response closes its connection,
    /// new connections are still served), then stops accepting, lets in-flight requests finish
    /// (within the grace period), closes idle connections and returns.
    pub async fn shutdown(self) {
        self.drain.start();
        tokio::time::sleep(self.shutdown_delay).await;
        let _ = self.stop.send(true);
        if let Err(error) = self.task.await {
            error!(%error, "server task failed");
        }
    }
}
