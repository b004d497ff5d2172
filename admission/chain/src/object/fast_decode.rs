//! [`ObjectShape`] read by hand in one pass with [`JsonCursor`]: field for field what its serde
//! derive reads (the same keys, defaults, `null` handling and duplicate-field refusals), without
//! serde's per-field dispatch. Anything else is declined and left to serde.

use std::borrow::Cow;
use std::collections::BTreeMap;

use inline_guard_policy::INJECT_ANNOTATION;
use inline_guard_policy::pod_spec::{ContainerView, CsiVolumeView, PodSpecView, VolumeMountView, VolumeView};

use super::{JobSpecShape, JobTemplateShape, ObjectNames, ObjectShape, SpecShape, TemplateShape};
use crate::json_cursor::{Declined, JsonCursor, Step};

/// Sets a field once: serde's derive refuses a struct that names a field twice.
pub(crate) fn once<T>(slot: &mut Option<T>, value: T) -> Step<()> {
    if slot.is_some() {
        return Err(Declined);
    }
    *slot = Some(value);
    Ok(())
}

/// An object's shape.
pub(crate) fn object_shape<'a>(cursor: &mut JsonCursor<'a>) -> Step<ObjectShape<'a>> {
    let (mut metadata, mut spec, mut template) = (None, None, None);
    cursor.object(|cursor, key| match key {
        "metadata" => once(&mut metadata, cursor.optional(object_names)?.unwrap_or_default()),
        "spec" => once(&mut spec, cursor.optional(spec_shape)?),
        "template" => once(&mut template, cursor.optional(boxed(template_shape))?),
        _ => cursor.skip(),
    })?;
    Ok(ObjectShape { metadata: metadata.unwrap_or_default(), spec: spec.flatten(), template: template.flatten() })
}

fn boxed<'a, T>(read: impl Fn(&mut JsonCursor<'a>) -> Step<T>) -> impl Fn(&mut JsonCursor<'a>) -> Step<Box<T>> {
    move |cursor| read(cursor).map(Box::new)
}

fn object_names<'a>(cursor: &mut JsonCursor<'a>) -> Step<ObjectNames<'a>> {
    let (mut name, mut generate_name, mut namespace, mut inject) = (None, None, None, None);
    cursor.object(|cursor, key| match key {
        "name" => once(&mut name, cursor.optional(JsonCursor::string)?),
        "generateName" => once(&mut generate_name, cursor.optional(JsonCursor::string)?),
        "namespace" => once(&mut namespace, cursor.optional(JsonCursor::string)?),
        "annotations" => once(&mut inject, cursor.optional(inject_annotation)?),
        _ => cursor.skip(),
    })?;
    Ok(ObjectNames {
        name: name.flatten(),
        generate_name: generate_name.flatten(),
        namespace: namespace.flatten(),
        inject: inject.flatten().flatten(),
    })
}

/// The value of the injection annotation in `metadata.annotations`, the others skipped; a
/// repeated key keeps its last value, as serde's map does.
fn inject_annotation<'a>(cursor: &mut JsonCursor<'a>) -> Step<Option<Cow<'a, str>>> {
    let mut found = None;
    cursor.object(|cursor, key| {
        if key == INJECT_ANNOTATION {
            found = Some(cursor.string()?);
            Ok(())
        } else {
            cursor.skip()
        }
    })?;
    Ok(found)
}

/// The six fields a Pod's `spec` and a template's `spec` share.
#[derive(Default)]
struct PodSpecFields<'a> {
    volumes: Option<Vec<VolumeView<'a>>>,
    containers: Option<Vec<ContainerView<'a>>>,
    init_containers: Option<Vec<ContainerView<'a>>>,
    ephemeral_containers: Option<Vec<ContainerView<'a>>>,
    runtime_class_name: Option<Option<Cow<'a, str>>>,
    service_account_name: Option<Option<Cow<'a, str>>>,
}

