//! What a pod spec lacks of its injection entries, and applying it. Planning reads the spec only,
//! so the validating side can ask "was everything injected?" with the same function the mutating
//! side uses to inject; applying changes the spec in place and returns the JSON Patch doing the
//! same to the object as sent. A spec that has everything already plans nothing: injecting twice
//! changes nothing.

use std::collections::BTreeMap;

use serde::Serialize;
use sharedresource_api::quote::quote;
use sharedresource_api::{DRIVER_NAME, Invalid};

use super::annotation::{INJECT_ANNOTATION, InjectEntry, InjectSource, same_path};
use crate::patch::{PatchOperation, PatchValue};
use crate::pod_spec::{ContainerView, CsiVolumeView, PodSpecView, VolumeMountView, VolumeView};
use crate::read_only::ContainerList;

/// The longest volume name (a DNS-1123 label).
const MAX_VOLUME_NAME_BYTES: usize = 63;
/// What every injected volume's name starts with.
const VOLUME_PREFIX: &str = "inject";
/// The containers that get the mounts: the ephemeral ones are added later, by hand, through their
/// own subresource.
const MOUNTED_LISTS: [ContainerList; 2] = [ContainerList::Containers, ContainerList::InitContainers];

/// An injected volume, as the patch writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InjectedVolume {
    /// Deterministic: see [`volume_name`].
    pub name: String,
    /// Always the shared-resource driver, read-only.
    pub csi: InjectedCsi,
}

/// An injected volume's `csi` source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectedCsi {
    /// [`DRIVER_NAME`].
    pub driver: &'static str,
    /// `true`: the driver publishes nothing else.
    pub read_only: bool,
    /// The one attribute selecting the source.
    pub volume_attributes: BTreeMap<&'static str, String>,
}

/// An injected mount, as the patch writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectedMount {
    /// The injected volume's name.
    pub name: String,
    /// The entry's mount path, as written.
    pub mount_path: String,
    /// `true`.
    pub read_only: bool,
}

/// What injection adds to one spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InjectionPlan {
    volumes: Vec<InjectedVolume>,
    /// `(list, container index, mount)`, in the order of the lists and containers.
    mounts: Vec<(ContainerList, usize, InjectedMount)>,
}

/// The name of the volume injected for `source`: `inject-<kind>-<name>` (kind `secret`,
/// `configmap` or `projection`) when that is a valid volume name; otherwise (a name with dots,
/// or too long) the name's first characters, dots made dashes, then 8 hex digits of the FNV-1a
/// hash of `<kind>/<name>`, so that two sources never share a volume and the same source always
/// gets the same one.
pub fn volume_name(source: &InjectSource) -> String {
    let kind = match source.keyword() {
        "sharedsecret" => "secret",
        "sharedconfigmap" => "configmap",
        keyword => keyword,
    };
    let name = source.name().as_str();
    let readable = format!("{VOLUME_PREFIX}-{kind}-{name}");
    if !name.contains('.') && readable.len() <= MAX_VOLUME_NAME_BYTES {
        return readable;
    }
    let hash = fnv1a_32(format!("{kind}/{name}").as_bytes());
    let room = MAX_VOLUME_NAME_BYTES - VOLUME_PREFIX.len() - kind.len() - 8 - 3;
    // Object names are ASCII, so any byte offset is a character boundary.
    let stem = name[..name.len().min(room)].replace('.', "-");
    let stem = stem.trim_end_matches('-');
    format!("{VOLUME_PREFIX}-{kind}-{stem}-{hash:08x}")
}

/// FNV-1a, 32 bits: small, stable across versions and platforms, which is all a name needs.
fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193))
}

/// What `spec` lacks of `entries`: each source's volume (unless the spec has it already), and a
/// mount of it at each entry's path in every container and init container (unless that container
/// mounts it there already). Refused, naming the entry: a volume of the injected name that is
/// something else, and a container that already mounts another volume at the entry's path.
pub fn plan_injection(spec: &PodSpecView<'_>, entries: &[InjectEntry]) -> Result<InjectionPlan, Invalid> {
    let refused = |entry: &InjectEntry, why: String| {
        Invalid(format!("annotation {INJECT_ANNOTATION:?}: entry {}: {why}", quote(&entry.spelled())))
    };
    let mut plan = InjectionPlan::default();
    let mut named: BTreeMap<String, &InjectSource> = BTreeMap::new();
    for entry in entries {
        let name = volume_name(&entry.source);
        match named.get(&name) {
            Some(source) if **source == entry.source => {}
            Some(source) => {
                return Err(refused(entry, format!("its volume name {name:?} is also {source}'s; rename one of them")));
            }
            None => {
                named.insert(name.clone(), &entry.source);
                match spec.volumes.iter().find(|volume| volume.name == name) {
                    Some(volume) if is_injected(volume, &entry.source) => {}
                    Some(_) => {
                        return Err(refused(
                            entry,
                            format!(
                                "the pod has another volume named {name:?}, the name injection gives {}",
                                entry.source
                            ),
                        ));
                    }
                    None => plan.volumes.push(injected_volume(name.clone(), &entry.source)),
                }
            }
        }
        for list in MOUNTED_LISTS {
            for (index, container) in list.of(spec).iter().enumerate() {
                match container.volume_mounts.iter().find(|mount| same_path(&mount.mount_path, &entry.mount_path)) {
                    Some(mount) if mount.name == name => {}
                    Some(mount) => {
                        return Err(refused(
                            entry,
                            format!(
                                "container {:?} already mounts volume {:?} at {}",
                                container.name,
                                mount.name,
                                quote(&mount.mount_path)
                            ),
                        ));
                    }
                    None => {
                        let mount =
                            InjectedMount { name: name.clone(), mount_path: entry.mount_path.clone(), read_only: true };
                        plan.mounts.push((list, index, mount));
                    }
                }
            }
        }
    }
    plan.mounts.sort_by_key(|(list, index, _)| (*list == ContainerList::InitContainers, *index));
    Ok(plan)
}

