//! `serve` as a process under the faults of a real rollout, with a client that behaves like
//! kube-apiserver's (kept-alive connections, POSTs never retried, a connection dropped only when
//! the server asks with `Connection: close`):
//! - SIGTERM while requests stream in: nothing lost;
//! - certificate rotations and cluster-state rewrites under load: nothing lost, nothing that must
//!   be denied admitted;
//! - the largest legal bodies on more connections than the limit: peak memory under the shipped
//!   Deployment's 128Mi;
//! - hostile request text: escaped, bounded and rate-limited log lines.
//!
//! Each prints its numbers (`cargo test -p csi-volume-admission --test chaos -- --nocapture`);
//! the README quotes them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use inline_guard_server::tls::{connector_trusting, generate_pair};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const STATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/examples/cluster-state.yaml");
/// A review the example cluster state must deny: a privileged driver in an enforce-restricted
/// namespace.
const MUST_DENY: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"enforce-restricted","operation":"CREATE","userInfo":{"username":"alice"},"object":{"metadata":{"name":"web"},"spec":{"containers":[],"volumes":[{"name":"v","csi":{"driver":"privileged.csi.example.com"}}]}}}}"#;

/// A running `serve` with its own certificate and cluster-state files, and every stderr line.
struct Serve {
    child: Child,
    dir: tempfile::TempDir,
    webhook: String,
    health: String,
    trusted: Vec<String>,
    log: Arc<Mutex<Vec<String>>>,
    /// The thread reading stderr into `log`; it ends at EOF, once serve has exited.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Serve {
    fn start(extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let pair = generate_pair(&dir.path().join("tls"), &["localhost"]).unwrap();
        std::fs::copy(STATE, dir.path().join("state.yaml")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_csi-volume-admission"))
            .arg("serve")
            .arg("--cluster-state")
            .arg(dir.path().join("state.yaml"))
            .arg("--tls-cert")
            .arg(&pair.files.cert)
            .arg("--tls-key")
            .arg(&pair.files.key)
            .args(["--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (addresses, found) = std::sync::mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let lines = log.clone();
        let reader = std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                for (what, key) in [("webhook listening", "webhook"), ("health listening", "health")] {
                    if line.contains(what)
                        && let Some(address) = line.split_whitespace().find_map(|w| w.strip_prefix("address="))
                    {
                        let _ = addresses.send((key, address.to_string()));
                    }
                }
                lines.lock().unwrap().push(line);
            }
        });
        let (mut webhook, mut health) = (None, None);
        while webhook.is_none() || health.is_none() {
            let (key, address) = found.recv_timeout(Duration::from_secs(20)).expect("serve logged its addresses");
            if key == "webhook" { webhook = Some(address) } else { health = Some(address) }
        }
        Serve {
            child,
            dir,
            webhook: webhook.unwrap(),
            health: health.unwrap(),
            trusted: vec![pair.ca_pem],
            log,
            reader: Some(reader),
        }
    }

    /// Every line serve wrote, read to the end: call after it has exited.
    fn whole_log(&mut self) -> Vec<String> {
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the stderr reader");
        }
        self.log.lock().unwrap().clone()
    }

    fn terminate(&self) {
        nix_kill(self.child.id(), "TERM");
    }

    fn wait(&mut self, bound: Duration) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(started.elapsed() < bound, "serve did not exit within {bound:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Peak resident memory of the server so far, in MiB.
    fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
            .unwrap();
        kib / 1024.0
    }

    async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = TcpStream::connect(&self.health).await.unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut text = String::new();
        tcp.read_to_string(&mut text).await.unwrap();
        text
    }
}

fn nix_kill(pid: u32, signal: &str) {
    assert!(Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap().success());
}

/// What a load of clients saw.
#[derive(Debug, Default)]
struct Tally {
    /// Answered with an AdmissionReview.
    answered: AtomicU64,
    /// Of those, allowed although the request must be denied.
    wrongly_allowed: AtomicU64,
    /// Answered with another status (429, 503).
    other_status: AtomicU64,
    /// Written on an open connection and never answered: what Go's client fails on.
    lost: AtomicU64,
    /// Answers that asked the client to reconnect.
    closes: AtomicU64,
    /// New connections refused or cut before the request was written (the listener closed).
    refused: AtomicU64,
}

