//! The webhook beside its floors, each a process of its own pinned to one core, with the load
//! generator pinned to another, all measured in the same run:
//! - `webhook`: `csi-volume-admission serve` itself (this binary re-executed into the command's
//!   own entry point), standalone, on the benchmark's fixture cluster;
//! - `nginx`: Debian's nginx, one process, the same certificate and TLS 1.3, answering every
//!   request with the webhook's exact answer bytes (it reads and discards the body);
//! - `rust floor` and `scan floor`: the webhook's own TLS and HTTP stack answering a canned
//!   response, without and with a bare JSON scan of the body;
//! - `pod security (Go)`: Pod Security Admission's own webhook (`tests/peers` builds it at the
//!   apiserver's release), the reference implementation of the same kind of check, evaluating
//!   the review's pod against the fixture namespace's labels, which it reads from a real
//!   kube-apiserver started for it (unpinned and idle while the servers are measured). Without Go
//!   it is left out, and the run says so.
//!
//! For each: open-loop fixed rates (latency counted from when each request was due, so a server
//! that falls behind is charged for the queue), then saturation; every load in rounds that
//! alternate between the servers, ratios to nginx taken per round.
//! CPU per request is each server's own CPU time (the kernel's per-process CPU clock, all its
//! threads) divided by the requests it answered; ratios to nginx lead the results, since this
//! VM's absolute speed drifts between days.
//!
//! `cargo bench -p inline-guard-benches --bench https_pinned [-- --seconds N] [--json FILE] [--profile]`
//! (`--profile`: a flat `perf` profile of the webhook at saturation, when perf is installed).
//! Needs `nginx` and `taskset` on PATH (`benches/run` installs nginx).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use inline_guard_benches::floor::{FloorWork, run_floor_child};
use inline_guard_benches::process_cpu::{Placement, cpu_time};
use inline_guard_benches::{NAMESPACE, REVIEW_3K, drivers, namespace_labels, option, percentile};
use inline_guard_server::tls::{TlsFiles, connector_trusting, generate_pair};
use rustls_pki_types::ServerName;
use serde_json::json;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Set in a child: which server it is.
const ROLE: &str = "INLINE_GUARD_BENCH_SERVER";
const RATES: [u32; 3] = [1_000, 5_000, 10_000];
const FIXED_RATE_CONNECTIONS: u32 = 16;
const SATURATION_CONNECTIONS: u32 = 32;
const SATURATION_ROUND: Duration = Duration::from_secs(1);

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        serve_as(&role);
    }
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped().expect("a run directory");
    let (seconds, json_out) = match (option::<u64>("--seconds"), option::<PathBuf>("--json")) {
        (Ok(seconds), Ok(json_out)) => (seconds.unwrap_or(5), json_out),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("https_pinned: {error}");
            std::process::exit(2);
        }
    };
    let placement = Placement::for_this_machine();
    placement.pin_generator().expect("pinning the load generator");

    let dir = tempfile::tempdir().expect("temp dir");
    let pair = generate_pair(dir.path(), &["localhost"]).expect("certificate");
    let state = dir.path().join("cluster-state.yaml");
    std::fs::write(&state, cluster_state()).expect("cluster state");
    let connector = connector_trusting(&[&pair.ca_pem]).expect("client TLS configuration");
    let body = Bytes::from_static(REVIEW_3K.as_bytes());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("the tokio runtime");

    let mut servers = Vec::new();
    let webhook = Server::start_webhook(&placement, dir.path(), &pair.files, &state);
    let answer = runtime.block_on(webhook.answer(&connector, &body));
    servers.push(webhook);
    servers.push(Server::start_nginx(&placement, dir.path(), &pair.files, &answer));
    servers.push(Server::start_floor(&placement, "rust floor", FloorWork::Nothing, &pair.files));
    servers.push(Server::start_floor(&placement, "scan floor", FloorWork::ScanJson, &pair.files));
    // Kept until the end: Pod Security Admission's webhook watches its namespaces.
    let _pod_security_cluster = match inline_guard_tests::peers::peers() {
        Ok(peers) => {
            let (cluster, server) = runtime.block_on(start_pod_security(&peers, &placement, dir.path(), &pair.files));
            servers.push(server);
            Some(cluster)
        }
        Err(error) => {
            eprintln!("https_pinned: NO GO PEERS, so Pod Security Admission's webhook is NOT measured: {error}");
            None
        }
    };
    for server in &servers {
        runtime.block_on(server.wait_until_answering(&connector, &body));
    }
    // What the reference answered, so a run shows it evaluated the pod rather than failing on it.
    if let Some(reference) = servers.iter().find(|server| server.name == "pod security (Go)") {
        let answer = runtime.block_on(reference.answer(&connector, &body));
        let answer: serde_json::Value = serde_json::from_slice(&answer).expect("an AdmissionReview");
        println!("pod security (Go) answers: {}", answer["response"]);
        assert!(answer["response"]["allowed"].is_boolean(), "Pod Security Admission did not answer the review");
    }

    // One untimed saturation round each: connections, caches and the CPU's clock settle before
    // anything is counted (the first server measured was otherwise charged for it).
    for server in &servers {
        runtime.block_on(server.measure(&connector, SATURATION_CONNECTIONS, |senders| saturate(senders, &body)));
    }
    println!("{}; review {} bytes; answer {} bytes", placement.describe(), body.len(), answer.len());
    // Every load in alternating rounds, and the median of the per-round ratios to nginx: the
    // machine's speed and its tail latency drift over seconds, so each round compares servers
    // measured moments apart.
    let rounds = (seconds as usize).max(3);
    let per_round_seconds = (seconds as f64 / rounds as f64).max(1.0);
    let nginx = servers.iter().position(|s| s.name == "nginx").expect("nginx runs");
    let median_ratio = |rounds: &[Vec<Sample>], index: usize, f: fn(&Sample) -> f64| {
        let mut ratios: Vec<f64> =
            rounds[index].iter().zip(&rounds[nginx]).map(|(ours, floor)| f(ours) / f(floor)).collect();
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    };
    let mut fixed = Vec::new();
    for rate in RATES {
        let mut per_round: Vec<Vec<Sample>> = vec![Vec::new(); servers.len()];
        for _ in 0..rounds {
            for (index, server) in servers.iter().enumerate() {
                let load = |senders| fixed_rate(senders, &body, rate, per_round_seconds);
                per_round[index].push(runtime.block_on(server.measure(&connector, FIXED_RATE_CONNECTIONS, load)));
            }
        }
        for (index, server) in servers.iter().enumerate() {
            let merged = Sample::merge(&per_round[index]);
            let (cpu, p99) = (
                median_ratio(&per_round, index, Sample::cpu_per_request_us),
                median_ratio(&per_round, index, Sample::p99_us),
            );
            println!("{:<11} fixed {rate:>6}/s {}  cpu {cpu:.2}x, p99 {p99:.2}x nginx", server.name, merged.line());
            fixed.push(json!({"server": server.name, "rate": rate, "result": merged.json(),
                              "cpu_per_request_vs_nginx": cpu, "p99_vs_nginx": p99}));
        }
    }
    let mut per_round: Vec<Vec<Sample>> = vec![Vec::new(); servers.len()];
    for _ in 0..rounds {
        for (index, server) in servers.iter().enumerate() {
            let load = |senders| saturate(senders, &body);
            per_round[index].push(runtime.block_on(server.measure(&connector, SATURATION_CONNECTIONS, load)));
        }
    }
    let mut saturation = Vec::new();
    for (index, server) in servers.iter().enumerate() {
        let merged = Sample::merge(&per_round[index]);
        let cpu_ratio = median_ratio(&per_round, index, Sample::cpu_per_request_us);
        let throughput_ratio = median_ratio(&per_round, index, Sample::throughput);
        println!(
            "{:<11} saturation   {}  cpu {:.2}x nginx, throughput {:.0}% of nginx",
            server.name,
            merged.line(),
            cpu_ratio,
            100.0 * throughput_ratio
        );
        saturation.push(json!({
            "server": server.name, "result": merged.json(),
            "cpu_per_request_vs_nginx": cpu_ratio, "throughput_vs_nginx": throughput_ratio,
        }));
    }
    // Where the webhook's CPU goes at saturation, for the report to show what bounds it.
    let profile = if std::env::args().any(|a| a == "--profile") {
        let webhook = servers.iter().find(|s| s.name == "webhook").expect("the webhook runs");
        match inline_guard_benches::profile::start(webhook.child.id(), "webhook", dir.path()) {
            Some(recording) => {
                for _ in 0..3 {
                    runtime.block_on(webhook.measure(&connector, SATURATION_CONNECTIONS, |s| saturate(s, &body)));
                }
                let profile = recording.finish();
                if profile.is_none() {
                    eprintln!("https_pinned: perf recorded nothing usable: the webhook is NOT profiled");
                }
                profile
            }
            None => {
                eprintln!("https_pinned: perf could not start: the webhook is NOT profiled");
                None
            }
        }
    } else {
        None
    };
    if let Some(symbols) = profile.as_ref().and_then(|p| p["symbols"].as_array()) {
        println!("webhook at saturation, perf (top symbols):");
        for entry in symbols.iter().take(12) {
            println!(
                "  {:>6.2}%  {}",
                entry["percent"].as_f64().unwrap_or(f64::NAN),
                entry["entry"].as_str().unwrap_or("")
            );
        }
    }
    if let Some(path) = json_out {
        let report = json!({
            "profile": profile,
            "placement": placement.describe(), "seconds": seconds, "rounds": rounds, "seconds_per_round": per_round_seconds,
            "review_bytes": body.len(), "fixed_rate_connections": FIXED_RATE_CONNECTIONS,
            "saturation_connections": SATURATION_CONNECTIONS, "nginx": nginx_version(),
            "fixed": fixed, "saturation": saturation,
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&report).unwrap()).expect("writing the results");
        println!("results: {}", path.display());
    }
}

