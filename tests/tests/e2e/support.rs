//! What every scenario shares: one control plane, two webhook servers registered with it (the
//! shipped default configuration, and the OpenShift-compatible one), and small builders for the
//! namespaces, CSIDrivers, pods and workloads the scenarios create, seen as a client sees them.

use std::time::{Duration, Instant};

use inline_guard_tests::apply::{apply, objects};
use inline_guard_tests::cluster::{AuditEvent, ChildProcess, Cluster, namespace_defaults};
use inline_guard_tests::node::Node;
use inline_guard_tests::node::plugin::start_read_grants;
use inline_guard_tests::peers::Peers;
use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{Registration, WebhookServer, register};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

// Label keys, webhook names and message wording are spelled out here rather than imported from
// the policy crate: the suite checks the contract users and runbooks see, so a wrong constant in
// the product must fail here instead of being echoed back.

/// The label that selects which webhook server a namespace's pods go to.
pub const WEBHOOK_LABEL: &str = "e2e.inlineguard.dev/webhook";
/// The driver profile label.
pub const PROFILE: &str = "security.openshift.io/csi-ephemeral-volume-profile";
/// The validating webhook for pods (its name prefixes its audit annotations).
pub const POD_WEBHOOK: &str = "pods.csi-volume-admission.inlineguard.dev";
/// The validating webhook for workloads.
pub const WORKLOAD_WEBHOOK: &str = "workloads.csi-volume-admission.inlineguard.dev";
/// The webhook's identity in `config/deploy/rbac.yaml`.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:inline-guard-system:csi-volume-admission";
/// The read-grants controller's identity in `config/deploy/driver/read-grants.yaml`.
pub const READ_GRANTS_USER: &str = "system:serviceaccount:inline-guard-driver:sharedresource-read-grants";
/// The driver the shipped configuration forces read-only.
pub const SHARED_RESOURCE_DRIVER: &str = "sharedresource.csi.inlineguard.dev";

/// A scenario's result; `Err` carries what was observed.
pub type Outcome = Result<(), String>;

/// `Ok(true)` when the apiserver allowed a request, `Ok(false)` when it answered 403.
pub fn allowed<T>(result: Result<T, kube::Error>) -> Result<bool, String> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(false),
        Err(error) => Err(error.to_string()),
    }
}

/// The control plane, the webhook servers and the node, for the whole run.
pub struct Suite {
    /// The real node (containerd, kubelet, the driver), or why it did not start: only the node
    /// scenarios fail then. First, so that it is torn down while the apiserver still runs.
    pub node: Result<Node, String>,
    /// The read-grants controller, as its own ServiceAccount: what lets the driver read the
    /// Secrets and ConfigMaps shares name.
    pub read_grants: ChildProcess,
    /// `serve` with `config/admission.yaml`, for namespaces labelled `WEBHOOK_LABEL=shared`.
    pub shared: WebhookServer,
    /// `serve` with `config/openshift-compatible.yaml`, for `WEBHOOK_LABEL=openshift`.
    pub openshift: WebhookServer,
    _registrations: Vec<Registration>,
    /// An admin client.
    pub admin: kube::Client,
    /// etcd and kube-apiserver.
    pub cluster: Cluster,
    /// The built peers.
    pub peers: Peers,
    /// The runtime every scenario runs on; last, so that the clients and processes above are gone
    /// before it is.
    pub runtime: tokio::runtime::Runtime,
}

