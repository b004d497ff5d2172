//! A response written out by hand, byte for byte what serde_json writes for [`ReviewResponse`]
//! (its `Serialize` derive stays the reference, and a property test holds the two equal), in one
//! buffer sized up front instead of through serde's per-field calls.

use std::fmt::Write as _;

use super::{API_VERSION, AdmissionResponse, KIND, ReviewResponse, Status};
use crate::json_cursor::next_quote_backslash_or_control;

/// The response as one line of JSON.
pub(super) fn review_response_json(review: &ReviewResponse) -> String {
    let response = &review.response;
    let mut out = String::with_capacity(160 + estimated_len(response));
    out.push_str("{\"apiVersion\":");
    string(&mut out, API_VERSION);
    out.push_str(",\"kind\":");
    string(&mut out, KIND);
    out.push_str(",\"response\":{\"uid\":");
    string(&mut out, &response.uid);
    out.push_str(if response.allowed { ",\"allowed\":true" } else { ",\"allowed\":false" });
    if let Some(status) = &response.status {
        self::status(&mut out, status);
    }
    if !response.warnings.is_empty() {
        out.push_str(",\"warnings\":[");
        for (index, warning) in response.warnings.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            string(&mut out, warning);
        }
        out.push(']');
    }
    if !response.audit_annotations.is_empty() {
        out.push_str(",\"auditAnnotations\":{");
        for (index, (key, value)) in response.audit_annotations.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            string(&mut out, key);
            out.push(':');
            string(&mut out, value);
        }
        out.push('}');
    }
    if let Some(patch_type) = response.patch_type {
        out.push_str(",\"patchType\":");
        string(&mut out, patch_type);
    }
    if let Some(patch) = &response.patch {
        out.push_str(",\"patch\":");
        string(&mut out, patch);
    }
    out.push_str("}}");
    out
}

fn status(out: &mut String, status: &Status) {
    out.push_str(",\"status\":{\"status\":");
    string(out, status.status);
    out.push_str(",\"message\":");
    string(out, &status.message);
    out.push_str(",\"reason\":");
    string(out, status.reason);
    // Writing into a String cannot fail.
    let _ = write!(out, ",\"code\":{}}}", status.code);
}

/// The bytes the variable parts take before escaping.
fn estimated_len(response: &AdmissionResponse) -> usize {
    let status = response.status.as_ref().map_or(0, |status| 80 + status.message.len());
    let warnings: usize = response.warnings.iter().map(|warning| warning.len() + 3).sum();
    let annotations: usize = response.audit_annotations.iter().map(|(key, value)| key.len() + value.len() + 6).sum();
    let patch = response.patch.as_ref().map_or(0, |patch| patch.len() + 40);
    response.uid.len() + status + warnings + annotations + patch
}

/// `text` as a JSON string, escaped as serde_json escapes it: `"` and `\` by a backslash, the
/// control characters with a short form by it (`\b \t \n \f \r`), the others as `\u00xx`;
/// everything else, DEL and non-ASCII included, as it is. The bytes to escape are exactly those
/// the JSON reader stops at, so runs between them are found eight bytes at a time.
fn string(out: &mut String, text: &str) {
    out.push('"');
    let bytes = text.as_bytes();
    let mut run_start = 0;
    loop {
        let at = next_quote_backslash_or_control(bytes, run_start);
        out.push_str(&text[run_start..at]);
        let Some(&byte) = bytes.get(at) else { break };
        match byte {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
        }
        run_start = at + 1;
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![any::<String>(), "[\\x00-\\x20\"\\\\/\\x7f-\\u{a0}éa]{0,12}"]
    }

    fn response() -> impl Strategy<Value = ReviewResponse> {
        let status = (any_text(), prop::sample::select(vec!["Forbidden", "Invalid"]), any::<u16>())
            .prop_map(|(message, reason, code)| Status { status: "Failure", message, reason, code });
        (
            any_text(),
            any::<bool>(),
            prop::option::of(status),
            prop::collection::vec(any_text(), 0..3),
            prop::collection::btree_map(any_text(), any_text(), 0..3),
            prop::option::of(any_text()),
        )
            .prop_map(|(uid, allowed, status, warnings, audit_annotations, patch)| ReviewResponse {
                api_version: API_VERSION,
                kind: KIND,
                response: AdmissionResponse {
                    uid,
                    allowed,
                    status,
                    warnings,
                    audit_annotations: audit_annotations.into_iter().collect::<BTreeMap<_, _>>(),
                    patch_type: patch.as_ref().map(|_| "JSONPatch"),
                    patch,
                },
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn writes_exactly_what_serde_json_writes(review in response()) {
            prop_assert_eq!(review_response_json(&review), serde_json::to_string(&review).unwrap());
        }
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_escapes_it() {
        let every_ascii: String = (0u8..=0x7f).map(char::from).collect();
        let mut ours = String::new();
        string(&mut ours, &every_ascii);
        assert_eq!(ours, serde_json::to_string(&every_ascii).unwrap());
    }
}
