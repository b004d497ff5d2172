//! Pod creation through a real kube-apiserver 1.35 and etcd (built by `tests/peers`) under five
//! phases, in alternating rounds so that the machine's drift falls on all of them alike:
//! - `none`: no admission policy beyond the apiserver's own plugins;
//! - `cel`: a ValidatingAdmissionPolicy doing the enforce check in CEL (the namespace's label
//!   through `namespaceObject`, the drivers' profiles from a parameter ConfigMap);
//! - `webhooks`: the webhook configurations `csi-volume-admission webhooks` generates, calling
//!   `csi-volume-admission serve` as its ServiceAccount; the pods' driver is not a read-only
//!   driver, so the generated conditions send them to /validate only;
//! - `webhooks-forcing`: the same webhooks, on pods of the read-only driver that do not say
//!   `readOnly`, so /mutate patches them and /validate checks them: two calls;
//! - `floor-webhook`: the pods' validating webhook (same rules and conditions) pointed at a
//!   floor that allows everything with the request's uid, the least the apiserver accepts: what
//!   calling any webhook costs, so the part of ours that is ours shows.
//!
//! Every pod has one inline CSI volume of a driver the namespace allows, so each policy runs its
//! whole check and admits it. Sequential creates from one client; everything shares the
//! machine's cores, as a small control plane would.
//!
//! `cargo bench -p inline-guard-benches --bench apiserver_pods [-- --pods N] [--json FILE]`
//! (Go on PATH for the peers; not a test: nothing fails on a number).

use std::time::{Duration, Instant};

use inline_guard_benches::floor::{FloorWork, serve_floor};
use inline_guard_benches::percentile;
use inline_guard_server::tls::{TlsFiles, generate_pair};
use inline_guard_tests::cluster::{ChildProcess, Cluster, free_port};
use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{
    Endpoint, Registration, WebhookServer, generated_configurations, register, register_configurations,
    run_cli_if_child,
};
use serde_json::{Value, json};

const NAMESPACE: &str = "bench-pods";
const DRIVER: &str = "csi-0.bench.inlineguard.dev";
/// The driver `config/admission.yaml` forces read-only.
const SHARED_RESOURCE_DRIVER: &str = "sharedresource.csi.inlineguard.dev";
const ROUNDS: usize = 10;
/// Set in the environment of this benchmark re-executed as the floor webhook.
const FLOOR_ROLE: &str = "INLINE_GUARD_BENCH_FLOOR";
/// The floor's webhook name, by which the apiserver's metrics count its calls.
const FLOOR_WEBHOOK: &str = "floor.bench.inlineguard.dev";
const WEBHOOK_IDENTITY: &str = "system:serviceaccount:inline-guard-system:csi-volume-admission";

/// The enforce check of CSIVolumeAdmission, in CEL: a driver's profile may not be more
/// permissive than the namespace's enforce level (unlabelled: the parameter's defaults).
fn cel_policy() -> Vec<Value> {
    let rank = "{'restricted': 0, 'baseline': 1, 'privileged': 2}";
    vec![
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "csi-enforce"},
            "spec": {
                "failurePolicy": "Fail",
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
                "matchConditions": [{"name": "has-inline-csi-volumes", "expression": "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.csi))"}],
                "variables": [
                    {"name": "rank", "expression": rank},
                    {"name": "enforce", "expression": "has(namespaceObject.metadata.labels) && 'pod-security.kubernetes.io/enforce' in namespaceObject.metadata.labels ? namespaceObject.metadata.labels['pod-security.kubernetes.io/enforce'] : params.data['default-enforce']"}
                ],
                "validations": [{
                    "expression": "object.spec.volumes.all(v, !has(v.csi) || variables.rank[v.csi.driver in params.data ? params.data[v.csi.driver] : params.data['default-profile']] <= variables.rank[variables.enforce])",
                    "message": "an inline volume's CSI driver profile is more permissive than the namespace's enforce level"
                }]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "csi-enforce"},
            "spec": {
                "policyName": "csi-enforce", "validationActions": ["Deny"],
                "paramRef": {"name": "csi-driver-profiles", "namespace": "bench-params", "parameterNotFoundAction": "Deny"}
            }
        }),
    ]
}

fn pod(name: &str, driver: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": [{"name": "shared", "mountPath": "/shared", "readOnly": true}]}],
            "volumes": [{"name": "shared", "csi": {"driver": driver, "readOnly": true}}]
        }
    })
}