impl Suite {
    /// Starts the control plane from the built `peers`, applies the shipped namespace and RBAC,
    /// starts both webhook servers, registers them and waits until the apiserver calls them.
    pub fn start(peers: Peers) -> Result<Suite, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let cluster = runtime.block_on(Cluster::start(&peers))?;
        eprintln!("e2e: kube-apiserver {} ready at {} in {:?}", cluster.version, cluster.url(), started.elapsed());
        let admin = runtime.block_on(cluster.client())?;
        // The shipped namespace and RBAC, for real: the servers below run as that ServiceAccount,
        // so the cache's list/watch and live GETs prove the ClusterRole is enough.
        let deploy = repo_root().join("config/deploy");
        let mut rbac = objects(&deploy.join("namespace.yaml"))?;
        rbac.extend(objects(&deploy.join("rbac.yaml"))?);
        runtime.block_on(apply(&admin, &rbac, false))?;
        let identity = cluster.kubeconfig_as(SERVICE_ACCOUNT)?;
        let config = |name: &str| repo_root().join("config").join(name);
        let shared = WebhookServer::start(&cluster, "webhook-shared", &config("admission.yaml"), &identity)?;
        let openshift =
            WebhookServer::start(&cluster, "webhook-openshift", &config("openshift-compatible.yaml"), &identity)?;
        let registrations = runtime.block_on(async {
            // The driver's CSIDriver as shipped (labelled restricted, asking kubelet for tokens).
            apply(&admin, &objects(&repo_root().join("config/deploy/driver/csidriver.yaml"))?, false).await?;
            // The driver's CRDs and the share every pod of the scenarios names, before the
            // webhooks are asked anything.
            apply(&admin, &objects(&repo_root().join("config/deploy/driver/crds.yaml"))?, false).await?;
            wait_established(&admin, "sharedconfigmaps.sharedresource.inlineguard.dev").await?;
            apply(&admin, &everyone_may_use_cluster_ca(), false).await?;
            let mut registrations = Vec::new();
            for (server, name) in [(&shared, "shared"), (&openshift, "openshift")] {
                registrations
                    .push(register(&admin, server, name, json!({"matchLabels": {WEBHOOK_LABEL: name}})).await?);
                wait_until_called(&admin, name).await?;
            }
            Ok::<_, String>(registrations)
        })?;
        eprintln!("e2e: both webhooks answering through the apiserver after {:?}", started.elapsed());
        // The driver's CRDs and RBAC as shipped, then the node with the driver as its identity.
        let node = runtime.block_on(async {
            let driver = repo_root().join("config/deploy/driver");
            let mut objects_of_driver = objects(&driver.join("namespace.yaml"))?;
            objects_of_driver.extend(objects(&driver.join("crds.yaml"))?);
            objects_of_driver.extend(objects(&driver.join("rbac.yaml"))?);
            // The read-grants controller's identity as shipped (its Deployment is run below as
            // a process, this control plane running no controller-manager), and the opt-in to
            // reading pods, which the projection scenarios use.
            let read_grants = objects(&driver.join("read-grants.yaml"))?;
            objects_of_driver.extend(read_grants.into_iter().filter(|o| o["kind"] != "Deployment"));
            objects_of_driver.extend(objects(&driver.join("pod-metadata.yaml"))?);
            apply(&admin, &objects_of_driver, false).await?;
            wait_established(&admin, "sharedsecrets.sharedresource.inlineguard.dev").await?;
            wait_established(&admin, "sharedresourcenodes.sharedresource.inlineguard.dev").await?;
            let controller = cluster.kubeconfig_as(READ_GRANTS_USER)?;
            let read_grants = start_read_grants(&controller, cluster.run_dir())?;
            let identity =
                cluster.kubeconfig_as("system:serviceaccount:inline-guard-driver:sharedresource-csi-driver")?;
            Ok::<_, String>((Node::start(&cluster, &peers, &admin, &identity).await, read_grants))
        })?;
        let (node, read_grants) = node;
        match &node {
            Ok(_) => eprintln!("e2e: node Ready after {:?}", started.elapsed()),
            Err(error) => eprintln!("e2e: THE NODE DID NOT START; every node scenario fails with this:\n{error}"),
        }
        Ok(Suite {
            node,
            read_grants,
            shared,
            openshift,
            _registrations: registrations,
            admin,
            cluster,
            peers,
            runtime,
        })
    }
}

