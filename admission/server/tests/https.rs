//! The server over real TLS on loopback: round trips on both endpoints, a kept-alive connection
//! surviving a certificate rotation, slow clients cut off without slowing others, connections
//! shared among addresses (idle ones making room), readiness gating, and graceful shutdown with a
//! request in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use inline_guard_admission::plugins::standard_chain;
use inline_guard_policy::PolicySettings;
use inline_guard_server::health::Readiness;
use inline_guard_server::metrics::Metrics;
use inline_guard_server::server::{Parts, Server, ServerOptions};
use inline_guard_server::standalone::FileFacts;
use inline_guard_server::tls::{GeneratedPair, ReloadingCertificate, connector_trusting, generate_pair};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const CLUSTER: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: locked\n  labels:\n    pod-security.kubernetes.io/enforce: restricted\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: csi.example.com\n  labels:\n    security.openshift.io/csi-ephemeral-volume-profile: privileged\n";

struct Flag(AtomicBool);

impl Readiness for Flag {
    fn ready(&self) -> Result<(), String> {
        if self.0.load(Ordering::SeqCst) { Ok(()) } else { Err("caches not synced".into()) }
    }
}

struct Harness {
    server: Server,
    dir: tempfile::TempDir,
    trusted: Vec<String>,
    ready: Arc<Flag>,
}

// Long enough that a loaded CI machine answers a normal request well within it, so "not slowed by
// the slow client" cannot fail by accident.
const TIMEOUT: Duration = Duration::from_secs(1);

async fn start() -> Harness {
    start_with(ServerOptions::default()).await
}

/// A server on loopback with the test's timeouts and `options`' delay, budget and limits.
async fn start_with(options: ServerOptions) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_pair(&dir.path().join("tls"), &["localhost", "127.0.0.1"]).unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), CLUSTER).unwrap();
    let metrics = Arc::new(Metrics::new());
    let facts = Arc::new(FileFacts::load(&dir.path().join("cluster.yaml"), metrics.clone()).unwrap());
    let ready = Arc::new(Flag(AtomicBool::new(true)));
    let parts = Parts {
        chain: standard_chain(
            Arc::new(PolicySettings::default()),
            facts.clone(),
            Arc::new(inline_guard_admission::NothingChecked),
        ),
        readiness: ready.clone(),
        file_facts: Some(facts),
        certificate: Arc::new(ReloadingCertificate::load(pair.files.clone()).unwrap()),
        metrics,
    };
    let defaults = ServerOptions::default();
    let options = ServerOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        health_listen: "127.0.0.1:0".parse().unwrap(),
        // The tests' short bound, unless the test set its own.
        request_timeout: if options.request_timeout == defaults.request_timeout {
            TIMEOUT
        } else {
            options.request_timeout
        },
        shutdown_grace: if options.shutdown_grace == defaults.shutdown_grace {
            Duration::from_secs(5)
        } else {
            options.shutdown_grace
        },
        reload_interval: Duration::from_millis(50),
        shutdown_delay: if options.shutdown_delay == defaults.shutdown_delay {
            Duration::ZERO
        } else {
            options.shutdown_delay
        },
        ..options
    };
    let server = Server::start(options, parts).await.unwrap();
    Harness { server, dir, trusted: vec![pair.ca_pem], ready }
}

impl Harness {
    fn connector(&self) -> TlsConnector {
        connector_trusting(&self.trusted.iter().map(String::as_str).collect::<Vec<_>>()).unwrap()
    }

    async fn tls_stream(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.server.webhook_addr()).await.unwrap();
        self.connector().connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap()
    }

    /// A TLS connection to the webhook from `source` (any loopback address).
    async fn tls_stream_from(&self, source: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        let tcp = socket.connect(self.server.webhook_addr()).await.unwrap();
        self.connector().connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap()
    }

    async fn connection(&self) -> (SendRequest<Full<Bytes>>, Vec<u8>) {
        let stream = self.tls_stream().await;
        let leaf = stream.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        (sender, leaf)
    }

    fn rotate(&mut self) -> GeneratedPair {
        let pair = generate_pair(&self.dir.path().join("tls"), &["localhost", "127.0.0.1"]).unwrap();
        self.trusted.push(pair.ca_pem.clone());
        pair
    }
}