impl<'a> PodSpecFields<'a> {
    /// Reads the member `key` when it is one of the six; `None` leaves it to the caller.
    fn read(&mut self, cursor: &mut JsonCursor<'a>, key: &str) -> Option<Step<()>> {
        let containers = |cursor: &mut JsonCursor<'a>| nullable_list(cursor, container);
        Some(match key {
            "volumes" => nullable_list(cursor, volume).and_then(|list| once(&mut self.volumes, list)),
            "containers" => containers(cursor).and_then(|list| once(&mut self.containers, list)),
            "initContainers" => containers(cursor).and_then(|list| once(&mut self.init_containers, list)),
            "ephemeralContainers" => containers(cursor).and_then(|list| once(&mut self.ephemeral_containers, list)),
            "runtimeClassName" => {
                cursor.optional(JsonCursor::string).and_then(|name| once(&mut self.runtime_class_name, name))
            }
            "serviceAccountName" => {
                cursor.optional(JsonCursor::string).and_then(|name| once(&mut self.service_account_name, name))
            }
            _ => return None,
        })
    }

    fn into_view(self) -> PodSpecView<'a> {
        PodSpecView {
            volumes: self.volumes.unwrap_or_default(),
            containers: self.containers.unwrap_or_default(),
            init_containers: self.init_containers.unwrap_or_default(),
            ephemeral_containers: self.ephemeral_containers.unwrap_or_default(),
            runtime_class_name: self.runtime_class_name.flatten(),
            service_account_name: self.service_account_name.flatten(),
        }
    }
}

fn spec_shape<'a>(cursor: &mut JsonCursor<'a>) -> Step<SpecShape<'a>> {
    let mut pod = PodSpecFields::default();
    let (mut template, mut job_template) = (None, None);
    cursor.object(|cursor, key| {
        pod.read(cursor, key).unwrap_or_else(|| match key {
            "template" => once(&mut template, cursor.optional(boxed(template_shape))?),
            "jobTemplate" => once(&mut job_template, cursor.optional(boxed(job_template_shape))?),
            _ => cursor.skip(),
        })
    })?;
    let pod = pod.into_view();
    Ok(SpecShape {
        volumes: pod.volumes,
        containers: pod.containers,
        init_containers: pod.init_containers,
        ephemeral_containers: pod.ephemeral_containers,
        runtime_class_name: pod.runtime_class_name,
        service_account_name: pod.service_account_name,
        template: template.flatten(),
        job_template: job_template.flatten(),
    })
}

fn template_shape<'a>(cursor: &mut JsonCursor<'a>) -> Step<TemplateShape<'a>> {
    let (mut metadata, mut spec) = (None, None);
    cursor.object(|cursor, key| match key {
        "metadata" => once(&mut metadata, cursor.optional(object_names)?.unwrap_or_default()),
        "spec" => once(&mut spec, cursor.optional(pod_spec)?),
        _ => cursor.skip(),
    })?;
    Ok(TemplateShape { metadata: metadata.unwrap_or_default(), spec: spec.flatten() })
}

fn job_template_shape<'a>(cursor: &mut JsonCursor<'a>) -> Step<JobTemplateShape<'a>> {
    Ok(JobTemplateShape { spec: sole_member(cursor, "spec", job_spec_shape)? })
}

fn job_spec_shape<'a>(cursor: &mut JsonCursor<'a>) -> Step<JobSpecShape<'a>> {
    Ok(JobSpecShape { template: sole_member(cursor, "template", boxed(template_shape))? })
}

/// An object of which only the member `name` is read (`null` or absent: `None`), the shape of
/// the templates' wrappers around a pod spec.
fn sole_member<'a, T>(
    cursor: &mut JsonCursor<'a>,
    name: &str,
    read: impl Fn(&mut JsonCursor<'a>) -> Step<T>,
) -> Step<Option<T>> {
    let mut member = None;
    cursor
        .object(|cursor, key| if key == name { once(&mut member, cursor.optional(&read)?) } else { cursor.skip() })?;
    Ok(member.flatten())
}

