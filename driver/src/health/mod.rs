//! The driver's plain-HTTP health port: `/healthz` (the process answers), `/readyz` (its sockets
//! serve and its content source is ready) and `/metrics` (OpenMetrics text), on TCP (for
//! scrapers, with per-address slots) and on an abstract unix socket of its own network
//! namespace ([`bind_probe_socket`]), which the DaemonSet's exec probes ask through
//! [`probe`]: the driver's pod is on the pod network, so no other pod can reach that socket,
//! and a flood of the TCP port's slots from other pods cannot fail kubelet's probes.

pub mod probe;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::content::ContentSource;
use crate::error::{Result, RunError};
use crate::fair_slots::FairSlots;
use crate::metrics::Metrics;

/// What the health port reports.
pub struct Health {
    /// Set once the CSI socket serves.
    pub serving: AtomicBool,
    /// Set once this driver handed its volumes to a successor: it serves nothing any more and
    /// waits to be stopped.
    pub handed_over: AtomicBool,
    /// Where content comes from.
    pub content: Arc<dyn ContentSource>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
}

impl Health {
    /// Answers one request.
    pub fn answer<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        let text = |status: StatusCode, body: &str| {
            let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
            *response.status_mut() = status;
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            response
        };
        match request.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.handed_over.load(Ordering::SeqCst) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: this driver handed its volumes to a successor and waits to be stopped\n",
            ),
            "/readyz" if !self.serving.load(Ordering::SeqCst) => {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready: the CSI socket is not serving yet\n")
            }
            "/readyz" if !self.content.ready() => {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready: the content source is not ready\n")
            }
            "/readyz" => text(StatusCode::OK, "ok\n"),
            "/metrics" => {
                let mut response = text(StatusCode::OK, &self.metrics.encode());
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                );
                response
            }
            _ => text(StatusCode::NOT_FOUND, "no such path: try /healthz, /readyz or /metrics\n"),
        }
    }
}

/// Binds `address`.
pub async fn bind(address: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(address).await.map_err(|e| RunError::step(format!("binding the health port {address}"), e))
}

/// The abstract unix socket's name that the driver serving health port `port` answers probes
/// on: by the port, so drivers sharing a network namespace (as in the test suite) do not meet.
pub fn probe_socket_name(port: u16) -> String {
    format!("sharedresource-csi-driver-health-{port}")
}

/// Connections the probe socket serves at once: only processes of the driver's own pod can
/// connect (kubelet's exec probes), so a few; the bound keeps a stuck one from piling up.
const PROBES_AT_ONCE: usize = 8;

/// Binds the abstract unix socket of health port `port` ([`probe_socket_name`]).
pub fn bind_probe_socket(port: u16) -> Result<tokio::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt as _;
    let name = probe_socket_name(port);
    let step = |e| RunError::step(format!("binding the probe socket @{name}"), e);
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(step)?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&address).map_err(step)?;
    listener.set_nonblocking(true).map_err(step)?;
    tokio::net::UnixListener::from_std(listener).map_err(step)
}

/// Serves `health` on the probe socket `listener` until `shutdown` completes: at most
/// [`PROBES_AT_ONCE`] connections (one beyond is closed at once), each within the health port's
/// timeouts.
pub async fn serve_probes(listener: tokio::net::UnixListener, health: Arc<Health>, shutdown: impl Future<Output = ()>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(PROBES_AT_ONCE));
    let accept = async {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    warn!(%error, "probe socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                debug!("probe socket: connection refused, every slot is held");
                continue;
            };
            let health = health.clone();
            tokio::spawn(async move {
                let _slot = slot;
                answer_connection(stream, health, ConnectionLimits::HEALTH).await;
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown => {}
    }
}

/// Answers the requests of one connection, `io`, within `limits`.
async fn answer_connection<IO>(io: IO, health: Arc<Health>, limits: ConnectionLimits)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let health = health.clone();
        async move { Ok::<_, Infallible>(health.answer(&request)) }
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(16 << 10);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    let _ = tokio::time::timeout(limits.lifetime, connection).await;
}

