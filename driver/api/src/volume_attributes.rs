//! The attributes a pod gives a volume of this driver (`spec.volumes[].csi.volumeAttributes`),
//! parsed once into what the volume selects. The driver parses them at publish (kubelet's own
//! `csi.storage.k8s.io/` keys set aside first) and the admission plugin at creation, with the
//! same function, so a pod refused at mount is refused at creation with the same words.
//!
//! A volume names exactly one thing to mount: a share (`sharedSecret`, `sharedConfigMap`), a
//! projection in the pod's namespace (`projection`) or a provider of the node (`provider`). A
//! share's or a projection's volume takes `refreshResource` besides, a share's `optional` too,
//! and nothing else: an unknown key is a typo the user wants to hear about, not a setting
//! silently ignored. (A projection marks each of its sources optional instead.) A
//! provider's volume passes its other attributes to the provider as parameters, except keys
//! under the prefixes that carry a pod's identity.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use crate::invalid::{Invalid, Result};
use crate::object_name::ObjectName;
use crate::quote::quote;
use crate::share_kind::{SHARED_CONFIG_MAP_ATTRIBUTE, SHARED_SECRET_ATTRIBUTE, ShareKind};

/// The attribute naming a `SharedProjection` in the pod's namespace.
pub const PROJECTION_ATTRIBUTE: &str = "projection";
/// The attribute naming a provider of the node's configuration; not passed to it.
pub const PROVIDER_ATTRIBUTE: &str = "provider";
/// The attribute naming a `SecretProviderClass` (upstream's key), with a provider only.
pub const CLASS_ATTRIBUTE: &str = "secretProviderClass";
/// The attribute that turns refreshing off for one volume (`"false"`; default `"true"`).
pub const REFRESH_ATTRIBUTE: &str = "refreshResource";
/// The attribute that lets a share's volume be served empty while its share or backing object
/// does not exist (`"true"`; default `"false"`), as kubelet's `secret` volume's `optional`.
pub const OPTIONAL_ATTRIBUTE: &str = "optional";
/// The key prefixes that carry a pod's identity: the driver's (and kubelet's) to set, never a
/// volume attribute's (a pod naming another namespace there would speak for a pod it is not).
pub const RESERVED_PREFIXES: [&str; 2] = ["kubernetes.io/", "csi.storage.k8s.io/"];

/// The attributes that select what a volume mounts, in the order messages name them.
const SELECTING: [&str; 4] =
    [SHARED_SECRET_ATTRIBUTE, SHARED_CONFIG_MAP_ATTRIBUTE, PROJECTION_ATTRIBUTE, PROVIDER_ATTRIBUTE];

/// What a volume mounts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Selection {
    /// A cluster-scoped share of this kind.
    Share(ShareKind, ObjectName),
    /// A `SharedProjection` in the pod's namespace.
    Projection(ObjectName),
    /// A provider of the node's configuration.
    Provider(ObjectName),
}

/// A volume's attributes, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeAttributes {
    /// What the volume mounts.
    pub selection: Selection,
    /// Whether content changes reach the volume after publish (`refreshResource`, default true).
    pub refresh: bool,
    /// Whether a share that does not exist, or whose backing object does not, serves an empty
    /// volume (filled when it appears) instead of failing the mount (`optional`, shares only,
    /// default false). The pod must still be allowed to use the share.
    pub optional: bool,
}

impl VolumeAttributes {
    /// Checks `attributes` (without kubelet's `csi.storage.k8s.io/` keys, which kubelet adds at
    /// mount) by the rules above; the first rule broken is the one named.
    pub fn parse<K, V>(attributes: &BTreeMap<K, V>) -> Result<VolumeAttributes>
    where
        K: Borrow<str> + Ord,
        V: AsRef<str>,
    {
        let selection = selection(attributes)?;
        let refresh = flag(attributes, REFRESH_ATTRIBUTE, true)?;
        let mut optional = false;
        match &selection {
            Selection::Share(..) => {
                let selecting = selecting_attribute(&selection);
                let own = [selecting, REFRESH_ATTRIBUTE, OPTIONAL_ATTRIBUTE];
                if let Some(other) = attributes.keys().map(Borrow::borrow).find(|key: &&str| !own.contains(key)) {
                    return Err(Invalid(format!(
                        "volumeAttributes[{}] is not an attribute of this driver: a {selecting} volume takes {selecting:?}, {REFRESH_ATTRIBUTE:?} and {OPTIONAL_ATTRIBUTE:?} only",
                        quote(other)
                    )));
                }
                optional = flag(attributes, OPTIONAL_ATTRIBUTE, false)?;
            }
            Selection::Projection(_) => {
                let mut keys = attributes.keys().map(Borrow::borrow);
                if let Some(other) = keys.find(|key: &&str| *key != PROJECTION_ATTRIBUTE && *key != REFRESH_ATTRIBUTE) {
                    let optional = match other == OPTIONAL_ATTRIBUTE {
                        true => " (a projection marks each source optional in its spec)",
                        false => "",
                    };
                    return Err(Invalid(format!(
                        "volumeAttributes[{}] is not an attribute of this driver: a {PROJECTION_ATTRIBUTE} volume takes {PROJECTION_ATTRIBUTE:?} and {REFRESH_ATTRIBUTE:?} only{optional}",
                        quote(other)
                    )));
                }
            }
            Selection::Provider(_) => {
                for key in attributes.keys() {
                    check_parameter(key.borrow())?;
                }
                if attributes.contains_key(CLASS_ATTRIBUTE) {
                    check_class_alone(attributes)?;
                }
            }
        }
        Ok(VolumeAttributes { selection, refresh, optional })
    }
}

