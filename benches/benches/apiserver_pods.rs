//! Pod creation through a real kube-apiserver 1.35 and etcd (built by `tests/peers`) under six
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
//!   calling any webhook costs, so the part of ours that is ours shows;
//! - `generated-policies`: what `csi-volume-admission policy` prints for the same configuration
//!   (ValidatingAdmissionPolicies and the read-only MutatingAdmissionPolicy), no webhook;
//! - `generated-validating`: the same without the MutatingAdmissionPolicy: the decisions the
//!   hand-written policy makes (and warn and audit), without forcing, which it does not do.
//!
//! Every pod has one inline CSI volume of a driver the namespace allows, so each policy runs its
//! whole check and admits it. Sequential creates from one client; everything shares the
//! machine's cores, as a small control plane would.
//!
//! `cargo bench -p inline-guard-benches --bench apiserver_pods [-- --pods N] [--json FILE]`
//! (Go on PATH for the peers; not a test: nothing fails on a number).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inline_guard_benches::floor::{FloorWork, run_floor_child};
use inline_guard_benches::{option, percentile};
use inline_guard_server::tls::generate_pair;
use inline_guard_tests::apply::{apply, objects};
use inline_guard_tests::cluster::{ChildProcess, Cluster, free_port, namespace_defaults};
use inline_guard_tests::peers::Peers;
use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{
    Endpoint, WebhookServer, admission_policy_path, generated_configurations, generated_policies, register,
    register_configurations, run_cli_if_child,
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
    // A provider volume: SharedResourceAdmission judges its attributes only (a share would add
    // a lookup to every create, which this phase does not measure).
    object["spec"]["volumes"][0]["csi"] =
        json!({"driver": SHARED_RESOURCE_DRIVER, "volumeAttributes": {"provider": "bench"}});
    object["spec"]["containers"][0]["volumeMounts"][0] = json!({"name": "shared", "mountPath": "/shared"});
    object
}

/// The answer's status and, for a refusal, the apiserver's message.
async fn post(admin: &kube::Client, path: &str, object: &Value, dry_run: bool) -> Result<(u16, String), String> {
    let query = if dry_run { "?dryRun=All" } else { "" };
    let body = serde_json::to_vec(object).map_err(|e| format!("encoding for {path}: {e}"))?;
    let request = hyper::Request::post(format!("{path}{query}"))
        .header("content-type", "application/json")
        .body(body)
        .map_err(|e| format!("POST {path}: {e}"))?;
    match admin.request_text(request).await {
        Ok(_) => Ok((201, String::new())),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(error) => Err(format!("POST {path}: {error}")),
    }
}

/// The sum over the series of `metric` whose labels mention `label_value`, from Prometheus text.
fn metric_sum(text: &str, metric: &str, label_value: &str) -> f64 {
    let prefix = format!("{metric}{{");
    let quoted = format!("\"{label_value}\"");
    text.lines()
        .filter(|line| line.starts_with(&prefix) && line.contains(&quoted))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The mean of a Prometheus histogram `metric` over the series whose labels mention
/// `label_value`: the sum of their `_sum` over the sum of their `_count`.
fn mean_of(text: &str, metric: &str, label_value: &str) -> Option<f64> {
    let count = metric_sum(text, &format!("{metric}_count"), label_value);
    (count > 0.0).then(|| metric_sum(text, &format!("{metric}_sum"), label_value) / count)
}

/// The apiserver's own metrics.
async fn apiserver_metrics(admin: &kube::Client) -> Result<String, String> {
    let request = hyper::Request::get("/metrics").body(Vec::new()).map_err(|e| e.to_string())?;
    admin.request_text(request).await.map_err(|e| format!("GET /metrics: {e}"))
}

/// Deletes `path`; one that is already gone is fine.
async fn delete(admin: &kube::Client, path: &str) -> Result<(), String> {
    let request = hyper::Request::delete(path).body(Vec::new()).map_err(|e| e.to_string())?;
    match admin.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(format!("DELETE {path}: {error}")),
    }
}

