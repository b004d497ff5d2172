//! The driver's client of the apiserver: every request and every watch of a node's driver over
//! one HTTP/2 connection, as kubelet's Go client does. kube's own client speaks HTTP/1.1, where
//! each open watch holds a TLS connection of its own: 27 per node (7 cluster-wide kinds and one
//! per served object), which the node-scale benchmark saw cost the apiserver about 5 MB per node.
//! Authentication, impersonation and TLS come from kube's configuration as usual. A connection
//! that goes silent is found by HTTP/2 pings (every 30 s, given up after 15 s, as Go's client
//! does), so no watch waits forever on a dead connection; requests other than watches have the
//! driver's request timeout on top.

use hyper_util::client::legacy::connect::HttpConnector;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt as _;
use tower::{BoxError, ServiceBuilder};

/// A client for `config` whose requests share one HTTP/2 connection.
pub fn http2_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    // ALPN offers h2 only: the builder sets it from `enable_http2`.
    let tls = config.rustls_client_config()?;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(Duration::from_secs(10)));
    let https =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only().enable_http2().wrap_connector(tcp);
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(15))
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .layer(config.extra_headers_layer()?)
        .option_layer(config.auth_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}
