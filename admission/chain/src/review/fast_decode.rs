//! The AdmissionReview envelope read by hand in one pass with [`JsonCursor`]: what its serde
//! derive reads, field for field, about twice as fast (`benches/` stages). serde stays the
//! reference: whatever this declines, serde decodes or explains, and property tests hold the two
//! to the same answer on every input this accepts.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::{RequestFields, ReviewEnvelope};
use crate::attributes::{GroupVersionKind, GroupVersionResource, Operation, UserInfo};
use crate::json_cursor::{Declined, JsonCursor, Step};
use crate::object::ObjectShape;
use crate::object::fast_decode::{object_shape, once};

/// The whole body, or [`Declined`] when serde must decide.
pub(super) fn review_envelope(text: &str) -> Step<ReviewEnvelope<'_, ObjectShape<'_>>> {
    let mut cursor = JsonCursor::new(text);
    let (mut api_version, mut kind, mut request) = (None, None, None);
    cursor.object(|cursor, key| match key {
        "apiVersion" => once(&mut api_version, cursor.string()?),
        "kind" => once(&mut kind, cursor.string()?),
        "request" => once(&mut request, cursor.optional(request_fields)?),
        _ => cursor.skip(),
    })?;
    cursor.finish()?;
    Ok(ReviewEnvelope {
        api_version: api_version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        request: request.flatten(),
    })
}

fn request_fields<'a>(cursor: &mut JsonCursor<'a>) -> Step<RequestFields<'a, ObjectShape<'a>>> {
    let (mut uid, mut kind, mut resource, mut sub_resource, mut name, mut namespace) =
        (None, None, None, None, None, None);
    let (mut operation, mut user_info, mut object, mut old_object, mut dry_run) = (None, None, None, None, None);
    cursor.object(|cursor, key| match key {
        "uid" => once(&mut uid, cursor.string()?),
        "kind" => once(&mut kind, group_version_kind(cursor)?),
        "resource" => once(&mut resource, group_version_resource(cursor)?),
        "subResource" => once(&mut sub_resource, cursor.optional(JsonCursor::string)?),
        "name" => once(&mut name, cursor.optional(JsonCursor::string)?),
        "namespace" => once(&mut namespace, cursor.optional(JsonCursor::string)?),
        "operation" => once(&mut operation, self::operation(cursor)?),
        "userInfo" => once(&mut user_info, self::user_info(cursor)?),
        "object" => once(&mut object, cursor.optional(object_shape)?),
        "oldObject" => once(&mut old_object, cursor.optional(object_shape)?),
        "dryRun" => once(&mut dry_run, cursor.optional(JsonCursor::bool)?),
        _ => cursor.skip(),
    })?;
    Ok(RequestFields {
        uid: uid.ok_or(Declined)?,
        kind: kind.ok_or(Declined)?,
        resource: resource.ok_or(Declined)?,
        sub_resource: sub_resource.flatten(),
        name: name.flatten(),
        namespace: namespace.flatten(),
        operation: operation.ok_or(Declined)?,
        user_info: user_info.unwrap_or_default(),
        object: object.flatten(),
        old_object: old_object.flatten(),
        dry_run: dry_run.flatten(),
    })
}

fn group_version_kind<'a>(cursor: &mut JsonCursor<'a>) -> Step<GroupVersionKind<'a>> {
    let (group, version, kind) = group_version_and(cursor, "kind")?;
    Ok(GroupVersionKind { group, version, kind })
}

fn group_version_resource<'a>(cursor: &mut JsonCursor<'a>) -> Step<GroupVersionResource<'a>> {
    let (group, version, resource) = group_version_and(cursor, "resource")?;
    Ok(GroupVersionResource { group, version, resource })
}

/// `group` (may be absent: the core group), `version` and the member `name`, both required.
fn group_version_and<'a>(cursor: &mut JsonCursor<'a>, name: &str) -> Step<(Cow<'a, str>, Cow<'a, str>, Cow<'a, str>)> {
    let (mut group, mut version, mut named) = (None, None, None);
    cursor.object(|cursor, key| match key {
        "group" => once(&mut group, cursor.string()?),
        "version" => once(&mut version, cursor.string()?),
        _ if key == name => once(&mut named, cursor.string()?),
        _ => cursor.skip(),
    })?;
    Ok((group.unwrap_or_default(), version.ok_or(Declined)?, named.ok_or(Declined)?))
}

fn operation(cursor: &mut JsonCursor<'_>) -> Step<Operation> {
    match cursor.plain_str()? {
        "CREATE" => Ok(Operation::Create),
        "UPDATE" => Ok(Operation::Update),
        "DELETE" => Ok(Operation::Delete),
        "CONNECT" => Ok(Operation::Connect),
        _ => Err(Declined),
    }
}

fn user_info<'a>(cursor: &mut JsonCursor<'a>) -> Step<UserInfo<'a>> {
    let (mut username, mut uid, mut groups, mut extra) = (None, None, None, None);
    cursor.object(|cursor, key| match key {
        "username" => once(&mut username, cursor.string()?),
        "uid" => once(&mut uid, cursor.string()?),
        "groups" => once(&mut groups, cursor.list(JsonCursor::string)?),
        "extra" => once(&mut extra, extra_attributes(cursor)?),
        _ => cursor.skip(),
    })?;
    Ok(UserInfo {
        username: username.unwrap_or_default(),
        uid: uid.unwrap_or_default(),
        groups: groups.unwrap_or_default(),
        extra: extra.unwrap_or_default(),
    })
}

/// A map: a key given twice keeps its last value, as serde's map does.
fn extra_attributes(cursor: &mut JsonCursor<'_>) -> Step<BTreeMap<String, Vec<String>>> {
    let mut extra = BTreeMap::new();
    cursor.object(|cursor, key| {
        extra.insert(key.to_owned(), cursor.list(|cursor| cursor.string().map(Cow::into_owned))?);
        Ok(())
    })?;
    Ok(extra)
}

#[cfg(test)]
mod tests;
