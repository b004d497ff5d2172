//! The injection annotation's grammar: comma-separated entries `<kind>/<name>:<mountPath>`,
//! where `<kind>` is `sharedsecret`, `sharedconfigmap` or `projection`, `<name>` an object name
//! and `<mountPath>` an absolute path. Every entry is checked before anything is injected, and a
//! bad one is named (quoted, bounded) with what is wrong with it.

use std::fmt;

use sharedresource_api::quote::quote;
use sharedresource_api::volume_attributes::PROJECTION_ATTRIBUTE;
use sharedresource_api::{Invalid, ObjectName, ShareKind};

/// The annotation a pod (or a workload's pod template) names its shares in.
pub const INJECT_ANNOTATION: &str = "sharedresource.inlineguard.dev/inject";

/// More entries than a pod could sensibly mount; a bound on the work one annotation costs.
pub const MAX_ENTRIES: usize = 32;
/// The longest mount path an entry may give (Linux's PATH_MAX is 4096; nobody mounts a share
/// that deep, and the message quoting it stays short).
const MAX_MOUNT_PATH_BYTES: usize = 1024;

/// What an entry mounts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InjectSource {
    /// A SharedSecret or SharedConfigMap, by name.
    Share(ShareKind, ObjectName),
    /// A SharedProjection of the pod's namespace, by name.
    Projection(ObjectName),
}

/// One entry of the annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectEntry {
    /// What to mount.
    pub source: InjectSource,
    /// Where, in every container and init container, as written.
    pub mount_path: String,
}

impl InjectSource {
    /// The keyword an entry names this kind of source by.
    pub fn keyword(&self) -> &'static str {
        match self {
            InjectSource::Share(ShareKind::Secret, _) => "sharedsecret",
            InjectSource::Share(ShareKind::ConfigMap, _) => "sharedconfigmap",
            InjectSource::Projection(_) => "projection",
        }
    }

    /// The object's name.
    pub fn name(&self) -> &ObjectName {
        match self {
            InjectSource::Share(_, name) | InjectSource::Projection(name) => name,
        }
    }

    /// The volume attribute that selects this source, as the driver reads it.
    pub fn attribute(&self) -> &'static str {
        match self {
            InjectSource::Share(kind, _) => kind.attribute(),
            InjectSource::Projection(_) => PROJECTION_ATTRIBUTE,
        }
    }
}

impl fmt::Display for InjectSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InjectSource::Share(kind, name) => write!(f, "{} {:?}", kind.kind(), name.as_str()),
            InjectSource::Projection(name) => write!(f, "SharedProjection {:?}", name.as_str()),
        }
    }
}

impl InjectEntry {
    /// The entry as an annotation would spell it, for messages.
    pub fn spelled(&self) -> String {
        format!("{}/{}:{}", self.source.keyword(), self.source.name(), self.mount_path)
    }
}

/// The entries of an annotation's value, in order. Blank space around an entry is ignored; an
/// empty value injects nothing. Two entries may mount one source (at two paths), never two
/// sources at one path.
pub fn parse_injection(value: &str) -> Result<Vec<InjectEntry>, Invalid> {
    let in_annotation = |why: String| Invalid(format!("annotation {INJECT_ANNOTATION:?}: {why}"));
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let count = value.split(',').count();
    if count > MAX_ENTRIES {
        return Err(in_annotation(format!("names {count} entries; at most {MAX_ENTRIES} may be injected")));
    }
    let mut entries: Vec<InjectEntry> = Vec::with_capacity(count);
    for (index, text) in value.split(',').map(str::trim).enumerate() {
        let entry = parse_entry(text).map_err(|why| {
            if text.is_empty() {
                in_annotation(format!("entry {} is empty", index + 1))
            } else {
                in_annotation(format!("entry {}: {why}", quote(text)))
            }
        })?;
        if let Some(earlier) = entries.iter().find(|e| same_path(&e.mount_path, &entry.mount_path)) {
            return Err(in_annotation(format!(
                "entries {} and {} mount at the same path",
                quote(&earlier.spelled()),
                quote(text)
            )));
        }
        entries.push(entry);
    }
    Ok(entries)
}

fn parse_entry(text: &str) -> Result<InjectEntry, String> {
    let shape = || "is not <kind>/<name>:<mountPath>".to_string();
    let (keyword, rest) = text.split_once('/').ok_or_else(shape)?;
    let (name, mount_path) = rest.split_once(':').ok_or_else(shape)?;
    let name = ObjectName::parse(name).map_err(|invalid| invalid.to_string())?;
    let source = match keyword {
        "sharedsecret" => InjectSource::Share(ShareKind::Secret, name),
        "sharedconfigmap" => InjectSource::Share(ShareKind::ConfigMap, name),
        "projection" => InjectSource::Projection(name),
        other => {
            return Err(format!(
                "kind {} is not one of \"sharedsecret\", \"sharedconfigmap\", \"projection\"",
                quote(other)
            ));
        }
    };
    check_mount_path(mount_path)?;
    Ok(InjectEntry { source, mount_path: mount_path.to_string() })
}

/// A mount path a container can take: absolute, not the root, no `..`, no control characters.
fn check_mount_path(path: &str) -> Result<(), String> {
    let why = if path.is_empty() {
        "the mount path is empty"
    } else if !path.starts_with('/') {
        "the mount path is not absolute"
    } else if path.trim_end_matches('/').is_empty() {
        "the mount path is the container's root"
    } else if path.len() > MAX_MOUNT_PATH_BYTES {
        "the mount path is longer than 1024 bytes"
    } else if path.split('/').any(|part| part == "..") {
        "the mount path has a '..' element"
    } else if path.chars().any(char::is_control) {
        "the mount path has a control character"
    } else {
        return Ok(());
    };
    Err(why.to_string())
}

/// Whether two mount paths name one directory, as a container runtime resolves them: repeated
/// and trailing slashes do not count.
pub fn same_path(a: &str, b: &str) -> bool {
    fn parts(path: &str) -> impl Iterator<Item = &str> {
        path.split('/').filter(|part| !part.is_empty() && *part != ".")
    }
    parts(a).eq(parts(b))
}
