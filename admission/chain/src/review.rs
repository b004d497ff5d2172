//! The `admission.k8s.io/v1` AdmissionReview wire form: a request becomes [`Attributes`], an
//! [`Outcome`] becomes a response. This is the only place an admission error becomes a status code,
//! so the webhook server and `check -o json` answer identically.

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::attributes::{Attributes, GroupVersionKind, GroupVersionResource, Operation, UserInfo};
use crate::chain::{Chain, Outcome, Phase};
use crate::error::AdmissionError;
use crate::json_cursor::Declined;
use crate::object::{AdmissionObject, ObjectDecodeError, ObjectShape, PodSpecKind, is_shared_projection};

/// The only AdmissionReview version spoken.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The AdmissionReview kind.
pub const KIND: &str = "AdmissionReview";

/// Why a body is not a usable AdmissionReview request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON, or fields of the wrong shape.
    #[error("malformed AdmissionReview: {0}")]
    Malformed(String),
    /// A review of another group, version or kind.
    #[error("unsupported {api_version:?} {kind:?}: expected {API_VERSION:?} {KIND:?}")]
    WrongType {
        /// The `apiVersion` found.
        api_version: String,
        /// The `kind` found.
        kind: String,
    },
    /// A review without `request`.
    #[error("AdmissionReview has no request")]
    NoRequest,
}

#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewEnvelope<'a, O> {
    #[serde(default)]
    api_version: Cow<'a, str>,
    #[serde(default)]
    kind: Cow<'a, str>,
    request: Option<RequestFields<'a, O>>,
}

/// The request as sent, its objects as `O`: decoded shapes on the fast path, raw JSON when a
/// failure is being explained.
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestFields<'a, O> {
    uid: Cow<'a, str>,
    kind: GroupVersionKind<'a>,
    resource: GroupVersionResource<'a>,
    #[serde(default)]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(default)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    namespace: Option<Cow<'a, str>>,
    operation: Operation,
    #[serde(default)]
    user_info: UserInfo<'a>,
    #[serde(default = "Option::default")]
    object: Option<O>,
    #[serde(default = "Option::default")]
    old_object: Option<O>,
    #[serde(default)]
    dry_run: Option<bool>,
}

/// An AdmissionReview request: its uid, and either the attributes the chain runs on or why its
/// object does not decode (answered with the request's uid rather than as a bad body).
#[derive(Debug)]
pub struct ReviewRequest<'a> {
    /// Echoed in the response.
    pub uid: String,
    /// The chain's input, or the request's identity and why its object does not decode.
    pub attributes: Result<Attributes<'a>, Undecodable<'a>>,
}

/// A request whose object does not decode: what it was about, and why.
#[derive(Debug)]
pub struct Undecodable<'a> {
    /// The kind of the object.
    pub kind: GroupVersionKind<'a>,
    /// The namespace (empty for cluster-scoped objects).
    pub namespace: Cow<'a, str>,
    /// The object name (empty when generated).
    pub name: Cow<'a, str>,
    /// What is wrong with the object.
    pub error: ObjectDecodeError,
}

impl<'a> ReviewRequest<'a> {
    /// The kind of the object.
    pub fn kind(&self) -> &GroupVersionKind<'a> {
        match &self.attributes {
            Ok(attributes) => &attributes.kind,
            Err(undecodable) => &undecodable.kind,
        }
    }

    /// The namespace (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        match &self.attributes {
            Ok(attributes) => &attributes.namespace,
            Err(undecodable) => &undecodable.namespace,
        }
    }

    /// The object name (empty when generated).
    pub fn name(&self) -> &str {
        match &self.attributes {
            Ok(attributes) => &attributes.name,
            Err(undecodable) => &undecodable.name,
        }
    }
}