/// What one listener lets its clients hold. The health port is reachable from every pod of the
/// cluster unless a NetworkPolicy says otherwise, so whatever a client sends it costs a bounded
/// amount: a connection slot (of `total`, and of `per_peer` for its address, so one pod's flood
/// cannot take the slots kubelet's probes need), a read buffer of at most 16 KiB, headers within
/// `header_timeout`, and at most `lifetime` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once, over every client.
    pub total: usize,
    /// Connections open at once from one address.
    pub per_peer: usize,
    /// How long a request's headers may take to arrive (an idle keep-alive connection too).
    pub header_timeout: Duration,
    /// How long one connection may stay open, whatever it does.
    pub lifetime: Duration,
}

impl ConnectionLimits {
    /// The health port's: 256 connections (4 MiB of buffers at most), 8 per address, headers
    /// in 5 s, 30 s per connection. kubelet probes from the node's address with a connection
    /// per probe; a scraper keeps one.
    pub const HEALTH: ConnectionLimits = ConnectionLimits {
        total: 256,
        per_peer: 8,
        header_timeout: Duration::from_secs(5),
        lifetime: Duration::from_secs(30),
    };
}

/// Serves `health` on `listener` until `shutdown` completes, within [`ConnectionLimits::HEALTH`].
pub async fn serve(listener: TcpListener, health: Arc<Health>, shutdown: impl Future<Output = ()>) {
    serve_within(listener, health, ConnectionLimits::HEALTH, shutdown).await
}

