//! The floors a webhook is measured beside: the same rustls configuration and hyper HTTP/1.1
//! server, reading the body and answering a fixed allowed response without deciding anything
//! (and, for the scan floor, after a bare JSON scan of the body). Each runs as a child process of
//! the benchmark, pinned to the servers' core ([`serve_floor`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use inline_guard_server::tls::{ReloadingCertificate, TlsFiles, server_config};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// What a floor does with the body before answering.
#[derive(Clone, Copy)]
pub enum FloorWork {
    /// Nothing: the issue's floor.
    Nothing,
    /// A bare serde_json scan of the whole body (validating it as JSON, keeping nothing): the least
    /// any webhook that reads its AdmissionReview must do, so the gap to it is what deciding costs.
    ScanJson,
}

/// Serves a floor on `listener`, on the current runtime.
fn start_floor_on(listener: TcpListener, acceptor: TlsAcceptor, work: FloorWork) {
    let canned = Bytes::from_static(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"0df28fbd-5f5f-11e8-bc74-36e6bb280816","allowed":true}}"#,
    );
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let canned = canned.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let canned = canned.clone();
                    async move {
                        let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                        if let FloorWork::ScanJson = work {
                            let _ = std::hint::black_box(serde_json::from_slice::<serde::de::IgnoredAny>(&body));
                        }
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(canned)))
                    }
                });
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
}

/// Serves a floor on `listen` with the certificate `files` until the process is killed: the body
/// of the floor child processes. The runtime is tokio's default, as `serve`'s is.
pub fn serve_floor(listen: SocketAddr, files: TlsFiles, work: FloorWork) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let certificate = Arc::new(ReloadingCertificate::load(files).expect("certificate"));
        let acceptor = TlsAcceptor::from(server_config(certificate).expect("TLS configuration"));
        start_floor_on(TcpListener::bind(listen).await.expect("listen"), acceptor, work);
        std::future::pending::<()>().await;
    });
    unreachable!("the floor serves until killed")
}
