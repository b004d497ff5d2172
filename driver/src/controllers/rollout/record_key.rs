//! The rollout record's key ([`RecordKey`]): random bytes in one Secret of the controller's own
//! namespace (`--rollout-key-secret`, shipped `inline-guard-driver/sharedresource-rollout-key`),
//! made by the first controller that finds none and read by every one after, so versions agree
//! across restarts and replicas. Never logged. A key deleted is made anew by the next
//! controller; the records made under the old one then read as none (each carries its key's id)
//! and are written again without a restart. A Secret that holds no valid key is left alone
//! (an operator's to fix or delete), and the controller restarts nothing meanwhile.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tracing::warn;

use super::content_version::RecordKey;
use crate::apiserver::request::ask;
use crate::quote::Logged;

/// The key's Secret as shipped.
pub const DEFAULT_KEY_SECRET: &str = "inline-guard-driver/sharedresource-rollout-key";
/// The Secret's data key holding the key.
const DATA_KEY: &str = "key";
/// The field manager of the Secret's creation.
const MANAGER: &str = "sharedresource-rollout";
/// The first wait after a failed attempt; doubled each time up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// The key's Secret, as `NAMESPACE/NAME`.
pub type KeySecret = sharedresource_api::NamespacedObject;

/// The key `secret` holds, made when there is none; tried again with backoff until there is one.
pub async fn load_or_make(client: &Client, secret: &KeySecret, timeout: Duration) -> RecordKey {
    let mut wait = FIRST_WAIT;
    loop {
        match attempt(client, secret, timeout).await {
            Ok(key) => return key,
            Err(error) => {
                warn!(secret = %secret, error = %Logged(&error), "no key for the rollout records yet; restarting nothing until there is one")
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
    }
}

async fn attempt(client: &Client, secret: &KeySecret, timeout: Duration) -> Result<RecordKey, String> {
    let api = Api::<Secret>::namespaced(client.clone(), secret.namespace.as_str());
    let name = secret.name.as_str();
    let what = || format!("reading the rollout records' key, Secret {secret}");
    let found = ask(timeout, what, api.get_opt(name)).await.map_err(|e| e.0)?;
    let found = match found {
        Some(found) => found,
        None => {
            let bytes = RecordKey::generate()?;
            let object = serde_json::json!({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": secret.namespace.as_str()},
                "data": {DATA_KEY: k8s_openapi::ByteString(bytes.to_vec())},
            });
            let what = || format!("making the rollout records' key, Secret {secret}");
            ask(timeout, what, api.patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(&object)))
                .await
                .map_err(|e| e.0)?
        }
    };
    let bytes = found.data.as_ref().and_then(|data| data.get(DATA_KEY)).map(|value| value.0.as_slice());
    let bytes = bytes
        .ok_or_else(|| format!("Secret {secret} has no data key {DATA_KEY:?}; delete it to have a new key made"))?;
    RecordKey::from_bytes(bytes).map_err(|e| format!("Secret {secret}: {e}; delete it to have a new key made"))
}
