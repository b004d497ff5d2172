//! The driver's plain-HTTP health port: `/healthz` (the process answers), `/readyz` (its sockets
//! serve and its content source is ready) and `/metrics` (OpenMetrics text). Probes of the
//! DaemonSet point here.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use crate::content::ContentSource;
use crate::error::{Result, RunError};
use crate::metrics::Metrics;

/// What the health port reports.
pub struct Health {
    /// Set once the CSI socket serves.
    pub serving: AtomicBool,
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

/// Serves `health` on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, health: Arc<Health>, shutdown: impl Future<Output = ()>) {
    let accept = async {
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "health port: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let health = health.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let health = health.clone();
                    async move { Ok::<_, Infallible>(health.answer(&request)) }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
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
        assert_eq!(get("/metrics"), StatusCode::OK);
        assert_eq!(get("/nope"), StatusCode::NOT_FOUND);
    }
}