/// A pod whose volume of the read-only driver says nothing about `readOnly`, as users write them:
/// forcing patches it, so the apiserver calls both webhooks.
fn writable_pod(name: &str) -> Value {
    let mut object = pod(name, SHARED_RESOURCE_DRIVER);
    object["spec"]["volumes"][0]["csi"] = json!({"driver": SHARED_RESOURCE_DRIVER});
    object["spec"]["containers"][0]["volumeMounts"][0] = json!({"name": "shared", "mountPath": "/shared"});
    object
}

async fn post(admin: &kube::Client, path: &str, object: &Value, dry_run: bool) -> Result<u16, String> {
    let query = if dry_run { "?dryRun=All" } else { "" };
    let request = hyper::Request::post(format!("{path}{query}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(object).unwrap())
        .unwrap();
    match admin.request_text(request).await {
        Ok(_) => Ok(201),
        Err(kube::Error::Api(status)) => Ok(status.code),
        Err(error) => Err(format!("POST {path}: {error}")),
    }
}

/// The mean of a Prometheus histogram or summary `metric` over the series whose labels mention
/// `label_value`: the sum of their `_sum` over the sum of their `_count`.
fn mean_of(text: &str, metric: &str, label_value: &str) -> Option<f64> {
    let quoted = format!("\"{label_value}\"");
    let total = |suffix: &str| -> f64 {
        let prefix = format!("{metric}{suffix}{{");
        text.lines()
            .filter(|line| line.starts_with(&prefix) && line.contains(&quoted))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let count = total("_count");
    (count > 0.0).then(|| total("_sum") / count)
}

async fn delete(admin: &kube::Client, path: &str) {
    let request = hyper::Request::delete(path).body(Vec::new()).unwrap();
    let _ = admin.request_text(request).await;
}

/// Waits until a pod using a driver the namespace forbids is refused (`true`) or admitted
/// (`false`): the policy in force is the one the round measures.
async fn wait_for_policy(admin: &kube::Client, refused: bool) {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = post(admin, &path, &pod("probe", "privileged.bench.inlineguard.dev"), true).await.unwrap();
        if (status != 201) == refused {
            return;
        }
        assert!(Instant::now() < deadline, "the policy did not take effect within 30 s (status {status})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Policy {
    None,
    Cel,
    Webhooks,
    /// The same webhooks, on pods whose volume forcing must make read-only: /mutate is called
    /// (and patches) as well as /validate.
    WebhooksForcing,
    /// The pods' validating webhook pointed at a floor that allows everything with the request's
    /// uid: what the apiserver spends calling any webhook at all.
    FloorWebhook,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Cel => "cel",
            Policy::Webhooks => "webhooks",
            Policy::WebhooksForcing => "webhooks-forcing",
            Policy::FloorWebhook => "floor-webhook",
        }
    }
}

fn main() {
    run_cli_if_child();
    if std::env::var_os(FLOOR_ROLE).is_some() {
        let arg = |index: usize| std::env::args().nth(index).unwrap_or_default();
        let files = TlsFiles { cert: arg(2).into(), key: arg(3).into() };
        serve_floor(arg(1).parse().expect("listen address"), files, FloorWork::EchoUid);
    }
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let pods: usize = arg("--pods").and_then(|n| n.parse().ok()).unwrap_or(1000);
    let json_out = arg("--json");
    let per_round = pods.div_ceil(ROUNDS);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let peers = inline_guard_tests::peers::peers().expect("the peers (Go on PATH)");
    runtime.block_on(async {
        let cluster = Cluster::start(&peers).await.expect("the control plane");
        let admin = cluster.client().await.unwrap();
        let deploy = repo_root().join("config/deploy");
        let mut setup = inline_guard_tests::apply::objects(&deploy.join("namespace.yaml")).unwrap();
        setup.extend(inline_guard_tests::apply::objects(&deploy.join("rbac.yaml")).unwrap());
        inline_guard_tests::apply::apply(&admin, &setup, false).await.unwrap();
        let labels = json!({"pod-security.kubernetes.io/enforce": "baseline", "bench.inlineguard.dev/webhook": "on"});
        for (name, labels) in [(NAMESPACE, labels), ("bench-params", json!({}))] {
            let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
            post(&admin, "/api/v1/namespaces", &namespace, false).await.unwrap();
        }
        for (driver, profile) in [
            (DRIVER, "baseline"),
            ("privileged.bench.inlineguard.dev", "privileged"),
            (SHARED_RESOURCE_DRIVER, "restricted"),
        ] {
            let object = json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": {"name": driver, "labels": {"security.openshift.io/csi-ephemeral-volume-profile": profile}},
                "spec": {"podInfoOnMount": true, "attachRequired": false, "volumeLifecycleModes": ["Ephemeral"]}
            });
            post(&admin, "/apis/storage.k8s.io/v1/csidrivers", &object, false).await.unwrap();
        }
        let params = json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "csi-driver-profiles"},
            "data": {DRIVER: "baseline", "privileged.bench.inlineguard.dev": "privileged", "default-profile": "restricted", "default-enforce": "privileged"}
        });
        post(&admin, "/api/v1/namespaces/bench-params/configmaps", &params, false).await.unwrap();
        let identity = cluster.kubeconfig_as(WEBHOOK_IDENTITY).unwrap();
        let server = WebhookServer::start(&cluster, "webhook", &repo_root().join("config/admission.yaml"), &identity)
            .expect("the webhook");
        let floor = FloorProcess::start(&cluster.run_dir().join("floor"));

        let mut latencies: Vec<(Policy, Vec<Duration>)> =
            [Policy::None, Policy::Cel, Policy::Webhooks, Policy::WebhooksForcing, Policy::FloorWebhook]
                .into_iter()
                .map(|p| (p, Vec::new()))
                .collect();
        let mut created = 0usize;
        for _ in 0..ROUNDS {
            for (policy, samples) in &mut latencies {
                let mut registration: Option<Registration> = None;
                match policy {
                    Policy::None => wait_for_policy(&admin, false).await,
                    Policy::Cel => {
                        inline_guard_tests::apply::apply(&admin, &cel_policy(), false).await.unwrap();
                        wait_for_policy(&admin, true).await;
                    }
                    Policy::FloorWebhook => {
                        let selector = json!({"matchLabels": {"bench.inlineguard.dev/webhook": "on"}});
                        let endpoint = Endpoint { url: &floor.url, ca_pem: &floor.ca_pem };
                        let configurations = vec![floor_configuration()];
                        registration = Some(
                            register_configurations(&admin, endpoint, configurations, "floor", selector).await.unwrap(),
                        );
                        wait_for_calls(&admin, FLOOR_WEBHOOK, true).await;
                    }
                    Policy::Webhooks | Policy::WebhooksForcing => {
                        let selector = json!({"matchLabels": {"bench.inlineguard.dev/webhook": "on"}});
                        registration = Some(register(&admin, &server, "bench", selector).await.unwrap());
                        wait_for_policy(&admin, true).await;
                    }
                }
                let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
                for _ in 0..per_round {
                    let object = match policy {
                        Policy::WebhooksForcing => writable_pod(&format!("pod-{created}")),
                        _ => pod(&format!("pod-{created}"), DRIVER),
                    };
                    let started = Instant::now();
                    let status = post(&admin, &path, &object, false).await.unwrap();
                    samples.push(started.elapsed());
                    assert_eq!(status, 201, "a pod the {policy:?} policy should admit was refused");
                    created += 1;
                }
                match policy {
                    Policy::None => {}
                    Policy::Cel => {
                        delete(&admin, "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/csi-enforce").await;
                        delete(&admin, "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/csi-enforce").await;
                    }
                    Policy::Webhooks | Policy::WebhooksForcing => {
                        registration.take().unwrap().remove().await.unwrap()
                    }
                    Policy::FloorWebhook => {
                        registration.take().unwrap().remove().await.unwrap();
                        wait_for_calls(&admin, FLOOR_WEBHOOK, false).await;
                    }
                }
            }
        }
        // Where a webhook call's time goes: the apiserver's own measure of each call (encoding
        // the review, the round trip, decoding the answer) beside the server's time from request
        // head to response.
        let request = hyper::Request::get("/metrics").body(Vec::new()).unwrap();
        let apiserver_metrics = admin.request_text(request).await.unwrap_or_default();
        let mut calls = serde_json::Map::new();
        for webhook in
            ["pods.csi-volume-admission.inlineguard.dev", "read-only.csi-volume-admission.inlineguard.dev", FLOOR_WEBHOOK]
        {
            let mean = mean_of(&apiserver_metrics, "apiserver_admission_webhook_admission_duration_seconds", webhook);
            calls.insert(webhook.into(), json!({"apiserver_mean_ms": mean.map(|s| s * 1e3)}));
        }
        let server_metrics = server.metrics();
        for path in ["/validate", "/mutate"] {
            let mean = mean_of(&server_metrics, "csi_volume_admission_request_duration_seconds", path);
            calls.insert(path.into(), json!({"server_mean_ms": mean.map(|s| s * 1e3)}));
        }
        println!("webhook calls, mean: {}", serde_json::Value::Object(calls.clone()));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut results = serde_json::Map::new();
        println!("{pods} pod creations per policy in {ROUNDS} alternating rounds, sequential, one client");
        for (policy, samples) in &mut latencies {
            samples.sort_unstable();
            let (p50, p99) = (ms(percentile(samples, 0.5)), ms(percentile(samples, 0.99)));
            println!("{:<9} p50 {p50:.2} ms  p99 {p99:.2} ms", policy.name());
            results.insert(policy.name().into(), json!({"p50_ms": p50, "p99_ms": p99, "pods": samples.len()}));
        }
        let of = |policy: &str, key: &str| results[policy][key].as_f64().unwrap_or(f64::NAN);
        println!(
            "webhooks − none: p50 +{:.2} ms, p99 +{:.2} ms; webhooks / cel at p50: {:.2}",
            of("webhooks", "p50_ms") - of("none", "p50_ms"),
            of("webhooks", "p99_ms") - of("none", "p99_ms"),
            of("webhooks", "p50_ms") / of("cel", "p50_ms")
        );
        if let Some(path) = json_out {
            let report = json!({"pods_per_policy": pods, "rounds": ROUNDS, "policies": results, "calls": calls});
            std::fs::write(&path, serde_json::to_vec_pretty(&report).unwrap()).expect("writing the results");
        }
        drop(server);
        drop(floor);
    });
}

