//! `serve` as a process: it starts on the example cluster state with a generated certificate,
//! answers over HTTPS even after its log pipe closes, and on SIGTERM finishes the request in
//! flight and exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inline_guard_server::tls::connector_trusting;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Running {
    child: Child,
    address: String,
    health: String,
    ca_pem: String,
}

impl Drop for Running {
    // A failed assertion must not leave a server behind.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start() -> Running {
    let cluster_state = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/examples/cluster-state.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission"))
        .args(["serve", "--cluster-state", cluster_state, "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ca_path = None;
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(path) = line.strip_prefix("CA certificate: ") {
            ca_path = Some(path.to_string());
        }
        if line.starts_with("caBundle: ") {
            break;
        }
    }
    let ca_pem = std::fs::read_to_string(ca_path.expect("serve printed where its CA is")).unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut address, mut health) = (None, None);
    for line in stderr.by_ref() {
        let line = line.unwrap();
        let logged = || line.split_whitespace().find_map(|word| word.strip_prefix("address=")).map(str::to_string);
        if line.contains("webhook listening") {
            address = logged();
        }
        if line.contains("health listening") {
            health = logged();
        }
        if address.is_some() && health.is_some() {
            break;
        }
    }
    // The log pipe is closed from here on, as when a log shipper dies: the server must keep
    // serving (tracing-subscriber panics on a failed write unless the writer swallows it).
    drop(stderr);
    Running {
        child,
        address: address.expect("serve logged its address"),
        health: health.expect("serve logged its health address"),
        ca_pem,
    }
}

async fn tls(running: &Running) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(&running.address).await.unwrap();
    let connector = connector_trusting(&[&running.ca_pem]).unwrap();
    connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap()
}

const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"enforce-restricted","operation":"CREATE","userInfo":{"username":"alice"},"object":{"metadata":{"name":"web"},"spec":{"containers":[],"volumes":[{"name":"v","csi":{"driver":"privileged.csi.example.com"}}]}}}}"#;

/// Waits (up to 10 s) until `GET path` on the health port answers as `done` says.
async fn wait_for_health(running: &Running, path: &str, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut tcp = TcpStream::connect(&running.health).await.unwrap();
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        if done(&answer) {
            return;
        }
        assert!(Instant::now() < deadline, "GET {path} never answered as expected: {answer}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_and_exits_zero() {
    let mut running = start();
    // A bad request is logged from a runtime worker thread; that log must not wait on a standard
    // stream some other thread holds (it once deadlocked the server here).
    let mut bad = tls(&running).await;
    bad.write_all(b"GET /validate HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), bad.read_to_end(&mut answer))
        .await
        .expect("bad request answered")
        .unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 405"), "{}", String::from_utf8_lossy(&answer));

    let mut stream = tls(&running).await;
    let (first, rest) = REVIEW.split_at(REVIEW.len() / 2);
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        REVIEW.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    // The request is in flight when SIGTERM arrives.
    wait_for_health(&running, "/metrics", |answer| answer.contains("csi_volume_admission_requests_in_flight 1")).await;

    let status = Command::new("kill").args(["-TERM", &running.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    // The signal has been handled: the server is draining.
    wait_for_health(&running, "/readyz", |answer| answer.starts_with("HTTP/1.1 503")).await;
    stream.write_all(rest.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();

    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200 OK"), "no answer: {response:?}, exit {:?}", running.child.wait());
    assert!(response.contains(r#""uid":"u-1","allowed":false"#), "{response}");

    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = running.child.try_wait().unwrap() {
            break exit;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "serve did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0));
}

#[test]
fn a_bad_cluster_state_stops_serve_with_exit_two() {
    let output = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission"))
        .args([
            "serve",
            "--cluster-state",
            "/nonexistent/state.yaml",
            "--listen",
            "127.0.0.1:0",
            "--health-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.starts_with("csi-volume-admission serve: /nonexistent/state.yaml: cannot read: "), "{stderr}");
}
