//! `csi-volume-admission serve` as a separate process on loopback, and its registration with the
//! apiserver from what `csi-volume-admission webhooks --config` prints for the server's own
//! configuration (only the client config and a namespace selector are changed, so the tests
//! exercise the generated rules and matchConditions; for the shipped configuration that output is
//! `config/deploy/webhooks.yaml`, which a unit test keeps identical).
//!
//! The process is the test binary itself re-executed with [`CHILD_ENV`] set: the suites depend on
//! the command's library, not on a built binary, and `main` hands a re-executed child straight to
//! the same entry point the real binary's `main` calls.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use inline_guard_server::tls::generate_pair;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::{ChildProcess, Cluster, free_ports};

/// Set in a re-executed test binary's environment: run `csi-volume-admission` with the arguments.
pub const CHILD_ENV: &str = "INLINE_GUARD_E2E_RUN_CLI";

/// Runs the command instead of the tests when this process is a re-executed child; call first
/// thing in `main`.
pub fn run_cli_if_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let args = std::env::args_os().skip(1);
    let argv = std::iter::once(std::ffi::OsString::from("csi-volume-admission")).chain(args);
    let code =
        csi_volume_admission::cli::run(argv, &mut std::io::stdin(), &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(i32::from(code));
}

/// Runs `csi-volume-admission ARGS` to completion as a child process; returns (exit code, stdout, stderr).
pub fn run_cli(args: &[&str]) -> Result<(i32, String, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = std::process::Command::new(exe);
    command.args(args).env(CHILD_ENV, "1");
    let output = crate::bounded::output_within(&mut command, Duration::from_secs(120), "csi-volume-admission")?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// A running `serve`, killed on drop.
pub struct WebhookServer {
    process: Option<ChildProcess>,
    name: String,
    args: Vec<String>,
    log_dir: PathBuf,
    /// The configuration file `serve` runs with.
    pub config: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA that signed the serving certificate (PEM).
    pub ca_pem: String,
    health: u16,
}

impl WebhookServer {
    /// Starts `serve` against `cluster` with `config` (a file under the repository's `config/`),
    /// reaching the apiserver through `kubeconfig`, and waits until it is ready (both caches synced).
    pub fn start(cluster: &Cluster, name: &str, config: &Path, kubeconfig: &Path) -> Result<WebhookServer, String> {
        let dir = cluster.run_dir().join(name);
        let pair = generate_pair(&dir, &["127.0.0.1", "localhost"]).map_err(|e| e.to_string())?;
        let [port, health] = free_ports()?;
        let args = vec![
            "serve".to_string(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--config".into(),
            config.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--health-listen".into(),
            format!("127.0.0.1:{health}"),
            "--tls-cert".into(),
            pair.files.cert.display().to_string(),
            "--tls-key".into(),
            pair.files.key.display().to_string(),
        ];
        let mut server = WebhookServer {
            process: None,
            name: name.to_string(),
            args,
            log_dir: dir,
            config: config.to_path_buf(),
            url: format!("https://127.0.0.1:{port}"),
            ca_pem: pair.ca_pem,
            health,
        };
        server.restart()?;
        Ok(server)
    }

    /// Kills the process without letting it drain, as an OOM kill or a node loss would.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts the process again on the same ports and certificate, and waits until it is ready.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut process = ChildProcess::spawn(&self.name, &exe, &self.args, &[(CHILD_ENV, "1")], &self.log_dir)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            process.ensure_running()?;
            if http_status(self.health, "/readyz") == Some(200) {
                self.process = Some(process);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("{} not ready within 30 s\n{}", self.name, process.log_tail(30)))
    }

    /// The server's log tail, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.as_ref().map(|p| p.log_tail(lines)).unwrap_or_else(|| format!("{} is not running", self.name))
    }

    /// `GET /metrics` from the health port: the whole body of a 200 answer, or why there is none.
    /// Never an empty text for a scrape that failed: a count read from nothing would be a wrong
    /// figure (or a counter seen going backwards), not a failed scrape.
    pub fn metrics(&self) -> Result<String, String> {
        let response = http_get_within(self.health, "/metrics", METRICS_READ_BOUND)
            .map_err(|error| format!("{}: GET /metrics: {error}", self.name))?;
        match response.split_once("\r\n\r\n") {
            Some((head, body)) if head.split_whitespace().nth(1) == Some("200") => Ok(body.to_string()),
            _ => Err(format!("{}: GET /metrics: not a 200 answer: {:.200}", self.name, response)),
        }
    }
}