/// Waits (up to 30 s) until a dry-run create of `probe` is admitted (`admitted`) or refused:
/// the admission configuration the round measures is in force.
async fn wait_for_answer(admin: &kube::Client, probe: &Value, admitted: bool, what: &str) -> Result<(), String> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = post(admin, &path, probe, true).await?;
        if (status == 201) == admitted {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not take effect within 30 s (status {status})"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until a pod using a driver the namespace forbids is refused (`true`) or admitted
/// (`false`): the policy in force is the one the round measures.
async fn wait_for_policy(admin: &kube::Client, refused: bool) -> Result<(), String> {
    wait_for_answer(admin, &pod("probe", "privileged.bench.inlineguard.dev"), !refused, "the policy").await
}

/// Waits until a pod whose read-only driver's volume says nothing about `readOnly` is admitted:
/// the mutating webhook is in force too (the validating one, in force first, refuses the pod
/// until the mutating one patches it), so no round's first pods meet one without the other.
async fn wait_for_forcing(admin: &kube::Client) -> Result<(), String> {
    wait_for_answer(admin, &writable_pod("probe"), true, "read-only forcing").await
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
    /// What `csi-volume-admission policy` generates for the same configuration: the webhooks'
    /// decisions as ValidatingAdmissionPolicies (and read-only forcing as a
    /// MutatingAdmissionPolicy, which these pods do not need), no webhook.
    Generated,
    /// The generated ValidatingAdmissionPolicies alone (no read-only forcing).
    GeneratedValidating,
}

impl Policy {
    /// Every phase, in the order each round runs them.
    const ALL: [Policy; 7] = [
        Policy::None,
        Policy::Cel,
        Policy::Webhooks,
        Policy::WebhooksForcing,
        Policy::FloorWebhook,
        Policy::Generated,
        Policy::GeneratedValidating,
    ];

    fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Cel => "cel",
            Policy::Webhooks => "webhooks",
            Policy::WebhooksForcing => "webhooks-forcing",
            Policy::FloorWebhook => "floor-webhook",
            Policy::Generated => "generated-policies",
            Policy::GeneratedValidating => "generated-validating",
        }
    }
}

fn main() {
    run_cli_if_child();
    if std::env::var_os(FLOOR_ROLE).is_some() {
        run_floor_child(FloorWork::EchoUid);
    }
    // Everything this benchmark makes on the machine lives under one run directory: swept at the
    // end, on SIGINT/SIGTERM, and by the next run if this one is killed (inline_guard_tests::run_root).
    let _run = inline_guard_tests::run_root::claim_until_dropped().expect("a run directory");
    let options = option::<usize>("--pods").and_then(|pods| Ok((pods, option::<PathBuf>("--json")?)));
    let result = options.and_then(|(pods, json_out)| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("the tokio runtime: {e}"))?;
        let peers = inline_guard_tests::peers::peers().map_err(|e| format!("the peers (Go on PATH): {e}"))?;
        runtime.block_on(run(&peers, pods.unwrap_or(1000).max(ROUNDS), json_out))
    });
    if let Err(error) = result {
        eprintln!("apiserver_pods: {error}");
        std::process::exit(1);
    }
}

