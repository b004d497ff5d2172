//! Command-line parsing and exit codes. `check` and `audit` exit 0 when everything is admitted,
//! 1 when something is (or would be) denied, 2 on bad usage or input or an unreachable cluster;
//! `serve` exits 0 after a clean shutdown and 2 when it cannot start; `webhooks` exits 0 after
//! printing and 2 on a bad configuration.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::audit::{self, AuditArgs};
use crate::certificate;
use crate::check::{self, CheckArgs};
use crate::serve::{self, FactsSource, ServeArgs};

/// Everything admitted.
pub const EXIT_ADMITTED: u8 = 0;
/// At least one object denied.
pub const EXIT_DENIED: u8 = 1;
/// Bad usage or input.
pub const EXIT_BAD_INPUT: u8 = 2;

#[derive(Parser)]
#[command(
    name = "csi-volume-admission",
    version,
    about = "CSIVolumeAdmission: admission control for CSI inline ephemeral volumes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the admission chain offline on manifests, against a cluster state read from a file.
    Check {
        /// Namespaces and CSIDrivers (YAML, multi-document, JSON or a v1 List).
        #[arg(long, value_name = "FILE")]
        cluster_state: PathBuf,
        /// CSIVolumeAdmission configuration; the built-in default (config/admission.yaml) otherwise.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Output: a table for people, or one AdmissionReview response per line.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Manifests of Pods, workloads, other objects or AdmissionReview requests; `-` is stdin.
        #[arg(value_name = "INPUT", required = true)]
        inputs: Vec<PathBuf>,
    },
    /// Serve the admission chain as an HTTPS validating (/validate) and mutating (/mutate) webhook.
    Serve {
        /// Standalone mode: Namespaces and CSIDrivers from this file, reloaded when it changes,
        /// instead of an apiserver.
        #[arg(long, value_name = "FILE", conflicts_with = "kubeconfig")]
        cluster_state: Option<PathBuf>,
        /// Watch Namespaces and CSIDrivers on the cluster this kubeconfig's current context names;
        /// without it (and without --cluster-state), the in-cluster service account is used.
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// CSIVolumeAdmission configuration; the built-in default (config/admission.yaml) otherwise.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// HTTPS address of the webhook.
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
        listen: SocketAddr,
        /// Plain-HTTP address of /healthz, /readyz and /metrics.
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
        health_listen: SocketAddr,
        /// Serving certificate (PEM), reloaded when it changes; a self-signed one is generated
        /// when omitted.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// Private key of --tls-cert (PEM).
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// After SIGTERM, seconds during which /readyz fails and every response closes its
        /// connection while new connections are still served (so endpoints move first).
        #[arg(long, value_name = "SECONDS", default_value_t = 5)]
        shutdown_delay_seconds: u64,
        /// Webhook connections served at once; beyond them, a newcomer takes an idle connection's place
        /// from an address holding more, or waits (as many, up to the request timeout).
        #[arg(long, value_name = "N", default_value_t = inline_guard_server::server::DEFAULT_MAX_CONNECTIONS,
              value_parser = clap::value_parser!(usize))]
        max_connections: usize,
        /// MiB of request bodies held in memory at once; a request over it is answered 429 with
        /// Retry-After. The default fits the shipped limits.memory of 128Mi.
        #[arg(long, value_name = "MIB", default_value_t = (inline_guard_server::server::DEFAULT_BODY_BUDGET_BYTES >> 20) as u64,
              value_parser = clap::value_parser!(u64).range(3..=4096))]
        body_budget_mib: u64,
    },
    /// Report which Pods and workloads of a live cluster would be denied, warned or audited under
    /// the current labels and configuration. Exits 1 when any would be denied.
    Audit {
        /// The cluster of this kubeconfig's current context; the in-cluster service account
        /// otherwise.
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// CSIVolumeAdmission configuration; the built-in default (config/admission.yaml) otherwise.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Output: a table for people, or one JSON object per finding.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Write the webhook's serving certificate as a kustomize Component (the TLS Secret and the
    /// caBundle of both webhook configurations), for clusters without cert-manager. Rerun to
    /// rotate.
    Certificate {
        /// The directory to write `kustomization.yaml`, `secret.yaml` and `ca-bundle.yaml` to.
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
        /// The webhook Service's namespace.
        #[arg(long, default_value = inline_guard_config::webhook_configurations::SERVICE_NAMESPACE)]
        namespace: String,
        /// The webhook Service's name.
        #[arg(long, default_value = inline_guard_config::webhook_configurations::SERVICE_NAME)]
        service: String,
    },
    /// Print the ValidatingWebhookConfiguration and MutatingWebhookConfiguration for `serve` with
    /// this configuration (YAML, ready for `kubectl apply -f -`). Rerun whenever readOnlyDrivers
    /// changes: the mutating webhook's matchConditions name those drivers.
    Webhooks {
        /// CSIVolumeAdmission configuration; the built-in default (config/admission.yaml) otherwise.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Print this configuration's CSIVolumeAdmission decisions as ValidatingAdmissionPolicies and
    /// their bindings, for clusters that want no webhook on the pod-create path (see
    /// docs/native-policies.md for what they cannot say exactly as the webhook does).
    Policy {
        /// CSIVolumeAdmission configuration; the built-in default (config/admission.yaml) otherwise.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Output: one YAML stream, or one JSON list.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = PolicyOutput::Yaml)]
        output: PolicyOutput,
    },
}

/// How `policy` prints its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyOutput {
    /// A commented YAML stream, ready for `kubectl apply -f -`.
    Yaml,
    /// A JSON `List`.
    Json,
}

