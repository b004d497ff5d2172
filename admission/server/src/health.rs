//! The plain-HTTP health port: `/healthz` (the process answers), `/readyz` (its facts are loaded
//! or synced, and it is not shutting down) and `/metrics` (Prometheus text).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};

use crate::drain::Drain;
use crate::metrics::Metrics;

/// Whether the server can decide requests yet.
pub trait Readiness: Send + Sync {
    /// `Ok` when ready; otherwise what is still missing.
    fn ready(&self) -> Result<(), String>;
}

/// The health endpoints.
pub struct Health {
    metrics: Arc<Metrics>,
    readiness: Arc<dyn Readiness>,
    drain: Arc<Drain>,
}

impl Health {
    /// Health endpoints reporting `readiness` (not ready once `drain` starts) and `metrics`.
    pub fn new(metrics: Arc<Metrics>, readiness: Arc<dyn Readiness>, drain: Arc<Drain>) -> Health {
        Health { metrics, readiness, drain }
    }

    /// Answers one request.
    pub fn handle<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        match request.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" if self.drain.is_draining() => {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n".into())
            }
            "/readyz" => match self.readiness.ready() {
                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                Err(missing) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {missing}\n")),
            },
            "/metrics" => {
                let mut response = Response::new(Full::new(Bytes::from(self.metrics.encode())));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                );
                response
            }
            other => {
                text(StatusCode::NOT_FOUND, format!("no such path {other:?}: try /healthz, /readyz or /metrics\n"))
            }
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use http_body_util::BodyExt;

    use super::*;

    struct Flag(AtomicBool);

    impl Readiness for Flag {
        fn ready(&self) -> Result<(), String> {
            if self.0.load(Ordering::SeqCst) { Ok(()) } else { Err("caches not synced".into()) }
        }
    }

    async fn get(health: &Health, path: &str) -> (StatusCode, String) {
        let response = health.handle(&Request::get(path).body(()).unwrap());
        let status = response.status();
        (status, String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readiness_follows_the_facts_and_liveness_does_not() {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let drain = Arc::new(Drain::new());
        let health = Health::new(Arc::new(Metrics::new()), flag.clone(), drain.clone());
        assert_eq!(get(&health, "/healthz").await, (StatusCode::OK, "ok\n".into()));
        assert_eq!(
            get(&health, "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: caches not synced\n".into())
        );
        flag.0.store(true, Ordering::SeqCst);
        assert_eq!(get(&health, "/readyz").await, (StatusCode::OK, "ok\n".into()));
        let (status, metrics) = get(&health, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(metrics.contains("csi_volume_admission_live_lookups_total 0"), "{metrics}");
        assert_eq!(get(&health, "/nope").await.0, StatusCode::NOT_FOUND);
        drain.start();
        assert_eq!(
            get(&health, "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n".into())
        );
        assert_eq!(get(&health, "/healthz").await.0, StatusCode::OK, "alive while draining");
    }
}