/// Waits until the CRD `name` is established.
pub async fn wait_established(admin: &kube::Client, name: &str) -> Outcome {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds.get(name).await.map_err(|e| e.to_string())?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("CRD {name} not established within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the apiserver has picked up the registration for `webhook`: a dry-run pod that
/// must be denied is denied, and a dry-run pod that must be patched comes back read-only.
pub async fn wait_until_called(admin: &kube::Client, webhook: &str) -> Outcome {
    let namespace = format!("probe-{webhook}");
    create_namespace(admin, &namespace, webhook, &[("pod-security.kubernetes.io/enforce", "restricted")]).await?;
    let driver = format!("probe-{webhook}.e2e.inlineguard.dev");
    create_csi_driver(admin, &driver, Some("privileged")).await?;
    let denied = pod("probe", &[("v", driver.as_str())]);
    let patched = pod("probe", &[("v", SHARED_RESOURCE_DRIVER)]);
    dry_run_until(admin, &pods_path(&namespace), &denied, |answer| answer.status == 403).await?;
    let patched_read_only = |answer: &Answer| answer.body["spec"]["volumes"][0]["csi"]["readOnly"] == json!(true);
    dry_run_until(admin, &pods_path(&namespace), &patched, patched_read_only).await?;
    Ok(())
}

/// Creates `object` as a dry run at `path` until `wanted` holds of the answer, and returns that
/// answer: a new webhook configuration or admission policy, or a grant, takes the apiserver a
/// moment to load. Bounded at 60 s, far above a cold start, so only a change that never takes
/// effect fails.
pub async fn dry_run_until(
    admin: &kube::Client,
    path: &str,
    object: &Value,
    wanted: impl Fn(&Answer) -> bool,
) -> Result<Answer, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = create(admin, path, object, true).await?;
        if wanted(&answer) {
            return Ok(answer);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{path}: still answered {} {:?} {:?} after 60 s",
                answer.status,
                answer.message(),
                answer.warnings
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the apiserver answered to a create, as a client sees it.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The `Warning` headers' texts, in order.
    pub warnings: Vec<String>,
    /// The body: the created object, or a Status.
    pub body: Value,
    /// The `Audit-Id` the apiserver answered with: its audit events carry the same.
    pub audit_id: Option<String>,
}

impl Answer {
    /// A Status body's message.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// POSTs `object` to `path` (`?dryRun=All` when `dry_run`), keeping status, warnings and body.
pub async fn create(client: &kube::Client, path: &str, object: &Value, dry_run: bool) -> Result<Answer, String> {
    let uri = if dry_run { format!("{path}?dryRun=All") } else { path.to_string() };
    let request = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(object).map_err(|e| e.to_string())?))
        .map_err(|e| e.to_string())?;
    send(client, request).await
}

/// Sends `request`, keeping status, warnings and body.
pub async fn send(client: &kube::Client, request: http::Request<kube::client::Body>) -> Result<Answer, String> {
    let what = format!("{} {}", request.method(), request.uri());
    let response = client.send(request).await.map_err(|e| format!("{what}: {e}"))?;
    let status = response.status().as_u16();
    let warnings =
        response.headers().get_all("warning").iter().filter_map(|v| warning_text(v.to_str().ok()?)).collect();
    let audit_id = response.headers().get("audit-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let bytes = response.into_body().collect_bytes().await.map_err(|e| format!("{what}: {e}"))?;
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    Ok(Answer { status, warnings, body, audit_id })
}

/// The text of `299 - "text"` (RFC 7234 warn-value, with `\"` and `\\` escaped).
fn warning_text(header: &str) -> Option<String> {
    let quoted = header.strip_prefix("299 - \"")?.strip_suffix('"')?;
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        text.push(if c == '\\' { chars.next()? } else { c });
    }
    Some(text)
}

/// `/api/v1/namespaces/NS/pods`.
pub fn pods_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods")
}

/// `/apis/apps/v1/namespaces/NS/deployments`.
pub fn deployments_path(namespace: &str) -> String {
    format!("/apis/apps/v1/namespaces/{namespace}/deployments")
}

/// Creates a namespace routed to `webhook`'s server, with Pod Security `labels`.
pub async fn create_namespace(admin: &kube::Client, name: &str, webhook: &str, labels: &[(&str, &str)]) -> Outcome {
    let mut all = serde_json::Map::new();
    all.insert(WEBHOOK_LABEL.into(), webhook.into());
    for (key, value) in labels {
        all.insert((*key).into(), (*value).into());
    }
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": all}})).map_err(|e| e.to_string())?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("creating namespace {name}: {e}"))?;
    // Not a pod can be created there before.
    namespace_defaults(admin, name, Duration::from_secs(60)).await
}

/// 201, or 409 for an object that exists already.
pub fn created_or_existing(answer: Answer) -> Outcome {
    match answer.status {
        201 | 409 => Ok(()),
        other => Err(format!("{other} {}", answer.message())),
    }
}

/// Creates the ServiceAccount `namespace/name` unless it exists: the ServiceAccount admission
/// plugin refuses a pod whose account does not exist.
pub async fn create_service_account(admin: &kube::Client, namespace: &str, name: &str) -> Outcome {
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
    created_or_existing(
        create(admin, &format!("/api/v1/namespaces/{namespace}/serviceaccounts"), &account, false).await?,
    )
}

/// Sets (or with `None` removes) one label of a namespace.
pub async fn label_namespace(admin: &kube::Client, name: &str, key: &str, value: Option<&str>) -> Outcome {
    let patch = json!({"metadata": {"labels": {key: value}}});
    Api::<Namespace>::all(admin.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| format!("labelling namespace {name}: {e}"))
}

/// Creates a CSIDriver for inline volumes, with the profile label when given.
pub async fn create_csi_driver(admin: &kube::Client, name: &str, profile: Option<&str>) -> Outcome {
    let labels = profile.map(|p| json!({PROFILE: p})).unwrap_or_else(|| json!({}));
    let driver: CSIDriver = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"podInfoOnMount": true, "attachRequired": false, "volumeLifecycleModes": ["Ephemeral"]}
    }))
    .map_err(|e| e.to_string())?;
    Api::<CSIDriver>::all(admin.clone())
        .create(&PostParams::default(), &driver)
        .await
        .map(drop)
        .map_err(|e| format!("creating CSIDriver {name}: {e}"))
}