/// The control plane, the policies' fixtures, then every phase in alternating rounds.
async fn run(peers: &Peers, pods: usize, json_out: Option<PathBuf>) -> Result<(), String> {
    let per_round = pods.div_ceil(ROUNDS);
    let cluster = Cluster::start(peers).await?;
    let admin = cluster.client().await?;
    let deploy = repo_root().join("config/deploy");
    let mut setup = objects(&deploy.join("namespace.yaml"))?;
    setup.extend(objects(&deploy.join("rbac.yaml"))?);
    apply(&admin, &setup, false).await?;
    let labels = json!({"pod-security.kubernetes.io/enforce": "baseline", "bench.inlineguard.dev/webhook": "on"});
    for (name, labels) in [(NAMESPACE, labels), ("bench-params", json!({}))] {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        post(&admin, "/api/v1/namespaces", &namespace, false).await?;
        // The ServiceAccount admission plugin refuses pods until the namespace's account exists.
        namespace_defaults(&admin, name, Duration::from_secs(60)).await?;
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
        post(&admin, "/apis/storage.k8s.io/v1/csidrivers", &object, false).await?;
    }
    let params = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "csi-driver-profiles"},
        "data": {DRIVER: "baseline", "privileged.bench.inlineguard.dev": "privileged", "default-profile": "restricted", "default-enforce": "privileged"}
    });
    post(&admin, "/api/v1/namespaces/bench-params/configmaps", &params, false).await?;
    let identity = cluster.kubeconfig_as(WEBHOOK_IDENTITY)?;
    let config = repo_root().join("config/admission.yaml");
    let server = WebhookServer::start(&cluster, "webhook", &config, &identity)?;
    let floor = FloorProcess::start(&cluster.run_dir().join("floor"))?;
    let floor_configuration = floor_configuration(&config)?;
    let generated = generated_policies(&config, &json!({"matchLabels": {"bench.inlineguard.dev/webhook": "on"}}))?;
    let validating: Vec<Value> =
        generated.iter().filter(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("Validating"))).cloned().collect();
    let selector = json!({"matchLabels": {"bench.inlineguard.dev/webhook": "on"}});

    // Each phase's samples, round by round.
    let mut phases: Vec<(Policy, Vec<Vec<Duration>>)> =
        Policy::ALL.into_iter().map(|policy| (policy, Vec::new())).collect();
    let mut created = 0usize;
    for _ in 0..ROUNDS {
        for (policy, rounds) in &mut phases {
            let registration = match policy {
                Policy::None => {
                    wait_for_policy(&admin, false).await?;
                    None
                }
                Policy::Cel => {
                    apply(&admin, &cel_policy(), false).await?;
                    wait_for_policy(&admin, true).await?;
                    None
                }
                Policy::Generated => {
                    apply(&admin, &generated, false).await?;
                    wait_for_policy(&admin, true).await?;
                    None
                }
                Policy::GeneratedValidating => {
                    apply(&admin, &validating, false).await?;
                    wait_for_policy(&admin, true).await?;
                    None
                }
                Policy::FloorWebhook => {
                    let configurations = vec![floor_configuration.clone()];
                    let endpoint = Endpoint { url: &floor.url, ca_pem: &floor.ca_pem };
                    let registration =
                        register_configurations(&admin, endpoint, configurations, "floor", selector.clone()).await?;
                    wait_for_calls(&admin, FLOOR_WEBHOOK, true).await?;
                    Some(registration)
                }
                Policy::Webhooks | Policy::WebhooksForcing => {
                    let registration = register(&admin, &server, "bench", selector.clone()).await?;
                    wait_for_policy(&admin, true).await?;
                    if *policy == Policy::WebhooksForcing {
                        wait_for_forcing(&admin).await?;
                    }
                    Some(registration)
                }
            };
            let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
            let mut samples = Vec::with_capacity(per_round);
            for _ in 0..per_round {
                let name = format!("pod-{created}");
                let object = if *policy == Policy::WebhooksForcing { writable_pod(&name) } else { pod(&name, DRIVER) };
                let started = Instant::now();
                let (status, message) = post(&admin, &path, &object, false).await?;
                samples.push(started.elapsed());
                if status != 201 {
                    return Err(format!(
                        "{name}: the {} policy refused a pod it should admit ({status}: {})",
                        policy.name(),
                        message.chars().take(300).collect::<String>()
                    ));
                }
                created += 1;
            }
            rounds.push(samples);
            if *policy == Policy::Cel {
                delete(&admin, "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/csi-enforce")
                    .await?;
                delete(&admin, "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/csi-enforce").await?;
            }
            if matches!(policy, Policy::Generated | Policy::GeneratedValidating) {
                let applied = if *policy == Policy::Generated { &generated } else { &validating };
                // Bindings first: a policy without its binding does nothing.
                for object in applied.iter().rev() {
                    delete(&admin, &admission_policy_path(object, true)).await?;
                }
            }
            if let Some(registration) = registration {
                registration.remove().await?;
            }
            if *policy == Policy::FloorWebhook {
                wait_for_calls(&admin, FLOOR_WEBHOOK, false).await?;
            }
        }
    }
    let calls = call_times(&admin, &server).await?;
    println!("webhook calls, mean: {}", Value::Object(calls.clone()));
    let results = summarise(&phases);
    println!("{pods} pod creations per policy in {ROUNDS} alternating rounds, sequential, one client");
    let of = |policy: &str, key: &str| results[policy][key].as_f64().unwrap_or(f64::NAN);
    for policy in Policy::ALL {
        let name = policy.name();
        println!("{name:<20} p50 {:.2} ms  p99 {:.2} ms", of(name, "p50_ms"), of(name, "p99_ms"));
    }
    println!(
        "webhooks − none: p50 {:+.2} ms, p99 {:+.2} ms (median of per-round differences: {:+.2} ms); webhooks / cel at p50: {:.2}",
        of("webhooks", "p50_ms") - of("none", "p50_ms"),
        of("webhooks", "p99_ms") - of("none", "p99_ms"),
        of("webhooks", "p99_added_paired_ms"),
        of("webhooks", "p50_ms") / of("cel", "p50_ms")
    );
    for name in ["generated-policies", "generated-validating"] {
        println!(
            "{name} / cel at p50: {:.2} pooled, {:.2} median of rounds (target ≤ 1.10); {name} − none: p50 {:+.2} ms",
            of(name, "p50_ms") / of("cel", "p50_ms"),
            of(name, "p50_to_cel_paired"),
            of(name, "p50_ms") - of("none", "p50_ms")
        );
    }
    if let Some(path) = json_out {
        let report = json!({"pods_per_policy": pods, "rounds": ROUNDS, "policies": results, "calls": calls});
        let bytes = serde_json::to_vec_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(&path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Per phase: p50 and p99 over all its pods, the median over rounds of its p99 minus no
/// policy's p99 in the same round, and the median over rounds of its p50 over the hand-written
/// policy's in the same round. The pooled p99 of a thousand creations on a shared VM rests on
/// its ten slowest, so one stall anywhere moves it, and the pooled p50 drifts with the machine;
/// the paired medians compare phases measured moments apart and ignore a stall in any round.
fn summarise(phases: &[(Policy, Vec<Vec<Duration>>)]) -> serde_json::Map<String, Value> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let sorted = |samples: &[Duration]| {
        let mut samples = samples.to_vec();
        samples.sort_unstable();
        samples
    };
    let rounds_of = |wanted: Policy| -> &[Vec<Duration>] {
        phases.iter().find(|(p, _)| *p == wanted).map_or(&[], |(_, r)| r.as_slice())
    };
    let (baseline, cel) = (rounds_of(Policy::None), rounds_of(Policy::Cel));
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let mut results = serde_json::Map::new();
    for (policy, rounds) in phases {
        let all = sorted(&rounds.concat());
        let paired = median(
            rounds
                .iter()
                .zip(baseline)
                .map(|(ours, none)| ms(percentile(&sorted(ours), 0.99)) - ms(percentile(&sorted(none), 0.99)))
                .collect(),
        );
        let to_cel = median(
            rounds
                .iter()
                .zip(cel)
                .map(|(ours, cel)| ms(percentile(&sorted(ours), 0.5)) / ms(percentile(&sorted(cel), 0.5)))
                .collect(),
        );
        results.insert(
            policy.name().into(),
            json!({"p50_ms": ms(percentile(&all, 0.5)), "p99_ms": ms(percentile(&all, 0.99)),
                   "p99_added_paired_ms": paired, "p50_to_cel_paired": to_cel, "pods": all.len()}),
        );
    }
    results
}

/// Where a webhook call's time goes: the apiserver's own measure of each call (encoding the
/// review, the round trip, decoding the answer) beside the server's time from request head to
/// response.
async fn call_times(admin: &kube::Client, server: &WebhookServer) -> Result<serde_json::Map<String, Value>, String> {
    let apiserver = apiserver_metrics(admin).await?;
    let mut calls = serde_json::Map::new();
    for webhook in
        ["pods.csi-volume-admission.inlineguard.dev", "read-only.csi-volume-admission.inlineguard.dev", FLOOR_WEBHOOK]
    {
        let mean = mean_of(&apiserver, "apiserver_admission_webhook_admission_duration_seconds", webhook);
        calls.insert(webhook.into(), json!({"apiserver_mean_ms": mean.map(|s| s * 1e3)}));
    }
    let ours = server.metrics()?;
    for path in ["/validate", "/mutate"] {
        let mean = mean_of(&ours, "csi_volume_admission_request_duration_seconds", path);
        calls.insert(path.into(), json!({"server_mean_ms": mean.map(|s| s * 1e3)}));
    }
    Ok(calls)
}

/// The floor webhook, a child process (this binary re-executed) that dies with this one.
struct FloorProcess {
    _process: ChildProcess,
    url: String,
    ca_pem: String,
}

impl FloorProcess {
    fn start(dir: &Path) -> Result<FloorProcess, String> {
        let pair = generate_pair(dir, &["127.0.0.1"]).map_err(|e| format!("the floor's certificate: {e}"))?;
        let port = free_port()?;
        let args =
            [format!("127.0.0.1:{port}"), pair.files.cert.display().to_string(), pair.files.key.display().to_string()];
        let exe = std::env::current_exe().map_err(|e| format!("this benchmark's path: {e}"))?;
        let process = ChildProcess::spawn("floor", &exe, &args, &[(FLOOR_ROLE, "1")], dir)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("the floor webhook did not listen within 10 s\n{}", process.log_tail(20)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(FloorProcess { _process: process, url: format!("https://127.0.0.1:{port}"), ca_pem: pair.ca_pem })
    }
}

/// The pods webhook generated for `config`, renamed, for the floor: same rules and conditions as ours.
fn floor_configuration(config: &Path) -> Result<Value, String> {
    let generated = generated_configurations(config)?;
    let mut validating = generated.into_iter().next().ok_or("no validating configuration generated")?;
    let mut pods = validating["webhooks"][0].take();
    pods["name"] = json!(FLOOR_WEBHOOK);
    validating["metadata"]["name"] = json!("floor");
    validating["webhooks"] = json!([pods]);
    Ok(validating)
}

/// Waits until a dry-run pod is (`called`) or is no longer sent to `webhook`, as the apiserver's
/// own call count for it shows.
async fn wait_for_calls(admin: &kube::Client, webhook: &str, called: bool) -> Result<(), String> {
    const CALLS: &str = "apiserver_admission_webhook_admission_duration_seconds_count";
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let before = metric_sum(&apiserver_metrics(admin).await?, CALLS, webhook);
        post(admin, &path, &pod("probe", DRIVER), true).await?;
        let after = metric_sum(&apiserver_metrics(admin).await?, CALLS, webhook);
        if (after > before) == called {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{webhook}: still {} after 30 s", if called { "not called" } else { "called" }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