/// The value of the `"true"`/`"false"` attribute `key`, `default` when absent.
fn flag<K: Borrow<str> + Ord, V: AsRef<str>>(attributes: &BTreeMap<K, V>, key: &str, default: bool) -> Result<bool> {
    match attributes.get(key).map(AsRef::as_ref) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(Invalid(format!(
            "volumeAttributes[{key:?}] is {}: it is \"true\" or \"false\" (the default: \"{default}\")",
            quote(other)
        ))),
    }
}

/// The longest key of a provider parameter (a qualified name's prefix and name, and its `/`).
pub const MAX_PARAMETER_KEY: usize = 317;

/// A provider parameter's key is 1 to [`MAX_PARAMETER_KEY`] letters, digits, `-`, `_`, `.` and
/// `/` (a ConfigMap key's characters and a qualified name's `/`: every provider's parameters
/// are such names), and not under a [`RESERVED_PREFIXES`] prefix. The keys reach helpers as
/// JSON that many read with text tools: a key holding quotes, commas or spaces could stand, to
/// such a reader, where the pod's identity stands.
pub fn check_parameter(key: &str) -> Result<()> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/');
    if key.is_empty() || key.len() > MAX_PARAMETER_KEY || !key.chars().all(plain) {
        return Err(Invalid(format!(
            "volumeAttributes[{}]: a provider parameter's key is 1 to {MAX_PARAMETER_KEY} letters, digits, '-', '_', '.' and '/'",
            quote(key)
        )));
    }
    if RESERVED_PREFIXES.iter().any(|prefix| key.starts_with(prefix)) {
        return Err(Invalid(format!(
            "volumeAttributes[{}]: keys under kubernetes.io/ and csi.storage.k8s.io/ are the driver's to set (the pod's identity)",
            quote(key)
        )));
    }
    Ok(())
}

/// With a `secretProviderClass`, the provider's parameters come from the class: no attribute
/// but the provider, the class and `refreshResource` (the driver's own) may be given.
fn check_class_alone<K: Borrow<str> + Ord, V: AsRef<str>>(attributes: &BTreeMap<K, V>) -> Result<()> {
    let own = [CLASS_ATTRIBUTE, PROVIDER_ATTRIBUTE, REFRESH_ATTRIBUTE];
    if let Some(other) = attributes.keys().map(Borrow::borrow).find(|key: &&str| !own.contains(key)) {
        return Err(Invalid(format!(
            "volumeAttributes[{}]: with {CLASS_ATTRIBUTE:?}, the provider's parameters come from the SecretProviderClass; set it there",
            quote(other)
        )));
    }
    let name = attributes.get(CLASS_ATTRIBUTE).map(AsRef::as_ref).unwrap_or_default();
    ObjectName::parse(name).map_err(|error| Invalid(format!("SecretProviderClass name {error}")))?;
    Ok(())
}

fn selecting_attribute(selection: &Selection) -> &'static str {
    match selection {
        Selection::Share(kind, _) => kind.attribute(),
        Selection::Projection(_) => PROJECTION_ATTRIBUTE,
        Selection::Provider(_) => PROVIDER_ATTRIBUTE,
    }
}

/// The one thing the volume names, and its name checked; the other attributes are not looked at
/// ([`VolumeAttributes::parse`] checks them too).
pub fn selection<K: Borrow<str> + Ord, V: AsRef<str>>(attributes: &BTreeMap<K, V>) -> Result<Selection> {
    let named: Vec<(&str, &str)> =
        SELECTING.into_iter().filter_map(|key| attributes.get(key).map(|value| (key, value.as_ref()))).collect();
    let (attribute, name) = match named.as_slice() {
        [one] => *one,
        [] => {
            return Err(Invalid(format!(
                "volumeAttributes lacks {SHARED_SECRET_ATTRIBUTE:?}, {SHARED_CONFIG_MAP_ATTRIBUTE:?} or {PROJECTION_ATTRIBUTE:?}: name what to mount"
            )));
        }
        [(first, _), (second, _), ..] => {
            return Err(Invalid(format!(
                "volumeAttributes names both {first:?} and {second:?}: name one share, or one projection"
            )));
        }
    };
    let kind = ShareKind::of_attribute(attribute);
    let what = match kind {
        Some(kind) => kind.kind(),
        None if attribute == PROVIDER_ATTRIBUTE => "provider",
        None => "SharedProjection",
    };
    let name = ObjectName::parse(name).map_err(|error| Invalid(format!("{what} name {error}")))?;
    Ok(match kind {
        Some(kind) => Selection::Share(kind, name),
        None if attribute == PROVIDER_ATTRIBUTE => Selection::Provider(name),
        None => Selection::Projection(name),
    })
}

#[cfg(test)]
mod tests;