/// Sets a CSIDriver's profile label.
pub async fn label_csi_driver(admin: &kube::Client, name: &str, profile: &str) -> Outcome {
    let patch = json!({"metadata": {"labels": {PROFILE: profile}}});
    Api::<CSIDriver>::all(admin.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| format!("labelling CSIDriver {name}: {e}"))
}

/// A container that passes Pod Security `restricted`, so that only our webhook has anything to
/// say about the pods the scenarios create.
pub fn container(name: &str, mounts: &[(&str, &str)]) -> Value {
    let mounts: Vec<Value> =
        mounts.iter().map(|(volume, _)| json!({"name": volume, "mountPath": format!("/mnt/{volume}")})).collect();
    json!({
        "name": name,
        "image": "registry.invalid/app:1",
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 1000,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}

/// SharedConfigMap `cluster-ca` (of ConfigMap `default/cluster-ca`), which every service account
/// may use: what [`pod_spec`]'s volumes of the driver name, so that SharedResourceAdmission
/// admits them wherever a scenario is about something else.
fn everyone_may_use_cluster_ca() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-ca", "namespace": "default"},
               "data": {"ca.crt": "pem"}}),
        json!({"apiVersion": "sharedresource.inlineguard.dev/v1alpha1", "kind": "SharedConfigMap",
               "metadata": {"name": "cluster-ca"}, "spec": {"configMapRef": {"namespace": "default", "name": "cluster-ca"}}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "e2e-use-cluster-ca"},
               "rules": [{"apiGroups": ["sharedresource.inlineguard.dev"], "resources": ["sharedconfigmaps"],
                          "resourceNames": ["cluster-ca"], "verbs": ["use"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "e2e-use-cluster-ca"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-use-cluster-ca"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts"}]}),
    ]
}

/// A pod spec with one inline CSI volume per `(volume, driver)`, each mounted by the container.
/// A volume of the shared-resource driver names a share, as the driver and its admission
/// plugin require of every such volume.
pub fn pod_spec(volumes: &[(&str, &str)]) -> Value {
    let csi: Vec<Value> = volumes
        .iter()
        .map(|(volume, driver)| {
            let mut csi = json!({"driver": driver});
            if *driver == SHARED_RESOURCE_DRIVER {
                csi["volumeAttributes"] = json!({"sharedConfigMap": "cluster-ca"});
            }
            json!({"name": volume, "csi": csi})
        })
        .collect();
    json!({"containers": [container("app", volumes)], "volumes": csi})
}

/// A Pod named `name` with [`pod_spec`].
pub fn pod(name: &str, volumes: &[(&str, &str)]) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec(volumes)})
}

/// A Deployment named `name` whose template has [`pod_spec`], scaled to zero: the scenarios judge
/// the workload's admission, and the pods the controller-manager would make of it would add their
/// own admission requests to what a scenario counts.
pub fn deployment(name: &str, volumes: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(volumes)}
        }
    })
}

/// The message CSIVolumeAdmission gives for one violation (OpenShift's wording).
pub fn violation(object: &str, driver: &str, namespace: &str, mode: &str, driver_level: &str) -> String {
    format!(
        "{object} uses an inline volume provided by CSIDriver {driver} and namespace {namespace} has a pod security {mode} level that is lower than {driver_level}"
    )
}

/// How kube-apiserver words a validating webhook's denial.
pub fn denied_by(webhook: &str, message: &str) -> String {
    format!("admission webhook \"{webhook}\" denied the request: {message}")
}

/// The completed audit event for `resource` `namespace/name`, waiting for the log (up to 30 s:
/// it is written within milliseconds, but a busy machine must not fail the scenario).
pub async fn audit_event(cluster: &Cluster, resource: &str, namespace: &str, name: &str) -> Result<AuditEvent, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(event) = cluster.audit_events()?.into_iter().rev().find(|e| e.is_about(resource, namespace, name)) {
            return Ok(event);
        }
        if Instant::now() > deadline {
            return Err(format!("no audit event for {resource} {namespace}/{name} within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The annotations an event carries from `webhook`, without the prefix.
pub fn annotations_from(event: &AuditEvent, webhook: &str) -> Vec<(String, String)> {
    let prefix = format!("{webhook}/");
    event
        .annotations
        .iter()
        .filter_map(|(key, value)| Some((key.strip_prefix(&prefix)?.to_string(), value.clone())))
        .collect()
}

/// Pure check of the header parsing, run as a trial (this binary has no `cfg(test)` build).
pub fn warning_headers_are_unescaped() -> Outcome {
    let parsed = (warning_text(r#"299 - "a \"b\" \\ c""#), warning_text("199 - \"x\""));
    match parsed {
        (Some(text), None) if text == r#"a "b" \ c"# => Ok(()),
        other => Err(format!("unexpected parse: {other:?}")),
    }
}
