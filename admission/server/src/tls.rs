//! Serving certificates: loading a PEM pair, serving it through a resolver that swaps in a new
//! pair when the files change (cert-manager rotation) without a restart or a dropped connection,
//! and generating a loopback pair for standalone mode.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rustls::crypto::ring;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::reload::Reload;

/// A certificate chain file and its private key file, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why a certificate pair cannot be served. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{}: no PEM certificate found", .0.display())]
    NoCertificate(PathBuf),
    /// The key file holds no usable private key.
    #[error("{}: {reason}", path.display())]
    BadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key does not belong to the certificate.
    #[error("{} and {} do not match: {reason}", files.cert.display(), files.key.display())]
    Mismatch {
        /// The pair.
        files: TlsFiles,
        /// What rustls said.
        reason: String,
    },
    /// A certificate could not be generated or written.
    #[error("generating a certificate: {0}")]
    Generate(String),
}

/// Loads and checks a pair.
pub fn load_pair(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let read = |path: &Path| fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source });
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NoCertificate(files.cert.clone()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(files.cert.clone()));
    }
    let bad_key = |reason: String| TlsError::BadKey { path: files.key.clone(), reason };
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| bad_key("no PEM private key found".into()))?;
    let signing_key = ring::sign::any_supported_type(&key).map_err(|error| bad_key(error.to_string()))?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|error| TlsError::Mismatch { files: files.clone(), reason: error.to_string() })?;
    Ok(certified)
}