/// The volume injection would add for `source`, read-only and selecting it alone.
fn injected_volume(name: String, source: &InjectSource) -> InjectedVolume {
    let volume_attributes = [(source.attribute(), source.name().to_string())].into();
    InjectedVolume { name, csi: InjectedCsi { driver: DRIVER_NAME, read_only: true, volume_attributes } }
}

/// Whether `volume` is what injection makes for `source` (its `readOnly` aside: forcing sees to
/// that, and a stale one is no reason to refuse the pod).
fn is_injected(volume: &VolumeView<'_>, source: &InjectSource) -> bool {
    volume.csi.as_ref().is_some_and(|csi| {
        csi.driver == DRIVER_NAME
            && csi.volume_attributes.len() == 1
            && csi.volume_attributes.get(source.attribute()).is_some_and(|name| name == source.name().as_str())
    })
}

impl InjectionPlan {
    /// True when the spec has everything already.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty() && self.mounts.is_empty()
    }

    /// The volumes to add, by name.
    pub fn volume_names(&self) -> impl Iterator<Item = &str> {
        self.volumes.iter().map(|volume| volume.name.as_str())
    }

    /// Adds the plan's volumes and mounts to `spec`, the pod spec at `/spec` of the object, and
    /// returns the JSON Patch that does the same to the object as sent: appends to lists that
    /// have members, writes whole those that have none (absent, `null` or empty alike).
    pub fn apply(self, spec: &mut PodSpecView<'_>) -> Vec<PatchOperation> {
        let mut patch = Vec::new();
        if spec.volumes.is_empty() && !self.volumes.is_empty() {
            patch.push(PatchOperation::add("/spec/volumes".into(), PatchValue::Volumes(self.volumes.clone())));
        } else {
            for volume in &self.volumes {
                patch.push(PatchOperation::add("/spec/volumes/-".into(), PatchValue::Volume(volume.clone())));
            }
        }
        spec.volumes.extend(self.volumes.into_iter().map(|volume| VolumeView {
            name: volume.name.into(),
            csi: Some(CsiVolumeView {
                driver: volume.csi.driver.into(),
                read_only: Some(true),
                volume_attributes:
                    volume.csi.volume_attributes.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            }),
        }));
        let mut mounts = self.mounts.into_iter().peekable();
        while let Some((list, index, first)) = mounts.next() {
            let mut added = vec![first];
            while let Some((_, _, mount)) = mounts.next_if(|(l, i, _)| *l == list && *i == index) {
                added.push(mount);
            }
            // The plan's indexes come from this spec's lists.
            let Some(container) = list.of_mut(spec).get_mut(index) else { continue };
            append_mounts(&mut patch, list, index, container, added);
        }
        patch
    }
}

fn append_mounts(
    patch: &mut Vec<PatchOperation>,
    list: ContainerList,
    index: usize,
    container: &mut ContainerView<'_>,
    added: Vec<InjectedMount>,
) {
    let path = format!("/spec/{}/{index}/volumeMounts", list.field());
    if container.volume_mounts.is_empty() {
        patch.push(PatchOperation::add(path, PatchValue::Mounts(added.clone())));
    } else {
        for mount in &added {
            patch.push(PatchOperation::add(format!("{path}/-"), PatchValue::Mount(mount.clone())));
        }
    }
    container.volume_mounts.extend(added.into_iter().map(|mount| VolumeMountView {
        name: mount.name.into(),
        mount_path: mount.mount_path.into(),
        read_only: Some(true),
        ..Default::default()
    }));
}

/// How many missing volumes and mounts a message names before it says how many more there are.
const NAMED_AT_MOST: usize = 5;

/// The denial for a pod whose injection did not happen: names what it lacks (at most a few),
/// then says which configuration let it through.
pub fn not_injected_message(object: &str, plan: &InjectionPlan, spec: &PodSpecView<'_>) -> String {
    let volumes = plan.volumes.iter().map(|volume| format!("volume {:?}", volume.name));
    let mounts = plan.mounts.iter().map(|(list, index, mount)| {
        let container = list.of(spec).get(*index).map_or("", |c| &c.name);
        format!("mount of {:?} at {} in container {container:?}", mount.name, quote(&mount.mount_path))
    });
    let missing: Vec<String> = volumes.chain(mounts).collect();
    let mut named = missing.iter().take(NAMED_AT_MOST).cloned().collect::<Vec<_>>().join(", ");
    if missing.len() > NAMED_AT_MOST {
        named.push_str(&format!(" and {} more", missing.len() - NAMED_AT_MOST));
    }
    format!(
        "{object} asks for shares by annotation {INJECT_ANNOTATION:?} but lacks {named}. The share injection webhook did not \
         inject them; its MutatingWebhookConfiguration is missing or older than this server (regenerate it with \
         `csi-volume-admission webhooks`)"
    )
}