/// Serves `health` on `listener` within `limits` until `shutdown` completes. A connection beyond
/// the limits is accepted and closed at once, so that it never waits in the kernel's queue in
/// front of a probe.
pub async fn serve_within(
    listener: TcpListener,
    health: Arc<Health>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    // A connection's slot is its address's: one address holds at most `per_peer` of them.
    let slots = FairSlots::new(limits.total, limits.per_peer);
    let accept = async {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically out of descriptors: back off instead of spinning.
                    warn!(%error, "health port: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(slot) = slots.try_acquire(&peer.ip().to_string()) else {
                debug!(%peer, "health port: connection refused, its address or the port holds all it may");
                drop(tcp);
                continue;
            };
            let health = health.clone();
            tokio::spawn(async move {
                let _slot = slot;
                answer_connection(tcp, health, limits).await;
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_socket_and_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let health = Health {
            serving: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            content: Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
            metrics: Arc::new(Metrics::new()),
        };
        let get = |path: &str| {
            let response = health.answer(&Request::get(path).body(()).unwrap());
            response.status()
        };
        assert_eq!(get("/healthz"), StatusCode::OK);
        assert_eq!(get("/readyz"), StatusCode::SERVICE_UNAVAILABLE);
        health.serving.store(true, Ordering::SeqCst);
        assert_eq!(get("/readyz"), StatusCode::SERVICE_UNAVAILABLE, "the static directory does not exist yet");
        std::fs::create_dir(dir.path().join("shares")).unwrap();
        assert_eq!(get("/readyz"), StatusCode::OK);
        health.handed_over.store(true, Ordering::SeqCst);
        assert_eq!(get("/readyz"), StatusCode::SERVICE_UNAVAILABLE, "handed over: never ready again");
        assert_eq!(get("/healthz"), StatusCode::OK, "but alive, until it is stopped");
        assert_eq!(get("/metrics"), StatusCode::OK);
        assert_eq!(get("/nope"), StatusCode::NOT_FOUND);
    }

    #[test]
    fn each_reason_not_to_be_ready_is_told_on_its_own_the_others_met() {
        let dir = tempfile::tempdir().unwrap();
        let health = Health {
            serving: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            content: Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
            metrics: Arc::new(Metrics::new()),
        };
        let readyz = || {
            use http_body_util::BodyExt as _;
            let response = health.answer(&Request::get("/readyz").body(()).unwrap());
            let status = response.status();
            let body = futures_util::FutureExt::now_or_never(response.into_body().collect()).unwrap().unwrap();
            (status, String::from_utf8(body.to_bytes().to_vec()).unwrap())
        };
        let not_ready = |why: &str| (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n"));
        std::fs::create_dir(dir.path().join("shares")).unwrap();
        assert_eq!(readyz(), not_ready("the CSI socket is not serving yet"), "the source is ready, the socket not");
        std::fs::remove_dir(dir.path().join("shares")).unwrap();
        health.serving.store(true, Ordering::SeqCst);
        assert_eq!(readyz(), not_ready("the content source is not ready"), "the socket serves, the source is not");
        std::fs::create_dir(dir.path().join("shares")).unwrap();
        assert_eq!(readyz(), (StatusCode::OK, "ok\n".to_string()));
        health.handed_over.store(true, Ordering::SeqCst);
        let handed = "this driver handed its volumes to a successor and waits to be stopped";
        assert_eq!(readyz(), not_ready(handed), "handed over, the rest ready");
    }

    #[tokio::test]
    async fn the_health_port_answers_its_probes_within_its_shipped_limits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shares")).unwrap();
        let health = Arc::new(Health {
            serving: AtomicBool::new(true),
            handed_over: AtomicBool::new(false),
            content: Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
            metrics: Arc::new(Metrics::new()),
        });
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(serve(listener, health, std::future::pending()));
        // Bounded: a port that accepts and never answers fails here instead of hanging.
        let answered = tokio::time::timeout(Duration::from_secs(60), probe("127.0.0.1", port)).await;
        assert_eq!(answered.as_deref(), Ok("HTTP/1.1 200 OK"));
    }

    /// A client of the health port: a connection from `source` (any loopback address).
    async fn connect_from(source: &str, port: u16) -> tokio::net::TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.unwrap()
    }

    /// Whether the server closed `tcp` (or reset it). A minute is far longer than any of it
    /// takes on a loaded machine: the bound only turns a server that never closes into a
    /// failure instead of a hang.
    async fn closed(tcp: &mut tokio::net::TcpStream) -> bool {
        use tokio::io::AsyncReadExt as _;
        let mut buffer = [0u8; 64];
        let until_closed = async {
            loop {
                match tcp.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), until_closed).await.is_ok()
    }

    /// `total` and `per_peer` connections, and no timeout a test could meet.
    fn slots(total: usize, per_peer: usize) -> ConnectionLimits {
        ConnectionLimits {
            total,
            per_peer,
            header_timeout: Duration::from_secs(3600),
            lifetime: Duration::from_secs(3600),
        }
    }

    async fn serving(limits: ConnectionLimits) -> (u16, tokio::sync::oneshot::Sender<()>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shares")).unwrap();
        let health = Arc::new(Health {
            serving: AtomicBool::new(true),
            handed_over: AtomicBool::new(false),
            content: Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
            metrics: Arc::new(Metrics::new()),
        });
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_within(listener, health, limits, async move {
            let _ = stopped.await;
        }));
        (port, stop, dir)
    }

    /// `GET /healthz` from `source`: the status line.
    async fn probe(source: &str, port: u16) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut tcp = connect_from(source, port).await;
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        answer.lines().next().unwrap_or_default().to_string()
    }

    /// Whether `tcp`, which sent `G`, is still served: the rest of its request is answered.
    async fn served(tcp: &mut tokio::net::TcpStream) -> bool {
        use tokio::io::AsyncWriteExt as _;
        if tcp.write_all(b"ET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(tcp, &mut answer).await;
        answer.starts_with("HTTP/1.1 200 OK")
    }

    async fn assert_held(tcp: &mut tokio::net::TcpStream) {
        assert!(served(tcp).await, "a held connection was not served");
    }

    #[tokio::test]
    async fn a_flood_from_one_address_holds_its_own_slots_only_and_probes_are_answered() {
        use tokio::io::AsyncWriteExt as _;
        let (port, _stop, _dir) = serving(slots(16, 4)).await;
        let mut flood = Vec::new();
        for _ in 0..50 {
            let mut tcp = connect_from("127.0.0.1", port).await;
            tcp.write_all(b"G").await.unwrap();
            flood.push(tcp);
        }
        // The slots are taken in the order connections are accepted: the first four are held,
        // every later one is closed at once.
        let (held, refused) = flood.split_at_mut(4);
        for tcp in refused.iter_mut() {
            assert!(closed(tcp).await);
        }
        assert_eq!(probe("127.0.0.2", port).await, "HTTP/1.1 200 OK", "another address is served meanwhile");
        // The held ones are still open: they answer once their request is finished.
        for tcp in held.iter_mut() {
            assert_held(tcp).await;
        }
        assert_eq!(probe("127.0.0.1", port).await, "HTTP/1.1 200 OK", "the address's slots are given back");
    }

    #[tokio::test]
    async fn the_port_as_a_whole_is_bounded_too() {
        use tokio::io::AsyncWriteExt as _;
        let (port, _stop, _dir) = serving(slots(6, 4)).await;
        let mut held = Vec::new();
        // Each address at most half of what the others leave: 3, then 2, then 1.
        for source in ["127.0.0.3", "127.0.0.3", "127.0.0.3", "127.0.0.4", "127.0.0.4", "127.0.0.5"] {
            let mut tcp = connect_from(source, port).await;
            tcp.write_all(b"G").await.unwrap();
            held.push(tcp);
        }
        // Written after the six so that the server has accepted them first.
        let mut late = connect_from("127.0.0.6", port).await;
        assert!(closed(&mut late).await, "a seventh connection is refused, from any address");
        // The six were held, not refused too: each is answered (and then closed by the server).
        for tcp in held.iter_mut() {
            assert_held(tcp).await;
        }
        drop(held);
        // Given back as the server notices the six closed; until then a probe may be refused.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            assert!(std::time::Instant::now() < deadline, "the six slots were never given back");
            let mut tcp = connect_from("127.0.0.6", port).await;
            tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
            let mut answer = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut tcp, &mut answer).await;
            if answer.starts_with("HTTP/1.1 200 OK") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_closed() {
        use tokio::io::AsyncWriteExt as _;
        let limits = ConnectionLimits { header_timeout: Duration::from_millis(200), ..slots(16, 4) };
        let (port, _stop, _dir) = serving(limits).await;
        let mut trickle = connect_from("127.0.0.1", port).await;
        trickle.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        // Closed by the header timeout: the lifetime is an hour.
        assert!(closed(&mut trickle).await);
        let limits = ConnectionLimits { lifetime: Duration::from_millis(200), ..slots(16, 4) };
        let (port, _stop, _dir) = serving(limits).await;
        let mut idle = connect_from("127.0.0.1", port).await;
        idle.write_all(b"G").await.unwrap();
        assert!(closed(&mut idle).await, "closed at the end of its lifetime");
    }

    #[tokio::test]
    async fn a_flood_that_takes_every_tcp_slot_never_reaches_the_probe_socket() {
        use tokio::io::AsyncWriteExt as _;
        let (port, _stop, dir) =
            serving(slots(ConnectionLimits::HEALTH.total, ConnectionLimits::HEALTH.per_peer)).await;
        let health = Arc::new(Health {
            serving: AtomicBool::new(true),
            handed_over: AtomicBool::new(false),
            content: Arc::new(crate::content::StaticDirSource::new(dir.path().join("shares"))),
            metrics: Arc::new(Metrics::new()),
        });
        let probes = bind_probe_socket(port).unwrap();
        tokio::spawn(serve_probes(probes, health, std::future::pending()));
        // As many pods' addresses as fill the port, each holding its address's share of slots.
        let addresses = ConnectionLimits::HEALTH.total / ConnectionLimits::HEALTH.per_peer + 8;
        let mut flood = Vec::new();
        for a in 0..addresses {
            for _ in 0..ConnectionLimits::HEALTH.per_peer {
                let mut tcp = connect_from(&format!("127.0.1.{}", a + 1), port).await;
                tcp.write_all(b"G").await.unwrap();
                flood.push(tcp);
            }
        }
        // The flood bites: a probe of the TCP port from the node's address is closed unanswered.
        let mut tcp = connect_from("127.0.0.1", port).await;
        assert!(closed(&mut tcp).await, "the TCP port is full");
        // The probe socket answers all the same, again and again.
        for path in ["/healthz", "/readyz"].repeat(8) {
            let answer = tokio::task::spawn_blocking(move || probe::ask(port, path)).await.unwrap().unwrap();
            assert_eq!(answer, "HTTP/1.1 200 OK", "{path}");
        }
        // The flood held the port's every slot throughout, rather than being refused with the
        // probe: exactly `total` of its connections are served once their requests finish.
        assert_eq!(flood.len(), addresses * ConnectionLimits::HEALTH.per_peer);
        let mut held = 0;
        for tcp in &mut flood {
            held += usize::from(served(tcp).await);
        }
        assert_eq!(held, ConnectionLimits::HEALTH.total, "connections of the flood that held a slot");
    }

    #[test]
    fn the_probe_socket_is_named_by_the_health_port() {
        assert_eq!(probe_socket_name(9808), "sharedresource-csi-driver-health-9808");
        assert_ne!(probe_socket_name(9808), probe_socket_name(9809));
    }
}