/// Parses an AdmissionReview request body. The objects are decoded in the same pass, by hand; a
/// body the hand-written reader declines is decoded by serde, and only a body that fails there
/// too is read again, to say precisely what is wrong.
pub fn parse_request(body: &[u8]) -> Result<ReviewRequest<'_>, ReviewError> {
    // The hand-written reader first; serde decides whatever it declines, so what is accepted,
    // and every error, stays serde's own. One UTF-8 check of the whole body lets both read it as
    // text; a body that is not UTF-8 takes serde's byte path.
    let fast = match simdutf8::basic::from_utf8(body) {
        Ok(text) => fast_decode::review_envelope(text).or_else(|Declined| serde_json::from_str(text)),
        Err(_) => serde_json::from_slice::<ReviewEnvelope<ObjectShape>>(body),
    };
    // A SharedProjection's spec is not in the one-pass shape: such a review (rare, small) takes
    // the path that decodes the object knowing its resource.
    let fast = fast
        .ok()
        .filter(|envelope| envelope.request.as_ref().is_none_or(|request| !is_shared_projection(&request.resource)));
    if let Some(envelope) = fast {
        let fields = checked(envelope)?;
        let kind = PodSpecKind::of(&fields.resource);
        return Ok(fields.into_request(|shape| Ok(shape.map(|shape| AdmissionObject::from_shape(kind, shape)))));
    }
    let envelope: ReviewEnvelope<Box<RawValue>> = serde_json::from_slice(body).map_err(|error| {
        // A review of another version may fail on its request's shape: name the version instead.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct TypeOnly {
            #[serde(default)]
            api_version: String,
            #[serde(default)]
            kind: String,
        }
        match serde_json::from_slice::<TypeOnly>(body) {
            Ok(found) if found.api_version != API_VERSION || found.kind != KIND => {
                ReviewError::WrongType { api_version: found.api_version, kind: found.kind }
            }
            _ => ReviewError::Malformed(error.to_string()),
        }
    })?;
    let fields = checked(envelope)?;
    let resource = fields.resource.clone();
    Ok(fields.into_request(|raw| raw.map(|raw| AdmissionObject::from_json(&resource, raw.get())).transpose()))
}

fn checked<'a, O>(envelope: ReviewEnvelope<'a, O>) -> Result<RequestFields<'a, O>, ReviewError> {
    if envelope.api_version != API_VERSION || envelope.kind != KIND {
        return Err(ReviewError::WrongType {
            api_version: envelope.api_version.into_owned(),
            kind: envelope.kind.into_owned(),
        });
    }
    envelope.request.ok_or(ReviewError::NoRequest)
}

impl<'a, O> RequestFields<'a, O> {
    fn into_request(
        self,
        mut decode: impl FnMut(Option<O>) -> Result<Option<AdmissionObject<'a>>, ObjectDecodeError>,
    ) -> ReviewRequest<'a> {
        let namespace = self.namespace.unwrap_or_default();
        let name = self.name.unwrap_or_default();
        let objects = decode(self.object).and_then(|object| Ok((object, decode(self.old_object)?)));
        let attributes = match objects {
            Ok((object, old_object)) => Ok(Attributes {
                operation: self.operation,
                kind: self.kind,
                resource: self.resource,
                subresource: self.sub_resource.unwrap_or_default(),
                namespace,
                name,
                object,
                old_object,
                user_info: self.user_info,
                dry_run: self.dry_run.unwrap_or(false),
            }),
            Err(error) => Err(Undecodable { kind: self.kind, namespace, name, error }),
        };
        ReviewRequest { uid: self.uid.into_owned(), attributes }
    }
}

/// A complete AdmissionReview carrying a response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    api_version: &'static str,
    kind: &'static str,
    /// The answer.
    pub response: AdmissionResponse,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why not, when denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Warnings for the client.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Audit annotations (kube-apiserver prefixes the keys with the webhook name).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    /// `JSONPatch` when `patch` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// The RFC 6902 patch, base64-encoded as the API requires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

/// A `metav1.Status` explaining a denial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Always `Failure`.
    pub status: &'static str,
    /// The human-readable reason.
    pub message: String,
    /// The machine-readable reason (`Forbidden`, `Invalid`, `BadRequest`, `InternalError`).
    pub reason: &'static str,
    /// The HTTP status code it stands for.
    pub code: u16,
}