/// A kube-apiserver holding the fixture namespace with its labels, and Pod Security Admission's
/// webhook reading it, pinned like the other servers.
async fn start_pod_security(
    peers: &inline_guard_tests::peers::Peers,
    placement: &Placement,
    dir: &Path,
    files: &TlsFiles,
) -> (inline_guard_tests::cluster::Cluster, Server) {
    let cluster = inline_guard_tests::cluster::Cluster::start(peers).await.expect("the control plane");
    let admin = cluster.client().await.expect("an admin client");
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE, "labels": namespace_labels()}}))
            .expect("the namespace");
    kube::Api::all(admin).create(&kube::api::PostParams::default(), &namespace).await.expect("creating the namespace");
    let addr = free_address();
    let mut command = placement.server_command(&peers.pod_security_webhook);
    command.arg("--kubeconfig").arg(cluster.kubeconfig());
    command.arg("--tls-cert-file").arg(&files.cert).arg("--tls-private-key-file").arg(&files.key);
    command.args(["--bind-address", &addr.ip().to_string(), "--secure-port", &addr.port().to_string()]);
    let server = Server::spawn("pod security (Go)", addr, command, &dir.join("pod-security.log"));
    (cluster, server)
}

/// The child's part: serve until killed.
fn serve_as(role: &str) -> ! {
    match role {
        // `serve` as the binary runs it: the arguments after the role are its command line.
        "webhook" => {
            let args = std::env::args_os().skip(1);
            let code = csi_volume_admission::cli::run(
                std::iter::once("csi-volume-admission".into()).chain(args),
                &mut std::io::empty(),
                &mut std::io::sink(),
                &mut std::io::stderr(),
            );
            std::process::exit(i32::from(code));
        }
        "rust floor" => run_floor_child(FloorWork::Nothing),
        "scan floor" => run_floor_child(FloorWork::ScanJson),
        other => panic!("unknown server role {other:?}"),
    }
}

