//! `certificate`: the webhook's serving certificate without cert-manager. Writes a kustomize
//! Component holding the TLS Secret the Deployment mounts and a patch setting the `caBundle` of
//! every webhook in both shipped configurations, so that `kubectl apply -k` of an overlay that
//! includes it installs a working webhook in one step. Rerunning it rotates the certificate.
//!
//! The CA's key is never written: it signs this one certificate and is dropped, so a leaked
//! directory cannot mint another name. The private key is written with mode 0600.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use inline_guard_config::webhook_configurations::{SERVICE_NAME, SERVICE_NAMESPACE, webhook_configurations};
use inline_guard_policy::settings::ReadOnlyDrivers;
use inline_guard_server::tls::{TlsError, generate, write_file};

/// The Secret the shipped Deployment mounts (`config/deploy/deployment.yaml`).
pub const SECRET_NAME: &str = "csi-volume-admission-tls";

/// What `certificate` is asked for.
#[derive(Debug, Clone)]
pub struct CertificateArgs {
    /// The directory the Component is written to (created when missing).
    pub out_dir: PathBuf,
    /// The webhook Service's namespace.
    pub namespace: String,
    /// The webhook Service's name.
    pub service: String,
}

impl Default for CertificateArgs {
    fn default() -> Self {
        CertificateArgs { out_dir: PathBuf::new(), namespace: SERVICE_NAMESPACE.into(), service: SERVICE_NAME.into() }
    }
}

/// Why no certificate was written.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A name that cannot be a Service's or a namespace's.
    #[error("--{flag} {value:?} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63)")]
    BadName {
        /// The flag.
        flag: &'static str,
        /// The value, cut to 100 bytes.
        value: String,
    },
    /// The output directory could not be made.
    #[error("{}: {source}", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Generating or writing the certificate failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// A DNS-1123 label: what a Service and a namespace name must be.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn checked<'a>(flag: &'static str, value: &'a str) -> Result<&'a str, CertificateError> {
    if is_dns_label(value) {
        return Ok(value);
    }
    let mut cut = value.chars().take(100).collect::<String>();
    if cut.len() < value.len() {
        cut.push('…');
    }
    Err(CertificateError::BadName { flag, value: cut })
}

/// Writes the Component and tells `stdout` how to use it.
pub fn run(args: &CertificateArgs, stdout: &mut dyn Write) -> Result<(), CertificateError> {
    let namespace = checked("namespace", &args.namespace)?;
    let service = checked("service", &args.service)?;
    // The name the apiserver verifies when it calls a Service (`<service>.<namespace>.svc`), and
    // the cluster-domain form for clients that use it.
    let names = [format!("{service}.{namespace}.svc"), format!("{service}.{namespace}.svc.cluster.local")];
    let pems = generate(&names.each_ref().map(String::as_str))?;
    let base64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);

    std::fs::create_dir_all(&args.out_dir)
        .map_err(|source| CertificateError::Directory { path: args.out_dir.clone(), source })?;
    let file = |name: &str| args.out_dir.join(name);
    write_file(
        &file("secret.yaml"),
        secret_yaml(namespace, &base64(&pems.cert), &base64(&pems.key), &base64(&pems.ca)).as_bytes(),
        0o600,
    )?;
    write_file(&file("ca-bundle.yaml"), ca_bundle_patches(&base64(&pems.ca)).as_bytes(), 0o644)?;
    write_file(&file("kustomization.yaml"), COMPONENT.as_bytes(), 0o644)?;
    let _ = writeln!(
        stdout,
        "wrote a kustomize Component to {dir}: Secret {namespace}/{SECRET_NAME} for {names} and the caBundle of \
         both webhook configurations; list it under `components:` of an overlay of config/deploy (see docs/deploying.md)",
        dir = args.out_dir.display(),
        names = names.join(", "),
    );
    Ok(())
}

