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
    /// Allows with the request's own uid, as kube-apiserver requires of an answer: the least a
    /// webhook the apiserver accepts can do, so the apiserver's cost of calling any webhook at all
    /// is measured beside ours.
    EchoUid,
}

/// The allowed answer to `body`, carrying the first `"uid":"…"` it holds: kube-apiserver writes
/// `request.uid` before the object, so the first is the request's.
fn echo_uid_answer(body: &[u8]) -> Bytes {
    const KEY: &[u8] = br#""uid":""#;
    let uid = body
        .windows(KEY.len())
        .position(|window| window == KEY)
        .map(|at| &body[at + KEY.len()..])
        .and_then(|rest| rest.iter().position(|&b| b == b'"').map(|end| &rest[..end]))
        .unwrap_or_default();
    let mut answer = Vec::with_capacity(120 + uid.len());
    answer.extend_from_slice(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":""#);
    answer.extend_from_slice(uid);
    answer.extend_from_slice(br#"","allowed":true}}"#);
    Bytes::from(answer)
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
                        let answer = match work {
                            FloorWork::Nothing => canned,
                            FloorWork::ScanJson => {
                                let _ = std::hint::black_box(serde_json::from_slice::<serde::de::IgnoredAny>(&body));
                                canned
                            }
                            FloorWork::EchoUid => echo_uid_answer(&body),
                        };
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(answer)))
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
/// of the floor child processes. The runtime is tokio's default, as `serve`'s is. Returns only
/// when the floor cannot start, saying why.
fn serve_floor(listen: SocketAddr, files: TlsFiles, work: FloorWork) -> String {
    let served = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| format!("runtime: {e}"));
    let started = served.and_then(|runtime| {
        runtime.block_on(async {
            let certificate = ReloadingCertificate::load(files).map_err(|e| format!("certificate: {e}"))?;
            let config = server_config(Arc::new(certificate)).map_err(|e| format!("TLS configuration: {e}"))?;
            let listener = TcpListener::bind(listen).await.map_err(|e| format!("listening on {listen}: {e}"))?;
            start_floor_on(listener, TlsAcceptor::from(config), work);
            std::future::pending::<Result<(), String>>().await
        })
    });
    match started {
        Ok(()) => "the floor stopped serving".to_string(),
        Err(error) => error,
    }
}

/// The floor child's whole life: its command line is `LISTEN CERT KEY` after the program name,
/// as the benchmarks start it. Serves until killed; exits 2 saying why when it cannot start.
pub fn run_floor_child(work: FloorWork) -> ! {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let error = match args.as_slice() {
        [listen, cert, key, ..] => match listen.parse::<SocketAddr>() {
            Ok(listen) => serve_floor(listen, TlsFiles { cert: cert.into(), key: key.into() }, work),
            Err(error) => format!("listen address {listen:?}: {error}"),
        },
        _ => format!("expected LISTEN CERT KEY, got {args:?}"),
    };
    eprintln!("floor: {error}");
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_carries_the_request_uid_not_the_object_uid() {
        let body = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"r-1","object":{"metadata":{"uid":"o-2"}}}}"#;
        let answer: serde_json::Value = serde_json::from_slice(&echo_uid_answer(body)).unwrap();
        assert_eq!(answer["response"], serde_json::json!({"uid": "r-1", "allowed": true}));
    }
}
