//! The apiserver's JSON audit log, read back as the events a cluster admin would query.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// The part of an `audit.k8s.io/v1` Event the suites look at.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// The request's id: the `Audit-Id` header of its answer.
    #[serde(default, rename = "auditID")]
    pub audit_id: String,
    /// `ResponseComplete`, `Panic`, ...
    pub stage: String,
    /// `get`, `list`, `watch`, `create`, ...
    #[serde(default)]
    pub verb: String,
    /// Who asked.
    #[serde(default)]
    pub user: User,
    /// Whom the asker impersonated, if anyone (the suites' processes act as their identities so).
    #[serde(default)]
    pub impersonated_user: Option<User>,
    /// The request's path and query, as sent.
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
    /// What the request was about.
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    /// The answer's status, once there is one.
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// The request's body, where the audit policy logs it (`level: Request`).
    #[serde(default)]
    pub request_object: Option<serde_json::Value>,
    /// When the apiserver received the request (RFC 3339, microseconds, UTC).
    #[serde(default)]
    pub request_received_timestamp: String,
    /// Audit annotations, a webhook's prefixed with the webhook's name.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// `user`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct User {
    /// The user name.
    #[serde(default)]
    pub username: String,
}

/// `responseStatus`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponseStatus {
    /// The HTTP code.
    #[serde(default)]
    pub code: u16,
}

/// `objectRef`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectRef {
    /// Resource, e.g. `pods`.
    #[serde(default)]
    pub resource: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Name (filled from the object for creates).
    #[serde(default)]
    pub name: String,
}

impl AuditEvent {
    /// The identity the request acted as: the impersonated user when there is one.
    pub fn acting_user(&self) -> &str {
        self.impersonated_user.as_ref().map_or(&self.user.username, |user| &user.username)
    }

    /// Whether the apiserver refused it (403).
    pub fn forbidden(&self) -> bool {
        self.response_status.as_ref().is_some_and(|status| status.code == 403)
    }

    /// Whether this is a completed SubjectAccessReview asking about `user`.
    pub fn asks_about(&self, user: &str) -> bool {
        self.access_review_user() == Some(user)
    }

    /// The user a completed SubjectAccessReview asked about (`spec.user`, logged at `level:
    /// Request`); `None` for any other event.
    pub fn access_review_user(&self) -> Option<&str> {
        let review = self.stage == "ResponseComplete"
            && self.verb == "create"
            && self.object_ref.as_ref().is_some_and(|o| o.resource == "subjectaccessreviews");
        review.then(|| self.request_object.as_ref()?["spec"]["user"].as_str()).flatten()
    }

    /// Whether this is the completed request for `resource` `namespace/name`.
    pub fn is_about(&self, resource: &str, namespace: &str, name: &str) -> bool {
        self.stage == "ResponseComplete"
            && self
                .object_ref
                .as_ref()
                .is_some_and(|o| o.resource == resource && o.namespace == namespace && o.name == name)
    }
}

/// Every event in the log; a line the apiserver has not finished writing is skipped.
pub fn read(path: &Path) -> Result<Vec<AuditEvent>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    Ok(text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect())
}
