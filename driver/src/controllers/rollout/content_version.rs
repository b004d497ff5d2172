//! A backing object's content version: a keyed MAC (HMAC-SHA256 under the controller's
//! [`RecordKey`]) of which object it is and of exactly what a share's volume shows (a Secret's
//! `data`, a ConfigMap's `data` and `binaryData`). So a change of labels, annotations or anything
//! else about the object is no change; the same content of the same object is the same version
//! in every controller process holding the key; and a record on a workload tells nobody without
//! the key anything of the content (a guess cannot be checked offline), nor that two objects
//! hold the same. Only the version is kept; the content is dropped as soon as it is read.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

/// Hex digits of the MAC kept: 64 bits, ample to tell one version from the next.
const VERSION_HEX_DIGITS: usize = 16;
/// The key's length in bytes.
pub const KEY_BYTES: usize = 32;
/// Hex digits of the key's id written into each record, so a record made under another key
/// (a key deleted and made anew) reads as no record rather than as a change of every share.
const KEY_ID_HEX_DIGITS: usize = 8;

/// The key the versions are made with.
pub struct RecordKey(ring::hmac::Key, String);

impl RecordKey {
    /// The key of `bytes` ([`KEY_BYTES`] of them); what is wrong otherwise.
    pub fn from_bytes(bytes: &[u8]) -> Result<RecordKey, String> {
        if bytes.len() != KEY_BYTES {
            return Err(format!("the key has {} bytes, not {KEY_BYTES}", bytes.len()));
        }
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes);
        let id = hex(ring::hmac::sign(&key, b"inline-guard rollout record key id").as_ref(), KEY_ID_HEX_DIGITS);
        Ok(RecordKey(key, id))
    }

    /// [`KEY_BYTES`] fresh random bytes for a new key.
    pub fn generate() -> Result<[u8; KEY_BYTES], String> {
        let mut bytes = [0u8; KEY_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .map_err(|_| "the system's random source failed".to_string())?;
        Ok(bytes)
    }

    /// The key's id, as records carry it: a MAC of a fixed text, which tells nothing of the key.
    pub fn id(&self) -> &str {
        &self.1
    }
}

/// The version of Secret `namespace/name`'s content.
pub fn of_secret(key: &RecordKey, (namespace, name): (&str, &str), secret: &Secret) -> String {
    let empty = BTreeMap::new();
    let entries = secret.data.as_ref().unwrap_or(&empty).iter().map(|(k, v)| (k.as_str(), v.0.as_slice()));
    mac(key, ("Secret", namespace, name), entries)
}

/// The version of ConfigMap `namespace/name`'s content (its text and binary keys are one key
/// space).
pub fn of_config_map(key: &RecordKey, (namespace, name): (&str, &str), config_map: &ConfigMap) -> String {
    let (text, empty_text) = (config_map.data.as_ref(), BTreeMap::new());
    let (binary, empty_binary) = (config_map.binary_data.as_ref(), BTreeMap::<String, ByteString>::new());
    let mut entries: Vec<(&str, &[u8])> = text
        .unwrap_or(&empty_text)
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_bytes()))
        .chain(binary.unwrap_or(&empty_binary).iter().map(|(key, value)| (key.as_str(), value.0.as_slice())))
        .collect();
    entries.sort_unstable();
    mac(key, ("ConfigMap", namespace, name), entries.into_iter())
}

/// The MAC of the object `(kind, namespace, name)` and its `entries` (sorted by key), every
/// field length-prefixed so no two inputs share an encoding.
fn mac<'a>(key: &RecordKey, object: (&str, &str, &str), entries: impl Iterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut context = ring::hmac::Context::with_key(&key.0);
    let mut field = |bytes: &[u8]| {
        context.update(&(bytes.len() as u64).to_be_bytes());
        context.update(bytes);
    };
    field(object.0.as_bytes());
    field(object.1.as_bytes());
    field(object.2.as_bytes());
    for (name, value) in entries {
        field(name.as_bytes());
        field(value);
    }
    hex(context.sign().as_ref(), VERSION_HEX_DIGITS)
}

fn hex(bytes: &[u8], digits: usize) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect::<String>()[..digits].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> RecordKey {
        RecordKey::from_bytes(&[byte; KEY_BYTES]).unwrap()
    }

    fn secret(data: &[(&str, &str)], labels: &[(&str, &str)]) -> Secret {
        let mut secret = Secret {
            data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect()),
            ..Default::default()
        };
        secret.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        secret
    }

    const DB: (&str, &str) = ("owner", "db");

    #[test]
    fn the_version_follows_the_content_and_nothing_else() {
        let k = key(1);
        let base = of_secret(&k, DB, &secret(&[("a", "1"), ("b", "2")], &[]));
        assert_eq!(base.len(), VERSION_HEX_DIGITS);
        assert_eq!(
            of_secret(&k, DB, &secret(&[("a", "1"), ("b", "2")], &[("team", "x")])),
            base,
            "a label is no change"
        );
        assert_eq!(
            of_secret(&key(1), DB, &secret(&[("a", "1"), ("b", "2")], &[])),
            base,
            "the same key, another process"
        );
        assert_ne!(of_secret(&k, DB, &secret(&[("a", "1"), ("b", "3")], &[])), base, "a value changed");
        assert_ne!(of_secret(&k, DB, &secret(&[("a", "1")], &[])), base, "a key removed");
        // The boundary between key and value is part of the version.
        assert_ne!(of_secret(&k, DB, &secret(&[("ab", "")], &[])), of_secret(&k, DB, &secret(&[("a", "b")], &[])));
    }

    #[test]
    fn without_the_key_a_version_tells_nothing_not_even_that_two_objects_hold_the_same() {
        let content = secret(&[("password", "hunter2")], &[]);
        let version = of_secret(&key(1), DB, &content);
        assert_ne!(of_secret(&key(2), DB, &content), version, "another key, another version");
        assert_ne!(of_secret(&key(1), ("owner", "db-copy"), &content), version, "the same content elsewhere");
        // Nor is it the content's plain digest, which anyone could compute from a guess.
        let plain = ring::digest::digest(&ring::digest::SHA256, b"hunter2");
        assert!(!hex(plain.as_ref(), 64).contains(&version));
    }

    #[test]
    fn a_config_maps_text_and_binary_keys_are_one_content() {
        let k = key(1);
        let text = ConfigMap { data: Some([("k".to_owned(), "v".to_owned())].into()), ..Default::default() };
        let binary =
            ConfigMap { binary_data: Some([("k".to_owned(), ByteString(b"v".to_vec()))].into()), ..Default::default() };
        assert_eq!(of_config_map(&k, DB, &text), of_config_map(&k, DB, &binary));
        assert_ne!(of_config_map(&k, DB, &text), of_config_map(&k, DB, &ConfigMap::default()));
        assert_ne!(of_config_map(&k, DB, &text), of_secret(&k, DB, &secret(&[("k", "v")], &[])), "another kind");
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused_and_ids_differ_by_key() {
        assert!(RecordKey::from_bytes(&[0; 16]).is_err());
        assert_eq!(key(1).id().len(), KEY_ID_HEX_DIGITS);
        assert_eq!(key(1).id(), key(1).id());
        assert_ne!(key(1).id(), key(2).id());
        assert_ne!(RecordKey::generate().unwrap(), RecordKey::generate().unwrap());
    }
}