/// The fixture cluster as a cluster-state file: the review's namespace and drivers.
fn cluster_state() -> String {
    let labels = |labels: &std::collections::BTreeMap<String, String>| {
        labels.iter().map(|(k, v)| format!("    {k}: {v}\n")).collect::<String>()
    };
    let mut text = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n  labels:\n{}",
        labels(&namespace_labels())
    );
    for (name, driver_labels) in drivers(8) {
        text.push_str(&format!(
            "---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: {name}\n  labels:\n{}spec: {{}}\n",
            labels(&driver_labels)
        ));
    }
    text
}

fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
}

fn nginx_version() -> String {
    let output = std::process::Command::new("nginx").arg("-v").output().map(|o| o.stderr).unwrap_or_default();
    String::from_utf8_lossy(&output).trim().trim_start_matches("nginx version: ").to_string()
}

/// A server process under test, killed on drop.
struct Server {
    name: &'static str,
    addr: SocketAddr,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn spawn(name: &'static str, addr: SocketAddr, mut command: std::process::Command, log: &Path) -> Server {
        let log = std::fs::File::create(log).expect("log file");
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("log")).stderr(log);
        let child = command.spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Server { name, addr, child }
    }

    fn start_webhook(placement: &Placement, dir: &Path, files: &TlsFiles, state: &Path) -> Server {
        let addr = free_address();
        let mut command = placement.server_command(&std::env::current_exe().expect("this benchmark's path"));
        command.env(ROLE, "webhook").args(["serve", "--cluster-state"]).arg(state);
        command.args(["--listen", &addr.to_string(), "--health-listen", &free_address().to_string()]);
        command.arg("--tls-cert").arg(&files.cert).arg("--tls-key").arg(&files.key);
        Server::spawn("webhook", addr, command, &dir.join("webhook.log"))
    }

    fn start_floor(placement: &Placement, name: &'static str, _work: FloorWork, files: &TlsFiles) -> Server {
        let addr = free_address();
        let mut command = placement.server_command(&std::env::current_exe().expect("this benchmark's path"));
        command.env(ROLE, name).arg(addr.to_string()).arg(&files.cert).arg(&files.key);
        let log = files.cert.with_file_name(format!("{}.log", name.replace(' ', "-")));
        Server::spawn(name, addr, command, &log)
    }

    /// nginx answering `answer` to every request, one process, no access log.
    fn start_nginx(placement: &Placement, dir: &Path, files: &TlsFiles, answer: &[u8]) -> Server {
        let answer = String::from_utf8(answer.to_vec()).expect("the webhook's answer is UTF-8");
        // nginx expands `$name` in a return text; the answer must not hold one to be served verbatim.
        assert!(!answer.contains('$'), "the webhook's answer holds a '$', which nginx would expand");
        let quoted = answer.replace('\\', "\\\\").replace('\'', "\\'");
        let addr = free_address();
        let nginx_dir = dir.join("nginx");
        std::fs::create_dir_all(&nginx_dir).expect("nginx directory");
        let d = nginx_dir.display();
        let config = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             keepalive_requests 100000000;\n  keepalive_timeout 300s;\n  client_body_buffer_size 64k;\n  client_max_body_size 4m;\n\
             server {{\n    listen {addr} ssl;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    ssl_protocols TLSv1.3;\n\
             location / {{ default_type application/json; return 200 '{quoted}'; }}\n  }}\n}}\n",
            files.cert.display(),
            files.key.display()
        );
        let conf = nginx_dir.join("nginx.conf");
        std::fs::write(&conf, config).expect("nginx.conf");
        let mut command = placement.server_command(Path::new("nginx"));
        command.arg("-c").arg(&conf).arg("-p").arg(&nginx_dir);
        Server::spawn("nginx", addr, command, &dir.join("nginx.log"))
    }

    async fn wait_until_answering(&self, connector: &TlsConnector, body: &Bytes) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut sender) = connect(self.addr, connector).await
                && one_request(&mut sender, body).await.is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "{} did not answer within 20 s", self.name);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The webhook's answer to `body`, byte for byte.
    async fn answer(&self, connector: &TlsConnector, body: &Bytes) -> Vec<u8> {
        self.wait_until_answering(connector, body).await;
        let mut sender = connect(self.addr, connector).await.expect("connecting to the webhook");
        let response = sender.send_request(post(body)).await.expect("the webhook's answer");
        response.into_body().collect().await.expect("its body").to_bytes().to_vec()
    }

    /// Opens `connections` connections, then runs `load` over them, charging this server the
    /// CPU its process used meanwhile (the TLS handshakes are not counted).
    async fn measure<F, Fut>(&self, connector: &TlsConnector, connections: u32, load: F) -> Sample
    where
        F: FnOnce(Vec<Sender>) -> Fut,
        Fut: std::future::Future<Output = (usize, Duration, Vec<Duration>)>,
    {
        let mut senders = Vec::new();
        for _ in 0..connections {
            senders.push(connect(self.addr, connector).await.expect("connecting"));
        }
        let pid = self.child.id();
        let generator_before = cpu_time(std::process::id()).expect("the generator's CPU time");
        let before = cpu_time(pid).expect("the server's CPU time");
        let (requests, elapsed, mut latencies) = load(senders).await;
        let cpu = cpu_time(pid).expect("the server's CPU time") - before;
        let generator_cpu = cpu_time(std::process::id()).expect("the generator's CPU time") - generator_before;
        latencies.sort_unstable();
        Sample { requests, elapsed, latencies, cpu, generator_cpu }
    }
}