/// How long a metrics scrape may take: far above what the server needs on two busy cores (a
/// scrape that timed out at 2 s once made a CI run count no requests at all).
const METRICS_READ_BOUND: Duration = Duration::from_secs(30);

/// The status code of a plain-HTTP GET on loopback, if one came back.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let response = http_get(port, path)?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// A readiness probe: a slow answer is no answer, and the caller asks again.
fn http_get(port: u16, path: &str) -> Option<String> {
    http_get_within(port, path, Duration::from_secs(2)).ok()
}

/// A plain-HTTP GET on loopback, the whole response (head and body); no read waits longer than
/// `bound`.
fn http_get_within(port: u16, path: &str, bound: Duration) -> Result<String, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(bound)).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| format!("read (each read bound to {bound:?}): {e}"))?;
    Ok(response)
}

/// What `csi-volume-admission webhooks --config CONFIG` prints, one JSON value per document.
pub fn generated_configurations(config: &Path) -> Result<Vec<Value>, String> {
    let config = config.display().to_string();
    let (code, text, stderr) = run_cli(&["webhooks", "--config", &config])?;
    if code != 0 {
        return Err(format!("csi-volume-admission webhooks --config {config}: exit {code}: {stderr}"));
    }
    let path = PathBuf::from(format!("webhooks --config {config}"));
    let documents = inline_guard_config::read_documents(&path, &text).map_err(|e| e.to_string())?;
    Ok(documents.into_iter().map(|document| document.value).collect())
}

/// What `csi-volume-admission policy --config CONFIG -o json` prints, each binding limited to the
/// namespaces matching `namespace_selector` as well as to those its own selector matches.
pub fn generated_policies(config: &Path, namespace_selector: &Value) -> Result<Vec<Value>, String> {
    let config = config.display().to_string();
    let (code, text, stderr) = run_cli(&["policy", "--config", &config, "-o", "json"])?;
    if code != 0 {
        return Err(format!("csi-volume-admission policy --config {config}: exit {code}: {stderr}"));
    }
    let list: Value = serde_json::from_str(&text).map_err(|e| format!("policy -o json: {e}"))?;
    let mut items = list["items"].as_array().cloned().ok_or("policy -o json printed no items")?;
    for item in &mut items {
        if item["kind"].as_str().is_some_and(|kind| kind.ends_with("AdmissionPolicyBinding")) {
            let own = item["spec"]["matchResources"]["namespaceSelector"].take();
            item["spec"]["matchResources"] = json!({"namespaceSelector": both_selectors(own, namespace_selector)});
        }
    }
    Ok(items)
}

/// A label selector matching what both `a` and `b` match (their requirements ANDed).
fn both_selectors(a: Value, b: &Value) -> Value {
    let mut labels = serde_json::Map::new();
    let mut expressions = Vec::new();
    for selector in [&a, b] {
        if let Some(own) = selector["matchLabels"].as_object() {
            labels.extend(own.clone());
        }
        expressions.extend(selector["matchExpressions"].as_array().cloned().unwrap_or_default());
    }
    json!({"matchLabels": labels, "matchExpressions": expressions})
}

