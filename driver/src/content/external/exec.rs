//! Providers of kind `exec`. In eager mode: at publish and at each refresh, the helper is asked
//! with `mount` which files it serves, then every listed file is fetched with `get` (the calls
//! run in parallel, at most [`GETS_PER_VOLUME`] for one volume, at most `helperConcurrency`
//! helpers at once on the whole node and half of those for one namespace) and the volume shows
//! them all. A helper that fails, times out or says too much keeps what the volume shows
//! (UNAVAILABLE: not now); a helper that lists nothing to fetch, or a file it may not name,
//! withdraws it. In lazy mode, the answer to `mount` lays the volume out and each file is
//! fetched when opened ([`HelperFiles`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::fair_slots::FairSlots;

use super::helper_protocol::{MountReply, mount_arguments, mount_options};
use super::helper_run::{self, HelperFailure};
use serde_json::{Map, Value};

use super::lazy_files::{GETS_PER_VOLUME, HelperFiles};
use super::provider::{ExecProvider, FetchMode};
use crate::content::ask::VolumeAsk;
use crate::content::error::{Error, Result};
use crate::content::lazy::HandedFiles;
use crate::content::payload::{FileContent, Payload};
use crate::quote::quote;

/// The `exec` providers of a node, and the node's bound on helpers running at once (half of it
/// to one namespace at most, so one tenant's slow helpers leave the others room).
pub struct ExecProviders {
    providers: BTreeMap<String, ExecProvider>,
    permits: Arc<FairSlots>,
    /// The most an eager volume's files may hold together (`tmpfsSize`): fetching stops beyond.
    max_volume_bytes: u64,
}

impl Default for ExecProviders {
    fn default() -> Self {
        ExecProviders::new(BTreeMap::new(), 1)
    }
}

impl ExecProviders {
    /// `providers` by name, running at most `concurrency` helpers at once, half of them (rounded
    /// up) for one namespace's volumes.
    pub fn new(providers: BTreeMap<String, ExecProvider>, concurrency: usize) -> ExecProviders {
        ExecProviders { providers, permits: FairSlots::halved(concurrency), max_volume_bytes: u64::MAX }
    }

    /// The same providers, refusing an eager volume whose files hold more than `bytes` together
    /// as soon as they do (what could never be written is not gathered in memory either).
    pub fn with_volume_limit(mut self, bytes: u64) -> ExecProviders {
        self.max_volume_bytes = bytes;
        self
    }

    /// The provider named `name`, if the node has it.
    pub fn get(&self, name: &str) -> Option<&ExecProvider> {
        self.providers.get(name)
    }

    /// The files `provider` serves for `ask`'s volume: `mount`, then a `get` per listed file.
    /// A lazy provider's volume is laid out by [`ExecProviders::lazy_files`] and fetches its
    /// files when they are opened: it has nothing to lay out here (a refresh of it asks only
    /// whether access still holds).
    pub async fn files(&self, provider: &ExecProvider, ask: &VolumeAsk) -> Result<Payload> {
        if provider.mode == FetchMode::Lazy {
            return Ok(Payload::new());
        }
        let name = quote(provider.name.as_str());
        let name = name.as_str();
        let failed = |call: &str, failure: HelperFailure| {
            Error::Unavailable(format!("provider {name}: the helper's {call} {failure}"))
        };
        let (reply, options) = self.mount(provider, ask).await?;
        let paths = reply.listed_paths();
        if paths.is_empty() {
            return Err(Error::Unservable(format!(
                "provider {name}: the helper lists no files (\"files\" in its answer to mount); eager mode fetches the files a helper lists"
            )));
        }
        let (reply, options, failed) = (&reply, &options, &failed);
        // The volume's own bound first: waiting for the node's, a get holds none of the node's.
        let own = &Semaphore::new(GETS_PER_VOLUME);
        let gathered = &std::sync::atomic::AtomicU64::new(0);
        let limit = self.max_volume_bytes;
        let gets = paths.iter().map(|path| async move {
            let arguments = reply
                .get_arguments(path, options)
                .map_err(|why| Error::Unservable(format!("provider {name}: the helper's mount: {why}")))?;
            let arguments: Vec<OsString> = arguments.into_iter().map(OsString::from).collect();
            let _own =
                own.acquire().await.map_err(|_| Error::Internal("a volume's bound on helpers is closed".into()))?;
            let content = self
                .call(provider, &ask.pod.namespace, arguments)
                .await
                .map_err(|f| failed(&format!("get {}", quote(path)), f))?;
            let total =
                gathered.fetch_add(content.len() as u64, std::sync::atomic::Ordering::Relaxed) + content.len() as u64;
            if total > limit {
                return Err(Error::TooLarge(format!(
                    "provider {name}: the helper's files hold more than {limit} bytes together, the volume's size \
                     (tmpfsSize)"
                )));
            }
            Ok::<_, Error>((path.clone(), FileContent::new(content)))
        });
        futures_util::future::try_join_all(gets).await.map(|files| files.into_iter().collect())
    }

    /// The files of a lazy provider's volume: the helper's answer to `mount`, each file fetched
    /// when first opened.
    pub async fn lazy_files(&self, provider: &ExecProvider, ask: &VolumeAsk) -> Result<HelperFiles> {
        let (reply, options) = self.mount(provider, ask).await?;
        let permits = (self.permits.clone(), ask.pod.namespace.clone());
        HelperFiles::new(provider.clone(), permits, reply, options, tokio::runtime::Handle::current())
            .map(|files| files.with_memory_limit(self.max_volume_bytes))
    }

    /// The files of a lazy volume a predecessor process served as `handed`: its provider must
    /// still be configured here, in lazy mode (a successor given other providers cannot serve
    /// what the predecessor did, and says which).
    pub fn lazy_handed(&self, handed: HandedFiles) -> Result<HelperFiles> {
        let name = quote(&handed.provider);
        let Some(provider) = self.get(&handed.provider) else {
            return Err(Error::Missing(format!("provider {name} is not configured in this driver")));
        };
        if provider.mode != FetchMode::Lazy {
            return Err(Error::Unservable(format!("provider {name} no longer fetches files when opened")));
        }
        HelperFiles::from_handed(handed, provider.clone(), self.permits.clone(), tokio::runtime::Handle::current())
            .map(|files| files.with_memory_limit(self.max_volume_bytes))
    }

    /// The helper's answer to `mount` for `ask`'s volume, and the options it was given.
    async fn mount(&self, provider: &ExecProvider, ask: &VolumeAsk) -> Result<(MountReply, Map<String, Value>)> {
        let name = quote(provider.name.as_str());
        let options = mount_options(ask).map_err(Error::Invalid)?;
        let answer = self
            .call(provider, &ask.pod.namespace, mount_arguments(&ask.mount_point, &options))
            .await
            .map_err(|failure| Error::Unavailable(format!("provider {name}: the helper's mount {failure}")))?;
        let reply = MountReply::parse(&answer)
            .map_err(|why| Error::Unservable(format!("provider {name}: the helper's mount: {why}")))?;
        Ok((reply, options))
    }

    /// One helper call for a volume of `namespace`, once the node's bound lets it run.
    async fn call(
        &self,
        provider: &ExecProvider,
        namespace: &str,
        arguments: Vec<OsString>,
    ) -> std::result::Result<Vec<u8>, HelperFailure> {
        let _permit = self.permits.acquire(namespace).await;
        helper_run::run(&provider.helper, provider.run_as, &arguments, provider.timeout, provider.max_file_bytes).await
    }
}

#[cfg(test)]
mod tests;
