//! A real control plane for the end-to-end suites: etcd, kube-apiserver, kube-controller-manager
//! and, when asked for, kube-scheduler in a temporary directory, Node and RBAC authorization with the
//! NodeRestriction and ServiceAccount admission plugins, an admin identity (a static token),
//! client certificates for the components, serving certificates generated for the run, and an
//! audit policy writing a log file the suites read. Dropping the [`Cluster`] kills the processes
//! and removes the directory.
//!
//! Clients reach the apiserver on loopback; pods reach it on the pod network's gateway address
//! (see [`POD_NETWORK_GATEWAY`]).

mod audit_log;
mod client_ca;
mod controllers;
mod process;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inline_guard_server::tls::generate_pair;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use audit_log::AuditEvent;
use controllers::{ControllerFiles, Controllers};
pub use process::{ChildProcess, free_port, free_ports};

use crate::peers::Peers;

/// The audit policy: metadata (with annotations) for the objects the webhooks see, nothing else,
/// so the log stays small enough to scan after every request.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: [pods, podtemplates, replicationcontrollers]
      - group: apps
        resources: [deployments, replicasets, statefulsets, daemonsets]
      - group: batch
        resources: [jobs, cronjobs]
  # Who reads Secrets and ConfigMaps, and where (never their content: Metadata only).
  - level: Metadata
    resources:
      - group: ""
        resources: [secrets, configmaps]
  # Who changes Nodes (not their status) and CSINodes: the startup taint's order is read here,
  # with the CSINodes' bodies (driver names and node ids, nothing secret) to see which write
  # listed the driver.
  - level: Metadata
    resources:
      - group: ""
        resources: [nodes]
  - level: Request
    resources:
      - group: storage.k8s.io
        resources: [csinodes]
  # Every request for the shares and projections, so a suite can see what the driver asked
  # for by name (and that a name it refused was never asked for).
  - level: Metadata
    resources:
      - group: sharedresource.inlineguard.dev
  # The access questions asked, with their bodies (the user asked about and the object; no
  # secret): a suite counts them independently of the askers' own counters.
  - level: Request
    resources:
      - group: authorization.k8s.io
        resources: [subjectaccessreviews]
  - level: None
"#;

/// How long the apiserver may take to become ready (RBAC bootstrap included).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// The host's address on the node's pod network (the bridge `crate::node::runtime` puts pods
/// on): the apiserver's advertised address, so that the `kubernetes` Service's endpoint is one a
/// pod can reach (no kube-proxy runs, so its ClusterIP leads nowhere), and a name in its serving
/// certificate.
pub const POD_NETWORK_GATEWAY: &str = "198.51.100.1";

/// etcd and kube-apiserver, running.
pub struct Cluster {
    // Declared before `dir` so they are killed before their directory is removed, and the
    // controllers before the apiserver they talk to.
    controllers: Option<Controllers>,
    apiserver: ChildProcess,
    etcd: ChildProcess,
    dir: tempfile::TempDir,
    url: String,
    ca: PathBuf,
    token: String,
    kubeconfig: PathBuf,
    client_ca: client_ca::ClientCa,
    audit_log: PathBuf,
    /// The apiserver's release.
    pub version: String,
}

impl Cluster {
    /// Starts etcd, kube-apiserver and kube-controller-manager, and waits until the apiserver is
    /// ready and the `default` namespace has what pods need. No scheduler runs: the suites' pods
    /// name their node, and the pods a scenario only stores (to judge their admission, or to
    /// publish them as kubelet would) must never be run by the node.
    pub async fn start(peers: &Peers) -> Result<Cluster, String> {
        Cluster::start_with(peers, false).await
    }

    /// [`Cluster::start`] with kube-scheduler as well, for scenarios whose pods are placed as in
    /// a cluster (a DaemonSet's, a Deployment's).
    pub async fn start_with_scheduler(peers: &Peers) -> Result<Cluster, String> {
        Cluster::start_with(peers, true).await
    }

    async fn start_with(peers: &Peers, scheduler: bool) -> Result<Cluster, String> {
        let dir = tempfile::Builder::new().prefix("cluster-").tempdir().map_err(|e| e.to_string())?;
        let root = dir.path().to_path_buf();
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let path = root.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        };