/// One measurement of one server.
#[derive(Clone)]
struct Sample {
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    cpu: Duration,
    generator_cpu: Duration,
}

impl Sample {
    fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_per_request_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.requests.max(1) as f64
    }

    fn merge(rounds: &[Sample]) -> Sample {
        let mut merged = Sample {
            requests: 0,
            elapsed: Duration::ZERO,
            latencies: Vec::new(),
            cpu: Duration::ZERO,
            generator_cpu: Duration::ZERO,
        };
        for round in rounds {
            merged.requests += round.requests;
            merged.elapsed += round.elapsed;
            merged.cpu += round.cpu;
            merged.generator_cpu += round.generator_cpu;
            merged.latencies.extend(&round.latencies);
        }
        merged.latencies.sort_unstable();
        merged
    }

    fn p99_us(&self) -> f64 {
        self.micros(0.99)
    }

    fn micros(&self, p: f64) -> f64 {
        percentile(&self.latencies, p).as_secs_f64() * 1e6
    }

    fn line(&self) -> String {
        format!(
            "{:>8.0}/s  cpu {:>6.1} µs/req (server busy {:>3.0}%, generator {:>3.0}%)  p50 {:>7.0} µs  p99 {:>7.0} µs  p99.9 {:>7.0} µs",
            self.throughput(),
            self.cpu_per_request_us(),
            100.0 * self.cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            100.0 * self.generator_cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            self.micros(0.5),
            self.micros(0.99),
            self.micros(0.999)
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "requests": self.requests, "seconds": self.elapsed.as_secs_f64(), "throughput": self.throughput(),
            "cpu_per_request_us": self.cpu_per_request_us(),
            "server_busy": self.cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            "generator_busy": self.generator_cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            "p50_us": self.micros(0.5), "p99_us": self.micros(0.99), "p999_us": self.micros(0.999),
        })
    }
}