fn pod_spec<'a>(cursor: &mut JsonCursor<'a>) -> Step<PodSpecView<'a>> {
    let mut pod = PodSpecFields::default();
    cursor.object(|cursor, key| pod.read(cursor, key).unwrap_or_else(|| cursor.skip()))?;
    Ok(pod.into_view())
}

/// A list that `null` leaves empty, as `nullable` reads it.
fn nullable_list<'a, T>(cursor: &mut JsonCursor<'a>, read: impl FnMut(&mut JsonCursor<'a>) -> Step<T>) -> Step<Vec<T>> {
    cursor.optional(|cursor| cursor.list(read)).map(Option::unwrap_or_default)
}

fn volume<'a>(cursor: &mut JsonCursor<'a>) -> Step<VolumeView<'a>> {
    let (mut name, mut csi) = (None, None);
    cursor.object(|cursor, key| match key {
        "name" => once(&mut name, cursor.string()?),
        "csi" => once(&mut csi, cursor.optional(csi_source)?),
        _ => cursor.skip(),
    })?;
    Ok(VolumeView { name: name.unwrap_or_default(), csi: csi.flatten() })
}

fn csi_source<'a>(cursor: &mut JsonCursor<'a>) -> Step<CsiVolumeView<'a>> {
    let (mut driver, mut read_only, mut volume_attributes) = (None, None, None);
    cursor.object(|cursor, key| match key {
        "driver" => once(&mut driver, cursor.string()?),
        "readOnly" => once(&mut read_only, cursor.optional(JsonCursor::bool)?),
        "volumeAttributes" => once(&mut volume_attributes, cursor.optional(string_map)?),
        _ => cursor.skip(),
    })?;
    Ok(CsiVolumeView {
        driver: driver.unwrap_or_default(),
        read_only: read_only.flatten(),
        volume_attributes: volume_attributes.flatten().unwrap_or_default(),
    })
}

/// A JSON object of strings, as serde reads it into a map: a repeated key keeps its last value.
/// The text is borrowed from the body (a value with escapes is unescaped into its own string).
fn string_map<'a>(cursor: &mut JsonCursor<'a>) -> Step<BTreeMap<Cow<'a, str>, Cow<'a, str>>> {
    let mut map = BTreeMap::new();
    cursor.object(|cursor, key| {
        map.insert(Cow::Borrowed(key), cursor.string()?);
        Ok(())
    })?;
    Ok(map)
}

fn container<'a>(cursor: &mut JsonCursor<'a>) -> Step<ContainerView<'a>> {
    let (mut name, mut volume_mounts) = (None, None);
    cursor.object(|cursor, key| match key {
        "name" => once(&mut name, cursor.string()?),
        "volumeMounts" => once(&mut volume_mounts, nullable_list(cursor, volume_mount)?),
        _ => cursor.skip(),
    })?;
    Ok(ContainerView { name: name.unwrap_or_default(), volume_mounts: volume_mounts.unwrap_or_default() })
}

fn volume_mount<'a>(cursor: &mut JsonCursor<'a>) -> Step<VolumeMountView<'a>> {
    let (mut name, mut mount_path, mut read_only) = (None, None, None);
    let (mut sub_path, mut sub_path_expr) = (None, None);
    cursor.object(|cursor, key| match key {
        "name" => once(&mut name, cursor.string()?),
        "mountPath" => once(&mut mount_path, cursor.string()?),
        "readOnly" => once(&mut read_only, cursor.optional(JsonCursor::bool)?),
        "subPath" => once(&mut sub_path, cursor.optional(JsonCursor::string)?),
        "subPathExpr" => once(&mut sub_path_expr, cursor.optional(JsonCursor::string)?),
        _ => cursor.skip(),
    })?;
    Ok(VolumeMountView {
        name: name.unwrap_or_default(),
        mount_path: mount_path.unwrap_or_default(),
        read_only: read_only.flatten(),
        sub_path: sub_path.flatten().unwrap_or_default(),
        sub_path_expr: sub_path_expr.flatten().unwrap_or_default(),
    })
}