        let [client_port, peer_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = ChildProcess::spawn(
            "etcd",
            &peers.etcd,
            &[
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                // A throwaway store: durability costs seconds per test run and buys nothing.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            &[],
            &root,
        )?;

        let serving = generate_pair(&root.join("serving"), &["127.0.0.1", "localhost", POD_NETWORK_GATEWAY])
            .map_err(|e| e.to_string())?;
        let service_account_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let sa_key = write("service-account.key", &service_account_key.serialize_pem())?;
        let sa_pub = write("service-account.pub", &service_account_key.public_key_pem())?;
        let client_ca = client_ca::ClientCa::generate(&root)?;
        let token = random_token()?;
        let tokens = write("tokens.csv", &format!("{token},admin,admin,system:masters\n"))?;
        let policy = write("audit-policy.yaml", AUDIT_POLICY)?;
        let audit_log = root.join("audit.log");
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let path = |p: &Path| p.display().to_string();
        let apiserver = ChildProcess::spawn(
            "kube-apiserver",
            &peers.kube_apiserver,
            &[
                format!("--etcd-servers={etcd_url}"),
                // Pods reach it on the pod network's gateway, the suite on loopback.
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={POD_NETWORK_GATEWAY}"),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", root.join("certs").display()),
                format!("--tls-cert-file={}", path(&serving.files.cert)),
                format!("--tls-private-key-file={}", path(&serving.files.key)),
                format!("--token-auth-file={}", path(&tokens)),
                // As production clusters run: kubelet is authorized as a node (the Secrets,
                // ConfigMaps and tokens of its own pods only) and may change only its own Node
                // and pods.
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                format!("--client-ca-file={}", path(&client_ca.cert)),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", path(&sa_pub)),
                format!("--service-account-signing-key-file={}", path(&sa_key)),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                // Webhooks behind a Service are dialled at an endpoint's address: no kube-proxy
                // runs here to make the Service's ClusterIP lead anywhere.
                "--enable-aggregator-routing=true".into(),
                // As in every real cluster: node plugins (the driver's DaemonSet) run privileged.
                "--allow-privileged=true".into(),
                format!("--audit-policy-file={}", path(&policy)),
                format!("--audit-log-path={}", path(&audit_log)),
                "--audit-log-mode=blocking".into(),
                "--audit-log-format=json".into(),
                // The benchmarks force a collection through it (`/debug/pprof/heap?gc=1`) to
                // measure what the apiserver keeps; only the admin may reach it.
                "--profiling=true".into(),
            ]
            .into_iter()
            .chain(mutating_admission_policy(&peers.kubernetes_version))
            .collect::<Vec<String>>(),
            &[],
            &root,
        )?;

        let ca = write("ca.crt", &serving.ca_pem)?;
        let kubeconfig = write("kubeconfig", &kubeconfig_text(&url, &ca, &token, None))?;

        let mut cluster = Cluster {
            controllers: None,
            apiserver,
            etcd,
            dir,
            url,
            ca,
            token,
            kubeconfig,
            client_ca,
            audit_log,
            version: peers.kubernetes_version.clone(),
        };
        cluster.wait_ready().await?;
        let manager_kubeconfig = cluster.certificate_kubeconfig("system:kube-controller-manager", None)?;
        let scheduler_kubeconfig =
            if scheduler { Some(cluster.certificate_kubeconfig("system:kube-scheduler", None)?) } else { None };
        let files = ControllerFiles {
            manager_kubeconfig: &manager_kubeconfig,
            scheduler_kubeconfig: scheduler_kubeconfig.as_deref(),
            service_account_key: &sa_key,
            root_ca: &cluster.ca,
        };
        cluster.controllers =
            Some(Controllers::start(&peers.kube_controller_manager, &peers.kube_scheduler, &files, &root)?);
        cluster.wait_for_namespace_defaults("default").await?;
        Ok(cluster)
    }