fn review(namespace: &str, driver: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "4c1e2f00-0000-4000-8000-000000000007",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": {"metadata": {"name": "web"}, "spec": {"containers": [], "volumes": [{"name": "v", "csi": {"driver": driver}}]}}
        }
    })
    .to_string()
}

async fn post(sender: &mut SendRequest<Full<Bytes>>, path: &str, body: String) -> (StatusCode, String) {
    let request = Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    (status, String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
}

/// Waits (up to 5 s) until `/metrics` holds `line`.
async fn wait_for_metric(health: SocketAddr, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, metrics) = health_get(health, "/metrics").await;
        if metrics.lines().any(|l| l == line) {
            return;
        }
        assert!(Instant::now() < deadline, "/metrics never showed {line:?}:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn health_get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(connection);
    let response = sender
        .send_request(Request::get(path).header("host", "localhost").body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    (status, String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
}

#[tokio::test]
async fn both_endpoints_answer_over_tls_on_one_kept_alive_connection() {
    let harness = start().await;
    let (mut sender, _) = harness.connection().await;
    let (status, body) = post(&mut sender, "/validate", review("locked", "csi.example.com")).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["status"]["code"], 403);
    let (status, body) = post(&mut sender, "/mutate", review("locked", "sharedresource.csi.inlineguard.dev")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["response"]["patchType"], "JSONPatch");
    let (status, _) = post(&mut sender, "/validate", " ".repeat(3 * 1024 * 1024 + 1)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    harness.server.shutdown().await;
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_connections_while_old_ones_keep_working() {
    let mut harness = start().await;
    let (mut kept, original_leaf) = harness.connection().await;
    assert_eq!(post(&mut kept, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);

    harness.rotate();
    let deadline = Instant::now() + Duration::from_secs(5);
    let rotated_leaf = loop {
        let (_, leaf) = harness.connection().await;
        if leaf != original_leaf {
            break leaf;
        }
        assert!(Instant::now() < deadline, "the new certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(rotated_leaf, original_leaf);
    assert_eq!(
        post(&mut kept, "/validate", review("open", "csi.example.com")).await.0,
        StatusCode::OK,
        "the old connection still works"
    );

    // A broken pair is logged and the rotated one kept.
    std::fs::write(harness.dir.path().join("tls/tls.key"), "not a key").unwrap();
    wait_for_metric(harness.server.health_addr(), "csi_volume_admission_tls_reloads_total{result=\"failure\"} 1").await;
    assert_eq!(harness.connection().await.1, rotated_leaf);
    let (_, metrics) = health_get(harness.server.health_addr(), "/metrics").await;
    assert!(metrics.contains("csi_volume_admission_tls_reloads_total{result=\"success\"} 1"), "{metrics}");
    assert!(metrics.contains("csi_volume_admission_tls_reloads_total{result=\"failure\"} 1"), "{metrics}");
    harness.server.shutdown().await;
}

#[tokio::test]
async fn a_slow_client_is_cut_off_and_does_not_slow_others() {
    let harness = start().await;
    let mut slow = harness.tls_stream().await;
    slow.write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\n").await.unwrap();
    let cut_off = tokio::spawn(async move {
        let started = Instant::now();
        let mut buffer = Vec::new();
        let _ = slow.read_to_end(&mut buffer).await;
        (started.elapsed(), buffer)
    });

    let (mut other, _) = harness.connection().await;
    assert_eq!(post(&mut other, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    // Ordering, not speed: the other client was answered while the slow one was still held
    // (a server serving one connection at a time would answer it only after the cut-off).
    assert!(!cut_off.is_finished(), "another client waited for the slow one");

    let (elapsed, _) =
        tokio::time::timeout(Duration::from_secs(5), cut_off).await.expect("slow client never cut off").unwrap();
    assert!(elapsed >= TIMEOUT / 2, "cut off too early: {elapsed:?}");

    // A body that stalls after the head is answered 408 and the connection closed.
    let (mut stalled, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(harness.tls_stream().await)).await.unwrap();
    let connection = tokio::spawn(connection);
    let (_keep_open, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    let body = StreamBody::new(tokio_stream_from(receiver));
    let request = Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let response = stalled.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("connection not closed after 408")
        .unwrap()
        .ok();
    harness.server.shutdown().await;
}

#[tokio::test]
async fn readiness_is_served_on_the_health_port() {
    let harness = start().await;
    let health = harness.server.health_addr();
    harness.ready.0.store(false, Ordering::SeqCst);
    assert_eq!(
        health_get(health, "/readyz").await,
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: caches not synced\n".into())
    );
    assert_eq!(health_get(health, "/healthz").await.0, StatusCode::OK);
    harness.ready.0.store(true, Ordering::SeqCst);
    assert_eq!(health_get(health, "/readyz").await, (StatusCode::OK, "ok\n".into()));
    harness.server.shutdown().await;
}

#[tokio::test]
async fn shutdown_finishes_the_request_in_flight_and_refuses_new_connections() {
    // A long request bound and grace: the body's second half is sent only once shutdown was seen
    // waiting, which no stall of a busy machine short of a minute can cut short.
    let harness = start_with(ServerOptions {
        request_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(60),
        ..ServerOptions::default()
    })
    .await;
    let addr = harness.server.webhook_addr();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(harness.tls_stream().await)).await.unwrap();
    tokio::spawn(connection);
    let (body_sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
    let body = review("locked", "csi.example.com");
    let (first, rest) = body.split_at(body.len() / 2);
    body_sender.send(Ok(Frame::data(Bytes::from(first.to_string())))).await.unwrap();
    let request = Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(StreamBody::new(tokio_stream_from(receiver)))
        .unwrap();
    let in_flight = tokio::spawn(async move { sender.send_request(request).await });
    // The request is in flight when shutdown starts.
    wait_for_metric(harness.server.health_addr(), "csi_volume_admission_requests_in_flight 1").await;

    let shutdown = tokio::spawn(harness.server.shutdown());
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after shutdown started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Shutdown waits for the request in flight, however long it takes (the linger before it is
    // none here, the test's shutdown delay being zero): a while later it is still not finished.
    // A slower machine only waits longer here; it cannot make this fail.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!shutdown.is_finished(), "shutdown finished while a request was in flight");
    body_sender.send(Ok(Frame::data(Bytes::from(rest.to_string())))).await.unwrap();
    drop(body_sender);

    let response = in_flight.await.unwrap().expect("the in-flight request was answered");
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    tokio::time::timeout(Duration::from_secs(5), shutdown).await.expect("shutdown did not finish").unwrap();
}

fn tokio_stream_from<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |context| receiver.poll_recv(context))
}

#[tokio::test]
async fn draining_fails_readiness_closes_kept_alive_connections_after_their_answer_and_still_accepts() {
    let harness =
        start_with(ServerOptions { shutdown_delay: Duration::from_secs(1), ..ServerOptions::default() }).await;
    let (webhook, health) = (harness.server.webhook_addr(), harness.server.health_addr());
    let (mut kept, _) = harness.connection().await;
    assert_eq!(post(&mut kept, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);

    let tls = TlsConnectorBox(harness.connector());
    let started = Instant::now();
    let shutdown = tokio::spawn(harness.server.shutdown());
    while health_get(health, "/readyz").await.0 == StatusCode::OK {
        assert!(!shutdown.is_finished(), "/readyz was 200 for the whole shutdown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(health_get(health, "/readyz").await.1, "not ready: shutting down\n");

    // A request on the kept-alive connection is answered, and asks the client to reconnect.
    let request = Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(review("open", "csi.example.com"))))
        .unwrap();
    let response = kept.send_request(request).await.expect("answered while draining");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]));
    // New connections are still served during the delay.
    let (mut fresh, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls.connect(webhook).await)).await.unwrap();
    tokio::spawn(connection);
    assert_eq!(post(&mut fresh, "/mutate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    // Ordering, not speed: all of the above happened before the shutdown finished.
    assert!(!shutdown.is_finished(), "these ran within the delay");

    tokio::time::timeout(Duration::from_secs(10), shutdown).await.expect("shutdown did not finish").unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "the listener stayed open for the delay");
    assert!(TcpStream::connect(webhook).await.is_err(), "closed after the delay");
}

/// A connector that outlives the harness it came from.
struct TlsConnectorBox(TlsConnector);

impl TlsConnectorBox {
    async fn connect(&self, addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(addr).await.unwrap();
        self.0.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap()
    }
}

#[tokio::test]
async fn bodies_over_the_budget_are_answered_429_with_retry_after_and_the_budget_comes_back() {
    let harness = start_with(ServerOptions { body_budget_bytes: 4 << 20, ..ServerOptions::default() }).await;
    // Two requests declaring 2 MiB each hold the whole budget while their bodies trickle in.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = harness.tls_stream().await;
        let head = "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 2097152\r\n\r\n{";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.flush().await.unwrap();
        held.push(stream);
    }
    wait_for_metric(harness.server.health_addr(), "csi_volume_admission_requests_in_flight 2").await;
    let (mut other, _) = harness.connection().await;
    // A body larger than what arrives with the head: the server reads it to its end before the
    // connection can carry another request.
    let large = format!("{}{}", " ".repeat(1 << 20), review("open", "csi.example.com"));
    let request = Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(large)))
        .unwrap();
    let response = other.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers().get("retry-after").map(|v| v.as_bytes()), Some(&b"1"[..]));
    // Its body was read to its end, not left on the connection: the connection stays usable.
    let again = Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(review("open", "csi.example.com"))))
        .unwrap();
    other.ready().await.expect("the connection answered with 429 is still open");
    let response = other.send_request(again).await.expect("the connection answered with 429 is still open");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // The held bodies time out (408) and give their bytes back.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (mut sender, _) = harness.connection().await;
        let (status, _) = post(&mut sender, "/validate", review("open", "csi.example.com")).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < deadline, "the budget never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, metrics) = health_get(harness.server.health_addr(), "/metrics").await;
    assert!(metrics.contains("csi_volume_admission_unanswered_requests_total{status=\"429\"} 2"), "{metrics}");
    harness.server.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_limit_wait_and_are_served_when_one_closes() {
    // A long bound: a waiting connection is not given up, nor an idle one cut off, in this test.
    let options =
        ServerOptions { max_connections: 2, request_timeout: Duration::from_secs(60), ..ServerOptions::default() };
    let harness = start_with(options).await;
    let (mut first, _) = harness.connection().await;
    let (mut second, _) = harness.connection().await;
    assert_eq!(post(&mut first, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    assert_eq!(post(&mut second, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    // The third, from the same address, waits for a place: none of its own is closed for it.
    let tcp = TcpStream::connect(harness.server.webhook_addr()).await.unwrap();
    let connector = harness.connector();
    let third = tokio::spawn(async move { connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await });
    // A negative can only be watched for a while: 300 ms is far beyond a loopback handshake.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a third connection was served beyond the limit");
    drop(first);
    let stream = tokio::time::timeout(Duration::from_secs(5), third).await.expect("never served").unwrap().unwrap();
    let (mut third, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    assert_eq!(post(&mut third, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    harness.server.shutdown().await;
}

/// A head of a review whose body is not sent yet, asking to be told when the server reads it,
/// and that body.
fn held_review() -> (Vec<u8>, Vec<u8>) {
    let body = review("open", "csi.example.com").into_bytes();
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
        body.len()
    );
    (head.into_bytes(), body)
}

/// Reads from `stream` until `what` has arrived (a minute only turns a hang into a failure).
async fn read_until<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, what: &str) -> String {
    let mut seen = Vec::new();
    let reading = async {
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(what) {
            let read = stream.read(&mut buffer).await.unwrap();
            assert!(read > 0, "closed before {what:?}: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buffer[..read]);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), reading).await.expect("never arrived");
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn with_every_connection_answering_the_next_waits_and_takes_the_first_place_an_answer_frees() {
    // Long bounds, so that no timeout frees a place in this test.
    let options =
        ServerOptions { max_connections: 2, request_timeout: Duration::from_secs(60), ..ServerOptions::default() };
    let harness = start_with(options).await;
    let (head, body) = held_review();
    let mut answering = Vec::new();
    for _ in 0..2 {
        let mut stream = harness.tls_stream().await;
        stream.write_all(&head).await.unwrap();
        // The server reads the body: the request is being answered.
        read_until(&mut stream, "100 Continue").await;
        answering.push(stream);
    }
    // The third comes from another address, which holds none.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.5:0".parse().unwrap()).unwrap();
    let tcp = socket.connect(harness.server.webhook_addr()).await.unwrap();
    let connector = harness.connector();
    let third = tokio::spawn(async move { connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await });
    // A negative can only be watched for a while: 300 ms is far beyond a loopback handshake.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a third connection was served while both were answering");
    // The first request is answered; its connection, idle now, makes room for the waiting one
    // and closes after its answer.
    let mut first = answering.remove(0);
    first.write_all(&body).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(60), first.read_to_string(&mut answer))
        .await
        .expect("the first connection was neither answered nor closed")
        .ok();
    assert!(answer.contains("HTTP/1.1 200 OK"), "{answer}");
    let stream = tokio::time::timeout(Duration::from_secs(60), third).await.expect("never served").unwrap().unwrap();
    let (mut third, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    assert_eq!(post(&mut third, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    // The second, still answering, was never closed: its answer arrives.
    let mut second = answering.remove(0);
    second.write_all(&body).await.unwrap();
    read_until(&mut second, "HTTP/1.1 200 OK").await;
    harness.server.shutdown().await;
}

#[tokio::test]
async fn idle_connections_held_from_other_addresses_do_not_keep_a_client_out() {
    // Idle connections are not cut off by a timeout within this test: only making room frees them.
    let options =
        ServerOptions { max_connections: 8, request_timeout: Duration::from_secs(60), ..ServerOptions::default() };
    let harness = start_with(options).await;
    // Two pods hold every connection, idle past their handshakes (as a flood holds them cheaply).
    let mut flood = Vec::new();
    for source in ["127.0.0.3", "127.0.0.4"] {
        for _ in 0..4 {
            flood.push(harness.tls_stream_from(source).await);
        }
    }
    // The apiserver's connection, from its own address, is served now, not when one times out.
    let stream = tokio::time::timeout(Duration::from_secs(30), harness.tls_stream_from("127.0.0.1"))
        .await
        .expect("a client was kept out by idle connections of other addresses");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    assert_eq!(post(&mut sender, "/validate", review("open", "csi.example.com")).await.0, StatusCode::OK);
    // The place was the flood's longest idle connection's: closed.
    let mut buffer = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(60), flood[0].read(&mut buffer)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "the longest idle connection was not closed");
    // Another of the flood's is still served.
    let (head, body) = held_review();
    flood[1].write_all(&head).await.unwrap();
    read_until(&mut flood[1], "100 Continue").await;
    flood[1].write_all(&body).await.unwrap();
    read_until(&mut flood[1], "HTTP/1.1 200 OK").await;
    harness.server.shutdown().await;
}

/// A connection to `addr` from `source` (any loopback address), one byte of a request sent.
async fn trickling_from(source: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tcp, b"G").await.unwrap();
    tcp
}

#[tokio::test]
async fn one_address_holds_at_most_four_health_connections_and_another_address_is_answered() {
    let harness = start_with(ServerOptions::default()).await;
    let health = harness.server.health_addr();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(trickling_from("127.0.0.3", health).await);
    }
    // The fifth from that address is closed at once (a minute only turns a hang into a failure).
    let mut fifth = trickling_from("127.0.0.3", health).await;
    let mut buffer = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(60), tokio::io::AsyncReadExt::read(&mut fifth, &mut buffer));
    assert!(matches!(read.await, Ok(Ok(0) | Err(_))), "a fifth connection from one address was kept");
    // kubelet's probe comes from another address: answered.
    assert_eq!(health_get(health, "/healthz").await.0, StatusCode::OK);
    // The four held are still served: a finished request is answered on each.
    for tcp in &mut held {
        tokio::io::AsyncWriteExt::write_all(tcp, b"ET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(tcp, &mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }
    harness.server.shutdown().await;
}
