//! The cluster's client CA (`--client-ca-file`): it signs the certificates components present as
//! themselves, as in a production cluster, where kubelet authenticates as `system:node:<name>`
//! in `system:nodes`, so the Node authorizer and NodeRestriction judge it as they would any node.

use std::path::{Path, PathBuf};

/// A CA for client certificates, with its key.
pub struct ClientCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    /// The CA certificate, for the apiserver's `--client-ca-file`.
    pub cert: PathBuf,
}

fn failed(error: rcgen::Error) -> String {
    format!("generating a client certificate: {error}")
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

impl ClientCa {
    /// A new CA, its certificate written in `dir`.
    pub fn generate(dir: &Path) -> Result<ClientCa, String> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "inline-guard e2e client CA");
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().map_err(failed)?).map_err(failed)?;
        let cert = dir.join("client-ca.crt");
        write(&cert, &issuer.pem())?;
        Ok(ClientCa { issuer, cert })
    }

    /// A client certificate and key for user `name` (in `group` when given), written in `dir`
    /// as `NAME.crt` and `NAME.key` (the name's colons replaced); their paths.
    pub fn issue(&self, dir: &Path, name: &str, group: Option<&str>) -> Result<(PathBuf, PathBuf), String> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        if let Some(group) = group {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        let file = name.replace(':', "-");
        let (cert_path, key_path) = (dir.join(format!("{file}.crt")), dir.join(format!("{file}.key")));
        write(&cert_path, &cert.pem())?;
        write(&key_path, &key.serialize_pem())?;
        Ok((cert_path, key_path))
    }
}
