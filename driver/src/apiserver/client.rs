//! The client both binaries talk to the apiserver with: kube's own stack (base URI, retry of
//! 429/503/504, authentication, impersonation headers, connect and write timeouts), on
//! connections that send each write at once (`TCP_NODELAY`).
//!
//! Why not `kube::Client::try_from`: its connections leave Nagle's algorithm on. A request
//! whose headers and body leave in two TLS records (every SubjectAccessReview and apply is a
//! POST or PATCH with a body) then holds the body until the apiserver acknowledges the headers,
//! and the apiserver's kernel delays that acknowledgement by up to 40 ms: measured, the shares
//! benchmark's publish p99 went from 52 ms to under 14 ms when loopback acknowledged at once.
//! Go's net/http, kubelet's client included, turns Nagle off on every connection.
//!
//! Watches go elsewhere ([`WatchConnections`]): HTTP/2 connections, each carrying up to
//! [`WATCHES_PER_CONNECTION`] watches as streams, as kubelet's Go client carries its per-object
//! watches. Over kube's HTTP/1.1 each watch holds a TLS connection of its own for as long as it
//! runs; the driver starts one per object it serves, at that object's first publish, and
//! measured, the handshakes and the warm connections those watches took from the requests
//! raised the shares benchmark's publish p99 from 7.5 ms (no per-object watches) to 25 ms.
//! A new connection is opened when the others are full rather than queueing on one: hyper
//! queues streams past the server's limit (about 100 here) where Go's client opens another
//! connection, and a queued watch never starts. A connection that goes silent is found by
//! HTTP/2 pings (every 30 s, given up after 15 s, as Go's client does), so no watch waits
//! forever on a dead connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::apiserver::rate::RateLayer;
use crate::unpoisoned::UnpoisonedMutex;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// Streams one HTTP/2 connection carries before another is opened: half the lowest limit
/// seen on an apiserver here (about 100 streams per connection), so a connection is never
/// asked for more than its server allows.
pub const WATCHES_PER_CONNECTION: usize = 50;

/// The driver's clients: one for requests that answer (reads, reviews, status writes), and the
/// connections its watches run on.
#[derive(Clone)]
pub struct ApiserverClients {
    /// For requests that answer.
    pub requests: kube::Client,
    /// For watches, which hold their streams for as long as they run.
    pub watches: Arc<WatchConnections>,
}

impl ApiserverClients {
    /// The clients for `config`: requests over HTTP/1.1, watches over HTTP/2, each request and
    /// each watch's start taking a token of `rate` first. A proxy in the configuration is
    /// refused, as kube's own client built without proxy support refuses it.
    pub fn new(config: kube::Config, rate: RateLayer) -> Result<ApiserverClients, kube::Error> {
        Ok(ApiserverClients {
            requests: client(config.clone(), rate.clone())?,
            watches: Arc::new(WatchConnections::new(config, rate)?),
        })
    }
}

/// One client for both (tests, whose fakes answer watches and requests alike).
impl From<kube::Client> for ApiserverClients {
    fn from(client: kube::Client) -> ApiserverClients {
        ApiserverClients { requests: client.clone(), watches: Arc::new(WatchConnections::Fixed(client)) }
    }
}

/// Where watches run.
pub enum WatchConnections {
    /// HTTP/2 connections for `config`, opened as the watches need them.
    Pooled {
        /// What each connection is opened with.
        config: Box<kube::Config>,
        /// The rate every connection's watches start at, shared with the requests.
        rate: RateLayer,
        /// Each connection's client with its count of leased streams.
        connections: Mutex<Vec<(kube::Client, Arc<AtomicUsize>)>>,
    },
    /// One client for every watch, without a limit.
    Fixed(kube::Client),
}

/// A client to run watches on, and the streams they take on its connection until dropped.
pub struct WatchLease {
    /// The client whose connection has room for the streams.
    pub client: kube::Client,
    held: Option<(Arc<AtomicUsize>, usize)>,
}

impl Drop for WatchLease {
    fn drop(&mut self) {
        if let Some((count, streams)) = self.held.take() {
            count.fetch_sub(streams, Ordering::Relaxed);
        }
    }
}

impl WatchConnections {
    /// HTTP/2 connections for `config`. The first connection's client is made now, so what
    /// `config` lacks is told at start; it connects when its first watch starts.
    pub fn new(config: kube::Config, rate: RateLayer) -> Result<WatchConnections, kube::Error> {
        let first = (http2_client(config.clone(), rate.clone())?, Arc::new(AtomicUsize::new(0)));
        Ok(WatchConnections::Pooled { config: Box::new(config), rate, connections: Mutex::new(vec![first]) })
    }

