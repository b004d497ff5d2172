//! RFC 6902 JSON Patch operations, limited to what the mutating plugins emit: `readOnly` set to
//! `true` (read-only forcing), and volumes and mounts added (share injection).

use serde::Serialize;

use crate::share_injection::{InjectedMount, InjectedVolume};

/// One JSON Patch operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PatchOperation {
    /// `add` when the member is absent (or appended to a list), `replace` when it holds another
    /// value.
    pub op: PatchOp,
    /// A JSON Pointer (RFC 6901) into the object as sent.
    pub path: String,
    /// The value to set.
    pub value: PatchValue,
}

/// The operations the plugins need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchOp {
    /// Create a member, or append to a list (`/-`).
    Add,
    /// Overwrite an existing member.
    Replace,
}

/// What an operation writes, serialized as the bare JSON value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum PatchValue {
    /// A `readOnly` field.
    Bool(bool),
    /// One volume appended to `spec.volumes`.
    Volume(InjectedVolume),
    /// `spec.volumes` written whole, when the pod had none.
    Volumes(Vec<InjectedVolume>),
    /// One mount appended to a container's `volumeMounts`.
    Mount(InjectedMount),
    /// A container's `volumeMounts` written whole, when it had none.
    Mounts(Vec<InjectedMount>),
}

impl PatchOperation {
    /// Sets `path` to `true`, choosing `add` or `replace` by whether the field was present.
    pub fn set_true(path: String, was_present: bool) -> PatchOperation {
        let op = if was_present { PatchOp::Replace } else { PatchOp::Add };
        PatchOperation { op, path, value: PatchValue::Bool(true) }
    }

    /// Adds `value` at `path`.
    pub fn add(path: String, value: PatchValue) -> PatchOperation {
        PatchOperation { op: PatchOp::Add, path, value }
    }
}