impl Status {
    /// The one mapping from admission errors to API statuses.
    pub fn of(error: &AdmissionError) -> Status {
        let (reason, code, message) = match error {
            AdmissionError::Forbidden(message) => ("Forbidden", 403, message),
            AdmissionError::Invalid(message) => ("Invalid", 422, message),
            AdmissionError::BadRequest(message) => ("BadRequest", 400, message),
            AdmissionError::Internal(message) => ("InternalError", 500, message),
        };
        Status { status: "Failure", message: message.clone(), reason, code }
    }
}

impl ReviewResponse {
    fn new(response: AdmissionResponse) -> ReviewResponse {
        ReviewResponse { api_version: API_VERSION, kind: KIND, response }
    }

    /// The response to a request the chain ran on.
    pub fn from_outcome(uid: &str, outcome: Outcome) -> ReviewResponse {
        ReviewResponse::answering(uid.to_string(), outcome)
    }

    fn answering(uid: String, outcome: Outcome) -> ReviewResponse {
        let patch = (!outcome.patch.is_empty()).then(|| {
            let json = serde_json::to_vec(&outcome.patch).unwrap_or_default();
            base64::engine::general_purpose::STANDARD.encode(json)
        });
        ReviewResponse::new(AdmissionResponse {
            uid,
            allowed: outcome.result.is_ok(),
            status: outcome.result.as_ref().err().map(Status::of),
            warnings: outcome.warnings,
            audit_annotations: outcome.audit_annotations,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
        })
    }

    /// The response to a decided request, its uid moved rather than copied.
    pub fn from_decided(decided: Decided) -> ReviewResponse {
        ReviewResponse::answering(decided.uid, decided.outcome)
    }

    /// The response as one line of JSON.
    pub fn to_json(&self) -> String {
        encode::review_response_json(self)
    }
}

/// A request the chain has decided, before it is encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The request's uid.
    pub uid: String,
    /// The chain's outcome (a rejection with `BadRequest` when the object did not decode).
    pub outcome: Outcome,
}

/// Runs `chain` on one AdmissionReview body: the path every host shares. Hosts that answer some
/// outcomes differently (the webhook turns `Internal` into an HTTP error so the failure policy
/// applies) look at the outcome before encoding it.
pub async fn decide(chain: &Chain, phase: Phase, body: &[u8]) -> Result<Decided, ReviewError> {
    let request = parse_request(body)?;
    let outcome = match request.attributes {
        Ok(mut attributes) => chain.run(phase, &mut attributes).await,
        Err(undecodable) => Outcome::rejected(AdmissionError::BadRequest(undecodable.error.to_string())),
    };
    Ok(Decided { uid: request.uid, outcome })
}

/// Runs `chain` on one AdmissionReview body and encodes the answer.
pub async fn answer(chain: &Chain, phase: Phase, body: &[u8]) -> Result<ReviewResponse, ReviewError> {
    Ok(ReviewResponse::from_decided(decide(chain, phase, body).await?))
}

mod encode;
mod fast_decode;

/// The decoders behind [`parse_request`] one at a time, and the bare scan the hand-written one is
/// built on, so benchmarks can show what each costs.
#[cfg(feature = "test-util")]
pub mod decoders {
    use super::{ObjectShape, ReviewEnvelope};
    use crate::json_cursor::JsonCursor;

    /// The hand-written decoder alone; false when it declines.
    pub fn hand_written(text: &str) -> bool {
        super::fast_decode::review_envelope(text).is_ok()
    }

    /// serde's derive alone, as `parse_request` decoded before the hand-written decoder.
    pub fn serde_derive(text: &str) -> bool {
        serde_json::from_str::<ReviewEnvelope<ObjectShape>>(text).is_ok()
    }

    /// The hand-written reader skipping the whole text, keeping nothing: the least any decoder
    /// built on it can cost.
    pub fn scan_only(text: &str) -> bool {
        let mut cursor = JsonCursor::new(text);
        cursor.skip().and_then(|()| cursor.finish()).is_ok()
    }
}

#[cfg(test)]
mod tests;
