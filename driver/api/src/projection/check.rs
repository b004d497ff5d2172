//! The check of a projection that needs no data, and the rule of where sources meet. An explicit
//! path (an item's, a pod fact's, a token's) is the user's promise that the file is theirs: two
//! explicit paths naming one file, or one file where another needs a directory, make the
//! projection invalid, whatever the data. A key laid out under its own name (a share without
//! items) is implicit; wherever one is involved, the later source's file wins (the driver's
//! composition applies that part).

use std::collections::BTreeMap;

use crate::invalid::{Invalid, Result};
use crate::key::check_key;
use crate::object_name::ObjectName;
use crate::projection::pod_field::PodField;
use crate::projection::spec::{ProjectionSource, ProjectionSpec, SourceKind};
use crate::quote::quote;

/// The highest mode a file may have: permission bits only, as kubelet allows.
const MAX_MODE: u32 = 0o777;

/// The most files a projection may name (items of its shares, pod facts, tokens, over all its
/// sources). Each is rendered in the driver's memory and becomes an inode in a tmpfs the driver
/// pays for, and a pod fact costs nothing to ask for twice: without a bound, one namespace's
/// projection of a few thousand `metadata.annotations` items would take the node's driver down.
pub const MAX_PROJECTION_ITEMS: usize = 1000;

/// Checks what needs no data: one kind per source, share names that are object names, valid
/// paths, modes and field paths, and no two explicit paths that collide. The error names the
/// sources and the path. The driver runs it before composing; the admission plugin at creation.
pub fn check_spec(spec: &ProjectionSpec) -> Result<()> {
    if spec.sources.is_empty() {
        return Err(Invalid("the projection has no sources".into()));
    }
    check_mode(spec.default_mode, "defaultMode")?;
    let mut claimed = Claims::default();
    let mut items = 0usize;
    for (index, source) in spec.sources.iter().enumerate() {
        let label = source_label(index, source)?;
        items = items.saturating_add(explicit_paths(source).map_or(0, |paths| paths.len()));
        if items > MAX_PROJECTION_ITEMS {
            return Err(Invalid(format!(
                "the projection names more than {MAX_PROJECTION_ITEMS} items (counted up to {label}); \
                 a projection may name at most {MAX_PROJECTION_ITEMS} files"
            )));
        }
        if let Some(SourceKind::SharedSecret(share) | SourceKind::SharedConfigMap(share)) = source.kind() {
            ObjectName::parse(&share.name).map_err(|e| in_source(&label, Invalid(e.to_string())))?;
        }
        for (path, mode) in explicit_paths(source).map_err(|e| in_source(&label, e))? {
            check_key(path).map_err(|e| in_source(&label, e))?;
            check_mode(mode, &format!("{label}: the mode of {}", quote(path)))?;
            claimed.claim(path, &label, true)?;
        }
    }
    Ok(())
}

/// Who has each path so far, and whether they named it: the collision rule, applied to the
/// explicit paths here and to every file at composition.
#[derive(Default)]
pub struct Claims {
    owners: BTreeMap<String, Claim>,
}

struct Claim {
    label: String,
    explicit: bool,
}

impl Claims {
    /// Records that `label` puts a file at `path`. Refused when another explicit path is the
    /// same file, or when one of the two would need the other to be a directory.
    pub fn claim(&mut self, path: &str, label: &str, explicit: bool) -> Result<()> {
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

fn collision(earlier: &str, later: &str, path: &str, why: &str) -> Invalid {
    Invalid(format!("{earlier} and {later} collide at path {}: {why}", quote(path)))
}

/// `sources[1] (sharedSecret "db-creds")`: how errors name a source.
pub fn source_label(index: usize, source: &ProjectionSource) -> Result<String> {
    let Some(kind) = source.kind() else {
        return Err(Invalid(format!(
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
            Err(Invalid(format!("{what} {mode:#o} is out of range: a mode is between 0 and 0777 (octal)")))
        }
        _ => Ok(()),
    }
}

/// `error` said of the source `label`.
pub fn in_source(label: &str, error: Invalid) -> Invalid {
    Invalid(format!("{label}: {}", error))
}