fn post(body: &Bytes) -> Request<Full<Bytes>> {
    Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .expect("a request of constant parts")
}

/// One keep-alive connection to a server.
type Sender = SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr, connector: &TlsConnector) -> Result<Sender, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let server_name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = connector.connect(server_name, tcp).await.map_err(|e| e.to_string())?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn one_request(sender: &mut Sender, body: &Bytes) -> Result<(), String> {
    let response = sender.send_request(post(body)).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    response.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// `rate` requests a second over the connections of `senders` for `seconds`, each
/// request due at its own time; its latency runs from when it was due, not from when it was sent.
async fn fixed_rate(senders: Vec<Sender>, body: &Bytes, rate: u32, seconds: f64) -> (usize, Duration, Vec<Duration>) {
    let interval = Duration::from_secs_f64(f64::from(FIXED_RATE_CONNECTIONS) / f64::from(rate));
    let per_connection = (seconds / interval.as_secs_f64()) as u32;
    let started = Instant::now();
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(index, mut sender)| {
            let body = body.clone();
            let offset = interval.mul_f64(index as f64 / f64::from(FIXED_RATE_CONNECTIONS));
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_connection as usize);
                for n in 0..per_connection {
                    let due = started + offset + interval * n;
                    wait_until(due).await;
                    one_request(&mut sender, &body).await.expect("request");
                    latencies.push(due.elapsed());
                }
                latencies
            })
        })
        .collect();
    collect(tasks, started).await
}

/// Returns at `due`, within microseconds: tokio's timer has millisecond resolution and would
/// otherwise make every request late by up to a millisecond (charged to the server, since
/// latency runs from when a request was due). It sleeps to a millisecond and a half before,
/// then yields until the moment, on the generator's own core.
async fn wait_until(due: Instant) {
    if let Some(coarse) = due.checked_sub(Duration::from_micros(1_500))
        && let Some(wait) = coarse.checked_duration_since(Instant::now())
    {
        tokio::time::sleep(wait).await;
    }
    while Instant::now() < due {
        tokio::task::yield_now().await;
    }
}

/// Every connection sends back to back for one round.
async fn saturate(senders: Vec<Sender>, body: &Bytes) -> (usize, Duration, Vec<Duration>) {
    let started = Instant::now();
    let tasks = senders
        .into_iter()
        .map(|mut sender| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while started.elapsed() < SATURATION_ROUND {
                    let sent = Instant::now();
                    one_request(&mut sender, &body).await.expect("request");
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    collect(tasks, started).await
}

async fn collect(
    tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
    started: Instant,
) -> (usize, Duration, Vec<Duration>) {
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a load task"));
    }
    (latencies.len(), started.elapsed(), latencies)
}