impl Tally {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

async fn connect(address: &str, connector: &TlsConnector) -> Option<SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(address).await.ok()?;
    let tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// One client: a kept-alive connection, a POST after each answer, a new connection when the
/// server asks for one (or every `reconnect_every` requests), until `stop` or until the server
/// refuses connections.
async fn client(
    address: String,
    connector: TlsConnector,
    body: Bytes,
    reconnect_every: u64,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    let mut sent_on_connection = 0;
    while !stop.load(Ordering::SeqCst) {
        let mut current = match sender.take() {
            Some(current) => current,
            None => match connect(&address, &connector).await {
                Some(fresh) => {
                    sent_on_connection = 0;
                    fresh
                }
                None => {
                    tally.refused.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        if current.ready().await.is_err() {
            // Closed while idle, before this request was written: Go would have seen an idle
            // connection die and dialled again, losing nothing; so does this client.
            continue;
        }
        let request = Request::post("/validate")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        let response = match current.send_request(request).await {
            Ok(response) => response,
            Err(_) => {
                tally.lost.fetch_add(1, Ordering::SeqCst);
                continue;
            }
        };
        let close = response.headers().get("connection").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let status = response.status();
        let Ok(answer) = response.into_body().collect().await else {
            tally.lost.fetch_add(1, Ordering::SeqCst);
            continue;
        };
        if status == StatusCode::OK {
            tally.answered.fetch_add(1, Ordering::SeqCst);
            if String::from_utf8_lossy(&answer.to_bytes()).contains(r#""allowed":true"#) {
                tally.wrongly_allowed.fetch_add(1, Ordering::SeqCst);
            }
        } else {
            tally.other_status.fetch_add(1, Ordering::SeqCst);
        }
        sent_on_connection += 1;
        if close {
            tally.closes.fetch_add(1, Ordering::SeqCst);
        } else if reconnect_every == 0 || sent_on_connection < reconnect_every {
            sender = Some(current);
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn sigterm_under_kept_alive_load_loses_no_request() {
    let mut serve = Serve::start(&["--shutdown-delay-seconds", "2"]);
    let connector = connector_trusting(&[serve.trusted[0].as_str()]).unwrap();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = runtime();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            runtime.spawn(client(
                serve.webhook.clone(),
                connector.clone(),
                Bytes::from_static(MUST_DENY.as_bytes()),
                0,
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let before = Tally::get(&tally.answered);
    serve.terminate();
    let terminated = Instant::now();
    assert_eq!(serve.wait(Duration::from_secs(30)), Some(0), "serve exits 0");
    let exited = terminated.elapsed();
    // Until the listener is gone, clients keep going; then they only meet refusals.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    runtime.block_on(async {
        for client in clients {
            let _ = client.await;
        }
    });
    let after = Tally::get(&tally.answered) - before;
    println!(
        "SIGTERM under load: {before} answered before, {after} after (in {exited:?} to exit), {} lost, {} asked to reconnect",
        Tally::get(&tally.lost),
        Tally::get(&tally.closes)
    );
    assert_eq!(Tally::get(&tally.lost), 0, "requests lost across SIGTERM: {tally:?}");
    assert_eq!(Tally::get(&tally.wrongly_allowed), 0);
    assert!(after > 0, "requests kept being answered during the delay: {tally:?}");
    assert!(Tally::get(&tally.closes) > 0, "draining asked clients to reconnect: {tally:?}");
    assert!(exited >= Duration::from_secs(2), "the listener stayed open for the delay");
}

/// Replaces `path` by `content` through a temporary file and a rename.
fn write_atomically(path: &Path, content: &[u8]) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, content).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

#[test]
fn certificate_rotations_and_cluster_state_rewrites_under_load_lose_and_admit_nothing() {
    let mut serve = Serve::start(&[]);
    // Every CA the rotations will use is trusted from the start, as a caBundle would be.
    let rotations: Vec<PathBuf> = (0..5).map(|i| serve.dir.path().join(format!("rotation-{i}"))).collect();
    for dir in &rotations {
        serve.trusted.push(generate_pair(dir, &["localhost"]).unwrap().ca_pem);
    }
    let connector = connector_trusting(&serve.trusted.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = runtime();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let body = Bytes::from_static(MUST_DENY.as_bytes());
            runtime.spawn(client(serve.webhook.clone(), connector.clone(), body, 25, tally.clone(), stop.clone()))
        })
        .collect();

    let state = serve.dir.path().join("state.yaml");
    let content = std::fs::read(&state).unwrap();
    let served = serve.dir.path().join("tls");
    for round in 0..50 {
        if round % 10 == 0 {
            // A rotation as cert-manager's Secret update lands: the key first, then the
            // certificate (a mismatched pair in between is refused and the old one kept).
            let source = &rotations[round / 10];
            write_atomically(&served.join("tls.key"), &std::fs::read(source.join("tls.key")).unwrap());
            write_atomically(&served.join("tls.crt"), &std::fs::read(source.join("tls.crt")).unwrap());
        }
        // `kubectl get ns,csidrivers -o yaml > state.yaml`: truncated, then written. Once, the
        // empty file stays longer than the 2 s poll, so a reload surely reads it.
        std::fs::write(&state, b"").unwrap();
        std::thread::sleep(Duration::from_millis(if round == 25 { 2500 } else { 30 }));
        std::fs::write(&state, &content).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        // And as the README asks: written beside it and renamed over it.
        write_atomically(&state, &content);
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, Ordering::SeqCst);
    runtime.block_on(async {
        for client in clients {
            let _ = client.await;
        }
    });
    let metrics = runtime.block_on(serve.metrics());
    serve.terminate();
    assert_eq!(serve.wait(Duration::from_secs(30)), Some(0));
    println!(
        "5 certificate rotations and 100 cluster-state rewrites (50 truncate-and-write) under load: {} answered, {} lost, {} wrongly allowed, {} refused connections",
        Tally::get(&tally.answered),
        Tally::get(&tally.lost),
        Tally::get(&tally.wrongly_allowed),
        Tally::get(&tally.refused),
    );
    assert_eq!(Tally::get(&tally.lost), 0, "{tally:?}");
    assert_eq!(Tally::get(&tally.wrongly_allowed), 0, "a request that must be denied was allowed: {tally:?}");
    assert_eq!(Tally::get(&tally.refused), 0, "{tally:?}");
    assert!(Tally::get(&tally.answered) > 200, "{tally:?}");
    let reloads: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("csi_volume_admission_tls_reloads_total{result=\"success\"} "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0);
    // The certificate files are polled every 2 s, so rotations 0.9 s apart are not all seen.
    assert!(reloads >= 2, "certificates were rotated under load: {reloads}");
    let log = serve.log.lock().unwrap().join("\n");
    assert!(log.contains("holds no Namespace; refusing it as broken"), "the emptied file was refused");
}

/// A legal review of nearly 3 MiB: the must-deny pod with a large annotation.
fn largest_legal_review() -> Bytes {
    let padding = "x".repeat(3 * 1024 * 1024 - MUST_DENY.len() - 200);
    let review = MUST_DENY.replace(
        r#""metadata":{"name":"web"}"#,
        &format!(r#""metadata":{{"name":"web","annotations":{{"pad":"{padding}"}}}}"#),
    );
    assert!(review.len() < 3 * 1024 * 1024);
    Bytes::from(review)
}

#[test]
fn the_largest_bodies_on_more_connections_than_the_limit_stay_under_the_shipped_memory_limit() {
    let mut serve = Serve::start(&[]);
    let connector = connector_trusting(&[serve.trusted[0].as_str()]).unwrap();
    let body = largest_legal_review();
    let tally = Arc::new(Tally::default());
    let runtime = runtime();
    // 320 connections (the limit is 256), each sending the largest legal body, three times.
    for _ in 0..3 {
        runtime.block_on(async {
            let sends: Vec<_> = (0..320)
                .map(|_| {
                    let (address, connector, body, tally) =
                        (serve.webhook.clone(), connector.clone(), body.clone(), tally.clone());
                    tokio::spawn(async move {
                        let Some(mut sender) = connect(&address, &connector).await else {
                            tally.refused.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        let request = Request::post("/validate")
                            .header("host", "localhost")
                            .header("content-type", "application/json")
                            .body(Full::new(body))
                            .unwrap();
                        match sender.send_request(request).await {
                            Ok(response) if response.status() == StatusCode::OK => {
                                tally.answered.fetch_add(1, Ordering::SeqCst)
                            }
                            Ok(_) => tally.other_status.fetch_add(1, Ordering::SeqCst),
                            Err(_) => tally.lost.fetch_add(1, Ordering::SeqCst),
                        };
                    })
                })
                .collect();
            for send in sends {
                let _ = send.await;
            }
        });
    }
    let peak = serve.peak_rss_mib();
    let metrics = runtime.block_on(serve.metrics());
    serve.terminate();
    assert_eq!(serve.wait(Duration::from_secs(30)), Some(0));
    println!(
        "960 bodies of 3 MiB on 320 connections at once (limit 256, budget 24 MiB): {} answered, {} answered 429, peak RSS {peak:.1} MiB",
        Tally::get(&tally.answered),
        Tally::get(&tally.other_status)
    );
    assert!(peak < 128.0, "peak RSS {peak:.1} MiB is over the shipped limits.memory of 128Mi");
    assert_eq!(Tally::get(&tally.lost) + Tally::get(&tally.refused), 0, "{tally:?}");
    assert!(Tally::get(&tally.answered) > 0 && Tally::get(&tally.other_status) > 0, "{tally:?}");
    assert!(metrics.contains("csi_volume_admission_unanswered_requests_total{status=\"429\"}"), "{metrics}");
}

#[test]
fn hostile_request_text_makes_escaped_bounded_rate_limited_log_lines() {
    let mut serve = Serve::start(&[]);
    let connector = connector_trusting(&[serve.trusted[0].as_str()]).unwrap();
    let forged = "CREATE\nlevel=ERROR msg=\"forged line\"\n".to_string() + &"A".repeat(1 << 20);
    let hostile =
        MUST_DENY.replace(r#""operation":"CREATE""#, &format!("\"operation\":{}", serde_json_string(&forged)));
    let runtime = runtime();
    let mut elapsed = Duration::ZERO;
    let statuses: Vec<StatusCode> = runtime.block_on(async {
        let mut sender = connect(&serve.webhook, &connector).await.unwrap();
        let mut statuses = Vec::new();
        // Every line the limiter lets through falls between these two instants.
        let started = std::time::Instant::now();
        for _ in 0..50 {
            if sender.ready().await.is_err() {
                sender = connect(&serve.webhook, &connector).await.unwrap();
            }
            let request = Request::post("/validate")
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(hostile.clone())))
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            statuses.push(response.status());
            let _ = response.into_body().collect().await;
        }
        elapsed = started.elapsed();
        statuses
    });
    let metrics = runtime.block_on(serve.metrics());
    serve.terminate();
    assert_eq!(serve.wait(Duration::from_secs(30)), Some(0));
    let log = serve.whole_log();
    assert!(statuses.iter().all(|s| *s == StatusCode::BAD_REQUEST), "{statuses:?}");
    assert!(!log.iter().any(|line| line.starts_with("level=ERROR")), "a forged line: {log:?}");
    let longest = log.iter().map(String::len).max().unwrap_or(0);
    assert!(longest < 2048, "a log line of {longest} bytes");
    let warnings = log.iter().filter(|line| line.contains("request not answered")).count();
    // One line a second: the first, then at most one per whole second the requests took, however
    // fast or slow this machine is (a cold, busy one took 5 s for the 50).
    let at_most = 1 + elapsed.as_secs() as usize;
    assert!(
        (1..=at_most).contains(&warnings),
        "{warnings} warning lines for 50 bad requests over {elapsed:?} (at most {at_most}): {log:?}"
    );
    assert!(metrics.contains("csi_volume_admission_unanswered_requests_total{status=\"400\"} 50"), "{metrics}");
    println!("50 hostile requests over {elapsed:?}: {warnings} log line(s), longest {longest} bytes, all 50 counted");
}

/// `text` as a JSON string literal.
fn serde_json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