    /// Waits until `namespace` has what pods there need (see [`namespace_defaults`]), failing
    /// early with the controllers' logs if they exited.
    async fn wait_for_namespace_defaults(&mut self, namespace: &str) -> Result<(), String> {
        let client = self.client().await?;
        let controllers = self.controllers.as_mut().ok_or("the controllers are not running")?;
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            controllers.ensure_running()?;
            if namespace_defaults(&client, namespace, Duration::from_secs(1)).await.is_ok() {
                return Ok(());
            }
        }
        Err(format!(
            "namespace {namespace}: no default ServiceAccount or kube-root-ca.crt\n{}",
            controllers.log_tails(20)
        ))
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let client = self.client().await?;
        let deadline = Instant::now() + READY_WITHIN;
        let mut last = String::new();
        while Instant::now() < deadline {
            self.etcd.ensure_running()?;
            self.apiserver.ensure_running()?;
            let request = http::Request::get("/readyz").body(Vec::new()).map_err(|e| e.to_string())?;
            match client.request_text(request).await {
                Ok(text) if text.trim() == "ok" => return Ok(()),
                Ok(text) => last = text,
                Err(error) => last = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(format!(
            "kube-apiserver at {} not ready within {READY_WITHIN:?}: {last}\n{}\n{}",
            self.url,
            self.apiserver.log_tail(30),
            self.etcd.log_tail(10)
        ))
    }

    /// The apiserver's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// An admin kubeconfig file.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig file for node `name` with a client certificate of `system:node:NAME` in
    /// `system:nodes`, as kubelet's own credentials are in a production cluster.
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf, String> {
        self.certificate_kubeconfig(&format!("system:node:{name}"), Some("system:nodes"))
    }

    /// A kubeconfig file presenting a client certificate of `user` (in `group`).
    fn certificate_kubeconfig(&self, user: &str, group: Option<&str>) -> Result<PathBuf, String> {
        let (cert, key) = self.client_ca.issue(self.dir.path(), user, group)?;
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: certificate\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: certificate\ncurrent-context: e2e\n",
            self.url,
            self.ca.display(),
            cert.display(),
            key.display()
        );
        let path = self.dir.path().join(format!("kubeconfig-{}", user.replace(':', "-")));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// A client with node `name`'s own credentials (see [`Cluster::node_kubeconfig`]).
    pub async fn node_client(&self, name: &str) -> Result<kube::Client, String> {
        let path = self.node_kubeconfig(name)?;
        let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        sharedresource_csi_driver::apiserver::client::client(config, unlimited()).map_err(|e| e.to_string())
    }

    /// A kubeconfig file acting as `user` by impersonation (`as:`), so that a process given it
    /// (`serve`, `audit`) has exactly the RBAC permissions granted to that user.
    pub fn kubeconfig_as(&self, user: &str) -> Result<PathBuf, String> {
        let file_name: String = user.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let path = self.dir.path().join(format!("kubeconfig-{file_name}"));
        std::fs::write(&path, kubeconfig_text(&self.url, &self.ca, &self.token, Some(user)))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// A directory for the suites' own files, removed with the cluster.
    pub fn run_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client acting as the admin (`system:masters`).
    pub async fn client(&self) -> Result<kube::Client, String> {
        self.client_with(|_| {}).await
    }

    /// A client acting as `user` in `groups`, by impersonation, so RBAC decides what it may do
    /// (a service account is `system:serviceaccount:NAMESPACE:NAME`).
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<kube::Client, String> {
        let config = self.config_as(user, groups).await?;
        sharedresource_csi_driver::apiserver::client::client(config, unlimited()).map_err(|e| e.to_string())
    }

    /// A client authenticating with `token` (a ServiceAccount's, from a TokenRequest): the
    /// identity the apiserver's authenticator gives it, no impersonation.
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, String> {
        self.client_with(|config| {
            config.auth_info.token = Some(token.to_string().into());
        })
        .await
    }

    /// The configuration of a client acting as `user` in `groups` (see [`Cluster::client_as`]).
    pub async fn config_as(&self, user: &str, groups: &[&str]) -> Result<kube::Config, String> {
        self.config_with(|config| {
            config.auth_info.impersonate = Some(user.to_string());
            config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        })
        .await
    }

    async fn config_with(&self, adjust: impl FnOnce(&mut kube::Config)) -> Result<kube::Config, String> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| e.to_string())?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        adjust(&mut config);
        Ok(config)
    }

    async fn client_with(&self, adjust: impl FnOnce(&mut kube::Config)) -> Result<kube::Client, String> {
        let config = self.config_with(adjust).await?;
        // The driver's own client stack, so what the suite and the benchmarks measure is what the
        // driver does on a node (connections with TCP_NODELAY).
        sharedresource_csi_driver::apiserver::client::client(config, unlimited()).map_err(|e| e.to_string())
    }

    /// Every audit event written so far.
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>, String> {
        audit_log::read(&self.audit_log)
    }
}

/// Waits (up to `within`) until the controller-manager has given `namespace` its `default`
/// ServiceAccount, without which the ServiceAccount admission plugin refuses every pod there,
/// and its `kube-root-ca.crt`, without which kubelet cannot build a pod's token volume.
pub async fn namespace_defaults(client: &kube::Client, namespace: &str, within: Duration) -> Result<(), String> {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    let accounts = kube::Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    let config_maps = kube::Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + within;
    loop {
        let account = accounts.get_opt("default").await.map_err(|e| e.to_string())?;
        let root_ca = config_maps.get_opt("kube-root-ca.crt").await.map_err(|e| e.to_string())?;
        if account.is_some() && root_ca.is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "namespace {namespace} has no default ServiceAccount or kube-root-ca.crt after {within:?} \
                 (kube-controller-manager gives them)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A kubeconfig for the admin token, impersonating `user` when given.
fn kubeconfig_text(url: &str, ca: &Path, token: &str, user: Option<&str>) -> String {
    let impersonation = user.map(|user| format!("    as: {user}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {url}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {token}\n{impersonation}contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: admin\n    namespace: default\ncurrent-context: e2e\n",
        ca.display()
    )
}

/// 32 hex digits from the kernel's random source.
fn random_token() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The suite's own clients (the admin, the identities it acts as) are not the driver: they send
/// at whatever rate a scenario needs.
fn unlimited() -> sharedresource_csi_driver::apiserver::rate::RateLayer {
    sharedresource_csi_driver::apiserver::rate::RateLayer::new(u32::MAX, u32::MAX)
}

/// MutatingAdmissionPolicy is beta and off by default from 1.34 (through 1.35): on, so the
/// generated read-only policy can be proven against the webhook. Before 1.34 it is alpha
/// (`v1alpha1` only), which the generated policy is not written for: left off, as a cluster of
/// that minor runs (docs/compatibility.md).
fn mutating_admission_policy(version: &str) -> Vec<String> {
    let minor: u32 = version.split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or(u32::MAX);
    if minor < 34 {
        return Vec::new();
    }
    vec![
        "--feature-gates=MutatingAdmissionPolicy=true".into(),
        "--runtime-config=admissionregistration.k8s.io/v1beta1=true".into(),
    ]
}