/// The API path of a generated policy or binding (`name`: the object's own, else the collection).
pub fn admission_policy_path(object: &Value, name: bool) -> String {
    let (version, plural) = match object["kind"].as_str() {
        Some("ValidatingAdmissionPolicy") => ("v1", "validatingadmissionpolicies"),
        Some("ValidatingAdmissionPolicyBinding") => ("v1", "validatingadmissionpolicybindings"),
        Some("MutatingAdmissionPolicy") => ("v1beta1", "mutatingadmissionpolicies"),
        _ => ("v1beta1", "mutatingadmissionpolicybindings"),
    };
    let collection = format!("/apis/admissionregistration.k8s.io/{version}/{plural}");
    if name { format!("{collection}/{}", object["metadata"]["name"].as_str().unwrap_or_default()) } else { collection }
}

/// The webhook configurations `csi-volume-admission webhooks` generates for `server`'s
/// configuration, pointed at `server` and limited to namespaces matching `namespace_selector`,
/// created under names ending in `-SUFFIX`.
pub async fn register(
    client: &kube::Client,
    server: &WebhookServer,
    suffix: &str,
    namespace_selector: Value,
) -> Result<Registration, String> {
    let configurations = generated_configurations(&server.config)?;
    register_configurations(client, server.endpoint(), configurations, suffix, namespace_selector).await
}

/// Where the apiserver reaches a webhook: its base URL and the CA that signed its certificate.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint<'a> {
    /// `https://HOST:PORT`, to which each webhook's service path is appended.
    pub url: &'a str,
    /// The CA (PEM).
    pub ca_pem: &'a str,
}

impl WebhookServer {
    /// Where the apiserver reaches this server.
    pub fn endpoint(&self) -> Endpoint<'_> {
        Endpoint { url: &self.url, ca_pem: &self.ca_pem }
    }
}

/// Creates `configurations` (webhook configuration objects, as generated) pointed at `endpoint`
/// and limited to namespaces matching `namespace_selector`, under names ending in `-SUFFIX`.
pub async fn register_configurations(
    client: &kube::Client,
    endpoint: Endpoint<'_>,
    configurations: Vec<Value>,
    suffix: &str,
    namespace_selector: Value,
) -> Result<Registration, String> {
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(endpoint.ca_pem);
    let mut registration = Registration { client: client.clone(), validating: Vec::new(), mutating: Vec::new() };
    for mut object in configurations {
        let name = format!("{}-{suffix}", object["metadata"]["name"].as_str().unwrap_or("csi-volume-admission"));
        object["metadata"] = json!({ "name": name });
        let Some(webhooks) = object["webhooks"].as_array_mut() else {
            return Err(format!("{name} has no webhooks"));
        };
        for webhook in webhooks {
            let service_path = webhook["clientConfig"]["service"]["path"].as_str().unwrap_or("/").to_string();
            webhook["clientConfig"] =
                json!({ "url": format!("{}{service_path}", endpoint.url), "caBundle": ca_bundle });
            webhook["namespaceSelector"] = namespace_selector.clone();
        }
        match object["kind"].as_str() {
            Some("ValidatingWebhookConfiguration") => {
                let typed: ValidatingWebhookConfiguration =
                    serde_json::from_value(object).map_err(|e| e.to_string())?;
                Api::all(client.clone())
                    .create(&PostParams::default(), &typed)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                registration.validating.push(name);
            }
            Some("MutatingWebhookConfiguration") => {
                let typed: MutatingWebhookConfiguration = serde_json::from_value(object).map_err(|e| e.to_string())?;
                Api::all(client.clone())
                    .create(&PostParams::default(), &typed)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                registration.mutating.push(name);
            }
            other => return Err(format!("{name}: unexpected kind {other:?}")),
        }
    }
    Ok(registration)
}

/// Webhook configurations created by [`register`].
pub struct Registration {
    client: kube::Client,
    validating: Vec<String>,
    mutating: Vec<String>,
}

impl Registration {
    /// Deletes the configurations.
    pub async fn remove(self) -> Result<(), String> {
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        for name in &self.validating {
            validating.delete(name, &DeleteParams::default()).await.map_err(|e| format!("{name}: {e}"))?;
        }
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        for name in &self.mutating {
            mutating.delete(name, &DeleteParams::default()).await.map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }
}