/// The floor webhook, a child process (this binary re-executed) that dies with this one.
struct FloorProcess {
    _process: ChildProcess,
    url: String,
    ca_pem: String,
}

impl FloorProcess {
    fn start(dir: &std::path::Path) -> FloorProcess {
        let pair = generate_pair(dir, &["127.0.0.1"]).expect("the floor's certificate");
        let port = free_port().expect("a free port");
        let args =
            [format!("127.0.0.1:{port}"), pair.files.cert.display().to_string(), pair.files.key.display().to_string()];
        let exe = std::env::current_exe().expect("this benchmark");
        let process = ChildProcess::spawn("floor", &exe, &args, &[(FLOOR_ROLE, "1")], dir).expect("the floor webhook");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the floor webhook did not listen within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        FloorProcess { _process: process, url: format!("https://127.0.0.1:{port}"), ca_pem: pair.ca_pem }
    }
}

/// The generated pods webhook, renamed, for the floor: same rules and conditions as ours.
fn floor_configuration() -> Value {
    let generated = generated_configurations(&repo_root().join("config/admission.yaml")).expect("generated webhooks");
    let mut validating = generated.into_iter().next().expect("the validating configuration");
    let mut pods = validating["webhooks"][0].take();
    pods["name"] = json!(FLOOR_WEBHOOK);
    validating["metadata"]["name"] = json!("floor");
    validating["webhooks"] = json!([pods]);
    validating
}

/// How many calls the apiserver has made to `webhook`, from its own metrics.
async fn calls_to(admin: &kube::Client, webhook: &str) -> f64 {
    let request = hyper::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.unwrap_or_default();
    let quoted = format!("name=\"{webhook}\"");
    text.lines()
        .filter(|line| {
            line.starts_with("apiserver_admission_webhook_admission_duration_seconds_count{") && line.contains(&quoted)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until a dry-run pod is (`called`) or is no longer sent to `webhook`.
async fn wait_for_calls(admin: &kube::Client, webhook: &str, called: bool) {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let before = calls_to(admin, webhook).await;
        post(admin, &path, &pod("probe", DRIVER), true).await.unwrap();
        if (calls_to(admin, webhook).await > before) == called {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{webhook}: still {} after 30 s",
            if called { "not called" } else { "called" }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
