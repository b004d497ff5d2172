//! Composition: a projection's spec and the data of its sources, already fetched and
//! access-checked, become one payload, by kubelet's `projected` rules. Two rules decide where
//! sources meet. An explicit path (an item's, a pod fact's, a token's) is the user's promise
//! that the file is theirs: two explicit paths naming one file, or one file where another
//! needs a directory, make the projection invalid, whatever the data. A key laid out under its
//! own name (a share without items) is implicit; wherever one is involved, the later source's
//! file wins.
//! [`check_spec`] is the part that needs no data, so the admission can refuse a bad object at
//! creation with the same words.

use std::collections::BTreeMap;

use crate::content::error::{Error, Result};
use crate::content::object_name::ObjectName;
use crate::content::payload::{DEFAULT_MODE, FileContent, Payload, check_key};
use crate::content::projection::api::{KeyItem, ProjectionSource, ProjectionSpec, ShareProjection, SourceKind};
use crate::content::projection::downward::{PodFacts, PodField};
use crate::content::projection::tokens::Tokens;
use crate::content::shares::kind::ShareKind;
use crate::quote::quote;

/// The highest mode a file may have: permission bits only, as kubelet allows.
const MAX_MODE: u32 = 0o777;

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

/// Checks what needs no data: one kind per source, share names that are object names, valid
/// paths, modes and field paths, and no two explicit paths that collide. The error names the sources and the path.
pub fn check_spec(spec: &ProjectionSpec) -> Result<()> {
    if spec.sources.is_empty() {
        return Err(Error::Invalid("the projection has no sources".into()));
    }
    check_mode(spec.default_mode, "defaultMode")?;
    let mut claimed = Claims::default();
    for (index, source) in spec.sources.iter().enumerate() {
        let label = source_label(index, source)?;
        if let Some(SourceKind::SharedSecret(share) | SourceKind::SharedConfigMap(share)) = source.kind() {
            ObjectName::parse(&share.name).map_err(|e| in_source(&label, Error::Invalid(e.to_string())))?;
        }
        for (path, mode) in explicit_paths(source).map_err(|e| in_source(&label, e))? {
            check_key(path).map_err(|e| in_source(&label, e))?;
            check_mode(mode, &format!("{label}: the mode of {}", quote(path)))?;
            claimed.claim(path, &label, true)?;
        }
    }
    Ok(())
}

/// The projection's files from `data`. `spec` is checked first; a share the spec names must be
/// in `data` (the caller fetched it) and a key an item names must be in its object unless the
/// item is optional; a token's audience must be one kubelet passed.
pub fn compose(spec: &ProjectionSpec, data: &SourceData) -> Result<Payload> {
    check_spec(spec)?;
    let default_mode = spec.default_mode.unwrap_or(DEFAULT_MODE);
    let mut claims = Claims::default();
    let mut payload = Payload::new();
    for (index, source) in spec.sources.iter().enumerate() {
        let label = source_label(index, source)?;
        for file in source_files(source, &label, data, default_mode)? {
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
                    data: field.render(&data.pod).into_bytes(),
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
            check_key(key).map_err(|e| in_source(label, e))?;
            files.push(SourceFile { path: key.clone(), data: value.clone(), mode: default_mode, explicit: false });
        }
        return Ok(files);
    };
    let mut files = Vec::with_capacity(items.len());
    for KeyItem { key, path, mode, optional } in items {
        match object.get(key) {
            Some(value) => files.push(SourceFile {
                path: path.clone(),
                data: value.clone(),
                mode: mode.unwrap_or(default_mode),
                explicit: true,
            }),
            None if *optional => {}
            None => {
                return Err(Error::Unservable(format!(
                    "{label}: the backing object has no key {} (mark the item optional to skip it)",
                    quote(key)
                )));
            }
        }
    }
    Ok(files)
}

/// Who has each path so far, and whether they named it.
#[derive(Default)]
struct Claims {
    owners: BTreeMap<String, Claim>,
}

struct Claim {
    label: String,
    explicit: bool,
}

impl Claims {
    /// Records that `label` puts a file at `path`. Refused when another explicit path is the
    /// same file, or when one of the two would need the other to be a directory.
    fn claim(&mut self, path: &str, label: &str, explicit: bool) -> Result<()> {
        if let Some(earlier) = self.owners.get(path)
            && earlier.explicit
            && explicit
        {
            return Err(collision(&earlier.label, label, path, "both name it"));
        }
        for (at, _) in path.match_indices('/') {
            if let Some(earlier) = self.owners.get(&path[..at]) {
                return Err(collision(&earlier.label, label, path, &format!("{} is a file", quote(&path[..at]))));
            }
        }
        let below = format!("{path}/");
        if let Some((inner, earlier)) = self.owners.range(below.clone()..).next().filter(|(p, _)| p.starts_with(&below))
        {
            return Err(collision(&earlier.label, label, inner, &format!("{} is a file", quote(path))));
        }
        self.owners.insert(path.to_string(), Claim { label: label.to_string(), explicit });
        Ok(())
    }
}

fn collision(earlier: &str, later: &str, path: &str, why: &str) -> Error {
    Error::Invalid(format!("{earlier} and {later} collide at path {}: {why}", quote(path)))
}

/// `sources[1] (sharedSecret "db-creds")`: how errors name a source.
fn source_label(index: usize, source: &ProjectionSource) -> Result<String> {
    let Some(kind) = source.kind() else {
        return Err(Error::Invalid(format!(
            "sources[{index}] must set exactly one of sharedSecret, sharedConfigMap, podInfo, serviceAccountToken"
        )));
    };
    let label = match kind {
        SourceKind::SharedSecret(share) => format!("sources[{index}] (sharedSecret {})", quote(&share.name)),
        SourceKind::SharedConfigMap(share) => format!("sources[{index}] (sharedConfigMap {})", quote(&share.name)),
        SourceKind::PodInfo(_) => format!("sources[{index}] (podInfo)"),
        SourceKind::ServiceAccountToken(token) => {
            format!("sources[{index}] (serviceAccountToken {})", quote(&token.audience))
        }
    };
    Ok(label)
}

/// The paths a source names itself, with their modes; field paths are checked on the way.
fn explicit_paths(source: &ProjectionSource) -> Result<Vec<(&str, Option<u32>)>> {
    let Some(kind) = source.kind() else {
        return Ok(Vec::new());
    };
    let paths = match kind {
        SourceKind::SharedSecret(share) | SourceKind::SharedConfigMap(share) => {
            share.items.iter().flatten().map(|item| (item.path.as_str(), item.mode)).collect()
        }
        SourceKind::PodInfo(info) => {
            let mut paths = Vec::with_capacity(info.items.len());
            for item in &info.items {
                PodField::parse(&item.field_path)?;
                paths.push((item.path.as_str(), item.mode));
            }
            paths
        }
        SourceKind::ServiceAccountToken(token) => vec![(token.path.as_str(), None)],
    };
    Ok(paths)
}

fn check_mode(mode: Option<u32>, what: &str) -> Result<()> {
    match mode {
        Some(mode) if mode > MAX_MODE => {
            Err(Error::Invalid(format!("{what} {mode:#o} is out of range: a mode is between 0 and 0777 (octal)")))
        }
        _ => Ok(()),
    }
}

fn in_source(label: &str, error: Error) -> Error {
    Error::Invalid(format!("{label}: {}", error))
}

#[cfg(test)]
mod tests;