/// Serves the current pair and swaps in a new one when the files change.
#[derive(Debug)]
pub struct ReloadingCertificate {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
    // The bytes last tried, so an unchanged (or unchanged-and-broken) pair is not re-parsed or
    // re-reported every poll. Contents, not mtimes: rotations within one mtime tick still count.
    last_seen: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl ReloadingCertificate {
    /// Loads the pair; a broken pair at start-up is an error.
    pub fn load(files: TlsFiles) -> Result<ReloadingCertificate, TlsError> {
        let certified = load_pair(&files)?;
        let seen = (fs::read(&files.cert).unwrap_or_default(), fs::read(&files.key).unwrap_or_default());
        Ok(ReloadingCertificate { files, current: RwLock::new(Arc::new(certified)), last_seen: Mutex::new(seen) })
    }

    /// Re-reads the files and swaps in the new pair if they changed and are valid.
    pub fn reload_if_changed(&self) -> Reload {
        let (Ok(cert), Ok(key)) = (fs::read(&self.files.cert), fs::read(&self.files.key)) else {
            // Mid-rotation a file can be briefly missing; the next poll sees the finished state.
            return Reload::Unchanged;
        };
        let mut last_seen = self.last_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if last_seen.0 == cert && last_seen.1 == key {
            return Reload::Unchanged;
        }
        *last_seen = (cert, key);
        match load_pair(&self.files) {
            Ok(certified) => {
                *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(certified);
                Reload::Reloaded
            }
            Err(error) => Reload::Rejected(error.to_string()),
        }
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A TLS 1.2/1.3 server configuration (ring provider) speaking HTTP/1.1 with `certificate`.
pub fn server_config(certificate: Arc<ReloadingCertificate>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Generate(error.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A generated serving pair and the CA that signed it.
#[derive(Debug, Clone)]
pub struct GeneratedPair {
    /// Where the serving certificate and key were written.
    pub files: TlsFiles,
    /// The CA certificate, PEM: what a client (or a webhook's `caBundle`, base64-encoded) trusts.
    pub ca_pem: String,
}

/// A serving certificate, its key and the CA that signed it, PEM, in memory.
pub struct GeneratedPems {
    /// The serving certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
    /// The CA certificate: what a client (or a webhook's `caBundle`, base64-encoded) trusts.
    pub ca: String,
}

impl std::fmt::Debug for GeneratedPems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("GeneratedPems").field("cert", &self.cert).field("ca", &self.ca).finish_non_exhaustive()
    }
}

/// Generates a CA and a serving certificate for `names` (DNS names or IP addresses), signed by
/// it, each with a new P-256 key; the CA's key is dropped, so nothing else is ever signed by it.
pub fn generate(names: &[&str]) -> Result<GeneratedPems, TlsError> {
    let failed = |error: rcgen::Error| TlsError::Generate(error.to_string());
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "csi-volume-admission self-signed CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca_key = rcgen::KeyPair::generate().map_err(failed)?;
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(failed)?;

    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut leaf_params = rcgen::CertificateParams::new(names).map_err(failed)?;
    leaf_params.distinguished_name.push(rcgen::DnType::CommonName, "csi-volume-admission");
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = rcgen::KeyPair::generate().map_err(failed)?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca).map_err(failed)?;
    Ok(GeneratedPems { cert: leaf.pem(), key: leaf_key.serialize_pem(), ca: ca.pem() })
}

/// Generates a CA and a serving certificate for `names` ([`generate`]), and writes the serving
/// pair to `dir` as `tls.crt` and `tls.key` (mode 0600) and the CA as `ca.crt`.
pub fn generate_pair(dir: &Path, names: &[&str]) -> Result<GeneratedPair, TlsError> {
    let pems = generate(names)?;
    fs::create_dir_all(dir).map_err(|error| TlsError::Generate(format!("{}: {error}", dir.display())))?;
    let files = TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
    write_file(&files.cert, pems.cert.as_bytes(), 0o644)?;
    write_file(&files.key, pems.key.as_bytes(), 0o600)?;
    write_file(&dir.join("ca.crt"), pems.ca.as_bytes(), 0o644)?;
    Ok(GeneratedPair { files, ca_pem: pems.ca })
}

/// A client connector trusting `ca_pems` (PEM certificates), for the tests, benchmarks and tools
/// that talk to a server whose CA was generated by [`generate_pair`].
#[cfg(any(test, feature = "test-util"))]
pub fn connector_trusting(ca_pems: &[&str]) -> Result<tokio_rustls::TlsConnector, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in ca_pems {
        let certificate =
            CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|error| TlsError::Generate(error.to_string()))?;
        roots.add(certificate).map_err(|error| TlsError::Generate(error.to_string()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Generate(error.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Writes `bytes` to `path` with `mode`, atomically: beside it, then renamed over it.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let failed = |error: std::io::Error| TlsError::Generate(format!("{}: {error}", path.display()));
    // Write beside the target and rename, so a watcher never reads half a file.
    let temporary = path.with_extension("tmp");
    let mut file =
        fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&temporary).map_err(failed)?;
    file.write_all(bytes).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    fs::rename(&temporary, path).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_pair_loads_and_its_key_matches() {
        let dir = tempfile::tempdir().unwrap();
        let pair = generate_pair(dir.path(), &["localhost", "127.0.0.1"]).unwrap();
        assert!(pair.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        load_pair(&pair.files).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(fs::metadata(&pair.files.key).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn broken_pairs_are_refused_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let first = generate_pair(&dir.path().join("a"), &["localhost"]).unwrap();
        let second = generate_pair(&dir.path().join("b"), &["localhost"]).unwrap();
        let mismatched = TlsFiles { cert: first.files.cert.clone(), key: second.files.key.clone() };
        let message = load_pair(&mismatched).unwrap_err().to_string();
        assert!(message.contains("do not match"), "{message}");

        let empty = dir.path().join("empty.pem");
        fs::write(&empty, "").unwrap();
        let no_cert = TlsFiles { cert: empty.clone(), key: first.files.key.clone() };
        assert_eq!(
            load_pair(&no_cert).unwrap_err().to_string(),
            format!("{}: no PEM certificate found", empty.display())
        );
        let no_key = TlsFiles { cert: first.files.cert.clone(), key: empty.clone() };
        assert_eq!(
            load_pair(&no_key).unwrap_err().to_string(),
            format!("{}: no PEM private key found", empty.display())
        );
    }

    #[test]
    fn reload_swaps_valid_pairs_and_keeps_the_old_one_on_a_broken_pair() {
        let dir = tempfile::tempdir().unwrap();
        let pair = generate_pair(dir.path(), &["localhost"]).unwrap();
        let certificate = ReloadingCertificate::load(pair.files.clone()).unwrap();
        let original = certificate.current();
        assert_eq!(certificate.reload_if_changed(), Reload::Unchanged);

        generate_pair(dir.path(), &["localhost"]).unwrap();
        assert_eq!(certificate.reload_if_changed(), Reload::Reloaded);
        let rotated = certificate.current();
        assert_ne!(rotated.cert, original.cert);

        fs::write(&pair.files.key, "-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n").unwrap();
        assert!(matches!(certificate.reload_if_changed(), Reload::Rejected(_)));
        assert_eq!(certificate.current().cert, rotated.cert, "the old pair is still served");
        assert_eq!(certificate.reload_if_changed(), Reload::Unchanged, "a broken pair is reported once");
    }
}
