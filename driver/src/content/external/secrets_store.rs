//! Providers of kind `secrets-store`: the Secrets Store CSI Driver's provider API
//! (`v1alpha1.CSIDriverProvider`), so the providers written for that driver (Vault, AWS, Azure,
//! GCP) serve our volumes unchanged. `Mount` is sent what upstream's driver sends (the provider
//! parameters from the volume's attributes with the pod's keys and tokens, the secrets, the
//! target path, the permission `420`, the versions of what the volume shows, from its record); the answer's files are checked (paths inside the volume, permission bits only, at
//! most 1024 files, the message within `maxMessageBytes`) and handed to the atomic writer like
//! any source's, so the provider never writes on the node itself.
//!
//! A provider that cannot be reached, does not answer in time or answers with an error keeps
//! what the volume shows (not now); an answer that cannot be served withdraws it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use hyper_util::rt::TokioIo;
use inline_guard_proto::secretsstore::csi_driver_provider_client::CsiDriverProviderClient;
use inline_guard_proto::secretsstore::{MountRequest, MountResponse, ObjectVersion};
use serde_json::{Map, Value};
use tonic::transport::{Channel, Endpoint, Uri};

use super::helper_protocol::{MAX_LISTED_FILES, mount_options};
use super::provider::SecretsStoreProvider;
use crate::content::ask::VolumeAsk;
use crate::content::error::{Error, Result};
use crate::content::payload::{DEFAULT_MODE, FileContent, Payload, check_key};
use crate::quote::{quote, quote_path};

/// The permission upstream's driver sends: 0644 as a JSON number.
const PERMISSION: &str = "420";

/// One `secrets-store` provider and its connection, made at first use. It keeps nothing of
/// the volumes it serves: the object versions it answers go back with the files, into the
/// volume's record.
pub struct SecretsStoreClient {
    provider: SecretsStoreProvider,
    channel: OnceLock<Channel>,
    /// The largest answer decoded: the provider's `maxMessageBytes`, or less when the volume
    /// could not hold more ([`SecretsStoreClient::limit_answers_to`]).
    answer_limit: usize,
}

/// What an answer may carry beside its files' content: their paths, modes and versions.
pub const ANSWER_ENVELOPE_BYTES: u64 = 1 << 20;

impl SecretsStoreClient {
    /// A client of `provider` (nothing is dialled yet).
    pub fn new(provider: SecretsStoreProvider) -> SecretsStoreClient {
        let answer_limit = provider.max_message_bytes;
        SecretsStoreClient { provider, channel: OnceLock::new(), answer_limit }
    }

    /// Decodes no answer larger than what a volume of `volume_bytes` can show plus
    /// [`ANSWER_ENVELOPE_BYTES`] (nor than the provider's `maxMessageBytes`): a larger one could
    /// never be served, and is refused before it is held whole.
    pub fn limit_answers_to(&mut self, volume_bytes: u64) {
        let most = usize::try_from(volume_bytes.saturating_add(ANSWER_ENVELOPE_BYTES)).unwrap_or(usize::MAX);
        self.answer_limit = self.answer_limit.min(most);
    }

