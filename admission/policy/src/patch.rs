//! RFC 6902 JSON Patch operations, limited to what read-only forcing emits.

use serde::Serialize;

/// One JSON Patch operation setting a boolean field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PatchOperation {
    /// `add` when the field is absent, `replace` when it holds another value.
    pub op: PatchOp,
    /// A JSON Pointer (RFC 6901) into the object as sent.
    pub path: String,
    /// The value to set.
    pub value: bool,
}

/// The operations read-only forcing needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchOp {
    /// Create a member.
    Add,
    /// Overwrite an existing member.
    Replace,
}

impl PatchOperation {
    /// Sets `path` to `true`, choosing `add` or `replace` by whether the field was present.
    pub fn set_true(path: String, was_present: bool) -> PatchOperation {
        let op = if was_present { PatchOp::Replace } else { PatchOp::Add };
        PatchOperation { op, path, value: true }
    }
}