/// The Component: the Secret, and the caBundle patches.
const COMPONENT: &str = "# Written by `csi-volume-admission certificate`: the webhook's serving certificate without
# cert-manager. Include this directory under `components:` of an overlay of config/deploy.
# Rerun the command to rotate (then `kubectl apply -k` again: the server reloads the files).
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - secret.yaml
patches:
  - path: ca-bundle.yaml
";

fn secret_yaml(namespace: &str, cert: &str, key: &str, ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {SECRET_NAME}\n  namespace: {namespace}\ntype: kubernetes.io/tls\n\
         data:\n  tls.crt: {cert}\n  tls.key: {key}\n  ca.crt: {ca}\n"
    )
}

/// A strategic-merge patch per configuration: webhooks merge by name, so each entry sets only its
/// `clientConfig.caBundle`. The names come from the generator of `config/deploy/webhooks.yaml`.
fn ca_bundle_patches(ca: &str) -> String {
    let mut text = String::new();
    for configuration in webhook_configurations(&ReadOnlyDrivers::default()) {
        let kind = configuration["kind"].as_str().unwrap_or_default();
        let name = configuration["metadata"]["name"].as_str().unwrap_or_default();
        text.push_str(&format!(
            "---\napiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\nwebhooks:\n"
        ));
        for webhook in configuration["webhooks"].as_array().into_iter().flatten() {
            let webhook = webhook["name"].as_str().unwrap_or_default();
            text.push_str(&format!("  - name: {webhook}\n    clientConfig:\n      caBundle: {ca}\n"));
        }
    }
    text
}

/// The files `run` writes, for the tests and the README.
pub fn written_files(dir: &Path) -> [PathBuf; 3] {
    ["kustomization.yaml", "secret.yaml", "ca-bundle.yaml"].map(|name| dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_dns_labels_are_refused_with_a_bounded_quote() {
        for bad in ["", "Upper", "-dash", "dash-", "a.b", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
        assert!(is_dns_label("csi-volume-admission"));
        let long = "Z".repeat(10_000);
        let error = checked("service", &long).unwrap_err().to_string();
        assert!(error.len() < 300, "{error}");
        assert!(error.starts_with("--service \"ZZZ"), "{error}");
    }

    #[test]
    fn the_component_holds_a_tls_secret_and_a_ca_bundle_for_every_shipped_webhook() {
        let dir = tempfile::tempdir().unwrap();
        let args = CertificateArgs { out_dir: dir.path().join("tls"), ..Default::default() };
        let mut stdout = Vec::new();
        run(&args, &mut stdout).unwrap();
        let [component, secret, patches] = written_files(&args.out_dir).map(|p| std::fs::read_to_string(p).unwrap());
        assert!(component.contains("kind: Component") && component.contains("- secret.yaml"));
        assert!(secret.contains("name: csi-volume-admission-tls\n  namespace: inline-guard-system\n"));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(args.out_dir.join("secret.yaml")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the private key's file is readable by others");

        let shipped = include_str!("../../../config/deploy/webhooks.yaml");
        let shipped_names: Vec<&str> = shipped
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("- name: "))
            .filter(|n| n.ends_with(".inlineguard.dev"))
            .collect();
        let patched: Vec<&str> = patches.lines().filter_map(|l| l.trim_start().strip_prefix("- name: ")).collect();
        assert!(shipped_names.len() >= 3, "{shipped_names:?}");
        assert_eq!(patched, shipped_names);
        let bundle = patches.lines().find_map(|l| l.trim().strip_prefix("caBundle: ")).unwrap();
        let ca = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(bundle).unwrap()).unwrap();
        let secret_ca = secret.lines().find_map(|l| l.trim().strip_prefix("ca.crt: ")).unwrap();
        assert_eq!(bundle, secret_ca);
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(String::from_utf8(stdout).unwrap().contains("csi-volume-admission.inline-guard-system.svc"));
    }
}
