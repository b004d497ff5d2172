//! Composition: a projection's spec and the data of its sources, already fetched and
//! access-checked, become one payload, by kubelet's `projected` rules. Where sources meet is
//! decided by the vocabulary crate's [`Claims`] (explicit paths collide; a key under its own
//! name gives way to the later source), and [`check_spec`], the part that needs no data, is the
//! vocabulary crate's too, so the admission plugin refuses a bad object at creation with the
//! same words.

use std::collections::BTreeMap;

use sharedresource_api::ShareKind;
use sharedresource_api::projection::check::{Claims, in_source, source_label};
use sharedresource_api::projection::spec::{KeyItem, ProjectionSource, ProjectionSpec, ShareProjection, SourceKind};

pub use sharedresource_api::projection::check::check_spec;

use crate::content::error::{Error, Result};
use crate::content::payload::{DEFAULT_MODE, FileContent, Payload};
use crate::content::projection::downward::{PodFacts, PodField, render};
use crate::content::tokens::Tokens;
use crate::quote::quote;

/// What the sources hold, fetched by the caller after the access checks.
#[derive(Clone, Default)]
pub struct SourceData {
    /// Each share's backing object's keys, by kind and share name.
    pub shares: BTreeMap<(ShareKind, String), BTreeMap<String, Vec<u8>>>,
    /// The pod the volume is for.
    pub pod: PodFacts,
    /// The tokens kubelet passed.
    pub tokens: Tokens,
}

// Share data may be Secret data: print which keys there are, never their values.
impl std::fmt::Debug for SourceData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: BTreeMap<_, Vec<&String>> =
            self.shares.iter().map(|(share, object)| (share, object.keys().collect())).collect();
        f.debug_struct("SourceData")
            .field("share_keys", &keys)
            .field("pod", &self.pod)
            .field("tokens", &self.tokens)
            .finish()
    }
}

/// The projection's files from `data`. `spec` is checked first; a share the spec names must be
/// in `data` (the caller fetched it) and a key an item names must be in its object unless the
/// item is optional; a token's audience must be one kubelet passed. Composition stops as soon as
/// the files hold more than `max_bytes` (the volume's tmpfsSize: what could never be written is
/// never held in memory either).
pub fn compose(spec: &ProjectionSpec, data: &SourceData, max_bytes: u64) -> Result<Payload> {
    check_spec(spec)?;
    let default_mode = spec.default_mode.unwrap_or(DEFAULT_MODE);
    let mut claims = Claims::default();
    let mut payload = Payload::new();
    let mut bytes: u64 = 0;
    for (index, source) in spec.sources.iter().enumerate() {
        let label = source_label(index, source)?;
        for file in source_files(source, &label, data, default_mode)? {
            bytes = bytes.saturating_add(file.data.len() as u64);
            if bytes > max_bytes {
                return Err(Error::TooLarge(format!(
                    "{label}: the projection's files hold more than {max_bytes} bytes, the volume's size \
                     (tmpfsSize); name fewer or smaller items"
                )));
            }
            claims.claim(&file.path, &label, file.explicit)?;
            payload.insert(file.path, FileContent { data: file.data, mode: file.mode });
        }
    }
    Ok(payload)
}

/// One file a source contributes.
struct SourceFile {
    path: String,
    data: Vec<u8>,
    mode: u32,
    explicit: bool,
}

fn source_files(
    source: &ProjectionSource,
    label: &str,
    data: &SourceData,
    default_mode: u32,
) -> Result<Vec<SourceFile>> {
    let Some(kind) = source.kind() else {
        return Err(Error::Invalid(format!("{label} sets no single kind")));
    };
    let files = match kind {
        SourceKind::SharedSecret(share) => share_files(ShareKind::Secret, share, label, data, default_mode)?,
        SourceKind::SharedConfigMap(share) => share_files(ShareKind::ConfigMap, share, label, data, default_mode)?,
        SourceKind::PodInfo(info) => {
            let mut files = Vec::with_capacity(info.items.len());
            for item in &info.items {
                let field = PodField::parse(&item.field_path).map_err(|e| in_source(label, e))?;
                files.push(SourceFile {
                    path: item.path.clone(),
                    data: render(&field, &data.pod).into_bytes(),
                    mode: item.mode.unwrap_or(default_mode),
                    explicit: true,
                });
            }
            files
        }
        SourceKind::ServiceAccountToken(token) => {
            if data.tokens.is_lost() {
                // Not the CSIDriver's fault: the driver restarted and has not been republished
                // yet. Nothing is rewritten until then.
                return Err(Error::Unavailable(format!(
                    "{label}: the token is held in memory only and the driver restarted since the volume was published; kubelet's next republish brings it"
                )));
            }
            let Some(value) = data.tokens.get(&token.audience) else {
                return Err(Error::Invalid(format!(
                    "{label}: kubelet passed no token for audience {}: the CSIDriver's tokenRequests must name it",
                    quote(&token.audience)
                )));
            };
            vec![SourceFile {
                path: token.path.clone(),
                data: value.as_bytes().to_vec(),
                mode: default_mode,
                explicit: true,
            }]
        }
    };
    Ok(files)
}

fn share_files(
    kind: ShareKind,
    share: &ShareProjection,
    label: &str,
    data: &SourceData,
    default_mode: u32,
) -> Result<Vec<SourceFile>> {
    let Some(object) = data.shares.get(&(kind, share.name.clone())) else {
        return Err(Error::Internal(format!("{label}: the share's data was not fetched")));
    };
    let Some(items) = &share.items else {
        let mut files = Vec::with_capacity(object.len());
        for (key, value) in object {
            sharedresource_api::key::check_key(key).map_err(|e| in_source(label, e))?;
            files.push(SourceFile { path: key.clone(), data: value.clone(), mode: default_mode, explicit: false });
        }
        return Ok(files);
    };
    let mut files = Vec::with_capacity(items.len());
    for KeyItem { key, path, mode, optional } in items {
        // An optional source skips every key its object lacks, as kubelet's projected sources
        // do (its object may not exist at all: then it lacks them all).
        let optional = *optional || share.optional;
        match object.get(key) {
            Some(value) => files.push(SourceFile {
                path: path.clone(),
                data: value.clone(),
                mode: mode.unwrap_or(default_mode),
                explicit: true,
            }),
            None if optional => {}
            None => {
                return Err(Error::Unservable(format!(
                    "{label}: the backing object has no key {} (mark the item, or the source, optional to skip it)",
                    quote(key)
                )));
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests;
