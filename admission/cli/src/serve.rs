//! `serve`: the admission chain as an HTTPS validating and mutating webhook, until SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use inline_guard_admission::plugins::standard_chain;
use inline_guard_config::AdmissionConfig;
use inline_guard_server::cache::{CacheSettings, watch_cluster};
use inline_guard_server::metrics::Metrics;
use inline_guard_server::server::{Parts, Server, ServerOptions};
use inline_guard_server::share_lookup::{LiveShareFacts, LookupSettings};
use inline_guard_server::standalone::FileFacts;
use inline_guard_server::tls::{ReloadingCertificate, TlsFiles, generate_pair};
use tracing::info;

/// Where the server's cluster facts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FactsSource {
    /// Standalone mode: a cluster-state file, reloaded when it changes.
    ClusterState(PathBuf),
    /// A lister cache on the cluster this kubeconfig names.
    Kubeconfig(PathBuf),
    /// A lister cache on the cluster the pod runs in.
    InCluster,
}

/// The arguments of `serve`, as parsed.
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// Where facts come from.
    pub facts: FactsSource,
    /// Configuration file; the built-in default otherwise.
    pub config: Option<PathBuf>,
    /// Addresses and bounds.
    pub options: ServerOptions,
    /// Serving pair; generated when absent.
    pub tls: Option<TlsFiles>,
    /// JSON logs.
    pub json_logs: bool,
}

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Bad configuration file.
    #[error(transparent)]
    Config(#[from] inline_guard_config::Error),
    /// Bad cluster-state file.
    #[error(transparent)]
    ClusterState(#[from] inline_guard_admission::ClusterStateError),
    /// Bad or ungeneratable certificate.
    #[error(transparent)]
    Tls(#[from] inline_guard_server::tls::TlsError),
    /// No usable Kubernetes client configuration.
    #[error("kubernetes client: {0}")]
    Kube(String),
    /// A socket could not be bound, or the runtime not started.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs the server until SIGTERM or SIGINT, then drains and returns.
pub fn run(args: ServeArgs, stdout: &mut dyn std::io::Write) -> Result<(), ServeError> {
    init_logging(args.json_logs);
    let config = AdmissionConfig::load_or_default(args.config.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let mut _generated = None;
    let files = match args.tls.clone() {
        Some(files) => files,
        None => {
            let dir = std::env::temp_dir().join(format!("csi-volume-admission-{}", std::process::id()));
            _generated = Some(GeneratedDir(dir.clone()));
            let pair = generate_pair(&dir, &["localhost", "127.0.0.1", "::1"])?;
            // Best effort, like the logs: a closed stdout must not stop the server.
            let _ = writeln!(
                stdout,
                "serving certificate: {} (self-signed for localhost, 127.0.0.1, ::1)",
                pair.files.cert.display()
            );
            let _ = writeln!(stdout, "CA certificate: {}", dir.join("ca.crt").display());
            let _ = writeln!(stdout, "caBundle: {}", base64::engine::general_purpose::STANDARD.encode(&pair.ca_pem));
            let _ = stdout.flush();
            pair.files
        }
    };
    let certificate = Arc::new(ReloadingCertificate::load(files)?);
    let options = args.options.clone();
    let settings = Arc::new(config.settings);

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        // Registered before anything is served: a SIGTERM arriving the moment the server is up
        // must drain it, not kill the process (the default action).
        let termination = Termination::register()?;
        let parts = match &args.facts {
            FactsSource::ClusterState(path) => {
                let facts = Arc::new(FileFacts::load(path, metrics.clone())?);
                Parts {
                    chain: standard_chain(settings, facts.clone(), facts.clone()),
                    readiness: facts.clone(),
                    file_facts: Some(facts),
                    certificate,
                    metrics,
                }
            }
            source => {
                let client = kube_client(source).await?;
                let shares = LiveShareFacts::new(client.clone(), LookupSettings::default(), metrics.clone());
                let (facts, watches) = watch_cluster(client, CacheSettings::default(), metrics.clone());
                tokio::spawn(watches);
                Parts {
                    chain: standard_chain(settings, facts.clone(), Arc::new(shares)),
                    readiness: facts,
                    file_facts: None,
                    certificate,
                    metrics,
                }
            }
        };
        let server = Server::start(options, parts).await?;
        info!(address = %server.webhook_addr(), "webhook listening (HTTPS: POST /validate, POST /mutate)");
        info!(address = %server.health_addr(), "health listening (HTTP: /healthz, /readyz, /metrics)");
        let server = match termination.wait().await {
            Signal::Terminate => {
                info!(delay = ?args.options.shutdown_delay, "SIGTERM: draining (not ready, connections closed after their answers), then no new connections");
                server
            }
            // A person at a terminal is not behind a Service: no delay to wait out.
            Signal::Interrupt => {
                info!("interrupted: no new connections, finishing requests in flight");
                server.without_shutdown_delay()
            }
        };
        server.shutdown().await;
        info!("stopped");
        Ok::<_, ServeError>(())
    })
}

/// The directory of a generated self-signed pair, removed when `serve` returns: the pair is only
/// good for this process (the next start generates a new CA), so nothing is left in /tmp.
struct GeneratedDir(PathBuf);

impl Drop for GeneratedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A client for the kubeconfig's current context, or for the cluster the pod runs in.
pub async fn kube_client(source: &FactsSource) -> Result<kube::Client, ServeError> {
    let kube_error = |error: &dyn std::fmt::Display| ServeError::Kube(error.to_string());
    // kube's TLS goes through rustls; only the ring provider is compiled in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match source {
        FactsSource::Kubeconfig(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|error| ServeError::Kube(format!("{}: {error}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|error| kube_error(&error))?
        }
        _ => kube::Config::incluster().map_err(|error| kube_error(&error))?,
    };
    kube::Client::try_from(config).map_err(|error| kube_error(&error))
}

/// What stopped the server.
enum Signal {
    /// SIGTERM: the kubelet (or an orchestrator) stopping a replica.
    Terminate,
    /// SIGINT: Ctrl-C.
    Interrupt,
}

/// SIGTERM and SIGINT, caught from the moment this is made.
struct Termination {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Termination {
    /// Catches both signals from now on (needs the runtime).
    fn register() -> std::io::Result<Termination> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Termination { terminate: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    /// The first of them to arrive.
    async fn wait(mut self) -> Signal {
        tokio::select! {
            _ = self.terminate.recv() => Signal::Terminate,
            _ = self.interrupt.recv() => Signal::Interrupt,
        }
    }
}

/// Standard error that swallows write failures. tracing-subscriber panics when it cannot even
/// report a failed write, and a closed log pipe must not take the webhook down with it. The
/// driver's `cli` has the same writer: see there why it is written twice.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests running serve twice in one process) keeps the first.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