    /// The files the provider serves for `ask`'s volume, and the version it answered of each
    /// object.
    pub async fn files(&self, ask: &VolumeAsk) -> Result<(Payload, BTreeMap<String, String>)> {
        let name = quote(self.provider.name.as_str());
        let request = MountRequest {
            attributes: Value::Object(mount_attributes(ask).map_err(Error::Invalid)?).to_string(),
            // The nodePublishSecretRef's keys (`{}` without one).
            secrets: Value::Object(
                ask.secrets.by_key().iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect(),
            )
            .to_string(),
            target_path: ask.mount_point.to_string_lossy().into_owned(),
            permission: PERMISSION.into(),
            // What the volume shows, as its record says: a volume that kept older content
            // (`refreshResource: "false"`) does not claim the newer versions.
            current_object_version: ask
                .object_versions
                .iter()
                .map(|(id, version)| ObjectVersion { id: id.clone(), version: version.clone() })
                .collect(),
        };
        let mut client = CsiDriverProviderClient::new(self.channel())
            .max_decoding_message_size(self.answer_limit)
            .max_encoding_message_size(self.provider.max_message_bytes);
        let timeout = self.provider.timeout;
        let answer = match tokio::time::timeout(timeout, client.mount(request)).await {
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "provider {name} did not answer Mount within {timeout:?} (socket {})",
                    quote_path(&self.provider.socket)
                )));
            }
            Ok(Err(status)) => {
                return Err(Error::Unavailable(format!(
                    "provider {name} failed Mount: {:?}: {}",
                    status.code(),
                    quote(status.message())
                )));
            }
            Ok(Ok(answer)) => answer.into_inner(),
        };
        let (payload, versions) = checked_files(answer).map_err(|why| match why {
            Refusal::Failed(code) => {
                Error::Unavailable(format!("provider {name} answered Mount with error code {}", quote(&code)))
            }
            Refusal::Unservable(why) => Error::Unservable(format!("provider {name}: {why}")),
        })?;
        Ok((payload, versions.into_iter().map(|version| (version.id, version.version)).collect()))
    }

    /// The provider's channel: dialled lazily, so a provider that starts after the driver (or
    /// restarts) is reached at the next call, and each call fails alone while it is down.
    fn channel(&self) -> Channel {
        self.channel
            .get_or_init(|| {
                let socket = self.provider.socket.clone();
                let connector = tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
                });
                // The URI is required by tonic and never dialled: the connector ignores it.
                Endpoint::from_static("http://[::]:50051")
                    .connect_timeout(self.provider.timeout)
                    .connect_with_connector_lazy(connector)
            })
            .clone()
    }
}

/// `attributes` of `Mount`: the volume's attributes but `provider` (the provider's parameters),
/// with kubelet's pod keys and the service-account tokens as upstream's driver passes them.
/// The flexVolume design's `kubernetes.io/` keys are the helper protocol's, not sent here.
pub fn mount_attributes(ask: &VolumeAsk) -> std::result::Result<Map<String, Value>, String> {
    let mut attributes = mount_options(ask)?;
    attributes.retain(|key, _| !key.starts_with("kubernetes.io/"));
    Ok(attributes)
}

/// Why an answer to `Mount` is not served.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// The provider said it failed, with this code.
    Failed(String),
    /// The answer cannot be laid out as a volume.
    Unservable(String),
}

/// The files of an answer to `Mount`, checked, and the versions to send back next time.
fn checked_files(answer: MountResponse) -> std::result::Result<(Payload, Vec<ObjectVersion>), Refusal> {
    if let Some(error) = answer.error.filter(|error| !error.code.is_empty()) {
        return Err(Refusal::Failed(error.code));
    }
    if answer.files.is_empty() {
        return Err(Refusal::Unservable(
            "its answer to Mount holds no files (a provider that writes into the target path itself is not supported: the driver writes the files it is given)".into(),
        ));
    }
    if answer.files.len() > MAX_LISTED_FILES {
        return Err(Refusal::Unservable(format!(
            "its answer to Mount holds {} files, more than the {MAX_LISTED_FILES} a volume may hold",
            answer.files.len()
        )));
    }
    // Recorded with the volume and sent back at each refresh: bounded like the files.
    if answer.object_version.len() > MAX_LISTED_FILES {
        return Err(Refusal::Unservable(format!(
            "its answer to Mount holds {} object versions, more than {MAX_LISTED_FILES}",
            answer.object_version.len()
        )));
    }
    let mut payload = BTreeMap::new();
    for file in answer.files {
        check_key(&file.path).map_err(|error| Refusal::Unservable(format!("its answer to Mount: {error}")))?;
        let mode = match file.mode {
            // Unset (proto3's zero): the permission the driver asked for.
            0 => DEFAULT_MODE,
            mode if (0..=0o777).contains(&mode) => mode.unsigned_abs(),
            mode => {
                return Err(Refusal::Unservable(format!(
                    "its answer to Mount gives file {} mode {mode:#o}, which is more than permission bits",
                    quote(&file.path)
                )));
            }
        };
        let path = file.path.clone();
        if payload.insert(file.path, FileContent { data: file.contents, mode }).is_some() {
            return Err(Refusal::Unservable(format!("its answer to Mount names file {} twice", quote(&path))));
        }
    }
    Ok((payload, answer.object_version))
}

#[cfg(test)]
pub(crate) mod tests;
