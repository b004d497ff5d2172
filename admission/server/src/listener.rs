//! Accepting connections: HTTPS for the webhook, plain HTTP for health, HTTP/1.1 with keep-alive,
//! a bound on how many connections are served at once, shared among the addresses they come from
//! ([`crate::fair_share`]), a bound on how long a client may take to send a request, and graceful
//! shutdown (stop accepting, finish in-flight requests, close idle connections).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::fair_share::{Admission, FairShare, Place, ShareLimits};
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
    /// How many connections are served and wait, and how many one address may hold
    /// ([`crate::fair_share`]: when every place is taken, a newcomer takes an idle connection's
    /// of the address holding the most).
    pub limits: ShareLimits,
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
    let closing = Closing::new();
    let loops = endpoints.into_iter().map(|endpoint| accept_loop(endpoint, timeouts, &closing, shutdown.clone()));
    futures_util::future::join_all(loops).await;
    // Listeners are closed (dropped by their loops): no new connections. A client that connected
    // a moment ago may not have sent its request yet, and closing its connection now, idle in
    // hyper's eyes, would lose that request: for a short while every connection is still served
    // (and, draining, closed after its answer). Then idle keep-alive connections close; busy
    // ones once their response is written.
    tokio::time::sleep(timeouts.close_linger).await;
    if tokio::time::timeout(timeouts.shutdown_grace, closing.close_all()).await.is_err() {
        warn!(grace = ?timeouts.shutdown_grace, "connections still open after the shutdown grace period; closing them");
    }
}

/// The signal every connection closes on at shutdown, and the wait until all have.
struct Closing(watch::Sender<()>);

impl Closing {
    fn new() -> Closing {
        Closing(watch::channel(()).0)
    }

    /// What a connection watches (and holds while open).
    fn watcher(&self) -> watch::Receiver<()> {
        self.0.subscribe()
    }

    /// Tells every connection to close (idle ones at once, busy ones after their answer) and
    /// waits until every one has.
    async fn close_all(&self) {
        self.0.send_replace(());
        self.0.closed().await;
    }
}

async fn accept_loop(endpoint: Endpoint, timeouts: Timeouts, closing: &Closing, mut shutdown: watch::Receiver<bool>) {
    let Endpoint { listener, tls, handler, limits } = endpoint;
    let share = FairShare::new(limits);
    loop {
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
        let admitted = match share.admit(peer.ip()) {
            Admission::Served(place) => Either::Left(place),
            Admission::Waits(handed, ticket) => Either::Right((handed, ticket)),
            Admission::Refused => {
                debug!(%peer, "connection closed: its address holds all it may, or too many wait");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let shutdown_signal = closing.watcher();
        let handler = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let place = match admitted {
                Either::Left(place) => place,
                // Not read from until it has a place; given up after the request timeout, as a
                // handshake is.
                Either::Right((handed, _ticket)) => match tokio::time::timeout(timeouts.request, handed).await {
                    Ok(Ok(place)) => place,
                    _ => return debug!(%peer, "connection closed: no place freed in time"),
                },
            };
            let place = Arc::new(place);
            let activity = place.activity().clone();
            match tls {
                None => serve_connection(tcp, handler, place, shutdown_signal, timeouts.request).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(timeouts.request, acceptor.accept(tcp));
                    tokio::select! {
                        handshake = handshake => match handshake {
                            Ok(Ok(stream)) => serve_connection(stream, handler, place, shutdown_signal, timeouts.request).await,
                            Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                            Err(_) => debug!(%peer, "TLS handshake timed out"),
                        },
                        () = activity.told_to_close() => debug!(%peer, "closed during its handshake to make room"),
                    }
                }
            }
        });
    }
}

async fn serve_connection<I>(
    io: I,
    handler: Handler,
    place: Arc<Place>,
    mut shutdown_signal: watch::Receiver<()>,
    header_timeout: Duration,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = place.activity().clone();
    let service = service_fn(move |request| {
        let handler = handler.clone();
        // From its head's arrival until its answer, the connection is not closed to make room.
        let answering = place.answering();
        async move {
            let response = handler.call(request).await;
            drop(answering);
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = http1::Builder::new();
    // A connection's read buffer may not grow past 64 KiB (hyper's default is ~400 KiB): bodies
    // stream through it in chunks, and the connection limit times this is what connections cost.
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true).max_buf_size(64 << 10);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    // Told to close (shutdown, or an idle connection making room): an idle connection closes at
    // once, one whose request is being answered after its answer.
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = shutdown_signal.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
        () = activity.told_to_close() => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
    };
    if let Err(error) = result {
        debug!(%error, "connection closed with an error");
    }
}
