//! The providers a node runs, by name, whatever their kind: what a volume's `provider`
//! attribute is looked up in, and the one place a provider's kind picks how its files are had.

use std::collections::BTreeMap;

use super::exec::ExecProviders;
use super::lazy_files::HelperFiles;
use super::provider::{FetchMode, Provider};
use super::secrets_store::SecretsStoreClient;
use crate::content::ask::VolumeAsk;
use crate::content::error::{Error, Result};
use crate::content::lazy::HandedFiles;
use crate::content::payload::Payload;
use crate::quote::quote;

/// The node's providers.
#[derive(Default)]
pub struct Providers {
    exec: ExecProviders,
    secrets_store: BTreeMap<String, SecretsStoreClient>,
}

impl Providers {
    /// `providers` by name, running at most `helper_concurrency` helper programs at once.
    pub fn new(providers: BTreeMap<String, Provider>, helper_concurrency: usize) -> Providers {
        let (mut exec, mut secrets_store) = (BTreeMap::new(), BTreeMap::new());
        for (name, provider) in providers {
            match provider {
                Provider::Exec(provider) => {
                    exec.insert(name, provider);
                }
                Provider::SecretsStore(provider) => {
                    secrets_store.insert(name, SecretsStoreClient::new(provider));
                }
            }
        }
        Providers { exec: ExecProviders::new(exec, helper_concurrency), secrets_store }
    }

    /// The same providers, an eager `exec` volume's files bounded to `bytes` together (the
    /// volume's tmpfsSize) while they are fetched. A Secrets Store provider's answer is one
    /// message, decoded only up to what such a volume can show (plus its envelope), and never
    /// beyond its `maxMessageBytes`.
    pub fn with_volume_limit(mut self, bytes: u64) -> Providers {
        self.exec = self.exec.with_volume_limit(bytes);
        for client in self.secrets_store.values_mut() {
            client.limit_answers_to(bytes);
        }
        self
    }

    /// Nothing when the node has a provider named `name`; otherwise why a volume naming it
    /// cannot be served.
    pub fn known(&self, name: &str) -> Result<()> {
        if self.exec.get(name).is_some() || self.secrets_store.contains_key(name) {
            return Ok(());
        }
        Err(unknown(name))
    }

    /// The files provider `name` serves for `ask`'s volume, and what it answered of each
    /// object's version (a Secrets Store provider's; none for a helper).
    pub async fn files(&self, name: &str, ask: &VolumeAsk) -> Result<(Payload, BTreeMap<String, String>)> {
        if let Some(provider) = self.exec.get(name) {
            return Ok((self.exec.files(provider, ask).await?, BTreeMap::new()));
        }
        match self.secrets_store.get(name) {
            Some(client) => client.files(ask).await,
            None => Err(unknown(name)),
        }
    }

    /// Whether provider `name` is a Secrets Store CSI provider.
    pub fn is_secrets_store(&self, name: &str) -> bool {
        self.secrets_store.contains_key(name)
    }

    /// Whether provider `name` fetches files when they are opened (an `exec` provider in
    /// lazy mode), so that its volumes are laid out by [`Providers::lazy_files`].
    pub fn is_lazy(&self, name: &str) -> bool {
        self.exec.get(name).is_some_and(|provider| provider.mode == FetchMode::Lazy)
    }

    /// The files of `ask`'s volume of lazy provider `name`, fetched when opened.
    pub async fn lazy_files(&self, name: &str, ask: &VolumeAsk) -> Result<HelperFiles> {
        match self.exec.get(name).filter(|provider| provider.mode == FetchMode::Lazy) {
            Some(provider) => self.exec.lazy_files(provider, ask).await,
            None => Err(Error::Internal(format!("provider {} does not fetch files when opened", quote(name)))),
        }
    }

    /// The files of a lazy volume a predecessor process served as `handed`.
    pub fn lazy_handed(&self, handed: HandedFiles) -> Result<HelperFiles> {
        self.exec.lazy_handed(handed)
    }
}

fn unknown(name: &str) -> Error {
    Error::Missing(format!(
        "provider {} is not configured on this node (providers in the driver's configuration)",
        quote(name)
    ))
}