    /// A client for `streams` more watches: on a connection with room for them, else a new one.
    pub fn lease(&self, streams: usize) -> Result<WatchLease, kube::Error> {
        let (config, rate, connections) = match self {
            WatchConnections::Fixed(client) => return Ok(WatchLease { client: client.clone(), held: None }),
            WatchConnections::Pooled { config, rate, connections } => (config, rate, connections),
        };
        let mut connections = connections.locked();
        let room =
            connections.iter().find(|(_, count)| count.load(Ordering::Relaxed) + streams <= WATCHES_PER_CONNECTION);
        let (client, count) = match room {
            Some((client, count)) => (client.clone(), count.clone()),
            None => {
                let opened = (http2_client(config.as_ref().clone(), rate.clone())?, Arc::new(AtomicUsize::new(0)));
                connections.push(opened.clone());
                opened
            }
        };
        count.fetch_add(streams, Ordering::Relaxed);
        Ok(WatchLease { client, held: Some((count, streams)) })
    }

    /// How many connections watches have been given (each connects at its first watch).
    #[cfg(test)]
    fn connections(&self) -> usize {
        match self {
            WatchConnections::Fixed(_) => 1,
            WatchConnections::Pooled { connections, .. } => connections.locked().len(),
        }
    }
}

/// A client for `config` whose connections never wait on Nagle's algorithm, and whose requests
/// each take a token of `rate`. A proxy in the configuration is refused (with kube's error for
/// it) rather than silently bypassed.
pub fn client(config: kube::Config, rate: RateLayer) -> Result<kube::Client, kube::Error> {
    refuse_proxy(&config)?;
    let tls = config.rustls_https_connector_with_connector(tcp_connector())?;
    let mut timed = hyper_timeout::TimeoutConnector::new(tls);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(timed);
    // The token is taken, and the request held back while the apiserver refuses most
    // (`apiserver::overload`), outside the retries: a retried request (a 429, a 503) is one
    // request of the caller's, as client-go counts it.
    let overload = rate.overload();
    let service = ServiceBuilder::new()
        .layer(rate)
        .layer(overload)
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// kube's own answer to a configuration naming a proxy, since this build has no proxy support.
fn refuse_proxy(config: &kube::Config) -> Result<(), kube::Error> {
    match &config.proxy_url {
        Some(proxy) => Err(kube::Error::ProxyProtocolDisabled {
            proxy_url: Box::new(proxy.clone()),
            protocol_feature: "kube/http-proxy",
        }),
        None => Ok(()),
    }
}

/// A client for `config` whose requests share one HTTP/2 connection, kept alive by pings.
fn http2_client(config: kube::Config, rate: RateLayer) -> Result<kube::Client, kube::Error> {
    refuse_proxy(&config)?;
    // ALPN offers h2 only: the builder sets it from `enable_http2`.
    let tls = config.rustls_client_config()?;
    let mut tcp = tcp_connector();
    tcp.set_connect_timeout(config.connect_timeout);
    let https =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only().enable_http2().wrap_connector(tcp);
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(15))
        .http2_keep_alive_while_idle(true)
        .build(https);
    let overload = rate.overload();
    let service = ServiceBuilder::new()
        .layer(rate)
        .layer(overload)
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// The TCP connections under TLS.
fn tcp_connector() -> HttpConnector {
    let mut tcp = HttpConnector::new();
    // The scheme is https; the TLS layer above wraps these plain TCP connections.
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp
}

/// A client for `kubeconfig`, else for `$KUBECONFIG` or the in-cluster service account, whose
/// requests take tokens of `rate`.
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    rate: RateLayer,
) -> Result<kube::Client, Box<dyn std::error::Error>> {
    Ok(client(kube_config(kubeconfig).await?, rate)?)
}

/// The configuration for `kubeconfig`, else for `$KUBECONFIG` or the in-cluster service account.
pub async fn kube_config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config, Box<dyn std::error::Error>> {
    // kube's TLS goes through rustls; only the ring provider is compiled in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    })
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn every_connection_sends_its_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: hyper::Uri = format!("https://{}", listener.local_addr().unwrap()).parse().unwrap();
        let connection = tcp_connector().oneshot(uri).await.unwrap();
        assert!(connection.inner().nodelay().unwrap(), "TCP_NODELAY is off on the apiserver connection");
    }

    #[tokio::test]
    async fn a_proxy_in_the_configuration_is_refused_not_bypassed() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://proxy.example.invalid:3128".parse().unwrap());
        let refused = ApiserverClients::new(config, RateLayer::new(1, 1)).err().expect("refused");
        assert!(refused.to_string().contains("proxy.example.invalid"), "{refused}");
    }

    #[tokio::test]
    async fn a_watch_goes_to_a_connection_with_room_and_a_full_one_opens_another() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let connections = WatchConnections::new(config, RateLayer::new(1, 1)).unwrap();
        let cluster_wide = connections.lease(7).unwrap();
        let mut objects: Vec<_> = (7..WATCHES_PER_CONNECTION).map(|_| connections.lease(1).unwrap()).collect();
        assert_eq!(connections.connections(), 1, "{WATCHES_PER_CONNECTION} streams fit on one connection");
        let overflow = connections.lease(1).unwrap();
        assert_eq!(connections.connections(), 2, "the first connection was full");
        objects.pop();
        let _reused = connections.lease(1).unwrap();
        assert_eq!(connections.connections(), 2, "a stream freed on the first connection is used again");
        drop((cluster_wide, overflow));
        let _wide_again = connections.lease(7).unwrap();
        assert_eq!(connections.connections(), 2);
    }
}
