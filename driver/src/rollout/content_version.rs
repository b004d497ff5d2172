//! A backing object's content version: a digest of exactly what a share's volume shows (a
//! Secret's `data`, a ConfigMap's `data` and `binaryData`), so a change of labels, annotations
//! or anything else about the object is no change, and the same content is the same version in
//! every controller process (a stable digest, not Rust's per-process hasher). Only the digest is
//! kept; the content is dropped as soon as it is read.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

/// Hex digits of the SHA-256 kept: 64 bits, ample to tell one version from the next.
const VERSION_HEX_DIGITS: usize = 16;

/// The version of a Secret's content.
pub fn of_secret(secret: &Secret) -> String {
    let empty = BTreeMap::new();
    digest(secret.data.as_ref().unwrap_or(&empty).iter().map(|(key, value)| (key.as_str(), value.0.as_slice())))
}

/// The version of a ConfigMap's content (its text and binary keys are one key space).
pub fn of_config_map(config_map: &ConfigMap) -> String {
    let (text, empty_text) = (config_map.data.as_ref(), BTreeMap::new());
    let (binary, empty_binary) = (config_map.binary_data.as_ref(), BTreeMap::<String, ByteString>::new());
    let mut entries: Vec<(&str, &[u8])> = text
        .unwrap_or(&empty_text)
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_bytes()))
        .chain(binary.unwrap_or(&empty_binary).iter().map(|(key, value)| (key.as_str(), value.0.as_slice())))
        .collect();
    entries.sort_unstable();
    digest(entries.into_iter())
}

/// The digest of `entries` (sorted by key), each key and value length-prefixed so no two
/// contents share an encoding.
fn digest<'a>(entries: impl Iterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for (key, value) in entries {
        context.update(&(key.len() as u64).to_be_bytes());
        context.update(key.as_bytes());
        context.update(&(value.len() as u64).to_be_bytes());
        context.update(value);
    }
    context.finish().as_ref().iter().map(|byte| format!("{byte:02x}")).collect::<String>()[..VERSION_HEX_DIGITS]
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, &str)], labels: &[(&str, &str)]) -> Secret {
        let mut secret = Secret {
            data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect()),
            ..Default::default()
        };
        secret.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        secret
    }

    #[test]
    fn the_version_follows_the_content_and_nothing_else() {
        let base = of_secret(&secret(&[("a", "1"), ("b", "2")], &[]));
        assert_eq!(base.len(), VERSION_HEX_DIGITS);
        assert_eq!(of_secret(&secret(&[("a", "1"), ("b", "2")], &[("team", "x")])), base, "a label is no change");
        assert_ne!(of_secret(&secret(&[("a", "1"), ("b", "3")], &[])), base, "a value changed");
        assert_ne!(of_secret(&secret(&[("a", "1")], &[])), base, "a key removed");
        // The boundary between key and value is part of the version.
        assert_ne!(of_secret(&secret(&[("ab", "")], &[])), of_secret(&secret(&[("a", "b")], &[])));
    }

    #[test]
    fn a_config_maps_text_and_binary_keys_are_one_content() {
        let text = ConfigMap { data: Some([("k".to_owned(), "v".to_owned())].into()), ..Default::default() };
        let binary =
            ConfigMap { binary_data: Some([("k".to_owned(), ByteString(b"v".to_vec()))].into()), ..Default::default() };
        assert_eq!(of_config_map(&text), of_config_map(&binary));
        assert_ne!(of_config_map(&text), of_config_map(&ConfigMap::default()));
        // The same bytes under a Secret are the same version: what the volume shows.
        assert_eq!(of_config_map(&text), of_secret(&secret(&[("k", "v")], &[])));
    }
}