/// How `serve` writes its logs (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How `check` prints its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table a person reads.
    Table,
    /// One `admission.k8s.io/v1` AdmissionReview response per line, in input order.
    Json,
}

/// Runs the command with `args` (program name first) and returns the exit code.
pub fn run<I, T>(args: I, stdin: &mut dyn Read, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_BAD_INPUT } else { EXIT_ADMITTED };
            let rendered = error.render().to_string();
            let sink: &mut dyn Write = if error.use_stderr() { stderr } else { stdout };
            let _ = sink.write_all(rendered.as_bytes());
            return code;
        }
    };
    match cli.command {
        Command::Audit { kubeconfig, config, output } => {
            let source = kubeconfig.map_or(FactsSource::InCluster, FactsSource::Kubeconfig);
            match audit::run(&AuditArgs { source, config, output }, stdout) {
                Ok(summary) if summary.denied > 0 => EXIT_DENIED,
                Ok(_) => EXIT_ADMITTED,
                Err(error) => {
                    let _ = writeln!(stderr, "csi-volume-admission audit: {error}");
                    EXIT_BAD_INPUT
                }
            }
        }
        Command::Serve {
            cluster_state,
            kubeconfig,
            config,
            listen,
            health_listen,
            tls_cert,
            tls_key,
            log_format,
            shutdown_delay_seconds,
            max_connections,
            body_budget_mib,
        } => {
            let tls = tls_cert.zip(tls_key).map(|(cert, key)| inline_guard_server::tls::TlsFiles { cert, key });
            let facts = match (cluster_state, kubeconfig) {
                (Some(path), _) => FactsSource::ClusterState(path),
                (None, Some(path)) => FactsSource::Kubeconfig(path),
                (None, None) => FactsSource::InCluster,
            };
            let options = inline_guard_server::server::ServerOptions {
                listen,
                health_listen,
                shutdown_delay: std::time::Duration::from_secs(shutdown_delay_seconds),
                max_connections: max_connections.max(1),
                body_budget_bytes: (body_budget_mib << 20) as usize,
                ..Default::default()
            };
            let args = ServeArgs { facts, config, options, tls, json_logs: log_format == LogFormat::Json };
            match serve::run(args, stdout) {
                Ok(()) => EXIT_ADMITTED,
                Err(error) => {
                    let _ = writeln!(stderr, "csi-volume-admission serve: {error}");
                    EXIT_BAD_INPUT
                }
            }
        }
        Command::Certificate { out_dir, namespace, service } => {
            let args = certificate::CertificateArgs { out_dir, namespace, service };
            match certificate::run(&args, stdout) {
                Ok(()) => EXIT_ADMITTED,
                Err(error) => {
                    let _ = writeln!(stderr, "csi-volume-admission certificate: {error}");
                    EXIT_BAD_INPUT
                }
            }
        }
        Command::Webhooks { config } => print_generated("webhooks", config.as_deref(), stdout, stderr, |config| {
            inline_guard_config::webhook_configurations::webhook_configurations_yaml(&config.settings.read_only_drivers)
        }),
        Command::Policy { config, output } => {
            print_generated("policy", config.as_deref(), stdout, stderr, |config| match output {
                PolicyOutput::Yaml => inline_guard_config::native_policies::native_policies_yaml(&config.settings),
                PolicyOutput::Json => {
                    let items = inline_guard_config::native_policies::native_policies(&config.settings);
                    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
                    serde_json::to_string_pretty(&list).map(|text| text + "\n").map_err(|error| error.to_string())
                }
            })
        }
        Command::Check { cluster_state, config, output, inputs } => {
            let args = CheckArgs { cluster_state, config, output, inputs };
            match check::run(&args, stdin, stdout) {
                Ok(summary) if summary.denied > 0 => EXIT_DENIED,
                Ok(_) => EXIT_ADMITTED,
                Err(error) => {
                    let _ = writeln!(stderr, "csi-volume-admission check: {error}");
                    EXIT_BAD_INPUT
                }
            }
        }
    }
}

/// `webhooks` and `policy`: objects generated from the configuration at `config` (the embedded
/// default without one), printed whole or not at all.
fn print_generated(
    command: &str,
    config: Option<&std::path::Path>,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    generate: impl FnOnce(inline_guard_config::AdmissionConfig) -> Result<String, String>,
) -> u8 {
    let text =
        inline_guard_config::AdmissionConfig::load_or_default(config).map_err(|e| e.to_string()).and_then(generate);
    match text {
        Ok(text) if stdout.write_all(text.as_bytes()).is_ok() => EXIT_ADMITTED,
        Ok(_) => EXIT_BAD_INPUT,
        Err(error) => {
            let _ = writeln!(stderr, "csi-volume-admission {command}: {error}");
            EXIT_BAD_INPUT
        }
    }
}
