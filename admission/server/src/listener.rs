//! Accepting connections: HTTPS for the webhook, plain HTTP for health, HTTP/1.1 with keep-alive,
//! a bound on how many connections are served at once and on how long a client may take to send
//! a request, and graceful shutdown (stop accepting, finish in-flight requests, close idle
//! connections).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::health::Health;
use crate::webhook::Webhook;

/// Who answers the requests of a listener.
#[derive(Clone)]
pub enum Handler {
    /// The admission endpoints.
    Webhook(Arc<Webhook>),
    /// The health endpoints.
    Health(Arc<Health>),
}

impl Handler {
    async fn call(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        match self {
            Handler::Webhook(webhook) => webhook.handle(request).await,
            Handler::Health(health) => health.handle(&request),
        }
    }
}

/// One listening socket and how to serve it.
pub struct Endpoint {
    /// The bound socket.
    pub listener: TcpListener,
    /// TLS for HTTPS; `None` for plain HTTP.
    pub tls: Option<TlsAcceptor>,
    /// Who answers.
    pub handler: Handler,
    /// Connections served at once; the next is accepted when one closes (it waits in the
    /// kernel's listen backlog meanwhile).
    pub max_connections: usize,
    /// When set, at most this many connections from one address; one more is closed at once. For
    /// a port every pod can reach whose clients include kubelet's probes: one pod's flood then
    /// holds its own few slots, never the probes'. Never for the webhook's port, whose one
    /// client, the apiserver, needs many.
    pub per_peer: Option<usize>,
}

/// The connections open from each address, on a listener with a per-address bound.
#[derive(Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection's place among its address's, given back when dropped.
struct PeerSlot {
    peers: Arc<Peers>,
    peer: std::net::IpAddr,
}

impl Peers {
    /// A place for a connection from `peer`, or `None` when it holds `limit` already.
    fn take(self: &Arc<Self>, peer: std::net::IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(peer).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(PeerSlot { peers: self.clone(), peer })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// Bounds on slow clients and on shutdown.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// The TLS handshake and the request head must each complete within this; the body is bounded
    /// by the webhook itself.
    pub request: Duration,
    /// How long in-flight requests may take to finish after shutdown starts.
    pub shutdown_grace: Duration,
    /// Between closing the listeners and closing idle connections: time for requests already on
    /// their way on fresh connections to arrive and be answered.
    pub close_linger: Duration,
}

/// Serves every endpoint until `shutdown` turns true, then drains gracefully.
pub async fn serve(endpoints: Vec<Endpoint>, timeouts: Timeouts, shutdown: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let loops = endpoints.into_iter().map(|endpoint| accept_loop(endpoint, timeouts, &graceful, shutdown.clone()));
    futures_util::future::join_all(loops).await;
    // Listeners are closed (dropped by their loops): no new connections. A client that connected
    // a moment ago may not have sent its request yet, and closing its connection now, idle in
    // hyper's eyes, would lose that request: for a short while every connection is still served
    // (and, draining, closed after its answer). Then idle keep-alive connections close; busy
    // ones once their response is written.
    tokio::time::sleep(timeouts.close_linger).await;
    if tokio::time::timeout(timeouts.shutdown_grace, graceful.shutdown()).await.is_err() {
        warn!(grace = ?timeouts.shutdown_grace, "connections still open after the shutdown grace period; closing them");
    }
}

async fn accept_loop(
    endpoint: Endpoint,
    timeouts: Timeouts,
    graceful: &GracefulShutdown,
    mut shutdown: watch::Receiver<bool>,
) {
    let Endpoint { listener, tls, handler, max_connections, per_peer } = endpoint;
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections.max(1)));
    let peers = Arc::new(Peers::default());
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let (tcp, peer) = match accepted {
            Ok(connection) => connection,
            Err(error) => {
                // Typically out of file descriptors: back off instead of spinning.
                warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer_slot = match per_peer {
            Some(limit) => match peers.take(peer.ip(), limit) {
                Some(taken) => Some(taken),
                None => {
                    debug!(%peer, "connection closed: its address holds all the connections it may");
                    continue;
                }
            },
            None => None,
        };
        let _ = tcp.set_nodelay(true);
        let watcher = graceful.watcher();
        let handler = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            match tls {
                None => serve_connection(tcp, handler, watcher, timeouts.request).await,
                Some(acceptor) => match tokio::time::timeout(timeouts.request, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => serve_connection(stream, handler, watcher, timeouts.request).await,
                    Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => debug!(%peer, "TLS handshake timed out"),
                },
            }
        });
    }
}

async fn serve_connection<I>(io: I, handler: Handler, watcher: Watcher, header_timeout: Duration)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler.call(request).await) }
    });
    let mut builder = http1::Builder::new();
    // A connection's read buffer may not grow past 64 KiB (hyper's default is ~400 KiB): bodies
    // stream through it in chunks, and the connection limit times this is what connections cost.
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true).max_buf_size(64 << 10);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    if let Err(error) = watcher.watch(connection).await {
        debug!(%error, "connection closed with an error");
    }
}
